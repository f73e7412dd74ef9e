"""The peers' run-folder plumbing, shared by every peer of the learning studies (TRL's
``GRPOTrainer`` in :func:`experiments.llm_team_learning.run_study_trl`, CoMLRL's
``MAGRPOTrainer`` in :func:`experiments.peer_comlrl.run_study_comlrl`): starting or resuming a
run folder, the verified checkpoint record, our held-out evaluation of the peer's adapters and
the finished run's ``study.json``. It imports neither study nor peer, so both import it (it
was in ``llm_team_learning``, which made ``llm_team_learning`` and ``peer_comlrl`` import each
other)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

from sat_theory.metrics import write_json_atomic

#: a peer run's checkpoint folder inside its run folder: the peer's own checkpoint
#: (``checkpoint-N/``) and :data:`PEER_CKPT_RECORD`, written after it, which names it
PEER_CKPT = "ckpt"
PEER_CKPT_RECORD = "latest.json"
PEER_CKPT_FORMAT = "sat-peer-ckpt/1"
_PEER_CKPT_DIR = r"checkpoint-\d+"


def peer_error(msg: str):
    """One line on stderr and exit status 2 (bad input: a checkpoint we did not write). The
    line names ``llm_team_learning``, the study script every peer run is started from."""
    print(f"llm_team_learning: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def _sha256(path: Path, size: int | None = None) -> str:
    """SHA-256 of ``path``'s first ``size`` bytes (all when ``None``)."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        left = size
        while left is None or left > 0:
            chunk = f.read(1 << 20 if left is None else min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            if left is not None:
                left -= len(chunk)
    return h.hexdigest()


def _ckpt_files(folder: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``folder`` (a symlink or anything that
    is not a regular file or a folder is an error: nothing of that kind is ours)."""
    import stat

    files = {}
    for root, dirs, names in os.walk(folder, followlinks=False):
        for n in [*dirs, *names]:
            p = Path(root) / n
            mode = os.lstat(p).st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                peer_error(f"{p} is not a regular file; this checkpoint was not written by the "
                           "study (nothing was loaded)")
            files[p.relative_to(folder).as_posix()] = _sha256(p)
    return files


def write_peer_checkpoint(d: Path, name: str, k: int, state: dict) -> None:
    """Commit the peer's checkpoint ``d/ckpt/<name>`` (complete on disk) as the run's
    checkpoint after evaluation ``k``: :data:`PEER_CKPT_RECORD` (written atomically) holds
    the SHA-256 of each of its files, of ``config.json`` (the run it belongs to) and of the
    ``metrics.jsonl`` written so far (and its length), and ``state`` (our counters). Then the
    older ``checkpoint-*`` folders go. A kill at any point leaves the previous record and the
    checkpoint it names whole."""
    import re

    ck = d / PEER_CKPT
    metrics = d / "metrics.jsonl"
    size = metrics.stat().st_size
    record = dict(format=PEER_CKPT_FORMAT, dir=name, eval=k, state=state,
                  config_sha256=_sha256(d / "config.json"),
                  metrics=dict(bytes=size, sha256=_sha256(metrics, size)),
                  files=_ckpt_files(ck / name))
    write_json_atomic(ck / PEER_CKPT_RECORD, record)
    for p in ck.iterdir():  # the older checkpoints (and a torn one of a killed save)
        if p.name != name and re.fullmatch(_PEER_CKPT_DIR, p.name) and not p.is_symlink():
            shutil.rmtree(p)


def peer_checkpoint(d: Path) -> dict | None:
    """The checkpoint record of the peer run in ``d`` (:func:`write_peer_checkpoint`), verified,
    or ``None`` when there is none. Refused (one line, exit 2; nothing loaded): a folder
    without our run marker ``.sat-run``, a record that is not ours, a checkpoint of another
    run (``config.json`` changed), a ``metrics.jsonl`` shorter or other than when it was
    written, a checkpoint file changed, missing or added (only files the run wrote are
    loaded)."""
    import re

    from sat_theory.ownership import MAX_JSON_BYTES, RUN_MARKER, read_marker

    p = d / PEER_CKPT / PEER_CKPT_RECORD
    if not p.exists():
        return None
    if read_marker(d) != "run":
        peer_error(f"{d} has a checkpoint but no {RUN_MARKER} marker: not a run folder this "
                   "study wrote; nothing was loaded (remove the folder to start again)")
    try:
        if not p.is_file() or p.is_symlink() or p.stat().st_size > MAX_JSON_BYTES:
            raise ValueError
        rec = json.loads(p.read_text(encoding="utf-8"))
        name, files = rec["dir"], rec["files"]
        ok = (rec["format"] == PEER_CKPT_FORMAT and re.fullmatch(_PEER_CKPT_DIR, name)
              and isinstance(files, dict) and isinstance(rec["state"], dict)
              and isinstance(rec["eval"], int))
    except (OSError, ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        peer_error(f"{p} is not a checkpoint record of this study; nothing was loaded")
    if not (d / "config.json").is_file() or _sha256(d / "config.json") != rec["config_sha256"]:
        peer_error(f"{p} belongs to another run (its config.json differs); nothing was loaded")
    metrics, want = d / "metrics.jsonl", rec["metrics"]
    if (not metrics.is_file() or metrics.stat().st_size < want["bytes"]
            or _sha256(metrics, want["bytes"]) != want["sha256"]):
        peer_error(f"{metrics} is not the one the checkpoint {p} was written with; nothing "
                   "was loaded")
    folder = d / PEER_CKPT / name
    if not folder.is_dir() or folder.is_symlink() or _ckpt_files(folder) != files:
        peer_error(f"{folder}: its files are not those the run wrote (changed, missing or "
                   "added); nothing was loaded")
    rec["path"] = folder
    return rec


def rewind_peer_run(d: Path, rec: dict) -> None:
    """Bring ``d`` back to the checkpoint ``rec``: ``metrics.jsonl`` cut to the records it
    had then, the evaluations after ``rec["eval"]`` (and torn temporary files) removed, other
    checkpoint folders removed; the continuation writes them again."""
    import re

    with open(d / "metrics.jsonl", "r+b") as f:
        f.truncate(rec["metrics"]["bytes"])
    for p in d.iterdir():
        m = re.fullmatch(r"eval_(\d+)\.jsonl", p.name)
        if (m and int(m.group(1)) > rec["eval"]) or re.fullmatch(r"\.eval_\d+\.jsonl\.tmp", p.name):
            p.unlink()
    for p in (d / PEER_CKPT).iterdir():
        if p.name != rec["dir"] and re.fullmatch(_PEER_CKPT_DIR, p.name) and not p.is_symlink():
            shutil.rmtree(p)


def remove_peer_checkpoint(d: Path) -> None:
    """Delete what a peer run wrote into ``d/ckpt`` (its checkpoint folders, the record and
    its temporary files, TRL's model card), then the folder if nothing else is left."""
    import re

    ck = d / PEER_CKPT
    if not ck.is_dir():
        return
    for p in ck.iterdir():
        if re.fullmatch(_PEER_CKPT_DIR, p.name) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif (p.name in (PEER_CKPT_RECORD, "README.md")
              or re.fullmatch(rf"\.{re.escape(PEER_CKPT_RECORD)}\.tmp\d+", p.name)):
            p.unlink()
    if not any(ck.iterdir()):
        ck.rmdir()


def start_peer_run(d: Path, resume: bool = False) -> tuple[bool, dict | None]:
    """``(run, checkpoint)`` for a peer run in ``d``: ``(False, None)`` when it finished
    already; with ``resume`` and a checkpoint, ``(True, record)`` (:func:`peer_checkpoint`,
    verified; the caller checks its own settings against the run's ``config.json``, then
    :func:`rewind_peer_run`); else ``(True, None)`` and a fresh folder carrying our run
    marker (a killed run without a checkpoint starts again)."""
    from sat_theory.ownership import read_marker, write_marker

    meta = d / "study.json"
    if meta.is_file() and json.loads(meta.read_text()).get("finished"):
        print(f"{d}: finished already")
        if read_marker(d) == "run":  # killed between study.json and removing the checkpoint
            remove_peer_checkpoint(d)
        return False, None
    rec = peer_checkpoint(d) if resume and d.is_dir() else None
    if rec is not None:
        return True, rec
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    write_marker(d, "run", ["config.json", "metrics.jsonl", "eval_*.jsonl", PEER_CKPT,
                            "study.json"])
    return True, None


def resume_peer_config(d: Path, rec: dict | None, config: dict, where=()) -> None:
    """A resumed run's settings ``config`` (what it would write as ``config.json``) must be
    those of the checkpoint's run, else one line and exit 2 (nothing loaded, nothing
    changed); then ``d`` is rewound to the checkpoint ``rec`` (:func:`rewind_peer_run`).
    ``where``: key paths (tuples) of fields that name the folder itself (a moved run folder
    still resumes), left out of the comparison. ``rec=None`` (a fresh run): nothing to do."""
    from sat_theory.fileio import jsonable

    def settings(conf: dict) -> dict:
        conf = json.loads(json.dumps(jsonable(conf), allow_nan=False))  # a deep copy
        for path in where:
            node = conf
            for key in path[:-1]:
                node = node.get(key, {}) if isinstance(node, dict) else {}
            if isinstance(node, dict):
                node.pop(path[-1], None)
        return conf

    if rec is None:
        return
    if settings(json.loads((d / "config.json").read_text())) != settings(config):
        peer_error(f"{d}: the checkpoint is of a run with other settings (config.json differs "
                   "from this run's); nothing was loaded")
    rewind_peer_run(d, rec)


def log_peer_eval(d: Path, team, writer, k: int, **fields) -> None:
    """Our greedy held-out evaluation of the peer's adapters (already copied into ``team``):
    ``eval_{k}.jsonl`` and a stage record with ``fields`` (tokens, training seconds)."""
    acc = team.evaluate()
    tmp = d / f".eval_{k}.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in team.eval_records()))
    os.replace(tmp, d / f"eval_{k}.jsonl")
    writer.log(dict(kind="stage", stage=k - 1, J_after=acc, eval_accuracy=acc, **fields))


def finish_peer_run(d: Path, method: str, seed: int, t_start: float, cfg,
                    meta_extra: dict | None = None, wall_before: float = 0.0) -> None:
    """``study.json`` of a finished peer run (``wall_seconds``: this session's plus
    ``wall_before``, the earlier sessions' of a resumed run; ``study``: the study's settings
    ``cfg``, a dataclass such as :class:`experiments.llm_team_learning.StudyConfig`), then
    its checkpoint goes."""
    write_json_atomic(d / "study.json", dict(method=method, seed=seed, finished=True,
                                       wall_seconds=wall_before + time.time() - t_start,
                                       study=asdict(cfg), **(meta_extra or {})))
    remove_peer_checkpoint(d)
