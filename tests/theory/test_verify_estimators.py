"""The estimator checks of ``sat verify`` (sat_theory/verify/estimators.py) and the estimator
library functions they rest on (sat_theory/estimators.py).

Every check passes unmutated in quick mode, and every declared mutation of its statement makes
it report violations, so none passes vacuously. Library functions are tested against
independent oracles (brute-force trajectory enumeration, hand formulas).
"""

import itertools
import math

import numpy as np
import pytest

from sat_theory.certificates import intermediate_policies, penalty_constant
from sat_theory.envs import random_mdp
from sat_theory.errors import InputError
from sat_theory.estimators import (
    empirical_stage_bound,
    group_mean_conditional_bias,
    hoeffding_epsilon,
    importance_weight_ess,
    sample_trajectory_weights,
    sat_finite_sample_term,
    step_weight_ratio,
    trajectory_weight_moment,
)
from sat_theory.policy import TeamPolicy, joint_policy
from sat_theory.verify import CHECKS, load_checks
from sat_theory.verify.cases import small_step_target

ESTIMATOR_CHECKS = ["finite_sample_coverage", "group_mean_bias", "clipping_bias",
                    "ratio_clipping_bias", "tv_ratio_identity", "kl_chain_rule",
                    "importance_weight_ess"]

load_checks()


@pytest.mark.parametrize("name", ESTIMATOR_CHECKS)
def test_check_passes_unmutated(name):
    c = CHECKS[name]
    res = c.fn(quick=True, seed=0, mutation=None)
    assert res.name == name and res.reference and res.section
    assert res.cases > 0 and res.violations == 0 and res.passed, res.findings[:2]
    assert res.findings


@pytest.mark.parametrize("name,mutation",
                         [(n, m) for n in ESTIMATOR_CHECKS for m in CHECKS[n].mutations])
def test_every_mutation_is_caught(name, mutation):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=mutation)
    assert res.violations > 0 and not res.passed


def test_finite_sample_coverage_reports_sat_constant():
    res = CHECKS["finite_sample_coverage"].fn(quick=True, seed=0, mutation=None)
    assert any("SAT's constant" in f and "does NOT hold" in f for f in res.findings)


# ------------------------------------------------------------------ importance weights
def _brute_force_moment(mdp, behavior, target, k, H):
    """E[w^k] over all H-decision trajectories, enumerated."""
    pb = joint_policy(mdp, behavior)
    rho = step_weight_ratio(mdp, behavior, target)
    S, K = pb.shape
    total = 0.0
    for traj in itertools.product(range(S), range(K), repeat=H):
        prob = 1.0
        w = 1.0
        s_prev = None
        a_prev = None
        for t in range(H):
            s, a = traj[2 * t], traj[2 * t + 1]
            prob *= mdp.rho0[s] if t == 0 else mdp.P[s_prev, a_prev, s]
            prob *= pb[s, a]
            w *= rho[s, a]
            s_prev, a_prev = s, a
        total += prob * w ** k
    return total


@pytest.mark.parametrize("layout", ["turn", "simultaneous"])
def test_weight_moment_matches_enumeration(layout):
    mdp = random_mdp(3, 2, 2, layout=layout, gamma=0.7, seed=3)
    b = TeamPolicy.random(mdp, 1)
    t = b.with_factor(0, TeamPolicy.random(mdp, 2).factors[0])
    for k in (1, 2, 3):
        for H in (1, 2):
            exact = trajectory_weight_moment(mdp, b, t, k, horizon=H)
            assert exact == pytest.approx(_brute_force_moment(mdp, b, t, k, H), rel=1e-12)


def test_geometric_episodes_are_a_mixture_of_horizons():
    """E w^k = Σ_{T≥1} (1−γ)γ^{T−1} E[w^k | T decisions] (an independent code path)."""
    mdp = random_mdp(4, 3, 2, layout="turn", gamma=0.6, seed=5)
    b = TeamPolicy.random(mdp, 0)
    t = intermediate_policies(b, small_step_target(mdp, b, np.random.default_rng(1), 0.05), (0, 1, 2))[2]
    g = mdp.gamma
    mix = sum((1 - g) * g ** (T - 1) * trajectory_weight_moment(mdp, b, t, 2, horizon=T)
              for T in range(1, 200))
    assert trajectory_weight_moment(mdp, b, t, 2) == pytest.approx(mix, rel=1e-10)
    assert trajectory_weight_moment(mdp, b, t, 1) == pytest.approx(1.0, rel=1e-12)


