"""Sphinx configuration of the rnstensor docs: numpydoc docstrings, an autosummary API reference, no network."""

import sys

import sphinx.ext.autosummary as _autosummary
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer

import rnstensor
import rnstensor.dask  # noqa: F401  (its page is in the reference; listed in submodules below)

# the summary tables cut a docstring's first line at its first ". "; the papers' "Alg. 5" and "Eq. 21" are no
# sentence ends (autosummary keeps a tuple of such abbreviations, "e.g." and the like, that it reads per call)
_autosummary.WELL_KNOWN_ABBREVIATIONS = tuple(getattr(_autosummary, "WELL_KNOWN_ABBREVIATIONS", ())) + (
    "Alg.", "Algs.", "Eq.", "Eqs.", "Sec.", "Fig.", "Tab.",
)

project = "rnstensor"
author = "the rnstensor authors"
copyright = "the rnstensor authors"
release = rnstensor.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "numpydoc",
]

# the reference follows each module's __all__, so a name added there appears without editing the docs
autosummary_generate = True
autosummary_ignore_module_all = False
autosummary_imported_members = True
autodoc_default_options = {"members": True, "inherited-members": False, "show-inheritance": True}
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types; signatures stay readable

# class pages list their members through the autosummary class template, not numpydoc's tables
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False

# the module template tells a re-exported submodule (rnstensor.fem in rnstensor's __all__) from a constant
autosummary_context = {"submodules": {}}
for _name in sorted(m for m in sys.modules if m.startswith("rnstensor.")):
    _parent, _, _short = _name.rpartition(".")
    autosummary_context["submodules"].setdefault(_parent, []).append(_short)

templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "Float64-accurate tensor contractions in exact INT8 residues", "nosidebar": False}

# doctest builder (-b doctest): the ``.. doctest::`` examples of the user pages run against the installed
# package, each page in one namespace. The docstrings' own examples are run by tests/test_doctests.py in their
# modules' namespaces, so the plain >>> blocks autodoc copies into the reference are not run again here.
doctest_test_doctest_blocks = ""
# exception messages are compared too (Sphinx's default ignores their details): a stale message fails the build
import doctest as _doctest  # noqa: E402

doctest_default_flags = _doctest.ELLIPSIS | _doctest.DONT_ACCEPT_TRUE_FOR_1


def _defining_comment(name: str, obj) -> list:
    """The ``#:`` comment above ``obj``'s assignment in the submodule it is re-exported from (``[]``: none).

    autodoc reads doc comments in the module a constant is documented under
    (``rnstensor.fem``), not in the one that assigns it (``rnstensor.fem.operators``).
    """
    package, _, attr = name.rpartition(".")
    for modname, module in sorted(sys.modules.items()):
        if modname.startswith(package + ".") and getattr(module, attr, None) is obj:
            try:
                comment = ModuleAnalyzer.for_module(modname).find_attr_docs().get(("", attr))
            except PycodeError:
                continue
            if comment:
                return list(comment)
    return []


def _constant_docstring(app, what, name, obj, options, lines):
    """A re-exported constant: its doc comment where it is assigned, never its type's docstring (``tuple``'s)."""
    if what not in ("data", "attribute"):
        return
    own = " ".join(" ".join(lines).split())
    if not own or own == " ".join((type(obj).__doc__ or "").split()):
        lines[:] = _defining_comment(name, obj)


def setup(app):
    # before numpydoc (priority 500) reformats the lines
    app.connect("autodoc-process-docstring", _constant_docstring, priority=100)
