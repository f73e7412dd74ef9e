"""Batched generation and teacher-forced scoring on the model's device (transformers).

Conventions that keep the behaviour log-probabilities, the ratios and the KLs consistent:

- An agent's policy is ``π(x_u | s, x_<u) = softmax(logits / τ)`` at temperature ``τ``, with
  no top-k / top-p truncation (``top_k=0, top_p=1``), so sampling, the stored behaviour
  log-probabilities, the surrogate ratios and both KL monitors all refer to the same
  distribution. Greedy decoding (evaluation) takes the arg-max.
- Generation left-pads the contexts (``attention_mask`` marks the padding; ``generate``
  derives the position ids from it), so every row continues right after its own context.
  A message ends at its first stop token (kept, it is part of the action: its probability
  is what ends the message) or after ``max_new_tokens`` tokens; whatever ``generate`` emits
  after a row's stop token is padding and dropped.
- Teacher-forced scoring right-pads ``context + message`` (positions then start at 0 in
  every row, as in generation) and returns the log-probabilities of the message tokens,
  ``(B, T)`` with a mask, from the logits at the positions just before them.
- Devices: token and index tensors are built on the host and moved to the model's device
  once per call (:func:`model_device`); log-probabilities come back to the host as float64
  NumPy arrays. Sampling draws its random numbers on the host from the global torch RNG
  (:class:`HostSampler`), so a seed gives the same messages on every device (up to float
  ties) and exactly the draws of transformers' own CPU sampler.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from sat_theory.progress import bar as progress_bar

__all__ = ["generate", "score_logits", "message_logprobs", "pad_right", "shared_prefixes",
           "model_device", "HostSampler"]


def model_device(model) -> torch.device:
    """The device of the model's (first) parameter: where its inputs must live."""
    return next(model.parameters()).device


class HostSampler:
    """Logits processor that samples the next token on the host: ``p = softmax(scores/τ)``
    (scores are transformers' float32 raw logits), one ``torch.multinomial`` draw per row
    from the global CPU RNG, and logits that are ``0`` at the drawn token and ``−∞``
    elsewhere, so that ``generate``'s greedy arg-max emits it. On the CPU these are exactly
    the operations of transformers' own sampler (temperature warper, softmax,
    multinomial), hence the same draws bit for bit; on CUDA the draws come from the same
    host stream, so CPU and GPU runs of one seed sample the same messages unless a row's
    probabilities differ across devices right at the drawn boundary (float roundoff). Costs
    one (B, V) device-to-host copy per decoding step on a GPU."""

    def __init__(self, temperature: float):
        self.temperature = float(temperature)

    def __call__(self, input_ids, scores):
        x = scores / self.temperature if self.temperature != 1.0 else scores
        probs = torch.softmax(x, dim=-1)
        tok = torch.multinomial(probs.cpu(), num_samples=1).to(scores.device)
        return torch.full_like(scores, -math.inf).scatter_(1, tok, 0.0)


