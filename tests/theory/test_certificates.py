"""Stage certificates (THEORY §4): every term against a naive re-implementation, and the
bounds of both papers checked exactly on random MDPs, random targets and every order."""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sat_theory import (
    BOUND_KEYS,
    InputError,
    TeamPolicy,
    evaluate,
    intermediate_policies,
    penalty_constant,
    random_mdp,
    stage_certificate,
)
from sat_theory.certificates import check_order
from sat_theory.verify.definitions import reference_certificate

LAYOUTS = ["simultaneous", "masked", "turn"]


def perturbed(mdp, pol, rng, scale):
    """A target near ``pol``: logits plus Gaussian noise of the given scale."""
    return TeamPolicy.from_logits(
        [np.log(f) + scale * rng.standard_normal(f.shape) for f in pol.factors])


# --------------------------------------------------------- the definitions, recomputed
def naive_terms(mdp, cur, tar, order):
    """Every per-step term from :func:`sat_theory.verify.definitions.reference_certificate`
    (separate dense solves, explicit products; independent of evaluate() and certificates)."""
    ref = reference_certificate(mdp, cur, tar, order)
    return ref["steps"], ref["stage"]["true_improvement"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_subnormal_target_probability_keeps_a_finite_kl(layout):
    """A target factor of [1, 5e-324] where the current one is [1 − 4e-5, 4e-5] (what the
    adversarial perturbation once produced in the full ``sat verify``): the KL is finite,
    ≈ 4e-5·(log 4e-5 − log 5e-324) ≈ 0.029, and both computations must say so. A joint probability
    formed as a product of factors underflows to 0 there (the reference once gave inf)."""
    mdp = random_mdp(3, 3, 2, layout=layout, seed=1)
    cur = TeamPolicy.random(mdp, 2)
    fc = [f.copy() for f in cur.factors]
    ft = [f.copy() for f in cur.factors]
    fc[1][:] = [1 - 4e-5, 4e-5]
    ft[1][:] = [1.0, 5e-324]
    cur, tar = TeamPolicy(tuple(fc)), TeamPolicy(tuple(ft))
    # the factor KL at a state where agent 1 acts: Σ p log(p/q), in logs (4e-5/5e-324 = inf)
    kl = (1 - 4e-5) * math.log(1 - 4e-5) + 4e-5 * (math.log(4e-5) - math.log(5e-324))
    cert = stage_certificate(mdp, cur, tar, (1, 0, 2))
    ref, _ = naive_terms(mdp, cur, tar, (1, 0, 2))
    step = cert.steps[0]
    assert step.delta_max == pytest.approx(kl, rel=1e-9)
    assert ref[0]["delta_max"] == pytest.approx(kl, rel=1e-9)
    assert ref[0]["delta"] == pytest.approx(step.delta, rel=1e-9) and 0 < step.delta <= kl * (1 + 1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("order", [(0, 1, 2), (2, 0, 1)])
def test_terms_match_naive(layout, order):
    mdp = random_mdp(7, 3, 2, layout=layout, seed=5)
    rng = np.random.default_rng(0)
    cur = TeamPolicy.random(mdp, 1)
    tar = perturbed(mdp, cur, rng, 0.5)
    cert = stage_certificate(mdp, cur, tar, order)
    ref, true = naive_terms(mdp, cur, tar, order)
    assert [s.agent for s in cert.steps] == list(order)
    for got, want in zip(cert.steps, ref, strict=True):
        for key, val in want.items():
            assert getattr(got, key) == pytest.approx(val, rel=1e-10, abs=1e-12), key
    assert cert.true_improvement == pytest.approx(true, rel=1e-10, abs=1e-12)
    # stage aggregates from the steps, as written in THEORY §4
    g = mdp.gamma
    A_max = max(s["A_max"] for s in ref)
    c = math.sqrt(2) * g * A_max / (1 - g) ** 2
    sq = [math.sqrt(s["delta"]) for s in ref]
    L = sum(s["L_seq"] for s in ref)
    assert cert.A_max == pytest.approx(A_max, rel=1e-12)
    assert cert.c == pytest.approx(c, rel=1e-12)
    assert cert.lower_bound == pytest.approx(L - c * sum(sq), rel=1e-10, abs=1e-12)
    assert cert.lower_bound_max == pytest.approx(
        L - c * sum(math.sqrt(s["delta_max"]) for s in ref), rel=1e-10, abs=1e-12)
    stale = sum(s["L_stale"] for s in ref) - c * sum(sq[i] + sum(sq[:i]) for i in range(3))
    assert cert.lower_bound_stale == pytest.approx(stale, rel=1e-10, abs=1e-12)
    fnorm = L - sum(math.sqrt(2) * g * s["f_inf"] * math.sqrt(s["delta"]) for s in ref) / (1 - g) ** 2
    assert cert.lower_bound_fnorm == pytest.approx(fnorm, rel=1e-10, abs=1e-12)
    tvb = L - sum(2 * g * s["f_inf"] * s["tv"] for s in ref) / (1 - g) ** 2
    assert cert.lower_bound_tv == pytest.approx(tvb, rel=1e-10, abs=1e-12)


# ------------------------------------------------- the theorems, exactly checked
cert_params = st.fixed_dictionaries(dict(
    layout=st.sampled_from(LAYOUTS),
    S=st.integers(1, 8),
    n=st.integers(1, 3),
    A=st.integers(2, 3),
    gamma=st.sampled_from([0.5, 0.9, 0.99]),
    seed=st.integers(0, 10_000),
    scale=st.sampled_from([0.01, 0.3, 3.0]),
))


@settings(max_examples=100)  # cheap (tiny MDPs); the theorem is the point of the suite
@given(cert_params)
def test_stage_certificate_holds_for_every_order(p):
    mdp = random_mdp(p["S"], p["n"], p["A"], layout=p["layout"], gamma=p["gamma"], seed=p["seed"])
    rng = np.random.default_rng(p["seed"])
    cur = TeamPolicy.random(mdp, rng, temperature=1.0)
    tar = perturbed(mdp, cur, rng, p["scale"])
    for order in itertools.permutations(range(mdp.n_agents)):
        cert = stage_certificate(mdp, cur, tar, order)
        assert cert.holds and cert.violated == [], (order, cert.violated)
        for s in cert.steps:  # TeamTR Thm 3.4 and SAT Thm 4.2 per step
            tol = 1e-9 * (1 + abs(s.bound_max))
            assert s.holds and s.true_gain >= s.bound_max - tol
        # the ladder: each rung at least as tight as the one below it
        slack = 1e-9 * (1 + abs(cert.lower_bound))
        assert cert.lower_bound_tv >= cert.lower_bound_fnorm - slack
        assert cert.lower_bound_fnorm >= cert.lower_bound - slack
        assert cert.lower_bound >= cert.lower_bound_max - slack
        # steps telescope to the stage improvement, which is independent of the order
        assert sum(s.true_gain for s in cert.steps) == pytest.approx(
            cert.true_improvement, abs=1e-9 * (1 + abs(cert.J_before)))
        assert cert.steps[0].L_stale == cert.steps[0].L_seq


def test_certificate_shape_and_keys():
    mdp = random_mdp(5, 3, 2, layout="masked", seed=1)
    cur = TeamPolicy.random(mdp, 0)
    cert = stage_certificate(mdp, cur, TeamPolicy.random(mdp, 1), [1, 2, 0])
    d = cert.to_dict()
    for k in ("order", "steps", "A_max", "c", "true_improvement", "holds", *BOUND_KEYS):
        assert k in d
    assert d["order"] == [1, 2, 0]
    for k in ("agent", "L_seq", "L_stale", "delta", "delta_max", "A_max", "true_gain", "f_inf", "tv"):
        assert k in d["steps"][0]


def test_identical_target_is_tight():
    """π_tar = π_cur: every δ, gain and surrogate is 0, and every bound equals 0."""
    mdp = random_mdp(6, 2, 3, layout="turn", seed=2)
    cur = TeamPolicy.random(mdp, 4)
    cert = stage_certificate(mdp, cur, cur, [1, 0])
    for k in BOUND_KEYS:
        assert abs(getattr(cert, k)) < 1e-12
    assert abs(cert.true_improvement) < 1e-12 and cert.holds


def test_zeta_shifts_every_bound():
    mdp = random_mdp(5, 2, 2, seed=3)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    base = stage_certificate(mdp, cur, tar, [0, 1])
    z = stage_certificate(mdp, cur, tar, [0, 1], zeta=[0.1, 0.2])
    shift = 0.3 / (1 - mdp.gamma)
    for k in BOUND_KEYS:
        assert getattr(z, k) == pytest.approx(getattr(base, k) - shift, rel=1e-12)
    with pytest.raises(InputError, match="zeta"):
        stage_certificate(mdp, cur, tar, [0, 1], zeta=[0.1])


def test_precomputed_evaluations_are_used():
    mdp = random_mdp(5, 2, 2, seed=3)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    pols = intermediate_policies(cur, tar, [1, 0])
    evs = [evaluate(mdp, p) for p in pols]
    a = stage_certificate(mdp, cur, tar, [1, 0], evaluations=evs)
    b = stage_certificate(mdp, cur, tar, [1, 0])
    assert a.to_dict() == b.to_dict()


def test_intermediate_policies_swap_one_factor_each():
    mdp = random_mdp(4, 3, 2, seed=0)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    pols = intermediate_policies(cur, tar, [2, 0, 1])
    assert len(pols) == 4
    done = set()
    for i, j in enumerate([2, 0, 1], start=1):
        done.add(j)
        for k in range(3):
            want = tar.factors[k] if k in done else cur.factors[k]
            np.testing.assert_array_equal(pols[i].factors[k], want)


def test_penalty_constant_equals_sat_form():
    """c·√δ = 2γ/(1−γ)² · A_max · √(δ/2)  (THEORY §4 note)."""
    g, A, delta = 0.9, 1.7, 0.03
    assert penalty_constant(g, A) * math.sqrt(delta) == pytest.approx(
        2 * g / (1 - g) ** 2 * A * math.sqrt(delta / 2), rel=1e-14)


@pytest.mark.parametrize("order", [[0, 0], [0], [0, 1, 2], [1, 2], [-1, 0], ["a", 0]])
def test_order_not_a_permutation(order):
    with pytest.raises(InputError, match="order"):
        check_order(order, 2)
    mdp = random_mdp(3, 2, 2, seed=0)
    pol = TeamPolicy.uniform(mdp)
    with pytest.raises(InputError):
        stage_certificate(mdp, pol, pol, order)


def test_estimated_advantages_constant_bias():
    """Â = A + b: f̂_i = f_i + b, so ζ_i = b, L̂_i = L_i + b/(1−γ) and every bound is unchanged
    (the ζ_i/(1−γ) term is exactly used up)."""
    mdp = random_mdp(5, 2, 2, layout="masked", seed=4)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    order = [1, 0]
    evs = [evaluate(mdp, p) for p in intermediate_policies(cur, tar, order)]
    exact = stage_certificate(mdp, cur, tar, order, evaluations=evs)
    b = 0.37
    est = stage_certificate(mdp, cur, tar, order, evaluations=evs,
                            advantages=[ev.A + b for ev in evs[:-1]])
    for s0, s1 in zip(exact.steps, est.steps, strict=True):
        assert s1.zeta == pytest.approx(b, rel=1e-12)
        assert s1.L_seq == pytest.approx(s0.L_seq + b / (1 - mdp.gamma), rel=1e-10)
        assert s1.bound == pytest.approx(s0.bound, rel=1e-9, abs=1e-12)
        assert s1.f_inf == s0.f_inf  # the ladder's ‖f_i‖∞ is that of the exact f_i
    for k in BOUND_KEYS:
        assert getattr(est, k) == pytest.approx(getattr(exact, k), rel=1e-9, abs=1e-12)
    with pytest.raises(InputError, match="advantages"):
        stage_certificate(mdp, cur, tar, order, advantages=[evs[0].A])
