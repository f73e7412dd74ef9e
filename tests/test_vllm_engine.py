"""The vLLM engine's glue (``sat_llm.vllm_engine``) against a CPU stand-in for vLLM's offline
API (``tests/fake_vllm.py``): the base it serves, one LoRA id per adapter version, one seed
per request, the stop rule, and the version and log-prob checks around it. vLLM itself is
not exercised here (it needs a GPU); what these tests pin is what we hand it and how we
read its answers."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm.team import LLMConfig, LLMTeam, RolloutMismatchError, stop_ids  # noqa: E402
from sat_llm.vllm_engine import base_state_dict  # noqa: E402
from sat_theory.algorithm import RunState, TrainConfig, run_stage  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402
from tests import fake_vllm  # noqa: E402

BASE = dict(model="tiny-random", task="copy", agents=2, max_new_tokens=6, n_train=16,
            n_eval=4, minibatch=4, lr=1e-2, seed=0, threads=1, device="cpu",
            temperature=0.7)


def vllm_team(monkeypatch, **kw):
    """A team whose rollouts go through VLLMEngine and the stand-in (CUDA pretended while
    the engine is built: the stand-in runs on the CPU)."""
    fake_vllm.install(monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        team = LLMTeam(LLMConfig(**{**BASE, **kw}, engine="vllm"))
    return team, fake_vllm.LLM.instances[-1]


def _update(team, agent=0, beta=1.0):
    b = team.rollout(2, 2)
    team.update(agent, b, np.linspace(-1, 1, len(b.turns_of(agent))), beta, team.snapshot(agent))
    return b


def test_served_base_has_the_models_own_names_and_weights(monkeypatch):
    """peft's wrapped state dict (``…base_layer.weight`` and every adapter's LoRA tensors)
    would not load in vLLM; the engine writes the base under transformers' names, and the
    served base computes what the team's base computes with its adapters off."""
    team, llm = vllm_team(monkeypatch)  # the stand-in refuses missing/unexpected names
    pm = team._model(0)
    wrapped = pm.get_base_model().state_dict()
    assert any(".base_layer." in k for k in wrapped) and any(".lora_" in k for k in wrapped)
    clean = base_state_dict(pm)
    assert not any(".base_layer." in k or ".lora_" in k for k in clean)
    assert set(clean) <= set(llm.base.state_dict())
    ids = torch.tensor([[1, 5, 6, 7, 8]])
    with pm.disable_adapter():
        want = pm(input_ids=ids).logits
    torch.testing.assert_close(llm.base(input_ids=ids).logits, want, rtol=0, atol=0)
    assert llm.kwargs["dtype"] == "float32" and llm.kwargs["enable_lora"]
    assert llm.kwargs["max_lora_rank"] == team.cfg.lora_r
    assert llm.kwargs["logprobs_mode"] == "processed_logprobs"


def test_the_engine_fails_to_load_a_wrapped_base(monkeypatch):
    """The stand-in's strict loader is what catches a wrapped checkpoint (it must be able to
    fail): the same engine writing ``get_base_model().state_dict()`` as it is is refused."""
    import sat_llm.vllm_engine as ve

    monkeypatch.setattr(ve, "base_state_dict", lambda pm: pm.get_base_model().state_dict())
    with pytest.raises(ValueError, match="does not match the model"):
        vllm_team(monkeypatch)


def test_a_group_gets_independent_draws_and_a_seed_the_same_draws(monkeypatch):
    """vLLM seeds each request: one seed per call would give every episode of a group (the
    same first context) the same message. Each request gets its own seed from the host RNG."""
    team, llm = vllm_team(monkeypatch)
    b = team.rollout(2, 4)
    sps = llm.requests[0][1]
    assert len({sp.seed for sp in sps}) == len(sps) == 8
    assert all(sp.ignore_eos and sp.top_k == -1 and sp.top_p == 1.0 and sp.logprobs == 0
               and sp.temperature == 0.7 for sp in sps)
    first = [tuple(e.turns[0].action) for e in b.episodes]
    for g in range(2):  # the 4 episodes of a group start from the same context
        assert len({m for m in first[4 * g:4 * g + 4]}) > 1
    again, _ = vllm_team(monkeypatch)
    assert [tuple(e.turns[0].action) for e in again.rollout(2, 4).episodes] == first


