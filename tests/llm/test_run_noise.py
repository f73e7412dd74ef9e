"""The parity interval that includes the training runs' own noise (study_metrics.run_noise_interval):
its coverage is the nominal one when the methods are equal, and it is not when the formula is
changed to the bootstrap's view that ignores run noise or to a normal quantile."""

import numpy as np
import pytest

from experiments.study_metrics import run_noise_interval


def _simulate(delta, *, P=3, sd=4.0, trials=4000, seed=0):
    """``trials`` studies of ``P`` seeds: d_s = delta + e_s, r_s = e'_s, e ~ N(0, sd²)."""
    rng = np.random.default_rng(seed)
    return (delta + sd * rng.standard_normal((trials, P)),
            sd * rng.standard_normal((trials, P)))


def _coverage(delta, **kw):
    D, R = _simulate(delta, **kw)
    hits = [(lambda iv: iv[1] <= delta <= iv[2])(run_noise_interval(d, r)["delta"])
            for d, r in zip(D, R, strict=True)]
    return float(np.mean(hits))


def test_interval_of_the_method_difference_covers_it_at_the_nominal_rate():
    assert 0.935 < _coverage(0.0) < 0.965
    assert 0.935 < _coverage(5.0, seed=1) < 0.965


def test_a_normal_quantile_instead_of_student_t_would_undercover():
    """The check can fail: with 1.96 instead of t_3 = 3.18 the same studies cover δ in ~86%."""
    D, R = _simulate(0.0)
    half = 1.96 * np.sqrt((R ** 2).mean(1) / 3)
    assert (np.abs(D.mean(1)) < half).mean() < 0.9


def test_single_seed_bound_is_exceeded_five_percent_of_the_time_under_equal_methods():
    D, R = _simulate(0.0, seed=2)
    outside = np.mean([not all(run_noise_interval(d, r)["within_noise"]) for d, r in zip(D, R, strict=True)])
    # three seeds, each outside with probability 0.05 (not independent: one v̂)
    assert 0.08 < outside < 0.2


def test_a_real_difference_far_beyond_the_run_noise_is_detected():
    out = run_noise_interval([-10.0, -9.0, -11.0], [1.0, -0.5, 0.8])
    assert out["delta"][2] < 0 and not any(out["within_noise"])
    assert out["seeds_only"][2] < 0


def test_the_worked_numbers():
    out = run_noise_interval([2.0, -1.0, 5.0], [3.0, -3.0, 0.0])
    v = (9 + 9 + 0) / 3
    assert out["run_noise_sd"] == pytest.approx(np.sqrt(v))
    assert out["per_seed_bound"] == pytest.approx(3.182446305 * np.sqrt(v), rel=1e-8)
    assert out["delta"][0] == pytest.approx(2.0)
    assert out["delta"][2] - 2.0 == pytest.approx(3.182446305 * np.sqrt(v / 3), rel=1e-8)
    assert out["seeds_only"][2] - 2.0 == pytest.approx(4.302652730 * np.std([2, -1, 5], ddof=1) / np.sqrt(3), rel=1e-8)


def test_too_few_seeds_is_refused():
    with pytest.raises(ValueError, match="per-seed differences"):
        run_noise_interval([1.0], [1.0])


def test_report_paragraph_states_the_interval_and_each_seed_against_the_bound():
    from experiments.report import _run_noise_paragraph

    par = [dict(seed=0, lenient_auc=(-0.081, -0.11, -0.05), noise_floor_auc=(0.03, 0.0, 0.06)),
           dict(seed=1, lenient_auc=(0.029, 0.01, 0.05), noise_floor_auc=(-0.02, -0.04, 0.0)),
           dict(seed=2, lenient_auc=(0.300, 0.25, 0.35), noise_floor_auc=None)]
    text = _run_noise_paragraph(par)
    r = run_noise_interval([-0.081, 0.029, 0.300], [0.03, -0.02])
    assert f"{100 * r['run_noise_sd']:.1f} points RMS over 2 seed(s)" in text
    assert "seed 0 -8.1 (within)" in text and "seed 2 +30.0 (beyond)" in text
    assert f"{100 * r['delta'][0]:+.1f} [{100 * r['delta'][1]:+.1f}" in text
    assert "not yet measured" in _run_noise_paragraph(par[:1])
