"""The passes through an LLM team's models: decoding functions and :class:`Scoring`, the part
of :class:`~sat_llm.team.LLMTeam` that runs them.

- Decoding (module functions over one model): greedy messages of contexts that share a
  prefix (:func:`greedy_shared_prefix`) and of many contexts at once, decoded together
  (:func:`greedy_pooled`); the stop tokens (:func:`stop_ids`).
- :class:`Scoring`: generation of the speakers' messages (sampled, with the behaviour
  log-prob check, or greedy), teacher-forced scoring, the reference pass and the minibatch
  loss, and ``kl``: exact and sampled token-level KL (:mod:`sat_llm.kl`) from the reference
  snapshot to the current adapter on the agent's messages in the batch, plus the current
  per-turn log-probabilities the algorithm needs for its surrogate estimate.

These passes stay next to the functions they call (``generate``, ``greedy_pooled``,
``score_logits``, ``sequence_kl``, ``_prefill``, ...): tests and benchmarks replace those
names in this module to watch or fail them.

The reference policy of a KL is evaluated through a scratch adapter ``ref`` on the same
base, into which the snapshot's weights are copied; its log-probabilities on a batch are
cached while the (batch, reference) pair stays the same (the backtracking loop re-uses them).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from sat_theory.progress import bar as progress_bar
from sat_theory.team import Batch

from .adapters import AgentSnapshot
from .chunks import _longest, _rows, in_chunks
from .episodes import RolloutMismatchError
from .kl import sampled_sequence_kl, sequence_kl
from .loss import clipped_surrogate, token_clipped_surrogate
from .models import memory_peak
from .protocol import Protocol
from .rollout import _lcp, _prefill, generate, message_logprobs, model_device, score_logits

__all__ = ["Scoring", "LOGP_TOL", "stop_ids", "greedy_shared_prefix", "greedy_pooled"]

#: default tolerance of the behaviour log-prob check — the mean per-token |Δ log π| between
#: an engine's log-probs and the training model's recomputation, per generation call — by
#: base dtype. A chosen default, not a derived bound: float32 ~2^14 units of roundoff (the
#: means we measured on tiny-random are ~5e-8); half precision 0.1, a guess at "far above
#: bf16 recomputation noise" that no GPU has measured yet (``experiments/gpu_check.py``
#: reports the mean and max), so in half precision only gross mismatches (wrong adapter,
#: template or temperature) are caught; stale adapters are caught by the version check
#: whatever the dtype. The mean, not the max: rare tokens can differ much more.
LOGP_TOL = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


def stop_ids(tok) -> list[int]:
    """Stop tokens of a message: eos and, for chat models, ``<|im_end|>``."""
    return sorted({tok.eos_token_id, *([tok.convert_tokens_to_ids("<|im_end|>")]
                                       if "<|im_end|>" in tok.get_vocab() else [])})


def _shared_prefix(keys: list[tuple]) -> int:
    """``P``: the length of the longest common prefix of all contexts ``keys``, at most
    ``min len − 1`` (every row keeps a token of its own to prefill)."""
    P = min((_lcp(keys[0], k) for k in keys), default=0)
    return min(P, min((len(k) for k in keys), default=0) - 1)


@torch.no_grad()
def greedy_shared_prefix(model, contexts, *, max_new_tokens: int, temperature: float = 1.0,
                         stop_ids, pad_id: int, greedy: bool = True, streamer=None):
    """Greedy messages of distinct contexts that share a common prefix (the held-out
    evaluation: every prompt starts with the same system message), ``(messages, logps)``
    as :func:`sat_llm.rollout.generate` returns them. The common prefix ``c[:P]`` (``P`` =
    the longest prefix of all contexts, at most ``min len − 1``) is prefilled once and its
    KV cache repeated for every row; the rows are laid out ``[prefix | padding | rest]``
    (padding masked), so ``generate``'s position ids ``cumsum(mask) − 1`` run ``0..P−1``
    over the prefix and continue at ``P`` after it, exactly the positions of an unpadded
    context: the same greedy decoding up to float roundoff (tests/llm/test_llm_scoring.py),
    without recomputing the prefix per row. Falls back to ``generate`` when sampling, when
    nothing is shared, or for one row."""
    from .rollout import _gen_config

    keys = [tuple(c) for c in contexts]
    P = _shared_prefix(keys)
    if not greedy or streamer is not None or len(keys) < 2 or P < 1:
        return generate(model, contexts, max_new_tokens=max_new_tokens, temperature=temperature,
                        stop_ids=stop_ids, pad_id=pad_id, greedy=greedy, streamer=streamer)
    B, R = len(keys), max(len(k) for k in keys) - P
    ids = torch.full((B, P + R), int(pad_id), dtype=torch.long)
    mask = torch.zeros((B, P + R), dtype=torch.long)
    ids[:, :P] = torch.tensor(keys[0][:P])
    mask[:, :P] = 1
    for b, k in enumerate(keys):  # the rest of each context right-aligned after the padding
        ids[b, P + R - (len(k) - P):] = torch.tensor(k[P:])
        mask[b, P + R - (len(k) - P):] = 1
    dev = model_device(model)
    ids, mask = ids.to(dev), mask.to(dev)
    cache = _prefill(model, ids[:1, :P], mask[:1, :P], torch.arange(P, device=dev)[None])
    cache.batch_select_indices(torch.zeros(B, dtype=torch.long, device=dev))
    out = model.generate(input_ids=ids, attention_mask=mask, cache=cache,
                         generation_config=_gen_config(max_new_tokens, stop_ids, pad_id))
    gen = out.sequences[:, P + R:]
    stops = {int(x) for x in stop_ids}
    msgs, lps = [], []
    for b in range(B):
        row = gen[b].tolist()
        end = next((u + 1 for u, x in enumerate(row) if x in stops), len(row))
        lp = [float(torch.log_softmax(out.logits[u][b].float() / float(temperature), -1)[row[u]])
              for u in range(end)]
        msgs.append(row[:end])
        lps.append(np.asarray(lp, dtype=np.float64))
    return msgs, lps


def _mergeable(cache) -> bool:
    """Whether a cache's per-layer key/value tensors ``(B, H, L, D)`` can be concatenated
    across batches (transformers' full-attention ``DynamicLayer``; sliding-window or
    linear-attention layers keep other state)."""
    from transformers.cache_utils import DynamicLayer

    return all(type(lay) is DynamicLayer for lay in getattr(cache, "layers", [None]))


def _merge_caches(parts: list, P: int, W: int):
    """One cache of the rows of ``parts = [(cache, mask (B_i, W_i)), ...]`` (each laid out
    ``[prefix (P) | padding | rest]``), every part widened to ``W`` columns by masked zero
    columns inserted right after the prefix, so every row keeps the layout of one
    unchunked :func:`greedy_shared_prefix` call of width ``W``. Returns ``(cache, mask)``;
    the first part's cache object is reused (its tensors replaced)."""
    cache = parts[0][0]
    masks = []
    for _, m in parts:
        gap = W - m.shape[1]
        masks.append(torch.cat([m[:, :P], m.new_zeros((m.shape[0], gap)), m[:, P:]], 1) if gap else m)
    for i, layer in enumerate(cache.layers):
        ks, vs = [], []
        for c, m in parts:
            k, v = c.layers[i].keys, c.layers[i].values
            gap = W - m.shape[1]
            if gap:  # zero keys/values at masked columns: they never reach a softmax weight
                z = k.new_zeros((k.shape[0], k.shape[1], gap, k.shape[3]))
                k = torch.cat([k[:, :, :P], z, k[:, :, P:]], 2)
                v = torch.cat([v[:, :, :P], z, v[:, :, P:]], 2)
            ks.append(k)
            vs.append(v)
        layer.keys, layer.values = torch.cat(ks), torch.cat(vs)
    return cache, torch.cat(masks)


