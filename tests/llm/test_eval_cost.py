"""Issue 21 item 6: the pooled held-out evaluation (``greedy_pooled``: the system prefix
prefilled once, rows ordered by length and prefilled in chunks, all rows decoded together,
each leaving when it stops) gives the messages and records of plain per-problem greedy
``generate``, in the problems' order, however the chunks are regrouped."""

import numpy as np
import pytest

pytest.importorskip("transformers")

import sat_llm.scoring as scoring  # noqa: E402  (the module whose passes call these)
from sat_llm.rollout import generate  # noqa: E402
from sat_llm.team import greedy_pooled, stop_ids  # noqa: E402
from tests.llm.helpers import arithmetic_eval_team  # noqa: E402


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    yield from arithmetic_eval_team(tmp_path_factory)


_EXTRA_STOP: list[int] = []


def _kw(tok):
    """Generation settings; the tiny random model never emits its real stop tokens, so one
    token it does emit (:func:`_stops`) is added as a stop: rows then end at different steps."""
    return dict(max_new_tokens=6, temperature=0.7, stop_ids=[*stop_ids(tok), *_EXTRA_STOP],
                pad_id=tok.pad_token_id)


@pytest.fixture(scope="module", autouse=True)
def _stops(team):
    """The third token of the first held-out context's plain greedy message becomes a stop
    token for the direct tests (chosen at run time: deterministic for the seeded model)."""
    tok, model = team.tokenizer(0), team._activate(0)
    ctx = team.protocol.render(tok, team.eval_set[0].prompt, [], 0, True)
    m, _ = generate(model, [ctx], greedy=True, **_kw(tok))
    _EXTRA_STOP[:] = [m[0][min(2, len(m[0]) - 1)]]
    yield
    _EXTRA_STOP.clear()


def _loop(model, ctxs, kw):
    """The reference: one plain greedy ``generate`` call per context."""
    out = [generate(model, [c], greedy=True, share_prefix=False, **kw) for c in ctxs]
    return [m[0] for m, _ in out], [lp[0] for _, lp in out]


@pytest.fixture(scope="module")
def ragged(team):
    """Held-out contexts cut to different lengths, longest first in places, so ordering by
    length permutes the rows and chunks need padding and widened caches."""
    tok = team.tokenizer(0)
    ctxs = [team.protocol.render(tok, p.prompt, [], 0, True) for p in team.eval_set]
    for i, cut in ((1, 5), (3, 3), (4, 1), (7, 4), (10, 2)):
        ctxs[i] = ctxs[i][:-cut]
    return ctxs


def test_ragged_contexts_are_reordered(ragged):
    order = sorted(range(len(ragged)), key=lambda i: len(ragged[i]))
    assert order != list(range(len(ragged)))  # the sort moves rows: the mapping is exercised
    assert len({len(c) for c in ragged}) >= 4


@pytest.mark.parametrize("chunk", [1, 2, 5, 12])
def test_pooled_equals_per_problem_generate(team, ragged, chunk):
    tok, model = team.tokenizer(0), team._activate(0)
    kw = _kw(tok)
    ref_m, ref_l = _loop(model, ragged, kw)
    assert len({tuple(m) for m in ref_m}) > 1  # distinct messages: a swapped row would show
    m, lp = greedy_pooled(model, ragged, chunk=chunk, **kw)
    assert m == ref_m
    for a, b in zip(lp, ref_l, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_pooled_keeps_the_problem_to_message_mapping(team, ragged):
    """Reversing (or rotating) the inputs reverses (rotates) the outputs: each message
    belongs to its own context, not to its slot in the length order."""
    tok, model = team.tokenizer(0), team._activate(0)
    kw = _kw(tok)
    m, _ = greedy_pooled(model, ragged, chunk=5, **kw)
    rev, _ = greedy_pooled(model, ragged[::-1], chunk=5, **kw)
    rot, _ = greedy_pooled(model, ragged[3:] + ragged[:3], chunk=2, **kw)
    assert rev == m[::-1]
    assert rot == m[3:] + m[:3]
    assert rev != m  # not a trivially symmetric case


def test_a_broken_mapping_is_caught(team, ragged):
    """The comparison above fails when the pooled path returns rows in length order (the
    bug the regrouping could introduce)."""
    tok, model = team.tokenizer(0), team._activate(0)
    kw = _kw(tok)
    ref_m, _ = _loop(model, ragged, kw)
    order = sorted(range(len(ragged)), key=lambda i: len(ragged[i]))
    m, _ = greedy_pooled(model, ragged, chunk=5, **kw)
    assert [m[i] for i in order] != ref_m


def test_evaluate_records_equal_the_per_problem_loop(team, monkeypatch):
    """``evaluate`` + ``eval_records`` through the pooled path equal the same with every
    problem generated alone by plain ``generate`` (and the chunked path of before)."""
    def loop(model, contexts, *, chunk, **kw):
        return _loop(model, contexts, kw)

    def chunked(model, contexts, *, chunk, **kw):
        parts = [scoring.greedy_shared_prefix(model, contexts[a:a + chunk], **kw)
                 for a in range(0, len(contexts), chunk)]
        return [m for p in parts for m in p[0]], [lp for p in parts for lp in p[1]]

    out = {}
    monkeypatch.setattr(scoring, "stop_ids", lambda tok: _kw(tok)["stop_ids"])
    for name, fn in (("pooled", greedy_pooled), ("loop", loop), ("chunked", chunked)):
        monkeypatch.setattr(scoring, "greedy_pooled", fn)
        team._eval_cache.clear()
        acc = team.evaluate()
        out[name] = (acc, team.eval_records())
    assert out["pooled"] == out["loop"] == out["chunked"]
    recs = out["pooled"][1]
    assert [r["id"] for r in recs] == list(range(len(team.eval_set)))
    assert [r["prompt"] for r in recs] == [p.prompt for p in team.eval_set]


def test_pooled_drops_finished_rows(team, ragged, monkeypatch):
    """A decoding step runs only the rows still going: the row-steps of the pooled path are
    the sum of the message lengths (less the first token, from the prefill), where one
    ``generate`` per chunk runs every row until the chunk's longest message ends."""
    tok, model = team.tokenizer(0), team._activate(0)
    body = model.get_base_model().get_decoder()  # the prefix prefill runs only the body
    rows = []
    h = body.register_forward_pre_hook(
        lambda _m, a, k: rows.append(k["input_ids"].shape) if k["input_ids"].shape[1] == 1
        else None, with_kwargs=True)
    try:
        m, _ = greedy_pooled(model, ragged, chunk=5, **_kw(tok))
    finally:
        h.remove()
    assert len({len(x) for x in m}) > 1  # rows stop at different steps: some leave early
    assert sum(b for b, _ in rows) == sum(len(x) - 1 for x in m)
    assert len(rows) == max(len(x) for x in m) - 1  # one step per token, for all chunks
