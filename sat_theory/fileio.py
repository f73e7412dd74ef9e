"""Reading the files a user hands us and writing strict JSON: UTF-8 text with a one-line
error naming the line and byte, and JSON without non-finite numbers. Used by the run folder
(``metrics``, ``runner``), the LLM package's dataset reader and the commands; lives below the
command line so that none of those imports ``sat_theory.commands``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from .errors import InputError

__all__ = ["read_utf8", "check_utf8", "jsonable", "dumps"]


def read_utf8(path) -> str:
    """The text of ``path`` (a JSONL, JSON or prompts file we read), which must be UTF-8.
    Other bytes are an :class:`InputError` naming the line and byte (one line, exit 2),
    never a traceback and never replacement characters slipped into the data."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _not_utf8(path, data.count(b"\n", 0, e.start) + 1, e.start, data[e.start]) from None


def check_utf8(path, chunk: int = 1 << 20) -> None:
    """:func:`read_utf8`'s check without holding the file in memory, for files handed to other
    readers (e.g. ``datasets``/pyarrow, which raise ``UnicodeDecodeError`` only when a row is
    read). Reads ``chunk`` bytes at a time; a character split across two chunks is carried
    over (at most 3 bytes)."""
    carry, line, offset = b"", 1, 0  # line and byte offset where ``carry`` starts
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            data = carry + block
            try:
                data.decode("utf-8")
                end = len(data)
            except UnicodeDecodeError as e:
                if not (block and e.reason == "unexpected end of data"):
                    line += data.count(b"\n", 0, e.start)
                    raise _not_utf8(path, line, offset + e.start, data[e.start]) from None
                end = e.start  # a character cut by the chunk boundary: decode it next time
            if not block:
                return
            carry = data[end:]
            line += data.count(b"\n", 0, end)
            offset += end


def _not_utf8(path, line: int, offset: int, byte: int) -> InputError:
    return InputError(f"{path}: line {line} is not UTF-8 text (byte 0x{byte:02x} at offset "
                      f"{offset})")


def jsonable(x):
    """Convert numpy scalars/arrays, tuples and non-finite floats to strict-JSON values.

    Non-finite floats become the strings ``"Infinity"``, ``"-Infinity"``, ``"NaN"`` (strict
    JSON has no such numbers; Python's ``float()`` reads these strings back).
    """
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.bool_ | bool):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, float | np.floating):
        x = float(x)
        if math.isfinite(x):
            return x
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    return x


def dumps(obj) -> str:
    """``obj`` as one line of strict JSON (:func:`jsonable` first)."""
    return json.dumps(jsonable(obj), allow_nan=False)
