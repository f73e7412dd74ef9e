"""Checkpoints after every agent update, and resuming a killed run where it stopped.

After each agent step (``run_stage``'s ``on_step`` hook) :func:`save_checkpoint` writes
``RUN/checkpoint.pt`` atomically (temporary file + ``os.replace``): every agent's adapter
and AdamW state, the torch and numpy RNG states, the team's counters, the algorithm's
:class:`~sat_theory.algorithm.RunState` (β, δ, order RNG), the position (stage, completed
steps, order so far), the stage-start snapshots and the batch in use (needed by stale
occupancy), and the number of metrics records written so far.

Resuming (:func:`resume_stage`) truncates ``metrics.jsonl`` to the records the checkpoint
counts (a record written after the last checkpoint belongs to a step that will be redone),
restores everything, and finishes the interrupted stage from its next step with the
algorithm's own step, commit and stage-record code (``sat_theory.algorithm``), so no
completed step is lost or repeated. ``run_stage`` has no entry point for a partly done
stage; this module drives the same private pieces in the same order (see the report's
request for a ``resume`` parameter of ``run_stage``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from sat_theory.errors import InputError

__all__ = ["CHECKPOINT", "save_checkpoint", "load_checkpoint", "truncate_metrics", "resume_stage"]

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


def resume_stage(team, cfg, state, saved: dict, *, log, on_step) -> dict:
    """Finish a stage that stopped after ``saved["step"]`` of its steps.

    ``saved``: ``order`` (agents updated so far, then the planned rest for data-independent
    orders), ``step``, ``steps`` (their records), ``start`` (stage-start snapshots),
    ``batch`` (the batch in use), ``J_before``. Mirrors ``sat_theory.algorithm.run_stage``'s
    loop from step ``saved["step"]`` on.
    """
    from sat_theory import algorithm as alg

    n = team.n_agents
    st = alg._Stage(team, cfg, state, state.stage)
    st.start = saved["start"]
    if saved.get("batch") is not None:
        st.batch = saved["batch"]
        st.adv, st.adv_stats = alg._advantage_stats(st.batch, cfg)
    done = list(saved["order"][:saved["step"]])
    # the algorithm keeps, for importance weights, the log-ratios of agents updated since the
    # batch was drawn; recompute them from the restored parameters
    if st.batch is not None and (cfg.occupancy == "stale+IS" or cfg.correction == "happo"):
        for j in done:
            ta = st.batch.arrays(j)
            logp = np.asarray(team.kl(j, st.batch, team.snapshot(j))["logp"])
            st.updated[j] = (ta.episode, ta.t, logp - ta.logp)
    order = list(saved["order"])
    steps = list(saved["steps"])
    for i in range(saved["step"], n):
        if st.needs_fresh(i):
            st.fresh()
        if cfg.order == "greedy":
            res = alg._greedy_step(st, i, [j for j in range(n) if j not in done])
            order = done + [res.agent]
        else:
            res = st.step(i, order[i])
        st.commit(res)
        done.append(res.agent)
        steps.append(res.record)
        log(res.record)
        on_step(res.record)
    rec = alg._stage_record(st, order[:n] if cfg.order != "greedy" else done, steps,
                            saved["J_before"])
    log(rec)
    state.stage += 1
    return rec