def test_ess_is_one_without_update_and_zero_when_second_moment_diverges():
    mdp = random_mdp(3, 2, 2, layout="turn", gamma=0.99, seed=2)
    b = TeamPolicy.random(mdp, 0)
    assert importance_weight_ess(mdp, b, b) == pytest.approx(1.0, rel=1e-12)
    far = b.with_factor(0, TeamPolicy.random(mdp, 9, temperature=6.0).factors[0])
    assert trajectory_weight_moment(mdp, b, far, 2) == math.inf
    assert importance_weight_ess(mdp, b, far) == 0.0


def test_sampled_weights_are_seeded_and_match_mean_one():
    mdp = random_mdp(3, 2, 2, layout="turn", gamma=0.5, seed=4)
    b = TeamPolicy.random(mdp, 0)
    t = b.with_factor(1, TeamPolicy.random(mdp, 3).factors[1])
    w1 = sample_trajectory_weights(mdp, b, t, 5000, 7)
    np.testing.assert_array_equal(w1, sample_trajectory_weights(mdp, b, t, 5000, 7))
    se = math.sqrt((trajectory_weight_moment(mdp, b, t, 2) - 1) / w1.size)
    assert abs(w1.mean() - 1.0) < 5 * se  # z-test; false alarm ≈ 6e-7 (fixed seed anyway)


def test_weight_ratio_requires_absolute_continuity():
    mdp = random_mdp(2, 1, 2, layout="simultaneous", seed=0)
    b = TeamPolicy.from_factors([np.array([[1.0, 0.0], [0.5, 0.5]])], mdp)
    t = TeamPolicy.from_factors([np.array([[0.5, 0.5], [0.5, 0.5]])], mdp)
    with pytest.raises(InputError):
        step_weight_ratio(mdp, b, t)


# ------------------------------------------------------------------ certificates with sampling
def test_empirical_stage_bound_by_hand():
    L = np.array([0.3, 0.1])
    delta = np.array([0.01, 0.04])
    g, A_max, A_clip, eps_w, dc = 0.9, 2.0, 1.5, 0.2, 0.1
    N = np.array([100, 400])
    c = penalty_constant(g, A_max)
    B = (1 + eps_w) * A_clip / (1 - g)
    want = (L.sum() - c * (0.1 + 0.2)
            - sum(B * math.sqrt(2 * math.log(4 / dc) / n) for n in N)
            - A_clip / (1 - g) * (math.sqrt(0.02) + math.sqrt(0.08)))
    got = empirical_stage_bound(L, delta, N, gamma=g, A_max=A_max, A_clip=A_clip, eps_w=eps_w,
                                delta_conf=dc)
    assert got == pytest.approx(want, rel=1e-13)
    # per step, the Hoeffding term is Lemma E.8 at δ_conf/n
    assert B * math.sqrt(2 * math.log(4 / dc) / 100) == pytest.approx(hoeffding_epsilon(B, 100, dc / 2))


def test_sat_term_is_half_of_hoeffding_for_the_same_range():
    """SAT's term uses range B; the values span 2B, for which Hoeffding gives twice SAT's ε."""
    g, A_max, dc, n = 0.8, 1.3, 0.05, 3
    N = [50, 60, 70]
    sat = sat_finite_sample_term(N, gamma=g, A_max=A_max, delta_conf=dc)
    teamtr = sum(hoeffding_epsilon(A_max / (1 - g), k, dc / n) for k in N)
    assert sat == pytest.approx(teamtr / 2, rel=1e-13)


def test_group_mean_bias_formula_and_bad_input():
    v, p = np.array([0.0, 1.0, 3.0]), np.array([0.2, 0.5, 0.3])
    for G in (1, 2, 5):
        np.testing.assert_allclose(group_mean_conditional_bias(v, p, G), (1 - 1 / G) * (v - p @ v),
                                   atol=1e-14)
    with pytest.raises(InputError):
        group_mean_conditional_bias(v, p[:2], 3)
    with pytest.raises(InputError):
        empirical_stage_bound([0.1], [0.01], [10], gamma=0.9, A_max=1, A_clip=1, eps_w=0,
                              delta_conf=1.5)


def test_sparse_moment_path_matches_dense(monkeypatch):
    import sat_theory.estimators as est

    mdp = random_mdp(60, 3, 2, layout="turn", gamma=0.8, seed=1, successors=3, sparse=True)
    b = TeamPolicy.random(mdp, 0)
    t = intermediate_policies(b, small_step_target(mdp, b, np.random.default_rng(2), 0.05), (0, 1, 2))[2]
    dense = [trajectory_weight_moment(mdp, b, t, k, horizon=H) for k in (1, 2) for H in (None, 6)]
    monkeypatch.setattr(est, "_DENSE_MAX_STATES", 10)
    sparse = [trajectory_weight_moment(mdp, b, t, k, horizon=H) for k in (1, 2) for H in (None, 6)]
    np.testing.assert_allclose(sparse, dense, rtol=1e-9)
    assert np.isfinite(dense).all() and dense[2] > 1.0
