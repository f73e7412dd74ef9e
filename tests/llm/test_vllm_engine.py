"""The vLLM engine's paths that real vLLM cannot reach in CI, against a CPU stand-in for
vLLM's offline API (``tests/llm/fake_vllm.py``): an older vLLM that holds the stop token back
from ``token_ids``, and the one-line errors without vLLM or without CUDA on a CUDA build.
Everything else (the served base, one LoRA id per adapter version, one seed per request,
the version and log-prob checks) runs against real vLLM's CPU build in
``tests/llm/test_vllm_real.py``."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm.team import LLMConfig, LLMTeam, stop_ids  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402
from tests.llm import fake_vllm  # noqa: E402

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


def test_lora_rank_is_served_in_the_smallest_vllm_slot_that_holds_it():
    """vLLM accepts only some ``max_lora_rank`` values (1, 8, 16, ...): rank 4 adapters are
    served in the 8 slot; a rank beyond the largest slot is one clear error."""
    from sat_llm.vllm_engine import LORA_RANK_SLOTS, lora_rank_slot

    assert [lora_rank_slot(r) for r in (1, 2, 4, 8, 9, 16, 17, 512)] == [1, 8, 8, 8, 16, 16, 32, 512]
    assert all(lora_rank_slot(s) == s for s in LORA_RANK_SLOTS)
    with pytest.raises(InputError, match="LoRA ranks up to 512"):
        lora_rank_slot(513)


def test_a_sampling_call_is_cut_into_slices_that_fit_vllms_prefill_budget():
    """vLLM 0.32 on the CPU fails when it splits a seeded prompt across prefill steps, so a
    sampling call is served in consecutive slices whose prompt tokens fit the budget (a
    longer prompt alone); every context is in exactly one slice, in order."""
    from sat_llm.vllm_engine import prefill_parts

    assert prefill_parts([43] * 32, 4096) == [(0, 32)]  # the study's rollouts: one call
    assert prefill_parts([43] * 200, 4096) == [(0, 95), (95, 190), (190, 200)]  # 95·43 = 4085
    assert prefill_parts([5000, 10, 10], 4096) == [(0, 1), (1, 3)]
    assert prefill_parts([], 4096) == []
    lengths = [7, 3, 9, 1, 1, 12, 4]
    parts = prefill_parts(lengths, 12)
    assert [i for a, b in parts for i in range(a, b)] == list(range(len(lengths)))
    assert all(sum(lengths[a:b]) <= 12 or b - a == 1 for a, b in parts)


def test_a_big_rollout_goes_to_vllm_in_slices_with_every_requests_own_seed(monkeypatch):
    """A rollout whose prompts exceed the budget reaches vLLM as several calls, with the
    seeds one call would have carried (drawn for all contexts before the split)."""
    team, llm = vllm_team(monkeypatch)
    calls, real = [], llm.generate

    def generate(prompts, sps, **kw):
        calls.append([(tuple(p["prompt_token_ids"]), sp.seed) for p, sp in zip(prompts, sps, strict=True)])
        return real(prompts, sps, **kw)

    monkeypatch.setattr(llm, "generate", generate)
    budget = 100
    monkeypatch.setattr(team._engine, "_token_budget", lambda: budget)
    state = torch.random.get_rng_state()
    team.rollout(2, 4)
    first, n = [], 0  # agent 1's turn: the first 8 requests (agent 2's come after)
    for c in calls:
        if n >= 8:
            break
        assert sum(len(p) for p, _ in c) <= budget or len(c) == 1
        first.append(c)
        n += len(c)
    assert len(first) > 1 and n == 8
    torch.random.set_rng_state(state)
    assert [s for c in first for _, s in c] == torch.randint(2**31 - 1, (8,)).tolist()


def test_the_engines_folder_of_served_weights_is_removed_when_it_is_closed_or_collected(monkeypatch):
    """The served base (~0.5 GB for SmolLM2 in float32) and the adapters are written to the
    engine's own temporary folder; it is gone after ``close()``, and after the team and its
    engine are collected, so runs do not fill the disk with one copy of the base each."""
    import gc

    team, _ = vllm_team(monkeypatch)
    d = team._engine.dir
    team.rollout(2, 2)  # writes the adapters next to the base
    assert (d / "base").is_dir() and any(p.name.startswith("agent") for p in d.iterdir())
    team._engine.close()
    assert not d.exists()
    team._engine.close()  # idempotent

    team, _ = vllm_team(monkeypatch)
    d = team._engine.dir
    assert d.is_dir()
    del team
    gc.collect()
    assert not d.exists()