def _prefill_chunk(model, prefix, keys, P: int, pad_id: int):
    """Prefill of one chunk of contexts after their common prefix ``keys[b][:P]``:
    ``(cache, mask (B, P+R), last position (B, 1), logits (B, V) float32 of the next
    token)``, with exactly the inputs ``generate`` builds in :func:`greedy_shared_prefix`
    (rows ``[prefix | padding | rest]``, position ids ``cumsum(mask) − 1``, the 2-D mask
    dropped when it has no padding, ``logits_to_keep = 1``), so its numbers are that
    call's bit for bit. ``prefix``: the prefix's KV cache (one row; copied, not changed)."""
    B, R = len(keys), max(len(k) for k in keys) - P
    ids = torch.full((B, R), int(pad_id), dtype=torch.long)
    mask = torch.zeros((B, P + R), dtype=torch.long)
    mask[:, :P] = 1
    for b, k in enumerate(keys):  # the rest of each context right-aligned after the padding
        ids[b, R - (len(k) - P):] = torch.tensor(k[P:])
        mask[b, P + R - (len(k) - P):] = 1
    pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
    dev = model_device(model)
    ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
    cache = copy.deepcopy(prefix)
    cache.batch_select_indices(torch.zeros(B, dtype=torch.long, device=dev))
    out = model(input_ids=ids, position_ids=pos[:, P:], cache=cache, use_cache=True,
                logits_to_keep=1, attention_mask=None if bool((mask == 1).all()) else mask)
    return out.cache, mask, pos[:, -1:], out.logits[:, -1].float()