class _TokenTicks:
    """Logits processor that only counts decoding steps on a progress bar (the scores pass
    through unchanged); added only while bars are shown."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids, scores):
        self.bar.update(1)
        return scores


def _gen_config(max_new_tokens: int, stop_ids, pad_id):
    from transformers import GenerationConfig

    # a fresh config: no top-k/top-p/repetition settings inherited from the model's defaults
    kw = dict(max_new_tokens=int(max_new_tokens), eos_token_id=list(stop_ids), pad_token_id=int(pad_id),
              return_dict_in_generate=True, output_logits=True)
    # sampling is HostSampler's (a logits processor + arg-max), never generate's own
    return GenerationConfig(do_sample=False, **kw)


@torch.no_grad()
def generate(model, contexts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 1.0,
             stop_ids: Sequence[int], pad_id: int, greedy: bool = False,
             share_prefix: bool = True, streamer=None) -> tuple[list[list[int]], list[np.ndarray]]:
    """Sample one message per context. Returns ``(messages, logps)``: token ids cut after the
    first stop token, and the per-token behaviour log-probabilities under
    ``softmax(logits/τ)`` (for greedy decoding: under ``τ``-softmax too, for reference).

    ``share_prefix``: when contexts repeat (the G rollouts of one prompt), each distinct
    context is prefilled once and its KV cache repeated for its copies (see
    :func:`_shared_prefix_cache`); the result is the same computation up to float roundoff.
    Sampling uses the global (host) torch RNG through :class:`HostSampler` (seed it for
    reproducibility). ``streamer``: a transformers streamer (e.g. ``TextStreamer``) that
    receives the tokens as they are generated (one context only)."""
    from transformers import LogitsProcessorList

    if not contexts:
        return [], []
    dev = model_device(model)
    ids, mask = (x.to(dev) for x in _left_pad(contexts, pad_id))  # (B, L)
    L = ids.shape[1]
    cfg = _gen_config(max_new_tokens, stop_ids, pad_id)
    cache = _shared_prefix_cache(model, contexts, pad_id) if share_prefix else None
    procs = LogitsProcessorList([] if greedy else [HostSampler(temperature)])
    ticks = progress_bar(int(max_new_tokens), desc=f"generation ({ids.shape[0]} rows)",
                         unit="tok")
    if not ticks.disable:
        procs.append(_TokenTicks(ticks))
    out = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg,
                         logits_processor=procs or None, streamer=streamer,
                         **({"cache": cache} if cache is not None else {}))
    ticks.close()
    gen = out.sequences[:, L:]  # (B, T)
    T = gen.shape[1]
    logps = torch.empty(gen.shape, dtype=torch.float64, device=dev)
    for u in range(T):  # (B, V) raw logits of step u -> log-prob of the emitted token
        lp = torch.log_softmax(out.logits[u].float() / float(temperature), dim=-1)
        logps[:, u] = lp.gather(1, gen[:, u:u + 1]).squeeze(1).double()
    gen, logps = gen.cpu(), logps.cpu()
    stops = set(int(s) for s in stop_ids)
    msgs, lps = [], []
    for b in range(gen.shape[0]):
        row = gen[b].tolist()
        end = next((u + 1 for u, x in enumerate(row) if x in stops), len(row))
        msgs.append(row[:end])
        lps.append(logps[b, :end].numpy())
    return msgs, lps


def _left_pad(contexts, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``, both (B, L), of the contexts left-padded to the longest."""
    L = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), L), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(contexts), L), dtype=torch.long)
    for b, c in enumerate(contexts):
        ids[b, L - len(c):] = torch.tensor(list(c), dtype=torch.long)
        mask[b, L - len(c):] = 1
    return ids, mask


def _shared_prefix_cache(model, contexts, pad_id: int):
    """KV cache of every context but its last token, computed once per *distinct* context and
    gathered to one row per context; ``None`` when no context repeats (nothing to share) or a
    context has a single token. ``generate`` then runs only the last context token and the
    decoding steps for all rows. Why: with G rollouts per prompt the prefill is ~a third of
    the batched rollout time and batching barely speeds it up; sharing it does
    (BENCHMARKS.md, LLM section). Position ids follow the left padding exactly as
    ``generate`` derives them (``cumsum(mask) − 1``), so the cache equals the unshared one up
    to float roundoff."""
    keys = [tuple(c) for c in contexts]
    first: dict[tuple, int] = {}
    inverse = [first.setdefault(k, len(first)) for k in keys]
    if len(first) == len(keys) or min(len(k) for k in keys) < 2:
        return None
    dev = model_device(model)
    ids, mask = (x.to(dev) for x in _left_pad(list(first), pad_id))  # width of the full batch
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = _prefill(model, ids[:, :-1], mask[:, :-1], pos[:, :-1])
    cache.batch_select_indices(torch.tensor(inverse, device=dev))
    return cache


