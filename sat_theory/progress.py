"""Console output of ``sat`` commands: progress bars (tqdm, on stderr) and verbosity.

One process-wide level, set by a command's ``--quiet`` / ``--verbose`` (:func:`configure`):

- default: progress bars when stderr is a terminal; otherwise (a log file, CI, ``nohup``)
  one plain line at most every :data:`LINE_INTERVAL` seconds (``$SAT_PROGRESS_INTERVAL``,
  default 60) naming the outermost open task and how far it is, so a long run is never
  silent for half an hour and a short one (every test) writes nothing;
- ``--quiet``: no progress bars at all — neither ours nor transformers'/huggingface_hub's
  ("Loading weights") — so stderr carries only warnings and errors, stdout the result;
- ``--verbose``: progress bars even when stderr is not a terminal, and :func:`note` lines
  (one per stage in ``sat train``).

Library code asks for a bar with :func:`bar` (a disabled bar costs nothing) and never
checks the level itself; a library user who never calls :func:`configure` gets the default.
Whenever our bars are off, the third-party ones are switched off too.
"""

from __future__ import annotations

import os
import sys
import time

from .errors import InputError

__all__ = ["configure", "enabled", "bar", "note", "QUIET", "NORMAL", "VERBOSE",
           "LINE_INTERVAL"]

QUIET, NORMAL, VERBOSE = 0, 1, 2
_level = NORMAL
#: seconds between two progress lines when stderr is not a terminal
LINE_INTERVAL = 60.0


def configure(*, quiet: bool = False, verbose: bool = False) -> None:
    """Set the level from a command's flags (both given: an :class:`InputError`)."""
    global _level
    if quiet and verbose:
        raise InputError("--quiet and --verbose cannot be combined")
    _level = QUIET if quiet else VERBOSE if verbose else NORMAL
    _Lines._open.clear()  # a new command: bars left open by an earlier one are gone
    if not enabled():
        _silence_third_party_bars()


def enabled() -> bool:
    """Whether progress bars are shown (see the module docstring)."""
    if _level == NORMAL:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty and isatty())
    return _level == VERBOSE


def bar(total: int | None = None, *, desc: str, unit: str = "it", leave: bool = False):
    """A tqdm bar on stderr, disabled unless :func:`enabled`. Nested bars stack below the
    open ones and (``leave=False``) vanish when done."""
    from tqdm import tqdm

    if not enabled() and _level == NORMAL and total:
        return _Lines(total, desc, unit)
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave,
                dynamic_ncols=True, disable=not enabled())


class _Lines:
    """The bar's interface (``update``, ``set_postfix``, ``set_postfix_str``, ``close``,
    ``disable``) as one line on stderr at most every :data:`LINE_INTERVAL` seconds over all
    open bars together, for the outermost of them (the one opened first)."""

    _open: list = []
    _last = [0.0]  # when the last line was written (any bar)
    disable = True  # callers that add per-token hooks skip them, as for a disabled bar

    def __init__(self, total: int, desc: str, unit: str):
        self.total, self.desc, self.unit, self.n, self.post = int(total), desc, unit, 0, ""
        self.t0 = time.monotonic()
        if not _Lines._open:
            _Lines._last[0] = self.t0
        _Lines._open.append(self)

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        try:
            interval = float(os.environ.get("SAT_PROGRESS_INTERVAL", LINE_INTERVAL))
        except ValueError:
            interval = LINE_INTERVAL
        if now - _Lines._last[0] >= interval and _Lines._open:
            _Lines._last[0] = now
            print(_Lines._open[0].line(now), file=sys.stderr, flush=True)

    def line(self, now: float) -> str:
        pct = 100.0 * self.n / self.total if self.total else 0.0
        return (f"{self.desc}: {self.n}/{self.total} {self.unit} ({pct:.0f}%), "
                f"{now - self.t0:.0f} s{', ' + self.post if self.post else ''}")

    def set_postfix(self, **kw) -> None:
        self.post = ", ".join(f"{k}={v}" for k, v in kw.items())

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.post = str(text)

    def close(self) -> None:
        if self in _Lines._open:
            _Lines._open.remove(self)


def note(text: str) -> None:
    """A line on stderr in ``--verbose`` mode (printed above any open bar)."""
    if _level == VERBOSE:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)


def _silence_third_party_bars() -> None:
    """transformers' "Loading weights" and huggingface_hub's bars: off from now on (the
    environment variable for modules imported later, the switches for loaded ones)."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
