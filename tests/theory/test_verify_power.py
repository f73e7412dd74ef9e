"""The checks that keep ``sat verify`` honest (issue 25): planted violations against every
named tolerance, every check's known-false variants, and the estimator constants where they
are exact."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, kstest, kstwo

from sat_theory.estimators import (
    dkw_epsilon,
    empirical_stage_bound,
    group_advantages,
    hoeffding_epsilon,
    ratio_clipping_term,
)
from sat_theory.stage0 import align_distill, probe_kl
from sat_theory.verify import CHECKS, load_checks
from sat_theory.verify.estimators import DKW_LEVEL, draws_to_separate, ks_statistic
from sat_theory.verify.optimization import ALIGN_BOUNDARY_TOL
from sat_theory.verify.power import DESIGNED, POWER_CHECKS

load_checks()

NEW_CHECKS = ("estimator_constants", "group_advantage_definition", "stage0_boundary",
              "file_round_trip", "input_validation", "batched_equals_loop", "planted_violations",
              "checker_power")


@pytest.mark.parametrize("name", NEW_CHECKS)
def test_new_check_passes_unmutated(name):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=None)
    assert res.cases > 0 and res.violations == 0 and res.passed, res.findings[:3]


@pytest.mark.parametrize("name,mutation", [(n, m) for n in NEW_CHECKS for m in CHECKS[n].mutations])
def test_new_check_reports_its_known_false_variant(name, mutation):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=mutation)
    assert res.violations > 0 and not res.passed, f"{name} missed {mutation}"


def test_power_checks_run_last_and_every_check_declares_a_mutation():
    names = list(CHECKS)
    assert names[-len(POWER_CHECKS):] == list(POWER_CHECKS)
    assert all(c.mutations for c in CHECKS.values())


def _loosen(monkeypatch, module, attr, factor):
    """Set a tolerance ``factor``× looser wherever it is bound (its module and every
    ``from … import`` of it)."""
    import importlib
    import sys

    mod = importlib.import_module(module)
    old = getattr(mod, attr)
    for other in list(sys.modules.values()):
        if getattr(other, "__name__", "").startswith("sat_theory"):
            if vars(other).get(attr) is old:
                monkeypatch.setattr(other, attr, old * factor)


@pytest.mark.parametrize("module,attr", [(m, a) for m, a, _ in DESIGNED])
def test_a_10x_looser_tolerance_lets_a_planted_violation_through(monkeypatch, module, attr):
    """planted_violations passes with the designed tolerances and fails as soon as one of
    them is 10× looser (the planted violation, 3× the designed tolerance, passes unseen)."""
    assert CHECKS["planted_violations"].fn(quick=True, seed=0).passed
    _loosen(monkeypatch, module, attr, 10.0)
    res = CHECKS["planted_violations"].fn(quick=True, seed=0)
    assert not res.passed and res.violations > 0, res.findings


def test_hold_tol_10x_looser_lets_a_planted_bound_violation_through(monkeypatch):
    """The primitive itself: a violation 3·HOLD_TOL·(1+|b|) is reported by Tally.lower at
    HOLD_TOL and not at 10·HOLD_TOL."""
    from sat_theory.verify.tally import Tally

    b = 2.0
    planted = b - 3e-9 * (1 + b)
    t = Tally()
    assert not t.lower(planted, b, "planted")
    _loosen(monkeypatch, "sat_theory.certificates", "HOLD_TOL", 10.0)
    t = Tally()
    assert t.lower(planted, b, "planted")


# ------------------------------------------------------------------ estimator constants
def test_ks_statistic_matches_scipy():
    u = np.random.default_rng(0).random((5, 37))
    got = ks_statistic(u)
    want = [kstest(row, "uniform").statistic for row in u]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_dkw_epsilon_is_at_its_stated_level_and_the_missing_2_is_not():
    """Exact (kstwo): Pr(D_N > ε) ∈ [DKW_LEVEL·η, η] at dkw_epsilon; without the 2 in the
    denominator it falls below 0.03η, so a level test separates them."""
    for N in (20, 100, 500):
        for eta in (0.05, 0.01):
            p = kstwo.sf(dkw_epsilon(N, eta), N)
            assert DKW_LEVEL * eta <= p <= eta
            assert kstwo.sf(math.sqrt(math.log(2 / eta) / N), N) < 0.03 * eta


def test_draws_to_separate_meets_both_error_rates():
    """The number of draws the DKW simulation uses (printed in estimator_constants'
    findings): 1480 draws at η = 0.05 and 5649 at η = 0.01 for N = 20..100."""
    eta, N = 0.05, 100
    p_bad = kstwo.sf(math.sqrt(math.log(2 / eta) / N), N)
    R, t = draws_to_separate(DKW_LEVEL * eta, p_bad, above=False)
    assert binom.cdf(t - 1, R, DKW_LEVEL * eta) <= 1e-6  # a true level is not refused
    assert binom.sf(t - 1, R, p_bad) <= 1e-6  # the missing 2 is not accepted
    R2, t2 = draws_to_separate(1e-3, 6.6e-3, above=True)
    assert binom.sf(t2, R2, 1e-3) <= 1e-6 and binom.cdf(t2, R2, 6.6e-3) <= 1e-6


def test_hoeffding_epsilon_covers_the_two_point_law_and_without_its_2_does_not():
    B, N, eta = 1.0, 100, 1e-3
    k = np.arange(N + 1)
    pmf = binom.pmf(k, N, 0.5)
    dev = B * np.abs(2 * k / N - 1)
    assert pmf[dev > hoeffding_epsilon(B, N, eta)].sum() <= eta
    assert pmf[dev > B * math.sqrt(math.log(2 / eta) / N)].sum() > 5 * eta


def test_ratio_clipping_term_is_tight_on_the_two_point_case():
    """P = (½, ½), Q = (½+t, ½−t), A = A_clip·sign(w−1): the bias is 2·A_clip·t and
    A_clip√(2KL) → it as t → 0 (√(KL/2) would be half of it)."""
    A_clip, t = 3.0, 1e-4
    kl = -0.5 * math.log1p(-4 * t * t)
    assert ratio_clipping_term(A_clip, kl) == pytest.approx(2 * A_clip * t, rel=1e-7)


def test_empirical_stage_bound_is_its_formula():
    L, delta, N = np.array([0.3, -0.1]), np.array([0.01, 0.04]), np.array([100, 400])
    g, A_max, A_clip, eps_w, dc = 0.9, 1.5, 2.0, 0.2, 0.05
    c = math.sqrt(2) * g * A_max / (1 - g) ** 2
    B = (1 + eps_w) * A_clip / (1 - g)
    want = (L.sum() - c * np.sqrt(delta).sum()
            - sum(B * math.sqrt(2 * math.log(2 * 2 / dc) / n) for n in N)
            - sum(A_clip / (1 - g) * math.sqrt(2 * d) for d in delta))
    got = empirical_stage_bound(L, delta, N, gamma=g, A_max=A_max, A_clip=A_clip, eps_w=eps_w,
                                delta_conf=dc)
    assert got == pytest.approx(want, rel=1e-13)


def test_group_advantages_divide_by_the_std_not_the_variance():
    """Returns (0, 4): mean 2, population variance 4, std 2 → advantages ∓1 (not ∓½)."""
    got = group_advantages([0.0, 4.0], [0, 0], eps_norm=0.0, A_clip=None)
    np.testing.assert_allclose(got, [-1.0, 1.0], rtol=0, atol=1e-15)


def test_align_distill_stops_on_the_boundary_when_it_steps():
    rng = np.random.default_rng(3)
    old = rng.dirichlet(np.ones(3), size=4)
    pre = rng.dirichlet(np.ones(3), size=4)
    nu = np.full(4, 0.25)
    delta = probe_kl(old, pre, nu) / 4
    new, tr = align_distill(old, pre, nu, delta)
    assert tr.steps > 0
    assert delta * (1 - ALIGN_BOUNDARY_TOL) <= probe_kl(old, new, nu) <= delta * (1 + 1e-12)