def _right_pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)``, both (B, L), of ``seqs`` right-padded to the longest."""
    L = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), L), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = torch.tensor(list(s), dtype=torch.long)
        mask[b, :len(s)] = 1
    return ids, mask


def pad_right(contexts: Sequence[Sequence[int]], messages: Sequence[Sequence[int]], pad_id: int):
    """``(ids (B,L), attention_mask (B,L), starts (B,), lengths (B,))`` of ``context+message``
    right-padded; ``starts[b] = len(context_b)``, ``lengths[b] = len(message_b)``."""
    ids, mask = _right_pad([list(c) + list(m) for c, m in zip(contexts, messages, strict=True)],
                           pad_id)
    starts = torch.tensor([len(c) for c in contexts])
    lengths = torch.tensor([len(m) for m in messages])
    return ids, mask, starts, lengths


_KEEPS: dict[type, bool] = {}


def _keeps_positions(model) -> bool:
    """Whether ``model(..., logits_to_keep=pos)`` accepts per-row positions ``pos`` (B,T)
    (transformers' ``slice_logits_to_keep``; older versions index a 2-D tensor differently)."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if type(base) not in _KEEPS:
        try:
            from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401
            ok = "logits_to_keep" in inspect.signature(base.forward).parameters
        except ImportError:
            ok = False
        _KEEPS[type(base)] = ok
    return _KEEPS[type(base)]


def _logits_at(model, pos: torch.Tensor, **kw) -> torch.Tensor:
    """Logits ``(B,T,V)`` at the per-row positions ``pos`` (B,T) of one forward pass. The LM
    head (``d × V`` per position; V = 49152 for SmolLM2) runs only at those positions when
    the model can be told so (``logits_to_keep``; the model's own head, so any logit scaling
    or soft-capping it applies stays), else on every position and the rows are gathered."""
    if _keeps_positions(model):
        return model(logits_to_keep=pos, **kw).logits
    logits = model(**kw).logits  # (B, L, V)
    return logits.gather(1, pos[:, :, None].expand(*pos.shape, logits.shape[-1]))


def _message_rows(messages) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(tokens (B,T), mask (B,T) bool, T)`` of the messages right-padded with 0."""
    lengths = torch.tensor([len(m) for m in messages])
    T = int(lengths.max()) if len(messages) else 0
    tokens = torch.zeros((len(messages), T), dtype=torch.long)
    for b, m in enumerate(messages):
        tokens[b, :len(m)] = torch.tensor(list(m), dtype=torch.long)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return tokens, mask, T


def _lcp(a: tuple, b: tuple) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def shared_prefixes(contexts) -> list[int] | None:
    """Per row, the length ``k_b`` of the context prefix to run once per distinct prefix, or
    ``None`` when nothing is shared (or a context has fewer than 2 tokens). ``k_b`` is the
    longest prefix the row's context shares with another row's (identical copies — the G
    turns of one prompt — share all of it; the turns of a later speaker share the prompt
    part), capped at ``len − 1`` so that every row keeps a token to run after its prefix; a
    row that shares nothing runs ``context[:-1]`` as its own prefix (no extra cost). In
    sorted order the longest prefix shared with any other context is shared with a
    neighbour, so one pass over the sorted distinct contexts finds it."""
    keys = [tuple(c) for c in contexts]
    if not keys or min(len(k) for k in keys) < 2:
        return None
    count: dict[tuple, int] = {}
    for k in keys:
        count[k] = count.get(k, 0) + 1
    order = sorted(count)
    share = {}
    for i, k in enumerate(order):
        best = len(k) if count[k] > 1 else 0
        for nb in (i - 1, i + 1):
            if 0 <= nb < len(order):
                best = max(best, _lcp(k, order[nb]))
        share[k] = best
    if not any(share.values()):
        return None
    return [min(share[k], len(k) - 1) if share[k] else len(k) - 1 for k in keys]


def score_logits(model, contexts, messages, *, pad_id: int, temperature: float = 1.0,
                 dtype=torch.float32, share_prefix: bool = False, also_float64: bool = False):
    """Teacher-forced ``(logp (B,T,V), tokens (B,T), mask (B,T))``: ``logp[b,u]`` is the full
    ``log softmax(logits/τ)`` predicting message token ``u`` of row ``b`` (``T`` = longest
    message); ``mask`` is 1 on real message tokens. Gradients flow if enabled. ``dtype``
    of the log-softmax: float64 for the KL monitors (float32 normalisation errors of ~1e-7
    would otherwise show as tiny negative KLs). The LM head runs only where a message token
    is predicted (:func:`_logits_at`), not over the contexts.

    ``share_prefix``: context prefixes that several rows share (the G
    turns of one prompt's group: the whole context; a later speaker's turns: the prompt
    part, see :func:`shared_prefixes`) are run once, and each row runs only the rest of its
    context and its message against the gathered KV cache (:func:`_shared_prefix_logits`);
    the same log-probabilities up to float roundoff. When nothing is shared (or a context
    has a single token) it is the plain pass.

    ``also_float64``: also return, as a fourth element, the float64 ``log softmax`` of the same
    logits, detached — exactly what a no-grad ``dtype=torch.float64`` call on the same rows
    computes (one forward serves as both, e.g. an update's first pass at the reference)."""
    dev = model_device(model)
    tokens, mask, T = (x.to(dev) if torch.is_tensor(x) else x for x in _message_rows(messages))
    ks = shared_prefixes(contexts) if share_prefix and T > 0 else None
    if ks is not None:
        sel = _shared_prefix_logits(model, contexts, ks, messages, T, pad_id)
    else:
        ids, attn, starts, _ = pad_right(contexts, messages, pad_id)
        # the logit at position p predicts token p+1: message token u sits at starts+u
        pos = (starts[:, None] + torch.arange(T)[None, :] - 1).clamp(min=0, max=ids.shape[1] - 1)
        sel = _logits_at(model, pos.to(dev), input_ids=ids.to(dev),
                         attention_mask=attn.to(dev))  # (B, T, V)
    logp = _log_softmax(sel, dtype, temperature)
    if also_float64:
        with torch.no_grad():
            return logp, tokens * mask, mask.to(logp.dtype), _log_softmax(sel.detach(),
                                                                          torch.float64, temperature)
    return logp, tokens * mask, mask.to(logp.dtype)


def _log_softmax(logits: torch.Tensor, dtype, temperature: float) -> torch.Tensor:
    """``log softmax(logits / τ)`` over the vocabulary in ``dtype``."""
    x = logits.to(dtype)
    if float(temperature) != 1.0:  # x / 1 == x exactly: skip a pass over (B, T, V)
        x = x / float(temperature)
    return torch.log_softmax(x, dim=-1)


def _shared_prefix_logits(model, contexts, ks, messages, T: int, pad_id: int):
    """Logits ``(B,T,V)`` predicting the message tokens: each distinct prefix
    ``context_b[:k_b]`` runs once (left-padded; KV cache only, no LM head), its cache is
    gathered to the rows, and row ``b`` runs ``context_b[k_b:] + message_b[:-1]``
    (right-padded) at positions ``k_b, k_b + 1, ...``; message token ``u`` is predicted at
    suffix column ``len(context_b) − k_b − 1 + u``, where alone the LM head runs. Why: the
    G copies of a prompt's context are most of the scored tokens for short messages, and
    their passes are identical. Same left-padded cache and position ids as
    :func:`generate`'s shared prefill, so the result equals the plain pass up to float
    roundoff (tests/llm/test_llm_scoring_shared.py)."""
    prefixes = [tuple(c[:k]) for c, k in zip(contexts, ks, strict=True)]
    first: dict[tuple, int] = {}
    rows = torch.tensor([first.setdefault(p, len(first)) for p in prefixes])
    ids, mask = _left_pad(list(first), pad_id)  # (U, K)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    rests = [list(c[k:]) + list(m[:-1]) for c, k, m in zip(contexts, ks, messages, strict=True)]
    step, smask = _right_pad(rests, pad_id)
    Ls = step.shape[1]
    attn = torch.cat([mask[rows], smask], dim=1)
    kt = torch.tensor(ks)
    spos = kt[:, None] + torch.arange(Ls)[None, :]
    first_col = torch.tensor([len(c) for c in contexts]) - kt - 1
    keep = (first_col[:, None] + torch.arange(T)[None, :]).clamp(max=Ls - 1)  # (B, T)
    dev = model_device(model)  # every index tensor built on the host, moved once
    ids, mask, pos, rows, step, attn, spos, keep = (
        x.to(dev) for x in (ids, mask, pos, rows, step, attn, spos, keep))
    cache = _prefill(model, ids, mask, pos)
    cache.batch_select_indices(rows)
    return _logits_at(model, keep, input_ids=step, attention_mask=attn, position_ids=spos,
                      cache=cache, use_cache=True)


def _prefill(model, ids, mask, pos):
    """KV cache of ``ids`` (left-padded, explicit position ids). A prefill that only builds the
    cache needs no LM head (for SmolLM2 a 113 MB weight read per call): run the decoder body
    (with a peft model its LoRA layers sit inside it, so the active adapter applies) or, if
    the model has none, keep a single logit."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    body = base.get_decoder() if hasattr(base, "get_decoder") else None
    if body is not None and body is not base:
        return body(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).cache
    keep = {"logits_to_keep": 1} if _keeps_positions(model) else {}
    return model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **keep).cache


def message_logprobs(logp: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token ``log π(x_u | s, x_<u)`` (B,T), zero where ``mask`` is 0."""
    return logp.gather(2, tokens[:, :, None]).squeeze(2) * mask
