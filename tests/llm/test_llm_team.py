"""``LLMTeam`` driven by the shared algorithm, on the tiny random model (seconds).

Every test runs on the CPU and, as its ``gpu``-marked twin, on CUDA in float32 (the
``device`` fixture of ``conftest.py``; skipped without a GPU).

The task (:class:`tests.llm.helpers.LowercaseTask`, loaded through ``make_task``'s
``module:Class`` form) scores the fraction of lowercase letters in the final message, so even
a random character model's scores vary inside a group and the advantages — hence the updates —
are not zero.
"""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm.align import stage0_align  # noqa: E402
from sat_theory.algorithm import RunState, TrainConfig, run_stage  # noqa: E402
from tests.llm.helpers import make_team  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: threads only add contention on a busy 2-core box


def _weights(team, j):
    return {k: v.clone() for k, v in team._get_weights(j).items()}


def _same(a, b):
    """Equal adapter weights; compared on the host (replacement agents are built there)."""
    return all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def _base_params(team):
    return {k: p.detach().clone() for k, p in team._model(0).named_parameters() if "lora_" not in k}


def test_only_the_updated_agents_adapter_changes(device):
    team = make_team(agents=3, device=device)
    batch = team.rollout(2, 2)
    before = [_weights(team, j) for j in range(3)]
    base = _base_params(team)
    M = len(batch.turns_of(1))
    adv = np.linspace(-1, 1, M)
    info = team.update(1, batch, adv, 0.1, team.snapshot(1))
    assert info["opt_steps"] >= 1
    assert not _same(before[1], _weights(team, 1))
    assert _same(before[0], _weights(team, 0)) and _same(before[2], _weights(team, 2))
    after_base = _base_params(team)
    assert all(torch.equal(base[k], after_base[k]) for k in base)


def test_snapshot_restore_round_trip_with_optimizer_state(device):
    team = make_team(device=device)
    batch = team.rollout(2, 2)
    snap0 = team.snapshot(0)  # the behaviour policy of the batch
    adv = np.linspace(-1, 1, len(batch.turns_of(0)))
    team.update(0, batch, adv, 0.1, snap0)  # optimizer state exists now
    snap = team.snapshot(0)
    w, opt = _weights(team, 0), copy.deepcopy(team._opt[0].state_dict())
    team.update(0, batch, adv, 0.1, snap)
    assert team.kl(0, batch, snap)["kl"] > 0
    team.restore(0, snap)
    assert _same(w, _weights(team, 0))
    st = team._opt[0].state_dict()["state"]
    assert all(torch.equal(st[k]["exp_avg"], opt["state"][k]["exp_avg"]) for k in st)
    team.restore(0, snap0)
    r = team.kl(0, batch, snap0)
    assert r["kl"] == 0 and r["kl_sampled"] == 0
    # the generation-time behaviour log-probs equal teacher-forced scoring (left vs right padding)
    assert np.allclose(r["logp"], [t.logp for _, t in batch.turns_of(0)], atol=1e-4)


def _stage(method, device, agents=3, **kw):
    team = make_team(agents=agents, device=device)
    cfg = TrainConfig(method=method, stages=1, n_groups=2, group_size=2, **kw)
    state = RunState.initial(cfg, agents)
    steps = []
    rec = run_stage(team, cfg, state, log=lambda r: steps.append(r) if r["kind"] == "step" else None)
    return team, steps, rec


def test_fresh_batch_per_agent_update_in_sat_mode(device):
    _, steps, _ = _stage("sat", device)
    ids = [s["rollout_id"] for s in steps]
    assert len(ids) == 3 and len(set(ids)) == 3


def test_one_batch_per_stage_in_naive_mode(device):
    _, steps, rec = _stage("naive", device)
    assert len({s["rollout_id"] for s in steps}) == 1 and rec["rollouts"] == 1


def test_trust_region_holds_or_step_is_rejected(device):
    # a learning rate far too large for δ: the first try leaves the region, backtracking
    # (β×2, step×½ per retry) must bring the step back inside or the step is rejected
    team = make_team(agents=2, device=device, lr=0.3)
    start = [_weights(team, j) for j in range(2)]
    cfg = TrainConfig(method="sat", stages=1, n_groups=2, group_size=2, delta=1e-3,
                      max_backtracks=2, on_violation="reject")
    state = RunState.initial(cfg, 2)
    steps = []
    run_stage(team, cfg, state, log=lambda r: steps.append(r) if r["kind"] == "step" else None)
    assert any(s["backtracks"] > 0 for s in steps)  # the region was actually tested
    for s in steps:
        assert s["kl"] <= s["delta_i"] or s["rejected"]
        if s["rejected"]:
            assert _same(start[s["agent"]], _weights(team, s["agent"])) and s["kl"] == 0


def test_stage0_alignment_moves_the_new_agent_toward_the_old_one(device):
    team = make_team(agents=2, device=device, lr=3e-3)
    old = _weights(team, 0)
    new = team.new_agent(0, "random", seed=1)
    aligned, info = stage0_align(team, 0, new, 5e-4, "distill", probe_groups=2,
                                 probe_group_size=2, max_steps=8)
    # stopped as soon as the exact token KL on the probe set was <= delta_align
    assert info["kl_start"] > 5e-4 >= info["kl_end"] and info["reached"] and info["steps"] < 8
    assert _same(old, _weights(team, 0))  # the team is untouched until the swap
    team.replace(0, aligned)
    assert _same(aligned.weights, _weights(team, 0))
    with pytest.raises(Exception, match="tabular-only"):
        stage0_align(team, 0, new, 0.1, "project")


def test_heterogeneous_team_has_separate_bases_and_trains(device):
    team = make_team(agents=2, device=device, agent_models=("tiny-random", "tiny-random"))
    assert team._model(0) is not team._model(1)
    before = _weights(team, 1)
    batch = team.rollout(2, 2)
    adv = np.linspace(-1, 1, len(batch.turns_of(0)))
    team.update(0, batch, adv, 0.1, team.snapshot(0))
    assert _same(before, _weights(team, 1))
    assert team.kl(0, batch, team.snapshot(0))["kl"] == 0


@pytest.mark.parametrize("bad", ["broadcast", "int", "nan"])
def test_a_checkpoint_adapter_tensor_of_the_wrong_shape_dtype_or_value_is_refused(bad):
    """``load_state_dict`` (``--resume``) copied tensors with ``copy_``, which broadcasts a
    (1, k) tensor into an (m, k) parameter and casts integers: a tampered checkpoint resumed."""
    from sat_theory.errors import InputError

    team = make_team(agents=1)
    state = team.state_dict()
    name, w = next((k, v) for k, v in state["weights"][0].items() if v.shape[0] > 1)
    state["weights"][0][name] = {"broadcast": w[:1].clone(), "int": w.to(torch.int64),
                                 "nan": torch.full_like(w, float("nan"))}[bad]
    before = _weights(team, 0)
    with pytest.raises(InputError, match=f"adapter tensor {name}"):
        team.load_state_dict(state)
    assert _same(_weights(team, 0), before)  # nothing was half-loaded


def test_a_checkpoint_of_the_right_layout_loads():
    team = make_team(agents=1)
    state = team.state_dict()
    team.load_state_dict(state)
    assert _same(_weights(team, 0), state["weights"][0])
