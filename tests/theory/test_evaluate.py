"""Exact evaluation: a rational oracle, identities (THEORY §2), batched/looped and
sparse/dense agreement."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sat_theory import TeamPolicy, evaluate, evaluate_many, joint_policy, random_mdp
from sat_theory.evaluate import bellman_residual, collapse
from sat_theory.policy import expected_advantage

LAYOUTS = ["simultaneous", "masked", "turn"]


# ----------------------------------------------------------------- the oracle
def _solve_exact(M: list[list[Fraction]], b: list[Fraction]) -> list[Fraction]:
    """Gauss–Jordan elimination over the rationals (exact; M is small and non-singular)."""
    n = len(b)
    A = [row[:] + [b[i]] for i, row in enumerate(M)]
    for c in range(n):
        piv = next(r for r in range(c, n) if A[r][c] != 0)
        A[c], A[piv] = A[piv], A[c]
        inv = 1 / A[c][c]
        A[c] = [x * inv for x in A[c]]
        for r in range(n):
            if r != c and A[r][c] != 0:
                f = A[r][c]
                A[r] = [x - f * y for x, y in zip(A[r], A[c], strict=True)]
    return [A[i][n] for i in range(n)]


def oracle(mdp, pol):
    """V, d, Q, J computed in exact rational arithmetic from the (exactly representable)
    float entries of P, R, ρ0, γ and the policy factors. The joint policy is the exact
    product of the factors: π(a|s) = Π_{j active} π^(j)(a_j|s)."""
    S, K = mdp.n_states, mdp.n_joint
    g = Fraction(mdp.gamma)
    P = np.asarray(mdp.to_dense().P)
    F = [[[Fraction(x) for x in row] for row in f] for f in pol.factors]
    pi = [[Fraction(0)] * K for _ in range(S)]
    for s in range(S):
        for k in range(K):
            if mdp.kind == "turn":
                pi[s][k] = F[int(mdp.turn[s])][s][k]
            else:
                acts = mdp.slot_actions[k]
                p = Fraction(1)
                for j, a in enumerate(acts):
                    if mdp.active[s, j]:
                        p *= F[j][s][a]
                    elif a != 0:
                        p = Fraction(0)
                pi[s][k] = p
    Pq = [[[Fraction(P[s, k, t]) for t in range(S)] for k in range(K)] for s in range(S)]
    Rq = [[Fraction(mdp.R[s, k]) for k in range(K)] for s in range(S)]
    P_pi = [[sum(pi[s][k] * Pq[s][k][t] for k in range(K)) for t in range(S)] for s in range(S)]
    r_pi = [sum(pi[s][k] * Rq[s][k] for k in range(K)) for s in range(S)]
    M = [[(1 if s == t else 0) - g * P_pi[s][t] for t in range(S)] for s in range(S)]
    V = _solve_exact(M, r_pi)
    MT = [[M[t][s] for t in range(S)] for s in range(S)]
    d = _solve_exact(MT, [(1 - g) * Fraction(x) for x in mdp.rho0])
    Q = [[Rq[s][k] + g * sum(Pq[s][k][t] * V[t] for t in range(S)) for k in range(K)]
         for s in range(S)]
    J = sum(Fraction(x) * v for x, v in zip(mdp.rho0, V, strict=True))
    return (np.array([float(v) for v in V]), np.array([float(x) for x in d]),
            np.array([[float(q) for q in row] for row in Q]), float(J))


ORACLE_CASES = [
    (layout, S, n, A, seed)
    for layout in LAYOUTS
    for (S, n, A) in [(2, 2, 2), (3, 2, 2), (4, 3, 2)]
    for seed in (0, 1)
] + [("simultaneous", 3, 2, (2, 3), 5), ("masked", 4, 2, (3, 2), 6)]


@pytest.mark.parametrize("layout,S,n,A,seed", ORACLE_CASES)
def test_rational_oracle(layout, S, n, A, seed):
    mdp = random_mdp(S, n, A, layout=layout, gamma=0.9, seed=seed)
    pol = TeamPolicy.random(mdp, seed + 100)
    V, d, Q, J = oracle(mdp, pol)
    ev = evaluate(mdp, pol)
    tol = dict(rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ev.V, V, **tol)
    np.testing.assert_allclose(ev.d, d, **tol)
    np.testing.assert_allclose(ev.Q, Q, **tol)
    np.testing.assert_allclose(ev.A, Q - V[:, None], **tol)
    np.testing.assert_allclose(ev.J, J, **tol)


def test_rational_oracle_sparse_file_form():
    """A (tiny) sparse turn-taking MDP goes through the same exact path."""
    mdp = random_mdp(4, 2, 3, layout="turn", sparse=True, successors=2, seed=3)
    pol = TeamPolicy.random(mdp, 7)
    V, d, Q, J = oracle(mdp, pol)
    ev = evaluate(mdp, pol)
    np.testing.assert_allclose(ev.V, V, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ev.d, d, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ev.Q, Q, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------- hypothesis identities
mdp_params = st.fixed_dictionaries(dict(
    layout=st.sampled_from(LAYOUTS),
    S=st.integers(1, 12),
    n=st.integers(1, 3),
    A=st.integers(1, 3),
    gamma=st.sampled_from([0.1, 0.5, 0.9, 0.99]),
    seed=st.integers(0, 10_000),
    successors=st.sampled_from([None, 1, 2]),
))


def make(p):
    return random_mdp(p["S"], p["n"], p["A"], layout=p["layout"], gamma=p["gamma"],
                      seed=p["seed"], successors=p["successors"])


@given(mdp_params, st.integers(0, 10_000), st.sampled_from([0.0, 1.0, 5.0]))
def test_occupancy_is_distribution(p, pseed, temp):
    mdp = make(p)
    ev = evaluate(mdp, TeamPolicy.random(mdp, pseed, temperature=temp))
    assert np.all(ev.d >= 0)
    assert abs(ev.d.sum() - 1) < 1e-10
    # d is the fixed point d = (1−γ)ρ0 + γ P_πᵀ d
    P_pi, _ = collapse(mdp, ev.pi)
    np.testing.assert_allclose(ev.d, (1 - mdp.gamma) * mdp.rho0 + mdp.gamma * P_pi.T @ ev.d,
                               atol=1e-10)


@given(mdp_params, st.integers(0, 10_000), st.integers(0, 10_000))
def test_performance_difference_identity(p, s1, s2):
    """J(π') − J(π) = 1/(1−γ) E_{s∼d^π'} E_{a∼π'} A^π(s,a)  (THEORY §2)."""
    mdp = make(p)
    pi, pi2 = TeamPolicy.random(mdp, s1, temperature=2.0), TeamPolicy.random(mdp, s2)
    ev, ev2 = evaluate(mdp, pi), evaluate(mdp, pi2)
    rhs = ev2.d @ expected_advantage(ev2.pi, ev.A) / (1 - mdp.gamma)
    scale = 1 + np.abs(mdp.R).max() / (1 - mdp.gamma)
    assert abs((ev2.J - ev.J) - rhs) <= 1e-9 * scale


@given(mdp_params, st.integers(0, 10_000))
def test_bellman_and_advantage_identities(p, pseed):
    """V = r_π + γP_πV (residual ~0), E_{a∼π} A^π(s,a) = 0, J = ρ0ᵀV = (1−γ)^{-1} dᵀ r_π."""
    mdp = make(p)
    ev = evaluate(mdp, TeamPolicy.random(mdp, pseed))
    scale = 1 + np.abs(mdp.R).max() / (1 - mdp.gamma)
    assert bellman_residual(mdp, ev.pi, ev.V) <= 1e-10 * scale
    assert np.abs(expected_advantage(ev.pi, ev.A)).max() <= 1e-10 * scale
    assert abs(ev.J - ev.d @ ev.r_pi / (1 - mdp.gamma)) <= 1e-10 * scale
    assert ev.A_max >= 0


def test_joint_array_input_equals_policy_input():
    mdp = random_mdp(6, 2, 2, layout="masked", seed=4)
    pol = TeamPolicy.random(mdp, 1)
    a, b = evaluate(mdp, pol), evaluate(mdp, joint_policy(mdp, pol))
    np.testing.assert_array_equal(a.V, b.V)
    np.testing.assert_array_equal(a.d, b.d)


def test_deterministic():
    """Same seed, same numbers, bit for bit."""
    vals = [evaluate(m, TeamPolicy.random(m, 3)) for m in
            (random_mdp(30, 3, 2, layout="masked", seed=9), random_mdp(30, 3, 2, layout="masked", seed=9))]
    np.testing.assert_array_equal(vals[0].V, vals[1].V)
    np.testing.assert_array_equal(vals[0].d, vals[1].d)


# ------------------------------------------------------------ batched == looped
@pytest.mark.parametrize("layout", LAYOUTS)
def test_evaluate_many_equals_loop(layout):
    mdp = random_mdp(25, 3, 2, layout=layout, seed=11)
    pols = [TeamPolicy.random(mdp, s, temperature=t) for s, t in [(0, 1.0), (1, 3.0), (2, 0.0)]]
    batch = evaluate_many(mdp, pols)
    assert batch.V.shape == (3, 25) and batch.Q.shape == (3, 25, mdp.n_joint)
    for b, pol in enumerate(pols):
        ev = evaluate(mdp, pol)
        np.testing.assert_allclose(batch.V[b], ev.V, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.d[b], ev.d, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.Q[b], ev.Q, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.A[b], ev.A, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(batch.J[b], ev.J, rtol=1e-12, atol=1e-12)
    # a (B, S, K) joint array is accepted too
    again = evaluate_many(mdp, batch.pi)
    np.testing.assert_array_equal(again.V, batch.V)


def test_evaluate_many_sparse_equals_loop():
    mdp = random_mdp(40, 2, 3, layout="turn", sparse=True, seed=2)
    pols = [TeamPolicy.random(mdp, s) for s in range(3)]
    batch = evaluate_many(mdp, pols)
    for b, pol in enumerate(pols):
        np.testing.assert_allclose(batch.V[b], evaluate(mdp, pol).V, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------- sparse == dense
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma", [0.9, 0.99])
def test_krylov_equals_dense(seed, gamma):
    """Force the Krylov path on a small sparse MDP and compare with the dense LU."""
    mdp = random_mdp(200, 3, 4, layout="turn", sparse=True, successors=5, gamma=gamma, seed=seed)
    pol = TeamPolicy.random(mdp, seed)
    kr = evaluate(mdp, pol, method="krylov", tol=1e-12)
    de = evaluate(mdp.to_dense(), pol)
    assert kr.residual <= 1e-12
    scale = 1 / (1 - gamma)
    np.testing.assert_allclose(kr.V, de.V, atol=1e-10 * scale)
    np.testing.assert_allclose(kr.d, de.d, atol=1e-10)
    np.testing.assert_allclose(kr.Q, de.Q, atol=1e-10 * scale)
    assert abs(kr.J - de.J) <= 1e-10 * scale


def test_sparse_collapse_with_rows_of_different_lengths():
    """``P_π`` from CSR rows of unequal length (the general branch of the collapse) equals
    the dense collapse, and so do the evaluations."""
    import scipy.sparse as sp

    from sat_theory import FactorizedMDP

    rng = np.random.default_rng(3)
    S, A = 40, 3
    P = rng.random((S, A, S)) * (rng.random((S, A, S)) < rng.uniform(0.05, 0.6, (S, A, 1)))
    P[:, :, 0] += 1e-3  # no empty row
    P /= P.sum(-1, keepdims=True)
    R = rng.standard_normal((S, A))
    args = (R, rng.integers(0, 2, S), 2, rng.dirichlet(np.ones(S)), 0.9)
    sparse = FactorizedMDP.turn_taking(sp.csr_matrix(P.reshape(S * A, S)), *args)
    dense = FactorizedMDP.turn_taking(P, *args)
    assert len(np.unique(np.diff(sparse.P.indptr))) > 1
    pol = TeamPolicy.random(dense, 0)
    pi = joint_policy(dense, pol)
    before = sparse.P.copy()
    np.testing.assert_allclose(collapse(sparse, pi)[0].toarray(), collapse(dense, pi)[0],
                               atol=1e-15)
    # collapse canonicalises its result in place: the MDP's own arrays must be untouched
    for k in ("indices", "indptr", "data"):
        np.testing.assert_array_equal(getattr(sparse.P, k), getattr(before, k))
    kr = evaluate(sparse, pol, method="krylov", tol=1e-12)
    np.testing.assert_allclose(kr.V, evaluate(dense, pol).V, atol=1e-10)


def test_dense_mdp_forced_krylov_and_sparse_forced_dense():
    dense = random_mdp(30, 2, 2, layout="turn", successors=3, seed=5)
    pol = TeamPolicy.random(dense, 0)
    a = evaluate(dense, pol, method="krylov", tol=1e-12)
    b = evaluate(dense.to_sparse(), pol, method="dense")
    np.testing.assert_allclose(a.V, b.V, atol=1e-10)
    np.testing.assert_allclose(a.d, b.d, atol=1e-10)


def test_auto_sparse_path_large():
    """Above SPARSE_MIN_STATES the automatic path is Krylov: check it to its own residual."""
    from sat_theory.evaluate import SPARSE_MIN_STATES

    S = SPARSE_MIN_STATES + 100
    mdp = random_mdp(S, 4, 3, layout="turn", sparse=True, successors=5, seed=0)
    pol = TeamPolicy.random(mdp, 0)
    ev = evaluate(mdp, pol, tol=1e-10)
    assert 0 < ev.residual <= 1e-10  # a Krylov solve reports a non-zero residual
    assert bellman_residual(mdp, ev.pi, ev.V) <= 1e-10
    assert abs(ev.d.sum() - 1) < 1e-8 and ev.d.min() >= 0
    P_pi, _ = collapse(mdp, ev.pi)
    fixed = (1 - mdp.gamma) * mdp.rho0 + mdp.gamma * (P_pi.T @ ev.d)
    assert np.abs(fixed - ev.d).max() <= 1e-9


def test_unknown_method():
    mdp = random_mdp(3, 1, 2, seed=0)
    with pytest.raises(ValueError, match="unknown evaluation method"):
        evaluate(mdp, TeamPolicy.uniform(mdp), method="magic")


@pytest.mark.parametrize("successors,A,gamma", [(1, 2, 0.99), (1, 1, 0.9), (2, 2, 0.999)])
def test_krylov_on_poorly_mixing_chains(successors, A, gamma):
    """Deterministic/near-deterministic graphs (cycles, eigenvalues on the unit circle) are the
    hard case for Krylov; the solver must still reach its guarantees: sup-norm Bellman
    residual ≤ tol for V, ‖d − d^π‖₁ ≤ tol for d."""
    mdp = random_mdp(300, 2, A, layout="turn", sparse=True, successors=successors, gamma=gamma, seed=4)
    pol = TeamPolicy.random(mdp, 0)
    tol = 1e-9
    kr = evaluate(mdp, pol, method="krylov", tol=tol)
    de = evaluate(mdp.to_dense(), pol)
    assert bellman_residual(mdp, kr.pi, kr.V) <= tol
    assert np.abs(kr.V - de.V).max() <= tol / (1 - gamma) * (1 + 1e-6)
    assert np.abs(kr.d - de.d).sum() <= tol * (1 + 1e-6)


def _count_krylov(monkeypatch):
    import importlib

    E = importlib.import_module("sat_theory.evaluate")
    calls = []
    inner = E._krylov
    monkeypatch.setattr(E, "_krylov", lambda *a, **k: calls.append(1) or inner(*a, **k))
    return calls


def test_mixing_graph_needs_no_krylov_and_chain_falls_back(monkeypatch):
    """Random graphs (|λ₂| ≈ 0.4) are solved by the deflated sweeps alone, V and d; a
    near-deterministic cycle (|λ₂| ≈ 1) hands its iterate to BiCGSTAB and still reaches
    both guarantees."""
    calls = _count_krylov(monkeypatch)
    mix = random_mdp(300, 3, 4, layout="turn", sparse=True, successors=5, gamma=0.99, seed=0)
    ev = evaluate(mix, TeamPolicy.random(mix, 0), method="krylov", tol=1e-10)
    assert abs(ev.d.sum() - 1) < 1e-9 and calls == []  # d solved too, still no BiCGSTAB
    chain = random_mdp(300, 2, 1, layout="turn", sparse=True, successors=1, gamma=0.99, seed=4)
    ev = evaluate(chain, TeamPolicy.random(chain, 0), method="krylov", tol=1e-10)
    de = evaluate(chain.to_dense(), TeamPolicy.random(chain, 0))
    assert len(calls) == 1 and ev.residual <= 1e-10
    assert np.abs(ev.d - de.d).sum() <= 1e-10 * (1 + 1e-6)
    assert len(calls) == 2


def test_macqueen_shift_removes_the_slow_mode_from_any_start():
    """From ``x₀ = 0`` plain value iteration needs ~log(tol)/log γ sweeps (γ=0.99: ~2000);
    the midpoint shift brings a mixing graph to tol within the sweep budget. (The default
    start ``r_π/(1−γ)`` has no slow-mode component at all: ``μᵀ(I−γP_π)⁻¹ = μᵀ/(1−γ)``.)"""
    import importlib

    E = importlib.import_module("sat_theory.evaluate")
    mdp = random_mdp(500, 3, 4, layout="turn", sparse=True, successors=5, gamma=0.99, seed=1)
    pi = joint_policy(mdp, TeamPolicy.random(mdp, 1))
    P = E._collapse_sparse(mdp.P, pi)
    r = np.einsum("sk,sk->s", pi, mdp.R)
    x, res, ok = E._macqueen(P, r, 0.99, np.zeros_like(r), 1e-10)
    assert ok and res <= 1e-10
    np.testing.assert_allclose(x, evaluate(mdp.to_dense(), pi).V, atol=1e-10 / (1 - 0.99))


@given(seed=st.integers(0, 10**6), gamma=st.sampled_from([0.5, 0.9, 0.99]),
       sweeps=st.integers(1, 12))
def test_deflated_sweeps_contract_at_least_like_value_iteration(seed, gamma, sweeps):
    """After k sweeps both residuals are at most γ^k times the first: MacQueen's shift makes
    ``‖ρ_{k+1}‖∞ ≤ γ span(ρ_k)/2``, the mass-conserving occupancy sweep ``‖ρ_{k+1}‖₁ ≤ γ‖ρ_k‖₁``."""
    import importlib

    E = importlib.import_module("sat_theory.evaluate")
    mdp = random_mdp(40, 2, 3, layout="turn", sparse=True, successors=3, gamma=gamma, seed=seed)
    pi = joint_policy(mdp, TeamPolicy.random(mdp, seed))
    P = E._collapse_sparse(mdp.P, pi)
    r = np.einsum("sk,sk->s", pi, mdp.R)
    x0 = r / (1 - gamma)
    res0 = np.abs(r + gamma * (P @ x0) - x0).max()
    b = (1 - gamma) * mdp.rho0
    res0_d = np.abs(b + gamma * (P.T @ mdp.rho0) - mdp.rho0).sum()
    old = E.MAX_SWEEPS
    E.MAX_SWEEPS = sweeps  # stop after `sweeps` residual evaluations (k = sweeps − 1 updates)
    try:
        x, res, ok = E._macqueen(P, r, gamma, x0, 0.0)
        y, res_d, ok_d = E._occupancy_sweeps(P.T, b, gamma, 0.0)
    finally:
        E.MAX_SWEEPS = old
    k = sweeps - 1
    assert res == pytest.approx(np.abs(r + gamma * (P @ x) - x).max(), abs=1e-12)
    assert res <= gamma ** k * res0 * (1 + 1e-9) + 1e-13
    assert res_d <= gamma ** k * res0_d * (1 + 1e-9) + 1e-13


# ------------------------------------------------- mixed-precision dense path
@pytest.mark.parametrize("layout", ["turn", "simultaneous"])
def test_mixed_precision_path_equals_float64_lu(monkeypatch, layout):
    """Above MIXED_MIN_STATES the dense path refines a float32 LU in float64 (DSGESV scheme):
    it must agree with the float64 LU to roundoff, for V, d and everything built on them."""
    import sys

    E = sys.modules["sat_theory.evaluate"]
    mdp = random_mdp(300, 2, 2, layout=layout, gamma=0.99, seed=1)
    pol = TeamPolicy.random(mdp, 2)
    monkeypatch.setattr(E, "MIXED_MIN_STATES", 10**9)
    ref = evaluate(mdp, pol)
    monkeypatch.setattr(E, "MIXED_MIN_STATES", 100)
    mixed = evaluate(mdp, pol)
    scale = 1 / (1 - mdp.gamma)
    np.testing.assert_allclose(mixed.V, ref.V, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(mixed.d, ref.d, rtol=0, atol=1e-14)
    assert bellman_residual(mdp, mixed.pi, mixed.V) <= 1e-13 * scale
    assert abs(mixed.d.sum() - 1) < 1e-13


def test_mixed_precision_falls_back_when_refinement_cannot_converge(monkeypatch):
    """γ within 1e-9 of 1: cond(I − γP_π) ~ 1e9 exceeds float32's reach, refinement fails and
    the float64 LU answers (no silent loss of accuracy)."""
    import sys

    E = sys.modules["sat_theory.evaluate"]
    monkeypatch.setattr(E, "MIXED_MIN_STATES", 100)
    mdp = random_mdp(200, 2, 2, layout="turn", gamma=1 - 1e-9, successors=2, seed=0)
    pol = TeamPolicy.random(mdp, 0)
    ev = evaluate(mdp, pol)
    monkeypatch.setattr(E, "MIXED_MIN_STATES", 10**9)
    ref = evaluate(mdp, pol)
    np.testing.assert_allclose(ev.V, ref.V, rtol=1e-9)
    np.testing.assert_allclose(ev.d, ref.d, atol=1e-9)


def test_certificate_of_small_sparse_mdp():
    """A small sparse MDP is evaluated on a dense copy per policy: same certificate as dense."""
    from sat_theory import stage_certificate

    mdp = random_mdp(40, 2, 2, layout="turn", sparse=True, successors=3, seed=1)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    cert = stage_certificate(mdp, cur, tar, [1, 0])
    dense = stage_certificate(mdp.to_dense(), cur, tar, [1, 0])
    assert cert.lower_bound == pytest.approx(dense.lower_bound, rel=1e-12, abs=1e-12)
    assert cert.holds
