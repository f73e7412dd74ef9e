"""Out-of-memory retries inside an LLM update (``Updates._accumulate``/``_backward``, the
reference pass's :func:`sat_llm.chunks.in_chunks`) do not change the update.

Out-of-memory errors are injected on chosen calls of the update's forwards (the gradient
pass and the no-grad reference pass, told apart by ``torch.is_grad_enabled()``) and
backwards; the update must then give the adapter weights and the logged numbers of an
update without any error, use every turn in exactly one micro-batch of each minibatch's
final try, and leave the reference pass of every row filled with the numbers a run without
errors computes.

Tolerance ``1e-5`` (absolute and relative): micro-batching runs the float32 model on other
row groups, each padded to its own longest message, and sums a minibatch's gradient over
them, so the same float32 operations run in another order and blocking (roundoff ~1e-7
relative per operation, a few accumulations deep; the reference pass differs by ~1e-7 for
the same reason, its log-softmax and the KL being float64). Measured: 3e-7 on an AVX2 CPU
and 1.25e-6 (one weight of 256) on an AVX-512 one, so 1e-6 was too tight for the latter. A skipped or repeated row
changes these numbers by far more (its share of the minibatch, ~1/4 here).

The ``token`` ratio reads the reference pass in the surrogate too (``sequence`` only in
the KL), so the cases run with it; the two-epoch test runs ``sequence``.
"""

import copy
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm import scoring  # noqa: E402  (the module whose score_logits the update calls)
from sat_llm.chunks import _longest, _rows  # noqa: E402
from sat_llm.team import LLMConfig, LLMTeam  # noqa: E402

torch.set_num_threads(1)

TOL = dict(rtol=1e-5, atol=1e-5)
#: the update's logged numbers that must not depend on the micro-batch size
LOGGED = ("opt_steps", "loss", "kl_train", "surrogate_clip", "grad_norm", "lr")


def _fresh(ratio: str, micro_batch: int, epochs: int = 1):
    """A one-agent tiny-random team (minibatch 4) and a rollout of 8 turns."""
    team = LLMTeam(LLMConfig(model="tiny-random", task="copy", agents=1, max_new_tokens=6,
                             n_train=16, n_eval=2, minibatch=4, micro_batch=micro_batch,
                             epochs=epochs, ratio=ratio, lr=1e-2, seed=0, threads=1,
                             device="cpu", dtype="float32"))
    batch = team.rollout(2, 4)
    assert len(batch.turns_of(0)) == 8
    return team, batch


class _Faults:
    """Raises ``torch.OutOfMemoryError`` on the chosen calls while armed: ``fail`` is a set of
    ``(kind, n)``, the ``n``-th call (from 1) of kind ``grad`` (the update's forward),
    ``ref`` (a no-grad reference-pass forward) or ``backward``."""

    def __init__(self, fail):
        self.fail, self.calls, self.armed = set(fail), {"grad": 0, "ref": 0, "backward": 0}, False

    def hit(self, kind: str) -> None:
        if not self.armed:
            return
        self.calls[kind] += 1
        n = self.calls[kind]
        if (kind, n) in self.fail:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected: {kind} #{n})")


def _install(monkeypatch, faults: _Faults, log: list) -> None:
    """The fault injection, and the record ``log`` of the update: ``("minibatch", s, e)`` when
    a minibatch starts, ``(a, b)`` for a micro-batch whose backward succeeded, ``None`` for one
    that ran out of memory (its minibatch is then redone)."""
    real_score, real_backward = scoring.score_logits, torch.Tensor.backward
    real_acc, real_bwd = LLMTeam._accumulate, LLMTeam._backward

    def score(*a, **k):
        faults.hit("grad" if torch.is_grad_enabled() else "ref")
        return real_score(*a, **k)

    def backward(self, *a, **k):
        faults.hit("backward")
        return real_backward(self, *a, **k)

    def accumulate(self, agent, ctxs, msgs, behT, adv, refs, beta, M, s, e, fill):
        log.append(("minibatch", s, e))
        return real_acc(self, agent, ctxs, msgs, behT, adv, refs, beta, M, s, e, fill)

    def backward_pass(self, agent, ctxs, msgs, behT, adv, refs, beta, M, a, b, fill):
        try:
            out = real_bwd(self, agent, ctxs, msgs, behT, adv, refs, beta, M, a, b, fill)
        except torch.OutOfMemoryError:
            log.append(None)
            raise
        log.append((a, b))
        return out

    monkeypatch.setattr(scoring, "score_logits", score)
    monkeypatch.setattr(torch.Tensor, "backward", backward)
    monkeypatch.setattr(LLMTeam, "_accumulate", accumulate)
    monkeypatch.setattr(LLMTeam, "_backward", backward_pass)


