"""The bound / occupancy / plug-and-play checks of ``sat verify`` (sat_theory/verify/bounds.py).

For every check: (a) it passes unmutated in quick mode, (b) every declared mutation of its
statement (halved constant, dropped term, stale occupancy, flipped KL direction, ...) makes it
report violations — so no check passes vacuously. Plus sympy proofs of the algebraic
identities behind the constants, and the saved naive-reuse counterexample.
"""

import math

import numpy as np
import pytest
import sympy as sp

from sat_theory.certificates import penalty_constant, stage_certificate, stage_lower_bound
from sat_theory.envs import named_mdp
from sat_theory.policy import factor_kl
from sat_theory.verify import CHECKS, load_checks
from sat_theory.verify.cases import (
    cases,
    max_factor_kl,
    random_mdps,
    random_policy,
    small_step_target,
)
from sat_theory.verify.naive_reuse import load_naive_reuse, verify_naive_reuse

BOUND_CHECKS = [
    "performance_difference", "occupancy_shift_max", "occupancy_shift_expected",
    "chained_occupancy_shift", "factor_lemma", "single_step_bound", "single_step_bound_max_kl",
    "joint_stage_bound_all_orders", "stale_stage_bound", "naive_reuse_counterexample",
    "plug_and_play_resumability", "certificate_tightening", "certificate_definitions",
    "expected_kl_vacuity", "estimated_advantage_bound",
]

load_checks()


def test_all_bound_checks_registered():
    for name in BOUND_CHECKS:
        assert name in CHECKS, name
        assert CHECKS[name].mutations, f"{name} declares no mutation"


@pytest.mark.parametrize("name", BOUND_CHECKS)
def test_check_passes_unmutated(name):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=None)
    assert res.name == name
    assert res.cases > 0
    assert res.violations == 0, res.findings[:3]
    assert res.passed


@pytest.mark.parametrize("name,mutation",
                         [(n, m) for n in BOUND_CHECKS for m in CHECKS[n].mutations])
def test_mutation_is_caught(name, mutation):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=mutation)
    assert res.violations > 0, f"{name} did not notice mutation {mutation}"
    assert not res.passed


def test_unknown_mutation_rejected():
    with pytest.raises(ValueError, match="no mutation"):
        CHECKS["factor_lemma"].fn(quick=True, seed=0, mutation="nonsense")


# ------------------------------------------------------------------ sympy identities
def test_pinsker_constant_chain_sympy():
    """SAT's 2γ/(1−γ)²·A_max·√(δ/2) equals TeamTR's c·√δ with c = √2·γ·A_max/(1−γ)²."""
    g, A, d = sp.symbols("gamma A_max delta", positive=True)
    sat = 2 * g / (1 - g) ** 2 * A * sp.sqrt(d / 2)
    c = sp.sqrt(2) * g * A / (1 - g) ** 2
    assert sp.simplify(sat - c * sp.sqrt(d)) == 0
    # and the code's constant is that c
    val = {g: sp.Rational(9, 10), A: sp.Rational(3, 2)}
    assert math.isclose(penalty_constant(0.9, 1.5), float(c.subs(val)), rel_tol=1e-14)


def test_occupancy_constant_chain_sympy():
    """2γ/(1−γ)·√(D/2) = √2γ/(1−γ)·√D: Pinsker turns the E-TV form into the KL form."""
    g, D = sp.symbols("gamma D", positive=True)
    assert sp.simplify(2 * g / (1 - g) * sp.sqrt(D / 2) - sp.sqrt(2) * g / (1 - g) * sp.sqrt(D)) == 0


def test_factor_lemma_symbolic_product():
    """KL(π⊗q ‖ π'⊗q) = KL(π‖π') for a two-action π and a three-action teammate q."""
    p, pp, q1, q2 = sp.symbols("p p' q1 q2", positive=True)
    pi, pi2, q = [p, 1 - p], [pp, 1 - pp], [q1, q2, 1 - q1 - q2]
    joint = sum(pi[a] * q[b] * sp.log((pi[a] * q[b]) / (pi2[a] * q[b]))
                for a in range(2) for b in range(3))
    factor = sum(pi[a] * sp.log(pi[a] / pi2[a]) for a in range(2))
    assert sp.simplify(sp.expand_log(joint - factor, force=True)) == 0


