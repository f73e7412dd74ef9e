"""What the project owns on disk, and how it deletes and replaces it.

The rules (README, "Files, code and signals"):

- A folder is a **run** or an **export** only when it carries our marker file
  (:data:`RUN_MARKER` ``.sat-run`` / :data:`EXPORT_MARKER` ``.sat-export``, a small JSON
  object written before anything else). A run written before markers existed is still
  recognised by its ``config.json`` (``algorithm`` + ``backend``) for reading and resuming,
  but never deleted.
- Deleting touches only entries of a marked folder that the project itself writes there
  (:data:`RUN_ENTRIES`, the exact names and temp names of :func:`is_run_entry`; a marker's
  own list is shown to people but never trusted for deletion) — never a user's file next to
  them, and only while the caller holds the folder's lock.
- An output folder equal to, inside or above a run or an export that it would replace is
  refused (:func:`check_out`).
- A replacement is atomic (:func:`replace_folder`): the old folder is renamed aside, the new
  one renamed in, then the old one deleted, with SIGINT/SIGTERM held back until all three
  are done, so an interrupt leaves the old or the new folder whole, never half of each.
- Only regular files are read (:func:`regular_file`): a FIFO, a device or a symlink to one
  (``/dev/zero``) would block or never end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from .errors import InputError

__all__ = ["RUN_MARKER", "EXPORT_MARKER", "RUN_ENTRIES", "write_marker", "read_marker",
           "kind_of", "owner_above", "owned_below", "check_out", "is_run_entry",
           "run_temp_files", "remove_run_entries", "replace_folder", "regular_file",
           "signals_held"]

RUN_MARKER = ".sat-run"
EXPORT_MARKER = ".sat-export"
_FORMATS = {"run": "sat-run/1", "export": "sat-export/1"}
_MARKER_OF = {"run": RUN_MARKER, "export": EXPORT_MARKER}

#: top-level entries a run writes into its folder (``--overwrite`` removes only these)
RUN_ENTRIES = ("config.json", "metrics.jsonl", "checkpoint.safetensors", "policies", "agents",
               "tb", "wandb", "mlruns")
#: eval files (``eval_{k}.jsonl``, ``eval_{k}_swap.jsonl``) and the exact temporary names of
#: :func:`sat_theory.checkpoint.write_atomic` (``.{name}.tmp{pid}``) for the files above
_EVAL = r"eval_\d+(?:_swap)?\.jsonl"
_RUN_FILE = rf"(?:config\.json|metrics\.jsonl|checkpoint\.safetensors|{_EVAL})"
_TEMP = re.compile(rf"\.{_RUN_FILE}\.tmp\d+")
_ENTRY = re.compile(rf"(?:{'|'.join(re.escape(n) for n in RUN_ENTRIES)}|{_EVAL})")


def write_marker(folder, kind: str, entries: Iterable[str] = ()) -> None:
    """Write ``folder``'s marker for ``kind`` (``"run"`` or ``"export"``) listing ``entries``
    (what a person finds there; informational)."""
    body = dict(format=_FORMATS[kind], written_by="sat-teamtr", entries=sorted(entries))
    (Path(folder) / _MARKER_OF[kind]).write_text(json.dumps(body) + "\n", encoding="utf-8")


def read_marker(folder) -> str | None:
    """``"run"``/``"export"`` when ``folder`` carries that marker (a small regular file with
    our format tag), else ``None``."""
    for kind, name in _MARKER_OF.items():
        p = Path(folder) / name
        try:
            st = os.stat(p, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode) or st.st_size > 1 << 16:
                continue
            if json.loads(p.read_text(encoding="utf-8")).get("format") == _FORMATS[kind]:
                return kind
        except (OSError, ValueError, AttributeError):
            continue
    return None


def _legacy_kind(folder: Path) -> str | None:
    """A run or export written before markers: a run ``config.json`` with ``algorithm`` and
    ``backend``, or an export's tagged ``team.json``."""
    for name, kind, ok in (("config.json", "run", lambda d: "algorithm" in d and "backend" in d),
                           ("team.json", "export",
                            lambda d: str(d.get("format", "")).startswith("sat-team-export/"))):
        p = folder / name
        try:
            if p.is_file() and p.stat().st_size < 1 << 24:
                d = json.loads(p.read_text(encoding="utf-8"))
                if isinstance(d, dict) and ok(d):
                    return kind
        except (OSError, ValueError):
            continue
    return None