def _greedy_rows(model, cache, mask, last, logits, *, max_new_tokens: int, temperature: float,
                 stop_ids) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy decoding of prefilled rows: ``x_u = argmax logits_u`` (first maximum, as
    ``generate``), its log-probability under ``softmax(logits_u / τ)``, and the row leaves
    the batch (its cache row dropped) as soon as it emits a stop token; at most
    ``max_new_tokens`` tokens. Each step runs one token per row still going, with the
    position ids and 2-D mask ``generate`` would pass (``None`` when unpadded). Why:
    ``generate`` runs every row of a batch until its last row stops (padding the finished
    ones); here a step costs the rows still going."""
    B = logits.shape[0]
    msgs: list[list[int]] = [[] for _ in range(B)]
    lps: list[list[float]] = [[] for _ in range(B)]
    rows = torch.arange(B)
    stops = torch.tensor(sorted({int(s) for s in stop_ids}), device=logits.device)
    am = None if bool((mask == 1).all()) else mask
    for u in range(int(max_new_tokens)):
        nxt = torch.argmax(logits, dim=-1)  # (b,)
        lp = torch.log_softmax(logits / float(temperature), -1).gather(1, nxt[:, None])[:, 0]
        for b, x, y in zip(rows.tolist(), nxt.tolist(), lp.double().tolist(), strict=True):
            msgs[b].append(x)
            lps[b].append(y)
        going = ~torch.isin(nxt, stops)
        if u == max_new_tokens - 1 or not bool(going.any()):
            break
        if not bool(going.all()):  # finished rows leave the batch
            keep = going.nonzero().squeeze(1)
            cache.batch_select_indices(keep)
            rows, nxt, last = rows[keep.cpu()], nxt[keep], last[keep]
            am = am[keep] if am is not None else None
        last = last + 1
        if am is not None:
            am = torch.cat([am, am.new_ones((am.shape[0], 1))], dim=-1)
        out = model(input_ids=nxt[:, None], position_ids=last, attention_mask=am, cache=cache,
                    use_cache=True, logits_to_keep=1)
        cache, logits = out.cache, out.logits[:, -1].float()
    return msgs, [np.asarray(x, dtype=np.float64) for x in lps]


@torch.no_grad()
def greedy_pooled(model, contexts, *, chunk: int, max_new_tokens: int, temperature: float = 1.0,
                  stop_ids, pad_id: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy messages of many contexts (the held-out evaluation), ``(messages, logps)`` in
    the order of ``contexts``, as :func:`greedy_shared_prefix` returns them per chunk:

    - the common prefix ``c[:P]`` of all contexts (the system message) is prefilled once
      per call, not once per chunk;
    - rows are ordered by context length (stable, so equal lengths keep their order) and
      prefilled in chunks of ``chunk`` rows (:func:`_prefill_chunk`; bounds the prefill's
      activations), each chunk with the inputs of a :func:`greedy_shared_prefix` call on
      it, so with equal lengths every prefill is today's bit for bit;
    - the chunks' caches are joined (:func:`_merge_caches`) and all rows decode together,
      each leaving as soon as it stops (:func:`_greedy_rows`).

    Why: a decoding step of SmolLM2-135M on one CPU thread costs about the same for 2 rows
    as for 32 (it is the weights' read, not the rows), and ``generate`` runs each chunk's
    steps until its longest message ends: ``max_new_tokens`` steps per chunk. Here the
    whole call takes at most ``max_new_tokens`` steps. Batch composition changes only
    float roundoff in the decoding steps (BENCHMARKS.md, "Evaluation cost": no message of
    the study's 600 untrained-model problems changed). Falls back to chunked
    :func:`greedy_shared_prefix` when nothing is shared, for one row, or when the model's
    cache cannot be joined (then each chunk decodes alone)."""
    keys = [tuple(c) for c in contexts]
    P = _shared_prefix(keys)
    if len(keys) < 2 or P < 1:
        parts = [greedy_shared_prefix(model, contexts[a:a + chunk], max_new_tokens=max_new_tokens,
                                      temperature=temperature, stop_ids=stop_ids, pad_id=pad_id)
                 for a in range(0, len(keys), chunk)]
        return [m for p in parts for m in p[0]], [lp for p in parts for lp in p[1]]
    msgs: list = [None] * len(keys)
    lps: list = [None] * len(keys)
    for g in _prefilled_groups(model, keys, P, chunk=chunk, pad_id=pad_id):
        W = max(m.shape[1] for _, _, m, _, _ in g)
        cache, mask = (_merge_caches([(c, m) for _, c, m, _, _ in g], P, W) if len(g) > 1
                       else (g[0][1], g[0][2]))
        m_, l_ = _greedy_rows(model, cache, mask, torch.cat([x[3] for x in g]),
                              torch.cat([x[4] for x in g]), max_new_tokens=max_new_tokens,
                              temperature=temperature, stop_ids=stop_ids)
        for i, m, lp in zip((i for x in g for i in x[0]), m_, l_, strict=True):
            msgs[i], lps[i] = m, lp
    return msgs, lps