def test_one_lora_id_per_adapter_version_and_the_checks_pass(monkeypatch):
    """A SAT stage through the engine: agent 1 generates with agent 0's *updated* adapter
    (a new version under a new id), the versions and the log-prob check (the stand-in's
    processed log-probs against the training model's recomputation) pass."""
    team, llm = vllm_team(monkeypatch, task="tests.test_llm_team:LowercaseTask", max_new_tokens=4)
    cfg = TrainConfig(method="sat", stages=1, delta=10.0, n_groups=2, group_size=2, seed=0)
    rec = run_stage(team, cfg, RunState.initial(cfg, team.n_agents))
    assert rec["kind"] == "stage" and min(team.version) >= 1  # both agents moved
    used = {(r.lora_name, r.lora_int_id) for r, _ in llm.requests}
    assert ("agent0_v0", 1) in used and ("agent1_v0", 2) in used
    assert any(name == "agent0_v1" for name, _ in used)
    assert len({i for _, i in used}) == len(used)  # a new id for every version
    b = team.rollout(2, 2)
    chk = b.extra["logp_check"]
    assert chk["n_tokens"] > 0 and chk["mean_abs"] <= chk["tol"] and chk["rescored"] == 0


def test_a_reused_lora_id_serves_stale_weights_and_the_logprob_check_fires(monkeypatch):
    """vLLM caches adapters by id. An engine that reused an id would keep serving the old
    adapter while reporting the agent's current version; the version check cannot see it,
    the behaviour log-prob recomputation must."""
    team, llm = vllm_team(monkeypatch)
    team.rollout(2, 2)
    eng = team._engine
    monkeypatch.setattr(eng, "_new_id", lambda: 1)  # the bug: the same id for every version
    new = team.new_agent(0, "random", seed=1)
    new.weights = {k: w * 40 for k, w in new.weights.items()}
    team.replace(0, new)
    with pytest.raises(RolloutMismatchError, match="does not reproduce the engine's behaviour"):
        team.rollout(2, 2)


def test_an_engine_not_synced_after_an_update_fails_the_version_check(monkeypatch):
    team, _ = vllm_team(monkeypatch)
    _update(team)
    eng = team._engine
    served = dict(eng._saved)
    monkeypatch.setattr(eng, "_lora", lambda agent: (served[agent][1], served[agent][0])
                        if agent in served else type(eng)._lora(eng, agent))
    with pytest.raises(RolloutMismatchError, match="generated by adapter version 0"):
        team.rollout(2, 2)


def test_a_held_back_stop_token_is_appended_and_rescored(monkeypatch):
    """Older vLLM versions leave the stop token out of ``token_ids``: the engine appends it
    and reports no log-probs for that call; the team rescores those messages."""
    team, _ = vllm_team(monkeypatch, max_new_tokens=40)
    stop = set(stop_ids(team.tokenizer(0)))
    monkeypatch.setattr(fake_vllm, "HOLD_BACK_STOP", True)
    b = team.rollout(2, 2)
    msgs = [list(t.action) for e in b.episodes for t in e.turns]
    ended = [m for m in msgs if m and m[-1] in stop]
    assert ended, "no message reached a stop token: raise max_new_tokens"
    assert b.extra["logp_check"]["rescored"] > 0
    for e in b.episodes:  # the behaviour log-probs are the training model's own
        for t in e.turns:
            assert np.isfinite(t.logp)


def test_vllm_engine_needs_vllm_and_cuda(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm -> ImportError
    with pytest.raises(InputError, match="needs vLLM"):
        LLMTeam(LLMConfig(**BASE, engine="vllm"))
    fake_vllm.install(monkeypatch)
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="needs a CUDA GPU"):
            LLMTeam(LLMConfig(**BASE, engine="vllm"))
