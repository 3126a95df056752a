"""Sphinx configuration of the rnstensor docs: numpydoc docstrings, an autosummary API reference, no network."""

import sphinx.ext.autosummary as _autosummary

import rnstensor

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

templates_path = ["_templates"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path = ["_static"]
html_theme_options = {"description": "Float64-accurate tensor contractions in exact INT8 residues", "nosidebar": False}

# doctest builder (-b doctest): the ``.. doctest::`` examples of the user pages run against the installed
# package, each page in one namespace. The docstrings' own examples are run by tests/test_doctests.py in their
# modules' namespaces, so the plain >>> blocks autodoc copies into the reference are not run again here.
doctest_test_doctest_blocks = ""


def _no_builtin_type_docstring(app, what, name, obj, options, lines):
    """A constant without a doc comment of its own would show its type's docstring (``tuple``'s); show none."""
    own = " ".join(" ".join(lines).split())
    if what in ("data", "attribute") and own and own == " ".join((type(obj).__doc__ or "").split()):
        lines.clear()


def setup(app):
    app.connect("autodoc-process-docstring", _no_builtin_type_docstring)
