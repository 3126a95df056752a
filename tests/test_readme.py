"""README.md is true: its examples run, their ``# -> value`` outputs hold, its API table matches the signatures."""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import io
import re
from pathlib import Path

import pytest

import rnstensor as rt

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def literal_prefix(text: str) -> str:
    """The leading Python literal of a comment such as ``(53, (7, 7, 0)): encoding bits`` or ``True: the volume``."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch in ": " and i > 0:
            return text[:i]
    return text


def claims(block: str) -> list[tuple[int, str]]:
    """``(line number, value)`` of every ``# -> value`` comment in a block (1-based lines)."""
    out = []
    for n, line in enumerate(block.splitlines(), 1):
        m = re.search(r"#\s*->\s*(.+)$", line)
        if m:
            out.append((n, literal_prefix(m.group(1).strip())))
    return out


def run_block(block: str) -> dict:
    """Execute a README block statement by statement; returns the value of every claimed line."""
    tree = ast.parse(block)
    wanted = {n for n, _ in claims(block)}
    ns: dict = {}
    got = {}
    for stmt in tree.body:
        if stmt.lineno in wanted and isinstance(stmt, ast.Expr):
            expr = stmt.value
            if isinstance(expr, ast.Call) and getattr(expr.func, "id", None) == "print" and len(expr.args) == 1:
                expr = expr.args[0]  # print(x)  # -> v: the claim is about x
            with contextlib.redirect_stdout(io.StringIO()):
                got[stmt.lineno] = eval(compile(ast.Expression(expr), "README", "eval"), ns)
        else:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(ast.Module([stmt], []), "README", "exec"), ns)
    return got


def test_readme_has_claims_to_check():
    assert sum(len(claims(b)) for b in python_blocks()) >= 3


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_readme_example_runs_and_its_outputs_hold(index):
    block = python_blocks()[index]
    if "import dask" in block:
        pytest.importorskip("dask.array")
    got = run_block(block)
    for line, text in claims(block):
        want = ast.literal_eval(text)
        value = got[line]
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()
        assert value == want and type(value) is type(want), f"README block {index}, line {line}: {value!r} != {want!r}"


# ----- the API table --------------------------------------------------------------------------------------------------


def api_rows() -> list[str]:
    section = README.split("## API overview", 1)[1].split("\n## ", 1)[0]
    return [ln for ln in section.splitlines() if ln.startswith("| `")]


def documented_calls() -> list[tuple[str, str, str]]:
    """``(module, name, params)`` of every ``name(params)`` in the table's first column."""
    out = []
    for row in api_rows():
        first = row.split(" | ")[0]
        m = re.match(r"\| `(rnstensor\.\w+)`:", first)
        module = m.group(1) if m else "rnstensor"
        for name, params in re.findall(r"`([A-Za-z_][\w.]*)\(([^`]*)\)`", first):
            out.append((module, name, params))
    return out


def split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def test_api_table_lists_real_calls():
    assert len(documented_calls()) >= 20


@pytest.mark.parametrize("module, name, params", documented_calls())
def test_api_table_matches_signature(module, name, params):
    obj = importlib.import_module(module)
    for attr in name.split("."):
        obj = getattr(obj, attr)
    sig = inspect.signature(obj)
    real = [p for p in sig.parameters.values() if p.name != "self"]
    listed = split_params(params)
    if listed == ["..."]:
        return
    positional = [p.name for p in real if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    seen_star = False
    order = []
    for item in listed:
        if item in ("*", "..."):
            seen_star = seen_star or item == "*"
            continue
        if item[0] in "'\"":  # choices for a parameter, e.g. set_backend('cpu' | 'numpy' | 'cuda')
            order.append(positional[len(order)])
            continue
        pname, _, default = item.partition("=")
        pname = pname.lstrip("*")
        if pname not in sig.parameters and not seen_star and any(p.kind == p.VAR_POSITIONAL for p in real):
            continue  # numpy's einsum(subscripts, *operands): the signature's *operands takes the subscripts too
        assert pname in sig.parameters, f"{name}: the README lists {pname!r}, the signature is {sig}"
        p = sig.parameters[pname]
        if default:
            assert p.default is not inspect.Parameter.empty, f"{name}({pname}) has no default; the README says {default}"
            assert p.default == ast.literal_eval(default), f"{name}({pname}): README {default}, code {p.default!r}"
        if item.startswith("*"):
            assert p.kind == p.VAR_POSITIONAL
            seen_star = True
        elif seen_star:
            assert p.kind == p.KEYWORD_ONLY, f"{name}: {pname} is listed keyword-only but is not ({sig})"
        elif p.kind != p.VAR_POSITIONAL:
            order.append(pname)
    assert order == positional[: len(order)], f"{name}: the README's positional order {order} is not {sig}'s"


def test_papers_are_cited_by_arxiv_id():
    refs = README.split("## References", 1)[1]
    for arxiv in ("2610.05059", "2610.26945", "2606.25453"):
        assert f"[{arxiv}]: https://arxiv.org/abs/{arxiv}" in refs
    assert "papers/" not in README
    for path in Path(rt.__file__).parent.rglob("*"):
        if path.suffix in (".py", ".cu", ".cuh", ".cpp", ".h"):
            assert "papers/" not in path.read_text(encoding="utf-8"), f"{path} cites a papers/ folder the repository has not"


def test_gpu_paragraph_says_first_what_ran_on_a_gpu():
    para = README.split("\nGPU:", 1)[1]
    first_sentence = para.split(". ", 1)[0]
    assert "run on a GPU" in first_sentence


def test_every_benchmark_section_says_where_it_was_measured():
    text = (Path(__file__).resolve().parent.parent / "BENCHMARKS.md").read_text(encoding="utf-8")
    sections = text.split("\n## ")[1:]
    assert sections
    for sec in sections:
        head, _, body = sec.partition("\n")
        assert "Measured on:" in body.split("\n### ", 1)[0], f"BENCHMARKS.md section {head!r} does not say where it was measured"