def test_stale_penalty_is_quadratic_sympy():
    """With δ_i ≡ δ: Σ_i (√δ + Σ_{k<i} √δ) = n(n+1)/2 · √δ, versus n·√δ intermediate."""
    n, i, k, d = sp.symbols("n i k delta", positive=True, integer=True)
    stale = sp.summation(sp.sqrt(d) + sp.summation(sp.sqrt(d), (k, 1, i - 1)), (i, 1, n))
    assert sp.simplify(stale - n * (n + 1) / 2 * sp.sqrt(d)) == 0


def test_stage_lower_bound_formula():
    L, delta, zeta = [0.3, -0.1], [0.01, 0.04], [0.0, 0.02]
    c = penalty_constant(0.9, 2.0)
    want = 0.2 - c * (0.1 + 0.2) - 0.02 / 0.1
    assert math.isclose(stage_lower_bound(L, delta, zeta, 0.9, 2.0), want, rel_tol=1e-12)


# ------------------------------------------------------------------ cases and counterexample
def test_cases_deterministic():
    a, b = cases(3, 8), cases(3, 8)
    for x, y in zip(a, b, strict=True):
        assert x.label == y.label
        for f, g in zip(x.target.factors, y.target.factors, strict=True):
            np.testing.assert_array_equal(f, g)


def test_small_step_reaches_radius():
    mdp = random_mdps(5, 1, layouts=("masked",))[0]
    cur = random_policy(mdp, 1)
    tar = small_step_target(mdp, cur, np.random.default_rng(2), 0.01)
    for j in range(mdp.n_agents):
        if mdp.active[:, j].any():
            assert math.isclose(max_factor_kl(mdp, cur.factors[j], tar.factors[j], j), 0.01,
                                rel_tol=1e-6)


def test_naive_reuse_counterexample_saved_and_exact():
    mdp, cur, naive, seq, order = load_naive_reuse()
    assert named_mdp("naive_reuse").n_states == mdp.n_states
    v = verify_naive_reuse(mdp, cur, naive, seq, order)
    assert min(v["naive_L_stale"]) > 0  # every naive step improves its stale surrogate
    assert v["naive_dJ"] < 0  # ... and the team gets worse
    assert min(v["seq_gains"]) >= 0 and v["seq_dJ"] > 0  # intermediate updates do not
    for j in range(mdp.n_agents):  # with radii no larger than the naive ones
        assert max_factor_kl(mdp, cur.factors[j], seq.factors[j], j) <= \
            max_factor_kl(mdp, cur.factors[j], naive.factors[j], j) + 1e-9
    cert = stage_certificate(mdp, cur, naive, order)
    assert not cert.violated  # the (stale) certificates themselves still hold: they are negative
    assert cert.lower_bound_stale < cert.true_improvement
    assert float(factor_kl(mdp, cur.factors[0], naive.factors[0], 0).max()) > 0


def test_certificate_with_nearly_unchanged_target():
    """Regression: KL of nearly equal rows summed to ~−1e-16 and √δ raised ValueError."""
    from scipy.special import softmax

    mdp = random_mdps(0, 1, layouts=("simultaneous",))[0]
    rng = np.random.default_rng(0)
    z = [rng.normal(size=(mdp.n_states, a)) for a in mdp.action_counts]
    cur = type(random_policy(mdp, 0))(tuple(softmax(x, axis=1) for x in z))
    tar = type(cur)(tuple(softmax(x + 1e-9 * rng.normal(size=x.shape), axis=1) for x in z))
    cert = stage_certificate(mdp, cur, tar, tuple(range(mdp.n_agents)))
    assert all(s.delta >= 0 for s in cert.steps)