def _final_tries(log: list) -> list[tuple[int, int, list]]:
    """``[(s, e, micro-batches of the minibatch's last try), ...]`` from :func:`_install`'s
    record."""
    out = []
    for x in log:
        if x is not None and x[0] == "minibatch":
            out.append((x[1], x[2], []))
        elif x is None:
            out[-1][2].clear()
        else:
            out[-1][2].append(x)
    return out


def _update(team, batch, faults=None):
    """Agent 0's update (advantages fixed, β = 0.1) with ``faults`` armed; ``(info, reference
    pass of all rows, kl)``."""
    ctxs, msgs, _ = team._turns(0, batch)
    ref = team.snapshot(0)
    if faults is not None:
        faults.armed = True
    try:
        info = team.update(0, batch, np.linspace(-1, 1, len(msgs)), 0.1, ref)
    finally:
        if faults is not None:
            faults.armed = False
    chunks = team._ref_cache[1]
    assert all(c[2] is not None for c in chunks)  # every deferred reference row was filled
    refs = _rows(chunks, 0, len(msgs), _longest(msgs))
    return info, refs, team.kl(0, batch, ref)


@pytest.fixture(scope="module")
def runs():
    """Per ``(ratio, micro_batch, epochs)``: a team and rollout before the update (copied by
    each test) and the update without any error."""
    cache = {}

    def get(ratio, micro_batch, epochs=1):
        key = (ratio, micro_batch, epochs)
        if key not in cache:
            team, batch = _fresh(ratio, micro_batch, epochs)
            fresh = copy.deepcopy((team, batch))
            cache[key] = fresh, (team, *_update(team, batch))
        fresh, plain = cache[key]
        return copy.deepcopy(fresh), plain

    return get


# (micro_batch setting, injected errors, micro-batch size after the update)
CASES = {
    "first forward": (0, {("grad", 1)}, 2),
    "second forward (the second minibatch)": (0, {("grad", 2)}, 2),
    "a later micro-batch of the first minibatch": (2, {("grad", 2)}, 1),
    "twice in a row": (0, {("grad", 1), ("grad", 2)}, 1),
    "a backward": (0, {("backward", 1)}, 2),
    "a reference chunk before the update": (0, {("ref", 1)}, 2),
    # the first minibatch's forward, then the reference pass that fills its deferred rows
    # (they were deferred in chunks of 4, the retry runs 2): the second halves the micro-batch
    # while the first minibatch's loop is running
    "the forward, then the deferred rows' reference pass": (0, {("grad", 1), ("ref", 2)}, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_out_of_memory_retries_give_the_update_without_errors(runs, monkeypatch, caplog, case):
    micro_batch, fail, micro_after = CASES[case]
    (team, batch), (plain, info0, refs0, kl0) = runs("token", micro_batch)
    faults, log = _Faults(fail), []
    _install(monkeypatch, faults, log)
    with caplog.at_level(logging.WARNING, logger="sat_llm"):
        info, refs, kl = _update(team, batch, faults)
    assert sum(1 for r in caplog.records if "out of memory" in r.getMessage()) == len(fail)
    assert info["micro_batch"] == micro_after and info0["micro_batch"] == (micro_batch or 4)
    # every turn in exactly one micro-batch of its minibatch's final try, in order
    tries = _final_tries(log)
    assert [(s, e) for s, e, _ in tries] == [(0, 4), (4, 8)]
    for s, e, parts in tries:
        rows = [r for a, b in parts for r in range(a, b)]
        assert rows == list(range(s, e)), (s, e, parts)
    for k in LOGGED:
        np.testing.assert_allclose(info[k], info0[k], **TOL, err_msg=k)
    for k, w in plain._get_weights(0).items():
        torch.testing.assert_close(team._get_weights(0)[k], w, **TOL)
    for x, x0 in zip(refs, refs0, strict=True):  # the reference pass, deferred rows included
        torch.testing.assert_close(x, x0, **TOL)
    for k in ("kl", "kl_max", "kl_sampled", "logp"):
        np.testing.assert_allclose(kl[k], kl0[k], **TOL, err_msg=k)


def test_two_epochs_reuse_the_rows_filled_after_an_out_of_memory_error(runs, monkeypatch):
    """The second pass over the batch reads the reference rows the first minibatch's retried
    forward filled."""
    (team, batch), (plain, info0, _, _) = runs("sequence", 0, 2)
    faults, log = _Faults({("grad", 1), ("ref", 2)}), []
    _install(monkeypatch, faults, log)
    info, _, _ = _update(team, batch, faults)
    assert [(s, e) for s, e, _ in _final_tries(log)] == [(0, 4), (4, 8)] * 2
    assert all([r for a, b in p for r in range(a, b)] == list(range(s, e))
               for s, e, p in _final_tries(log))
    for k in LOGGED:
        np.testing.assert_allclose(info[k], info0[k], **TOL, err_msg=k)
    for k, w in plain._get_weights(0).items():
        torch.testing.assert_close(team._get_weights(0)[k], w, **TOL)
