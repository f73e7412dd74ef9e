"""The study's curve metrics, intervals and tests (experiments/study_metrics.py)."""

from fractions import Fraction

import numpy as np
import pytest

from experiments.study_metrics import (
    bootstrap,
    common_checkpoints,
    compare_runs,
    curve_metrics,
    mcnemar_exact,
)

# 3 checkpoints x 4 problems: accuracies 1/2, 3/4, 1/2
S = [[1, 0, 0, 1], [1, 1, 0, 1], [0, 1, 0, 1]]


def test_metrics_of_a_hand_computed_curve():
    m = curve_metrics(S)
    want = dict(auc=Fraction(1, 2) / 3 + Fraction(3, 4) / 3 + Fraction(1, 2) / 3,
                final=Fraction(1, 2), best=Fraction(3, 4), drawdown=Fraction(1, 4),
                worst_drop=Fraction(1, 4), below_untrained=0)
    assert m == pytest.approx({k: float(v) for k, v in want.items()}, abs=1e-15)
    # a curve that only rises has no drawdown and no drop; one below its start counts
    assert curve_metrics([[0, 0], [1, 0], [1, 1]])["worst_drop"] == 0.0
    low = curve_metrics([[1, 1], [0, 1], [1, 1], [0, 0]])
    assert low["below_untrained"] == pytest.approx(2 / 3) and low["worst_drop"] == 1.0


def test_mcnemar_exact_hand_computed():
    a = [1, 1, 1, 0, 0, 1, 1, 1]
    b = [0, 0, 0, 0, 1, 1, 1, 1]  # n10 = 3, n01 = 1: p = 2 (C(4,0) + C(4,1)) / 2^4
    assert mcnemar_exact(a, b) == pytest.approx(10 / 16)
    assert mcnemar_exact(a, a) == 1.0
    assert mcnemar_exact([1] * 10, [0] * 10) == pytest.approx(2 / 2 ** 10)


def test_bootstrap_equals_an_explicit_loop_over_resamples():
    rng = np.random.default_rng(3)
    A, B = (rng.integers(0, 2, size=(5, 30)) for _ in range(2))
    got = bootstrap(A, B, reps=200, seed=7)
    idx = np.random.default_rng(7).integers(0, 30, size=(200, 30))
    for name in ("auc", "final", "best", "drawdown", "worst_drop", "below_untrained"):
        draws = []
        for r in idx:
            ma, mb = curve_metrics(A[:, r]), curve_metrics(B[:, r])
            draws.append(ma[name] - mb[name])
        lo, hi = np.percentile(draws, [2.5, 97.5])
        value = curve_metrics(A)[name] - curve_metrics(B)[name]
        assert got[name] == pytest.approx((value, lo, hi), abs=1e-12), name


def test_paired_difference_of_a_run_with_itself_is_exactly_zero_and_dominance_excludes_zero():
    A = np.random.default_rng(0).integers(0, 2, size=(4, 50))
    assert all(v == (0.0, 0.0, 0.0) for v in bootstrap(A, A, reps=500).values())
    B = A.copy()
    B[:, :15] = 0  # b loses 15 problems a may solve at every checkpoint
    A[:, :15] = 1
    c = compare_runs(A, B, reps=500)
    assert c["diff"]["final"][1] > 0 and c["diff"]["auc"][1] > 0 and c["mcnemar_p"] < 1e-3
    with pytest.raises(ValueError, match="same checkpoints"):
        bootstrap(A, B[:3])


def test_common_checkpoints_on_the_message_grid():
    single = {k: 32 * k for k in range(49)}          # every stage, 32 messages each
    trl = {k: 32 * k for k in range(0, 49, 4)}        # every 4 generations
    comlrl = {k: 40 * k for k in (0, 3, 6, 10, 13, 16, 19, 22, 26, 29, 32, 35, 38)}
    rows = common_checkpoints([single, trl, comlrl], 128)
    assert [r[0] for r in rows] == list(range(0, 49, 4)) and [r[1] for r in rows] == list(range(0, 49, 4))
    assert [r[2] for r in rows] == [0, 3, 6, 10, 13, 16, 19, 22, 26, 29, 32, 35, 38]
    sparse = {0: 0, 8: 256}  # a run evaluated every 8 stages shares only 0 and 256 messages
    assert common_checkpoints([single, sparse], 128) == [[0, 0], [8, 8]]


def test_pooled_bootstrap_is_the_mean_of_the_seeds_with_an_explicit_stratified_loop():
    from experiments.study_metrics import bootstrap_pooled

    rng = np.random.default_rng(5)
    pairs = [tuple(rng.integers(0, 2, size=(3, m)) for _ in range(2)) for m in (20, 31)]
    got = bootstrap_pooled(pairs, reps=300, seed=2)
    r = np.random.default_rng(2)
    idx = [r.integers(0, A.shape[1], size=(300, A.shape[1])) for A, _ in pairs]
    for name in ("auc", "final", "best", "drawdown"):
        value = np.mean([curve_metrics(A)[name] - curve_metrics(B)[name] for A, B in pairs])
        draws = [np.mean([curve_metrics(A[:, i[k]])[name] - curve_metrics(B[:, i[k]])[name]
                          for (A, B), i in zip(pairs, idx, strict=True)]) for k in range(300)]
        lo, hi = np.percentile(draws, [2.5, 97.5])
        assert got[name] == pytest.approx((value, lo, hi), abs=1e-12), name
    # one pair: the plain paired bootstrap
    assert bootstrap_pooled(pairs[:1], reps=300, seed=2) == pytest.approx(
        bootstrap(*pairs[0], reps=300, seed=2))
