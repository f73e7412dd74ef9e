"""Held-out evaluation: shared-prefix greedy decoding equals plain greedy decoding, and every
eval record carries the strict and lenient scores and the format flag."""

import numpy as np
import pytest

pytest.importorskip("transformers")

from sat_llm.rollout import generate  # noqa: E402
from sat_llm.team import greedy_shared_prefix, stop_ids  # noqa: E402
from tests.llm.helpers import arithmetic_eval_team  # noqa: E402


@pytest.fixture(scope="module")
def team(tmp_path_factory):
    yield from arithmetic_eval_team(tmp_path_factory)


def test_shared_prefix_greedy_equals_plain_greedy(team):
    tok, model = team.tokenizer(0), team._activate(0)
    ctxs = [team.protocol.render(tok, p.prompt, [], 0, True) for p in team.eval_set]
    ctxs[3] = ctxs[3][:-3]  # contexts of different lengths: padding between prefix and rest
    kw = dict(max_new_tokens=6, temperature=0.7, stop_ids=stop_ids(tok), pad_id=tok.pad_token_id)
    plain_m, plain_l = generate(model, ctxs, greedy=True, **kw)
    m, l_ = greedy_shared_prefix(model, ctxs, **kw)
    assert m == plain_m
    for a, b in zip(l_, plain_l, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    # a shifted position (prefix not reused as the same positions) changes the messages
    assert len({len(c) for c in ctxs}) > 1


def test_eval_records_carry_strict_lenient_and_format(team):
    team.evaluate()
    recs = team.eval_records()
    assert len(recs) == len(team.eval_set)
    for r, p in zip(recs, team.eval_set, strict=True):
        assert r["lenient"] == r["score"] == team.task.score(p, r["final"])
        assert r["strict"] == team.task.strict_score(p, r["final"])
        assert r["format_ok"] == team.task.format_ok(r["final"])
        assert r["strict"] <= r["lenient"]
