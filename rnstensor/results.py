"""Result files of the CLI and the benchmarks: JSON with a ``kind`` (its figure), the parameters and the machine."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Optional, Union

__all__ = ["json_on_stdout", "machine_facts", "result_record", "write_result", "read_result", "output_path"]


def output_path(path: str) -> str:
    """``path`` if its folder exists (``'-'``: standard output): an argparse ``type`` that says a bad ``--json``
    before a long run, not after it.

    Raises
    ------
    argparse.ArgumentTypeError
        If the folder does not exist (argparse reports it with the option's name).

    Examples
    --------
    >>> output_path("result.json")
    'result.json'
    """
    import argparse

    if path == "-":  # standard output
        return path
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"the folder {folder!r} of {path!r} does not exist; create it or write elsewhere")
    return path


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_facts() -> dict:
    """Where and when a result was measured: UTC date, platform, CPU, cores, Python, numpy, numba, backend.

    Examples
    --------
    >>> facts = machine_facts()
    >>> sorted(facts)
    ['backend', 'cpu', 'cpus', 'date', 'loadavg', 'machine', 'numba', 'numba_threads', 'numpy', 'platform', 'python']
    """
    import numpy as np

    try:
        import numba

        numba_version, threads = numba.__version__, int(numba.get_num_threads())
    except Exception:  # noqa: BLE001 - a broken numba is a fact about the machine, not a failure of the record
        numba_version, threads = None, None
    try:
        from .backends import get_backend

        backend = get_backend().name
    except Exception:  # noqa: BLE001 - same
        backend = None
    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba_version,
        "numba_threads": threads,
        "backend": backend,
    }


def result_record(kind: str, data: dict, params: Optional[dict] = None) -> dict:
    """``{'kind', 'params', 'machine', **data}``: one result as it is written and as :mod:`rnstensor.plot` reads it.

    Parameters
    ----------
    kind : str
        Which figure the result belongs to (a key of :data:`rnstensor.plot.FIGURES`).
    data : dict
        The measured data (its keys must not be ``kind``, ``params`` or ``machine``).
    params : dict, optional
        The parameters of the run (command-line options).

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        If ``data`` uses one of the three reserved keys.

    Examples
    --------
    >>> r = result_record("chain_accuracy", {"errors": []}, {"count": 2})
    >>> r["kind"], r["params"], sorted(r)
    ('chain_accuracy', {'count': 2}, ['errors', 'kind', 'machine', 'params'])
    """
    clash = sorted({"kind", "params", "machine"} & set(data))
    if clash:
        raise ValueError(f"data: the keys {clash} are reserved for the record; rename them")
    return {"kind": kind, "params": dict(params or {}), "machine": machine_facts(), **data}


def write_result(path: Union[str, os.PathLike], kind: str, data: dict, params: Optional[dict] = None) -> dict:
    """Write :func:`result_record` as JSON to ``path``; returns the record.

    Values JSON does not know (numpy scalars, tuples as lists) are written as
    their ``int``/``float`` or ``str``.
    """
    record = result_record(kind, data, params)
    if os.fspath(path) == "-":  # standard output, as the tools people know write it
        out = _JSON_STREAM[-1] if _JSON_STREAM else sys.stdout
        json.dump(record, out, indent=1, default=_plain)
        out.write("\n")
        out.flush()
        return record
    with open(path, "w") as f:
        json.dump(record, f, indent=1, default=_plain)
        f.write("\n")
    return record


_JSON_STREAM: list = []  # where write_result(path='-') writes while json_on_stdout holds the real standard output


@contextlib.contextmanager
def json_on_stdout(path):
    """For ``--json -``: while inside, what the command prints goes to standard error, so that standard output
    carries the JSON record alone (:func:`write_result` with ``path='-'`` writes it there); any other ``path``
    changes nothing.

    Examples
    --------
    >>> import io
    >>> with contextlib.redirect_stdout(io.StringIO()) as out, json_on_stdout("-"):
    ...     _ = write_result("-", "demo", {"ok": True})
    >>> json.loads(out.getvalue())["ok"]
    True
    """
    if path != "-":
        yield
        return
    _JSON_STREAM.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STREAM.pop()


def _plain(v):
    import numpy as np

    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)


def read_result(path: Union[str, os.PathLike]) -> dict:
    """A result file as a dict; a clear error when it is missing, not JSON, or has no ``kind``.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If it is not a JSON object with a ``kind`` field.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"result file {str(p)!r} not found; write one with --json PATH")
    try:
        record = json.loads(p.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"result file {str(p)!r} is not JSON ({exc}); give a file written by --json") from None
    if not isinstance(record, dict) or "kind" not in record:
        raise ValueError(
            f"result file {str(p)!r} has no 'kind' field; it was not written by rnstensor's --json "
            "(rerun the command or benchmark with --json PATH)"
        )
    return record
