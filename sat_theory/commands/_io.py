"""Shared helpers for subcommands: reading UTF-8 text files, strict JSON, plain tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..errors import InputError


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


def refuse_source_tree(out, given: bool, flag: str = "--out") -> None:
    """A default output folder that lies inside the source checkout (``./plots``, the
    committed ``figures/``) is refused: commands write there only when ``--out`` is typed.
    ``given``: whether the user typed the flag."""
    root = Path(__file__).resolve().parents[2]
    if given or not ((root / "pyproject.toml").is_file() and (root / "sat_theory").is_dir()):
        return
    o = Path(out).resolve()
    if o == root or root in o.parents:
        raise InputError(f"the default {flag} {out} is inside the source checkout {root}; "
                         f"pass {flag} {out} to write there on purpose, or {flag} DIR elsewhere")


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
    return json.dumps(jsonable(obj), allow_nan=False)


def table(rows: list[dict], columns: list[str], fmt: str = "{:.6g}") -> str:
    """A plain fixed-width text table."""
    def cell(v):
        if isinstance(v, float | np.floating):
            return fmt.format(v)
        return str(v)
    cells = [[cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c)
              for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def pick_names(only: str | None, allowed, what: str) -> list[str]:
    """The names of a comma-separated ``--only`` (all of ``allowed`` when ``None``); an unknown
    or empty selection is an :class:`InputError` listing the choices."""
    allowed = list(allowed)
    if only is None:
        return allowed
    names = [x.strip() for x in only.split(",") if x.strip()]
    unknown = [x for x in names if x not in allowed]
    if unknown or not names:
        raise InputError(f"unknown {what} {', '.join(unknown) or repr(only)}; "
                         f"choose from {', '.join(allowed)}")
    return names
