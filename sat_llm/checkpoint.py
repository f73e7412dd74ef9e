"""Safe LLM checkpoints: the LLM types in :mod:`sat_theory.checkpoint` state files.

Importing this module registers the LLM backend's snapshot and context types
(:class:`~sat_llm.team.AgentSnapshot`, the token-id context of a turn) as state types, so run
checkpoints (:mod:`sat_theory.runner`) can hold stage-start snapshots and stale batches of
LLM teams. :func:`save_checkpoint` / :func:`load_checkpoint` store one payload per folder
(each Ray agent actor keeps its own, :mod:`sat_llm.ray_team`): adapters and optimizer states
as safetensors, everything else JSON — no pickle, so a crafted file cannot run code.
"""

from __future__ import annotations

from pathlib import Path

from sat_theory.checkpoint import load_state, register_state_type, save_state
from sat_theory.errors import InputError

from .team import AgentSnapshot, _Ctx

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint"]

CHECKPOINT = "checkpoint.safetensors"

register_state_type(AgentSnapshot)
register_state_type(_Ctx)


def save_checkpoint(folder, payload: dict) -> None:
    """Atomically write ``payload`` (a state tree) to ``folder/checkpoint.safetensors``."""
    save_state(Path(folder) / CHECKPOINT, payload)


def load_checkpoint(folder) -> dict:
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        raise InputError(f"no checkpoint in {folder} (expected {CHECKPOINT})")
    return load_state(path)
