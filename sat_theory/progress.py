"""Console output of ``sat`` commands: progress bars (tqdm, on stderr) and verbosity.

One process-wide level, set by a command's ``--quiet`` / ``--verbose`` (:func:`configure`):

- default: progress bars only when stderr is a terminal, so logs, pipes and tests stay
  clean;
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

from .errors import InputError

__all__ = ["configure", "enabled", "bar", "note", "QUIET", "NORMAL", "VERBOSE"]

QUIET, NORMAL, VERBOSE = 0, 1, 2
_level = NORMAL


def configure(*, quiet: bool = False, verbose: bool = False) -> None:
    """Set the level from a command's flags (both given: an :class:`InputError`)."""
    global _level
    if quiet and verbose:
        raise InputError("--quiet and --verbose cannot be combined")
    _level = QUIET if quiet else VERBOSE if verbose else NORMAL
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

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=leave,
                dynamic_ncols=True, disable=not enabled())


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