def _prefilled_groups(model, keys: list[tuple], P: int, *, chunk: int, pad_id: int) -> list:
    """The contexts ``keys`` prefilled after their common prefix ``keys[0][:P]`` (itself
    prefilled once): rows ordered by context length (stable), in chunks of ``chunk`` rows
    (:func:`_prefill_chunk`), each ``(rows, cache, mask, last position, logits)``, grouped
    into the chunks that decode together: all of them when their caches can be joined
    (:func:`_mergeable`), else each alone."""
    dev = model_device(model)
    prefix = _prefill(model, torch.tensor([keys[0][:P]], device=dev),
                      torch.ones((1, P), dtype=torch.long, device=dev),
                      torch.arange(P, device=dev)[None])
    order = sorted(range(len(keys)), key=lambda i: len(keys[i]))  # less padding per chunk
    groups: list[list] = [[]]
    for a in range(0, len(order), chunk):
        rows = order[a:a + chunk]
        cache, mask, last, logits = _prefill_chunk(model, prefix, [keys[i] for i in rows], P, pad_id)
        if groups[-1] and not _mergeable(cache):
            groups.append([])
        groups[-1].append((rows, cache, mask, last, logits))
    return groups


class Scoring:
    """The passes through the models of an LLM team (a mixin of :class:`~sat_llm.team.LLMTeam`,
    which provides the adapters, :class:`~sat_llm.adapters.Adapters`, and the counters
    ``_version``, ``_micro``, ``_gen_cap``, ``_logp_stats``, ``_rescored``, ``_ref_cache``,
    the rollout ``_engine`` and ``streamer_for``); see the module docstring."""

    # ---------------------------------------------------------------- generation
    @torch.no_grad()
    def _speak(self, items: dict, last: bool, greedy: bool) -> dict:
        """:meth:`EpisodeLoop._speak`: every speaker generates here, in agent order."""
        return {j: self._messages(j, it, last, greedy, self.cfg.eval_batch if greedy else len(it))
                for j, it in sorted(items.items())}

    @torch.no_grad()
    def _messages(self, k: int, items, last: bool, greedy: bool, chunk: int, *,
                  protocol: Protocol | None = None, speaker: int | None = None):
        """Messages of agent ``k`` for ``items = [(prompt, history[, view]), ...]`` in chunks of
        ``chunk``: ``(contexts, messages, logps, texts)`` — context/message token ids, the
        summed behaviour log-probability and the cleaned text for the shared context.
        ``protocol``/``speaker``: the team's protocol and the agent's index in it (default:
        this team's and ``k``; a Ray actor holds a one-agent team of a larger protocol)."""
        proto = protocol or self.protocol
        tok = self.tokenizer(k)
        ctxs = [proto.render(tok, p, h, k if speaker is None else speaker, last, *v)
                for p, h, *v in items]
        model = self._activate(k)
        stop = stop_ids(tok)
        # greedy on the training model: one call decodes every row (:func:`greedy_pooled`,
        # prefilling ``want`` rows at a time); an out-of-memory error halves the rows per call
        pooled = greedy and self._engine is None
        want = min(chunk, self._gen_cap[k])

        def run(a, b):
            if self._engine is not None:
                m_, l_ = self._engine_messages(k, ctxs[a:b], greedy, stop)
            else:
                m_, l_ = self._model_messages(k, model, ctxs[a:b], greedy, stop,
                                              min(want, b - a) if pooled else None)
            return m_, (l_ if greedy else self._check_logps(k, ctxs[a:b], m_, l_))

        msgs, lps = self._generation_chunks(k, len(ctxs), min(len(ctxs), self._gen_cap[k])
                                            if pooled else want, run)
        texts = [proto.clean(tok.decode(m, skip_special_tokens=True)) for m in msgs]
        return ctxs, msgs, [float(np.sum(lp)) for lp in lps], texts

    def _engine_messages(self, k: int, ctxs, greedy: bool, stop) -> tuple:
        """``(messages, log-probs or None)`` of agent ``k`` on ``ctxs`` from the rollout
        engine (e.g. vLLM), which must have generated them with the agent's current adapter
        version (else :class:`RolloutMismatchError`)."""
        cfg = self.cfg
        m_, l_, v = self._engine.generate(k, ctxs, max_new_tokens=cfg.max_new_tokens,
                                          temperature=cfg.temperature, stop_ids=stop,
                                          greedy=greedy)
        if v != self._version[k]:  # intermediate occupancy: the predecessors just updated
            raise RolloutMismatchError(
                f"agent {k}'s messages were generated by adapter version {v}, but the "
                f"team's agent {k} is version {self._version[k]} (the engine was not "
                "synced after an update)")
        return m_, l_

    def _model_messages(self, k: int, model, ctxs, greedy: bool, stop, pool: int | None) -> tuple:
        """``(messages, log-probs)`` of agent ``k`` on ``ctxs`` from the training model itself:
        :func:`greedy_pooled` prefilling ``pool`` rows at a time (greedy without an engine),
        else :func:`greedy_shared_prefix` or sampled :func:`~sat_llm.rollout.generate`; one
        episode's message streams token by token to ``streamer_for(k)`` (``sat team``)."""
        cfg = self.cfg
        streamer = (self.streamer_for(k) if self.streamer_for is not None and len(ctxs) == 1
                    else None)
        kw = dict(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                  stop_ids=stop, pad_id=self.tokenizer(k).pad_token_id)
        if pool is not None and streamer is None:  # evaluation: prefill in chunks, decode together
            return greedy_pooled(model, ctxs, chunk=pool, **kw)
        gen = greedy_shared_prefix if greedy else generate
        return gen(model, ctxs, greedy=greedy, streamer=streamer, **kw)

    def _generation_chunks(self, k: int, n: int, rows: int, run) -> tuple[list, list]:
        """``(messages, logps)`` of ``run(a, b)`` over the agent's ``n`` contexts,
        :func:`in_chunks` of ``rows``; a size halved after an out-of-memory error stays halved
        for the agent (``_gen_cap``)."""
        parts, size = in_chunks(n, rows, run, what=f"generation (agent {k})",
                                device=self.devices[k])
        if size < rows:
            self._gen_cap[k] = size
        return [m for m_, _ in parts for m in m_], [lp for _, l_ in parts for lp in l_]

    def _check_logps(self, k: int, ctxs, msgs, lps):
        """Behaviour log-probs of sampled messages, checked against the training model: the
        first ``logp_check`` messages are rescored by teacher forcing; a mean per-token
        ``|Δ log π|`` above :meth:`logp_tolerance` raises, and the statistics are kept for
        the rollout's record (:meth:`_rollout_extra`). An engine that
        reports no log-probs gets all of its messages rescored, and those are the behaviour
        log-probs (nothing to compare then)."""
        if lps is None:
            self._rescored += len(msgs)
            return self._score(k, ctxs, msgs)
        n = min(self.cfg.logp_check, len(msgs))
        if n:
            ref = self._score(k, ctxs[:n], msgs[:n])
            d = np.concatenate([np.abs(np.asarray(lp, dtype=np.float64) - r)
                                for lp, r in zip(lps[:n], ref, strict=True)])
            st = self._logp_stats
            st[0], st[1], st[2] = st[0] + float(d.sum()), st[1] + d.size, max(st[2], float(d.max()))
            tol = self.logp_tolerance()
            if d.mean() > tol:
                raise RolloutMismatchError(
                    f"agent {k}: the training model does not reproduce the engine's behaviour "
                    f"log-probs (mean |Δ log π| per token {d.mean():.3g} > tolerance {tol:.3g}, "
                    f"max {d.max():.3g}, over {d.size} tokens): a stale adapter, another chat "
                    "template or temperature, or a numerics bug")
        return lps

    def _begin_rollout(self) -> None:
        self._logp_stats, self._rescored = [0.0, 0, 0.0], 0
        self.peak_memory(reset=True)

    def peak_memory(self, reset: bool = False) -> int:
        """Peak memory in bytes since the last reset over the team's devices
        (:func:`sat_llm.models.memory_peak`: CUDA allocated, CPU resident set)."""
        return max(memory_peak(d, reset) for d in sorted(set(self.devices), key=str))

    def logp_tolerance(self) -> float:
        """Largest mean per-token |Δ log π| the behaviour log-prob check tolerates (the
        loosest of the agents' dtypes' :data:`LOGP_TOL` unless ``logp_tol`` is set)."""
        return self.cfg.logp_tol or max(LOGP_TOL[str(t).removeprefix("torch.")] for t in self.dtypes)

    def _rollout_extra(self) -> dict:
        """What the rollout's checks saw: ``logp_check = {mean_abs, max_abs, n_tokens,
        rescored, tol}`` (per-token |Δ log π| engine vs training model, :meth:`_check_logps`;
        ``rescored``: messages whose engine reported no log-probs) and the peak memory."""
        total, n, mx = self._logp_stats
        chk = dict(mean_abs=total / n if n else None, max_abs=mx if n else None, n_tokens=n,
                   rescored=self._rescored, tol=self.logp_tolerance())
        return dict(logp_check=chk, peak_memory_bytes=self.peak_memory())

    @torch.no_grad()
    def _score(self, agent: int, ctxs, msgs) -> list[np.ndarray]:
        """Per-token log-probabilities of ``msgs`` under the agent (teacher forcing)."""
        model = self._activate(agent)
        pad = self.tokenizer(agent).pad_token_id

        def run(a, b):
            logp, toks, mask = score_logits(model, ctxs[a:b], msgs[a:b], pad_id=pad,
                                            temperature=self.cfg.temperature, share_prefix=True)
            tl = message_logprobs(logp, toks, mask).double().cpu().numpy()
            return [tl[i, :len(m)] for i, m in enumerate(msgs[a:b])]

        parts = self._chunked(agent, len(ctxs), run, "scoring")
        return [r for p in parts for r in p]

    def _chunked(self, agent: int, n: int, fn, what: str) -> list:
        """:func:`in_chunks` of the agent's no-grad passes in micro-batches; a size halved on
        an out-of-memory error stays halved for the agent."""
        bar = progress_bar(n, desc=f"{what} (agent {agent})", unit="row")

        def counted(a, b):
            out = fn(a, b)
            bar.update(b - a)
            return out

        parts, size = in_chunks(n, self._micro[agent], counted, what=f"{what} (agent {agent})",
                                device=self.devices[agent])
        bar.close()
        self._micro[agent] = min(self._micro[agent], size)
        return parts

    # ---------------------------------------------------------------- scoring and KL
    def _turns(self, agent: int, batch: Batch):
        turns = [t for _, t in batch.turns_of(agent)]
        return [t.context.ids for t in turns], [t.action for t in turns], np.array([t.logp for t in turns])

    def _ref_logps(self, agent: int, batch: Batch, reference: AgentSnapshot, ctxs, msgs,
                   defer=frozenset()):
        """Reference log-probabilities (full vocabulary, float64) as row chunks ``[[start,
        end, (logp, tokens, mask)], ...]`` of the agent's micro-batch size (read them with
        :func:`_rows`), cached for the current (batch, agent, reference) triple (backtracking
        retries and the monitor reuse them).

        ``defer``: row ranges ``(a, b)`` left as ``[a, b, None]`` for the caller to fill with
        a forward it runs anyway at the reference weights (the
        update's first minibatch, :meth:`update`); a later call without ``defer`` computes
        any range still missing."""
        key = (id(batch), batch.rollout_id, agent, id(reference), reference.version)
        if self._ref_cache is not None and self._ref_cache[0] == key:
            out = self._ref_cache[1]
            if defer or all(c[2] is not None for c in out):
                return out
        else:
            out = None
        self._set_weights(agent, reference.weights, adapter="ref")
        model = self._activate(agent, "ref")
        pad = self.tokenizer(agent).pad_token_id
        done = {(c[0], c[1]): c for c in out or () if c[2] is not None}

        @torch.no_grad()
        def run(a, b):
            if (a, b) in done:
                return done[(a, b)]
            if (a, b) in defer:
                return [a, b, None]
            return [a, b, score_logits(model, ctxs[a:b], msgs[a:b], pad_id=pad,
                                       temperature=self.cfg.temperature, dtype=torch.float64,
                                       share_prefix=True)]

        out = self._chunked(agent, len(ctxs), run, "reference scoring")
        self._ref_cache = (key, out)
        return out

    def _minibatch_loss(self, agent: int, ctxs, msgs, beh, adv, ref_mb, beta: float, M: int):
        """``(loss, seq_logp, kl, surr)`` of one minibatch at the current adapter:
        ``loss = −(Σ_m surr_m − β Σ_m KL̂_exact(m)) / M`` (so a pass over the batch sums to
        ``−L^clip + β·mean KL̂``), ``surr_m`` in the configured ratio form (:mod:`sat_llm.loss`;
        ``beh``: summed behaviour log-probs for ``sequence``; ``token`` takes its old per-token
        log-probs from the reference pass ``ref_mb = (logp, tokens, mask)``).
        ``ref_mb=None``: the adapter is at the reference weights, and this forward's logits
        (in float64, detached) are the reference pass of these rows; the entry is returned as
        a fifth element (:meth:`update` caches it)."""
        # shared context prefixes run once here too: autograd sums the gradient of
        # each repeated KV cache over its rows (same loss and gradient up to roundoff)
        # (with gradient checkpointing the layers drop any KV cache: no shared prefixes then)
        scored = score_logits(self._activate(agent), ctxs, msgs,
                              pad_id=self.tokenizer(agent).pad_token_id,
                              temperature=self.cfg.temperature,
                              share_prefix=not self.cfg.grad_checkpointing,
                              also_float64=ref_mb is None)
        logp, toks, mask = scored[:3]
        made = None
        if ref_mb is None:  # the same logits a no-grad float64 reference pass computes
            made = ref_mb = (scored[3], toks.detach(), mask.double())
        lp_ref, toks_ref, mask_ref = ref_mb
        tok = message_logprobs(logp, toks, mask)
        seq = tok.sum(-1)
        if self.cfg.ratio == "token":
            old = message_logprobs(lp_ref, toks_ref, mask_ref).to(tok.dtype)
            surr = token_clipped_surrogate(tok, old, mask, adv, self.cfg.eps_w)
        else:
            surr = clipped_surrogate(seq, beh, adv, self.cfg.eps_w)
        # β that rounds to 0 in float32 (the loss's dtype; e.g. β = 1e-300 for plain GRPO)
        # adds exactly 0 to loss and gradient: the KL is then measured, not differentiated
        with torch.set_grad_enabled(torch.is_grad_enabled()
                                    and float(torch.tensor(float(beta), dtype=torch.float32)) != 0):
            klv = sequence_kl(lp_ref, logp.double(), mask.double()).float()
        loss = -(surr.sum() - float(beta) * klv.sum()) / M
        return (loss, seq, klv, surr) if made is None else (loss, seq, klv, surr, made)

    @torch.no_grad()
    def kl(self, agent: int, batch: Batch, reference: AgentSnapshot) -> dict:
        """``{"kl": mean exact token-sum KL, "kl_max", "kl_sampled": mean eq. 18 estimate,
        "logp": current per-turn log-probabilities}`` on the agent's messages in ``batch``.

        An agent still at the reference's parameter version (an update skipped because every
        advantage was 0, or a rejected step restored) has the reference's weights, so its
        pass would repeat the reference pass number for number: the reference pass is used
        for both (KL exactly 0, one forward instead of two; none when it is cached)."""
        ctxs, msgs, _ = self._turns(agent, batch)
        if not msgs:
            res = dict(kl=0.0, kl_max=0.0, kl_sampled=0.0, logp=np.zeros(0), n_turns=0, n_tokens=0)
            self.last_kl[agent] = res
            return res
        refs = self._ref_logps(agent, batch, reference, ctxs, msgs)
        model = self._activate(agent)
        pad = self.tokenizer(agent).pad_token_id

        at_ref = self._version[agent] == reference.version

        def run(a, b):
            lp_ref, toks, mask = _rows(refs, a, b, _longest(msgs[a:b]))
            logp = lp_ref if at_ref else score_logits(
                model, ctxs[a:b], msgs[a:b], pad_id=pad, temperature=self.cfg.temperature,
                dtype=torch.float64, share_prefix=True)[0]
            tok_new = message_logprobs(logp, toks, mask)
            tok_ref = message_logprobs(lp_ref, toks, mask)
            return (sequence_kl(lp_ref, logp, mask).double(),
                    sampled_sequence_kl(tok_ref, tok_new, mask).double(),
                    tok_new.sum(-1).double(), int(mask.sum()))

        parts = self._chunked(agent, len(ctxs), run, "KL monitor")
        ex, sa, lp = (torch.cat([p[i] for p in parts]).cpu().numpy() for i in range(3))
        n_tok = sum(p[3] for p in parts)
        res = dict(kl=float(ex.mean()), kl_max=float(ex.max()), kl_sampled=float(sa.mean()),
                   logp=lp, n_turns=len(msgs), n_tokens=n_tok,
                   kl_per_token=float(ex.sum() / max(n_tok, 1)))
        self.last_kl[agent] = res
        return res