def kind_of(folder, *, legacy: bool = True) -> str | None:
    """``"run"``, ``"export"`` or ``None`` for ``folder`` (its marker; with ``legacy`` also the
    files of a run or export written before markers)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    return read_marker(folder) or (_legacy_kind(folder) if legacy else None)


def owner_above(path) -> tuple[Path, str] | None:
    """The nearest proper ancestor of ``path`` that is a run or an export, with its kind."""
    p = Path(os.path.abspath(path))
    for parent in p.parents:
        kind = kind_of(parent)
        if kind is not None:
            return parent, kind
    return None


def owned_below(path, depth: int = 3) -> tuple[Path, str] | None:
    """A run or export strictly inside ``path`` (searched ``depth`` levels down), or ``None``."""
    root = Path(path)
    level = [root] if root.is_dir() else []
    for _ in range(depth):
        nxt = []
        for d in level:
            try:
                children = sorted(c for c in d.iterdir() if c.is_dir() and not c.is_symlink())
            except OSError:
                continue
            for c in children:
                kind = kind_of(c)
                if kind is not None:
                    return c, kind
                nxt.append(c)
        level = nxt
    return None


def check_out(out, *, kind: str, flag: str = "--out", sources: Iterable = ()) -> None:
    """Refuse an output folder ``out`` for a ``kind`` that would clobber something of ours:
    equal to, inside or above one of ``sources`` (the folders the command reads), inside a
    run or export, above one, or an existing folder of the other kind."""
    out_abs = Path(os.path.abspath(out))
    for src in sources:
        s = Path(os.path.abspath(src))
        for a, b in ((out_abs, s), (Path(os.path.realpath(out)), Path(os.path.realpath(src)))):
            if a == b or b in a.parents or a in b.parents:
                rel = "is" if a == b else "is inside" if b in a.parents else "contains"
                raise InputError(f"{flag} {out} {rel} {src}, which this command reads; "
                                 "choose another folder")
    up = owner_above(out_abs)
    if up is not None:
        raise InputError(f"{flag} {out} is inside the {up[1]} folder {up[0]}; choose a folder "
                         "outside it")
    here = kind_of(out_abs)
    if here is not None and here != kind:
        raise InputError(f"{flag} {out} holds an {here} folder, not a {kind}; choose another "
                         "folder")
    down = owned_below(out_abs)
    if down is not None:
        raise InputError(f"{flag} {out} contains the {down[1]} folder {down[0]}; choose a "
                         "folder of its own")


def is_run_entry(name: str) -> bool:
    """Whether a top-level name in a run folder is one the runner writes (module docstring)."""
    return bool(_ENTRY.fullmatch(name) or _TEMP.fullmatch(name))


def run_temp_files(folder) -> list[Path]:
    """The runner's torn temporary files in ``folder`` (exact names, regular files only)."""
    folder = Path(folder)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [folder / n for n in names if _TEMP.fullmatch(n)
            and stat.S_ISREG(os.stat(folder / n, follow_symlinks=False).st_mode)]


def remove_run_entries(folder) -> list[str]:
    """Delete the entries a run wrote into the marked run folder ``folder`` (the caller holds
    its lock); everything else stays. Returns the names removed. A folder without our marker
    is an :class:`InputError` (nothing is deleted)."""
    folder = Path(folder)
    if read_marker(folder) != "run":
        raise InputError(f"{folder} is not marked as a sat run folder ({RUN_MARKER} missing: "
                         "written by something else, or by a version before markers); "
                         "nothing was deleted; remove its files yourself or choose another --out")
    removed = []
    for name in sorted(os.listdir(folder)):
        if not is_run_entry(name):
            continue
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        removed.append(name)
    return removed


@contextmanager
def signals_held():
    """SIGINT and SIGTERM wait while the block runs and are raised again after it, to the
    handlers in force before. (Python handlers run in the main thread whichever thread the
    signal reached, so deferring them holds in a process with library threads, where a
    per-thread signal mask would not.) Outside the main thread: no effect."""
    got: list[int] = []

    def defer(signum, frame):
        got.append(signum)

    try:
        old = {s: signal.signal(s, defer) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # handlers can be set in the main thread only
        old = None
    try:
        yield
    finally:
        if old is not None:
            for s, h in old.items():  # None: a handler not set from Python
                signal.signal(s, signal.SIG_DFL if h is None else h)
            if got:
                signal.raise_signal(got[0])


def replace_folder(new, out) -> None:
    """Put the finished folder ``new`` at ``out`` (same parent): when ``out`` exists, rename
    it aside, rename ``new`` in, then delete the old one — with SIGINT/SIGTERM held back
    until all three are done (a signal that came meanwhile is raised after), so an interrupt
    leaves ``out`` as the old or the new folder, whole, and nothing aside."""
    new, out = Path(new), Path(out)
    aside = out.with_name(f".{out.name}.old{os.getpid()}")
    with signals_held():
        moved = False
        if out.exists():
            os.replace(out, aside)
            moved = True
        try:
            os.replace(new, out)
        except OSError:
            if moved:  # the new one could not go in: the old one goes back
                os.replace(aside, out)
            raise
        if moved:
            shutil.rmtree(aside, ignore_errors=True)


def regular_file(path, what: str = "") -> Path:
    """``path`` if it names a regular file or a folder (a symlink to one is fine; folders are
    the caller's to check); a FIFO, socket or device (``/dev/zero``), or a symlink to one, is
    an :class:`InputError` — reading it would block or never end."""
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{what + ' ' if what else ''}{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{what + ' ' if what else ''}{path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        return p
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise InputError(f"{what + ' ' if what else ''}{path} is {kind}; give a regular file")
    return p


def is_run_set(folder) -> bool:
    """A run set ``experiments/runs.py`` wrote: a real folder with its ``spec.json``, or (a
    set interrupted before ``spec.json``) one holding nothing but run folders."""
    folder = Path(folder)
    if folder.is_symlink() or not folder.is_dir():
        return False
    if (folder / "spec.json").is_file():
        return True
    return all(c.is_dir() and not c.is_symlink() and kind_of(c) == "run" for c in folder.iterdir())


#: the largest JSON metadata file (team.json, a model's config.json) we read: 16 MiB
MAX_JSON_BYTES = 1 << 24


def read_json_file(path, what: str):
    """The decoded JSON of ``path``, a regular file of at most :data:`MAX_JSON_BYTES` holding
    UTF-8 JSON; anything else is one InputError line naming the file and ``what`` it should
    have been."""
    f = regular_file(path, what)
    if f.stat().st_size > MAX_JSON_BYTES:
        raise InputError(f"{f} is larger than 16 MiB; not {what}")
    try:
        return json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{f} is not valid JSON ({type(e).__name__})") from None

