"""Checkpoints after every agent update, and resuming a killed run where it stopped.

After each agent step (``run_stage``'s ``on_step`` hook) :func:`save_checkpoint` writes
``RUN/checkpoint.pt`` atomically (temporary file + ``os.replace``): every agent's adapter
and AdamW state, the torch and numpy RNG states, the team's counters, the algorithm's
:class:`~sat_theory.algorithm.RunState` (β, δ, order RNG), the position (stage, completed
steps, order so far), the stage-start snapshots and the batch in use (needed by stale
occupancy), and the number of metrics records written so far.

Resuming truncates ``metrics.jsonl`` to the records the checkpoint counts (a record written
after the last checkpoint belongs to a step that will be redone), restores everything, and
finishes the interrupted stage from its next step with ``run_stage(..., resume=position)``,
so no completed step is lost or repeated.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from sat_theory.errors import InputError

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint", "truncate_metrics"]

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(run_dir, payload: dict) -> None:
    """Atomically write ``payload`` (torch-serialisable) to ``run_dir/checkpoint.pt``."""
    path = Path(run_dir) / CHECKPOINT
    tmp = path.with_name(f".{CHECKPOINT}.tmp{os.getpid()}")
    torch.save(payload, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(run_dir) -> dict:
    path = Path(run_dir) / CHECKPOINT
    if not path.is_file():
        raise InputError(f"no checkpoint to resume in {run_dir} (expected {CHECKPOINT})")
    try:
        return torch.load(path, weights_only=False)
    except Exception as e:  # a torn or foreign file
        raise InputError(f"cannot read checkpoint {path}: {type(e).__name__}") from None


def truncate_metrics(run_dir, n_records: int) -> None:
    """Keep the first ``n_records`` complete lines of ``metrics.jsonl``."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        if n_records:
            raise InputError(f"{path} is missing but the checkpoint counts {n_records} records")
        return
    lines = [ln for ln in path.read_text().split("\n") if ln.strip()]
    if len(lines) < n_records:
        raise InputError(f"{path} has {len(lines)} records, the checkpoint counts {n_records}")
    tmp = path.with_name(".metrics.jsonl.tmp")
    tmp.write_text("".join(ln + "\n" for ln in lines[:n_records]))
    os.replace(tmp, path)
