"""Progress bars of the long runs (``rnstensor accuracy``, the benchmarks): tqdm on stderr, only in a terminal."""

from __future__ import annotations

import os
import sys
from typing import IO, Iterable, Iterator, Optional

__all__ = ["progress", "is_terminal", "HINT"]

#: The one line said in a terminal when tqdm is missing (never when output is redirected).
HINT = "(progress bars need tqdm: pip install 'rnstensor[cli]')"

_hinted = False


def is_terminal(stream: Optional[IO] = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``) is a terminal; False for files, pipes and closed streams."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream: not a terminal
        return False


def _columns(stream: IO) -> int:
    """The width of the terminal behind ``stream``; 0 where it has none or reports none."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError):  # no fileno (a test's stream), closed, or not a terminal
        return 0


class _Quiet:
    """The bar's stand-in where no bar is drawn: same methods, no output (``write`` still prints its lines)."""

    def __init__(self, iterable: Optional[Iterable] = None, total: Optional[int] = None):
        self.iterable = iterable
        self.total = total
        self.n = 0

    def __iter__(self) -> Iterator:
        for item in self.iterable if self.iterable is not None else ():
            yield item
            self.n += 1

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def set_description_str(self, desc: str = "", refresh: bool = True) -> None:
        pass

    @staticmethod
    def write(s: str, file: Optional[IO] = None, end: str = "\n") -> None:
        print(s, file=sys.stdout if file is None else file, end=end, flush=True)

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Quiet":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def progress(
    iterable: Optional[Iterable] = None,
    total: Optional[int] = None,
    desc: Optional[str] = None,
    *,
    file: Optional[IO] = None,
    unit: str = "it",
):
    """A tqdm progress bar on ``file`` (default stderr) when it is a terminal; a silent stand-in otherwise.

    Both have tqdm's ``update``, ``set_postfix_str``, ``set_description_str``,
    ``write`` (a line printed above the bar, to stdout by default; the
    stand-in prints it too), ``close`` and iteration over ``iterable``, and
    both are context managers, so callers never test which one they got.
    Without tqdm a terminal run works the same with no bar, and says
    :data:`HINT` once.

    Parameters
    ----------
    iterable : iterable, optional
        What to iterate over (as ``tqdm(iterable)``); None for a bar advanced by ``update``.
    total : int, optional
        Expected number of steps (default ``len(iterable)`` where it has one).
    desc : str, optional
        The label in front of the bar.
    file : file-like, optional
        Where the bar goes (default ``sys.stderr``); a bar is drawn only if it is a terminal.
    unit : str
        The unit of the rate (tqdm's ``unit``).

    Returns
    -------
    tqdm.tqdm or a stand-in with the same methods

    Examples
    --------
    >>> import io
    >>> with progress(range(3), desc="quiet", file=io.StringIO()) as bar:
    ...     sum(bar)
    3
    """
    global _hinted
    stream = sys.stderr if file is None else file
    if is_terminal(stream):
        try:
            from tqdm import tqdm
        except ImportError:
            if not _hinted:
                print(HINT, file=stream, flush=True)
                _hinted = True
        else:
            # follow the terminal's size; one that reports 0 x 0 (a pty nobody sized) would get no bar at all
            width = {"dynamic_ncols": True} if _columns(stream) > 0 else {"ncols": 80, "nrows": 24}
            # leave=False: the finished bar does not stay between the tables
            return tqdm(iterable, total=total, desc=desc, file=stream, unit=unit, leave=False, **width)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)
    return _Quiet(iterable, total)
