"""Teacher-forced scoring: the shared-prefix pass and the LM head at the message positions
only give the log-probabilities of the plain full-logits pass (up to float roundoff).

Every test runs on the CPU and, as its ``gpu``-marked twin, on CUDA in float32 (the
``device`` fixture of ``conftest.py``)."""

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm.models import load_model  # noqa: E402
from sat_llm.rollout import (  # noqa: E402
    message_logprobs,
    model_device,
    pad_right,
    score_logits,
    shared_prefixes,
)
from sat_llm.team import strict_float32  # noqa: E402

torch.set_num_threads(1)
strict_float32()  # no TF32 on the CUDA twins (what every LLMTeam switches off too)


@functools.cache
def _lora_model(device="cpu"):
    """tiny-random wrapped in a LoRA adapter with non-zero factors (so the adapter changes
    every layer's keys/values, as after an update), on ``device``, built once per device;
    the factors are drawn on the host."""
    from peft import LoraConfig, get_peft_model

    model, tok = load_model("tiny-random", seed=0)
    pm = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    pm.eval()
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return pm.to(device), enc


@pytest.fixture
def lora(device):
    return _lora_model(device)


def _full_logits_reference(model, ctxs, msgs, tau, dtype):
    """The computation before the LM-head restriction: logits at every position, gathered."""
    dev = model_device(model)
    ids, attn, starts, lengths = pad_right(ctxs, msgs, 0)
    logits = model(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits
    T = int(lengths.max())
    pos = (starts[:, None] + torch.arange(T)[None, :] - 1).clamp(max=ids.shape[1] - 1).to(dev)
    sel = logits.gather(1, pos[:, :, None].expand(len(ctxs), T, logits.shape[-1]))
    return torch.log_softmax(sel.to(dtype) / tau, dim=-1)


def _batch(enc):
    c1, c2, c3 = enc("hello there"), enc("hi"), enc("a much longer context than the others")
    # repeated contexts of different lengths, messages of different lengths (one empty)
    ctxs = [c1, c3, c1, c2, c3, c1, c2]
    msgs = [enc("abc"), enc("defghij"), enc("x"), enc("yz"), enc("q"), enc(""), enc("long one")]
    return ctxs, msgs


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-6), (torch.float32, 1e-5)])
def test_shared_prefix_scoring_equals_the_plain_pass(lora, dtype, tol):
    model, enc = lora
    ctxs, msgs = _batch(enc)
    with torch.no_grad():
        ref = _full_logits_reference(model, ctxs, msgs, 0.7, dtype)
        plain = score_logits(model, ctxs, msgs, pad_id=0, temperature=0.7, dtype=dtype)
        shared = score_logits(model, ctxs, msgs, pad_id=0, temperature=0.7, dtype=dtype,
                              share_prefix=True)
    m = plain[2].bool()
    assert plain[2].sum() == sum(len(x) for x in msgs) and m.shape == ref.shape[:2]
    assert torch.equal(plain[1], shared[1]) and torch.equal(plain[2], shared[2])
    # LM head at the message positions only: the same numbers as the full-logits pass
    assert torch.allclose(plain[0][m], ref[m], atol=tol, rtol=0)
    assert torch.allclose(shared[0][m], ref[m], atol=tol, rtol=0)
    assert torch.allclose(message_logprobs(*shared), message_logprobs(*plain), atol=tol, rtol=0)


def test_shared_prefix_runs_each_distinct_context_once(lora):
    model, enc = lora
    ctxs, msgs = _batch(enc)
    calls = []
    hook = model.get_base_model().get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        with torch.no_grad():
            score_logits(model, ctxs, msgs, pad_id=0, share_prefix=True)
    finally:
        hook.remove()
    L, T = max(len(c) for c in ctxs), max(len(x) for x in msgs)
    assert calls == [(3, L - 1), (len(ctxs), T)]


def test_no_repeated_context_is_the_plain_pass(lora):
    model, enc = lora
    ctxs = [enc("hello there"), enc("xi"), enc("another one")]  # no common first token
    msgs = [enc("abc"), enc("d"), enc("efgh")]
    with torch.no_grad():
        a = score_logits(model, ctxs, msgs, pad_id=0, dtype=torch.float64)
        b = score_logits(model, ctxs, msgs, pad_id=0, dtype=torch.float64, share_prefix=True)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("share", [False, True])
def test_lm_head_restriction_keeps_the_gradient(lora, share):
    """The update's grad path (LM head at message positions only; with ``share`` also the
    shared-prefix KV caches, whose gradients autograd sums over their rows): same loss value
    and LoRA gradient as the plain pass with full logits."""
    model, enc = lora
    ctxs, msgs = _batch(enc)
    params = [p for n, p in model.named_parameters() if "lora_" in n]
    grads = []
    for full in (True, False):
        model.zero_grad(set_to_none=True)
        if full:
            logp = _full_logits_reference(model, ctxs, msgs, 1.0, torch.float32)
            _, toks, mask = score_logits(model, ctxs, msgs, pad_id=0)
        else:
            logp, toks, mask = score_logits(model, ctxs, msgs, pad_id=0, share_prefix=share)
        loss = message_logprobs(logp, toks, mask).sum()
        loss.backward()
        grads.append((float(loss.detach()), torch.cat([p.grad.flatten() for p in params])))
    (l0, g0), (l1, g1) = grads
    assert abs(l0 - l1) < 1e-4 and torch.allclose(g0, g1, atol=1e-5, rtol=1e-4)
    model.zero_grad(set_to_none=True)


def test_partly_shared_contexts_run_their_common_prefix_once(lora):
    """A later speaker's turns: the group's contexts share the prompt, not the whole context;
    mixed with exact copies and a context that shares nothing."""
    model, enc = lora
    p1, p2 = "task: add 2 and 3. agent 1 said ", "task: mul 4 and 5. agent 1 said "
    ctxs = [enc(p1 + "5"), enc(p1 + "six"), enc(p1 + "5"), enc(p2 + "20!"), enc(p2 + "9"),
            enc("zz unrelated")]
    msgs = [enc("ok"), enc("no it is 5"), enc("yes"), enc("20"), enc("x"), enc("abc")]
    n = len(enc(p1))
    assert len(enc(p2)) == n and len(ctxs[0]) == n + 1
    # each prompt's rows share the prompt (the copies too: all but their last token); the
    # unrelated context runs all but its last token as its own prefix
    assert shared_prefixes(ctxs) == [n] * 5 + [len(ctxs[5]) - 1]
    calls = []
    hook = model.get_base_model().get_decoder().register_forward_pre_hook(
        lambda mod, args, kw: calls.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        with torch.no_grad():
            shared = score_logits(model, ctxs, msgs, pad_id=0, dtype=torch.float64,
                                  share_prefix=True)
    finally:
        hook.remove()
    assert calls[0] == (3, n)  # three distinct prefixes, each run once
    with torch.no_grad():
        ref = _full_logits_reference(model, ctxs, msgs, 1.0, torch.float64)
    m = shared[2].bool()
    assert torch.allclose(shared[0][m], ref[m], atol=1e-6, rtol=0)
