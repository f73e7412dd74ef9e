"""Local datasets for the ``dataset`` task (``sat train --backend llm --dataset PATH``).

``PATH`` is read with Hugging Face ``datasets`` and never downloaded: a folder written by
``save_to_disk`` (``datasets.load_from_disk``), or one ``.parquet``, ``.jsonl``/``.json`` or
``.csv`` file (``datasets.load_dataset("parquet" | "json" | "csv", data_files=PATH)``, a
single split called ``train``). Anything that is not an existing local file or folder is
refused, and so are FIFOs and devices (or symlinks to them) in its place or inside the
folder. CSV cells are read as strings (so ``0.50`` stays ``0.50``).

Each row gives a prompt and a gold answer:

- columns: ``--prompt-column`` (default: the first of ``prompt``, ``question``, ``problem``
  present) and ``--answer-column`` (default: the first of ``answer``, ``solution``);
- the prompt must be a non-empty string; the answer a non-empty string or a number (an
  integer is written in decimal, a finite float as Python's shortest round-trip ``repr``);
- GSM8K rule: an answer containing ``####`` is the text after its last ``####``, stripped
  (``"... so she has 42 left.\\n#### 42"`` → ``"42"``).

Anything else (unknown column, empty split, a non-string prompt, a missing answer) is an
:class:`~sat_theory.errors.InputError` naming the file, row (0-based, as ``ds[i]``) and column.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import tempfile
from pathlib import Path

from sat_theory.errors import InputError
from sat_theory.fileio import check_utf8

__all__ = ["FORMATS", "PROMPT_COLUMNS", "ANSWER_COLUMNS", "load_splits", "pick_column",
           "gold_answer", "split_rows", "fingerprint"]

#: file suffix -> ``datasets`` builder
FORMATS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
#: default column names, first present wins
PROMPT_COLUMNS = ("prompt", "question", "problem")
ANSWER_COLUMNS = ("answer", "solution")


def _datasets():
    try:
        import datasets
    except ImportError:
        raise InputError("--dataset needs the 'datasets' package: pip install -e '.[llm]'") from None
    return datasets


@contextlib.contextmanager
def _silent(datasets):
    """No progress bars and no logged errors while loading: a failure becomes one line."""
    bars = datasets.utils.are_progress_bars_disabled()
    level = datasets.logging.get_verbosity()
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)
        if not bars:
            datasets.enable_progress_bars()


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _csv_features(datasets, path: Path):
    """Every CSV column as a string (pyarrow would infer ``0.50`` as the float 0.5)."""
    import csv

    with path.open(newline="", encoding="utf-8") as fh:
        header = next((row for row in csv.reader(fh) if row), [])
    return datasets.Features({c: datasets.Value("string") for c in header})


def _has_rows(p: Path, fmt: str) -> bool:
    """Whether a file holds at least one row: a parquet row, a non-blank JSON line, a
    non-blank CSV line after the header (reads only up to the first one)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(str(p)).metadata.num_rows > 0
        except Exception:  # noqa: BLE001 - not parquet: load_dataset says so below
            return True
    with p.open(encoding="utf-8", errors="replace") as fh:
        lines = (ln for ln in fh if ln.strip())
        if fmt == "csv":
            next(lines, None)  # the header
        return next(lines, None) is not None


def _regular_files(p: Path, what: str) -> None:
    """``p`` and, for a folder, every file inside it are regular files (a FIFO, a device or
    a symlink to one, e.g. ``/dev/zero``, would block the reader or never end)."""
    from sat_theory.ownership import regular_file

    regular_file(p, what)
    if p.is_dir():
        for f in sorted(p.rglob("*")):
            regular_file(f, what + " holds")


