"""The algorithm checks, before every LLM update, that the batch came from the adapter
versions it expects (intermediate occupancy: the *updated* predecessors). On the CPU and,
as ``gpu``-marked twins, on CUDA in float32 (the ``device`` fixture of ``conftest.py``)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from sat_llm.team import LLMConfig, LLMTeam, RolloutMismatchError  # noqa: E402
from sat_theory.algorithm import RunState, TrainConfig, run_stage  # noqa: E402
from tests.llm.helpers import LOWERCASE_TASK  # noqa: E402

BASE = dict(model="tiny-random", task=LOWERCASE_TASK, agents=2,
            max_new_tokens=4, n_train=8, n_eval=4,
            minibatch=4, seed=0, threads=1, lr=1e-2, dtype="float32")


def _stage(team, method="sat"):
    cfg = TrainConfig(method=method, stages=1, delta=10.0, n_groups=2, group_size=2, seed=0)
    return run_stage(team, cfg, RunState.initial(cfg, team.n_agents))


def test_a_batch_from_before_the_predecessors_update_is_refused(device):
    """A rollout path that is not re-synced after agent 1's update (here: it keeps serving
    the stage-start batch) must fail at agent 2's update, not train on stale data."""
    team = LLMTeam(LLMConfig(**BASE, device=device))
    real = team.rollout
    cache = []

    def unsynced(n_groups, group_size):
        if not cache:
            cache.append(real(n_groups, group_size))
        return cache[0]

    team.rollout = unsynced
    with pytest.raises(RolloutMismatchError, match="expects"):
        _stage(team)


def test_synced_rollouts_and_stale_by_design_pass(device):
    """The same team with fresh rollouts, and naive (the stale batch is the method), pass."""
    for method in ("sat", "naive"):
        rec = _stage(LLMTeam(LLMConfig(**BASE, device=device)), method)
        assert rec["kind"] == "stage"
