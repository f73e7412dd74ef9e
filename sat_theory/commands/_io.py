"""Helpers of the subcommands: plain tables, ``--only`` selections, the source-checkout rule
for default output folders. The file and JSON helpers live in :mod:`sat_theory.fileio`
(below the command line)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError


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