def load_splits(path: str) -> dict:
    """``{split name: datasets.Dataset}`` of a local dataset (module docstring); never a hub
    download. A ``save_to_disk`` folder keeps its splits (a lone Dataset is ``train``)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"--dataset {path}: no such local file or folder (datasets are read "
                         "from disk only, never downloaded)")
    _regular_files(p, "--dataset")
    datasets = _datasets()
    with _silent(datasets):
        if p.is_dir():
            try:
                ds = datasets.load_from_disk(str(p))
            except FileNotFoundError as e:
                raise InputError(f"{path}: not a datasets save_to_disk folder ({_first_line(e)})") from None
            except Exception as e:  # noqa: BLE001 - e.g. datasets 5.2 fails on a 0-row folder
                raise InputError(f"{path}: cannot load this save_to_disk folder "
                                 f"({type(e).__name__}: {_first_line(e)}; an empty dataset?)") from None
            return dict(ds) if isinstance(ds, datasets.DatasetDict) else {"train": ds}
        fmt = FORMATS.get(p.suffix.lower())
        if fmt is None:
            raise InputError(f"{path}: unknown dataset format {p.suffix!r}; use a save_to_disk "
                             f"folder or one of {', '.join(FORMATS)}")
        if fmt != "parquet":  # pyarrow would raise UnicodeDecodeError only when a row is read
            check_utf8(p)
        if not _has_rows(p, fmt):  # datasets fails on these with unrelated messages
            raise InputError(f"{path}: no rows (the dataset is empty)")
        kw = {"features": _csv_features(datasets, p)} if fmt == "csv" else {}
        # a throw-away cache: load_dataset would otherwise write Arrow files under ~/.cache
        with tempfile.TemporaryDirectory(prefix="sat_dataset_") as cache:
            try:
                dd = datasets.load_dataset(fmt, data_files={"train": str(p)}, cache_dir=cache,
                                           keep_in_memory=True, **kw)
            except Exception as e:  # noqa: BLE001 - any reader failure is the user's file
                kind = "malformed JSON" if fmt == "json" else f"cannot read it as {fmt}"
                raise InputError(f"{path}: {kind} ({_first_line(e.__cause__ or e)})") from None
    return dict(dd)


def pick_column(columns, given: str | None, defaults: tuple[str, ...], flag: str, where: str) -> str:
    """``given`` if it is a column, else the first of ``defaults`` present."""
    cols = list(columns)
    if given is not None:
        if given not in cols:
            raise InputError(f"{where}: no column {given!r} ({flag}); columns: {', '.join(cols)}")
        return given
    for c in defaults:
        if c in cols:
            return c
    raise InputError(f"{where}: none of the columns {', '.join(defaults)}; name one with {flag} "
                     f"(columns: {', '.join(cols)})")


def gold_answer(value, where: str) -> str:
    """The gold answer string of a cell: a string, or a number in decimal (``repr`` for a
    finite float); the text after the last ``####`` when there is one (GSM8K)."""
    if isinstance(value, bool) or value is None:
        raise InputError(f"{where}: the answer must be a string or a number, got {value!r}")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InputError(f"{where}: the answer must be finite, got {value!r}")
        return repr(value)
    if not isinstance(value, str):
        raise InputError(f"{where}: the answer must be a string or a number, got "
                         f"{type(value).__name__}")
    if "####" in value:
        value = value.rsplit("####", 1)[1]
    value = value.strip()
    if not value:
        raise InputError(f"{where}: empty answer")
    return value


def split_rows(ds, prompt_column: str, answer_column: str, where: str) -> list[tuple[str, str]]:
    """``[(prompt, gold answer)]`` of one split, every row checked (module docstring)."""
    if len(ds) == 0:
        raise InputError(f"{where}: the split is empty")
    out = []
    for i, (prompt, answer) in enumerate(zip(ds[prompt_column], ds[answer_column], strict=True)):
        at = f"{where} row {i}"
        if not isinstance(prompt, str) or not prompt.strip():
            got = "an empty string" if isinstance(prompt, str) else repr(prompt)[:40]
            raise InputError(f"{at}: column {prompt_column!r} must hold a non-empty string "
                             f"prompt, got {got}")
        out.append((prompt.strip(), gold_answer(answer, f"{at}, column {answer_column!r}")))
    return out


def fingerprint(*splits: list[tuple[str, str]]) -> str:
    """SHA-256 (first 16 hex digits) of the rows a task uses: a resumed run checks that its
    dataset still holds the same prompts and answers."""
    h = hashlib.sha256()
    for rows in splits:
        h.update(json.dumps(rows, ensure_ascii=False).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
