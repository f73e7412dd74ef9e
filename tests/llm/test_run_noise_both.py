"""The parity interval with both methods' reruns (study_metrics.run_noise_interval's
``reruns_a``): it keeps the nominal coverage when one method's runs are much noisier than the
other's, where the interval that assumes equal noise undercovers."""

import numpy as np
import pytest

from experiments.study_metrics import run_noise_interval


def _simulate(delta, *, P=3, sd_a=6.0, sd_b=2.0, trials=4000, seed=0):
    """``trials`` studies of ``P`` seeds with run noise sd_a (method A) and sd_b (B):
    d_s = δ + a_s − b_s, r^B_s = b'_s − b''_s, r^A_s = a'_s − a''_s."""
    rng = np.random.default_rng(seed)
    n = lambda: rng.standard_normal((trials, P))  # noqa: E731
    return (delta + sd_a * n() - sd_b * n(), sd_b * (n() - n()), sd_a * (n() - n()))


def _coverage(delta, both, **kw):
    D, RB, RA = _simulate(delta, **kw)
    hits = [(lambda iv: iv[1] <= delta <= iv[2])(
        run_noise_interval(d, rb, reruns_a=ra if both else None)["delta"])
        for d, rb, ra in zip(D, RB, RA, strict=True)]
    return float(np.mean(hits))


def test_with_both_methods_reruns_the_coverage_is_nominal_under_unequal_noise():
    assert 0.93 < _coverage(0.0, True) < 0.97
    assert 0.93 < _coverage(3.0, True, seed=1) < 0.97


def test_assuming_equal_noise_undercovers_when_the_first_method_is_noisier():
    assert _coverage(0.0, False) < 0.85


def test_equal_reruns_pool_into_one_t_with_all_their_degrees_of_freedom():
    r = [3.0, -3.0, 0.0]
    both = run_noise_interval([2.0, -1.0, 5.0], r, reruns_a=r)
    one = run_noise_interval([2.0, -1.0, 5.0], r)
    assert both["run_noise_sd"] == pytest.approx(one["run_noise_sd"]) and both["dof"] == pytest.approx(6.0)
    assert both["per_seed_bound"] == pytest.approx(2.446911851 * np.sqrt(6.0), rel=1e-8)  # t_6
    assert one["dof"] == 3.0


def test_report_paragraph_uses_plains_reruns_once_there_are_any():
    from experiments.report import _run_noise_paragraph

    par = [dict(seed=0, lenient_auc=(-0.081, 0, 0), noise_floor_auc=(0.02, 0, 0),
                noise_floor_plain_auc=(0.09, 0, 0)),
           dict(seed=1, lenient_auc=(0.029, 0, 0), noise_floor_auc=(-0.01, 0, 0),
                noise_floor_plain_auc=None)]
    text = _run_noise_paragraph(par)
    r = run_noise_interval([-0.081, 0.029], [0.02, -0.01], reruns_a=[0.09])
    assert "two plain runs that differ only in our seed by 9.0 over 1" in text
    assert f"{100 * r['per_seed_bound']:.1f} points with probability 5%" in text
    assert "seed 0 -8.1 (within)" in text and "of each method's own size" in text
    for p in par:
        p.pop("noise_floor_plain_auc")
    assert "are not yet run" in _run_noise_paragraph(par)
