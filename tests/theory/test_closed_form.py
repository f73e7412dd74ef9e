"""Exact values on the named toy MDPs, derived by hand (THEORY §2 conventions).

Each test writes the closed form next to its derivation; the float path must match it to
1e-12. Policies are parameterized by the probability of action 1 of each agent at each state.
"""

import numpy as np
import pytest

from sat_theory import TeamPolicy, evaluate, named_mdp

TOL = dict(rtol=1e-12, atol=1e-12)
GAMMAS = [0.5, 0.9, 0.99]


def two_action_policy(mdp, probs_of_one):
    """TeamPolicy with factor j giving action 1 w.p. ``probs_of_one[j][s]``."""
    factors = []
    for p in probs_of_one:
        p = np.asarray(p, dtype=np.float64)
        factors.append(np.stack([1.0 - p, p], axis=1))
    return TeamPolicy.from_factors(factors, mdp)


# ---------------------------------------------------------------------- bandit
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("p,q", [(0.0, 0.0), (1.0, 1.0), (0.3, 0.8), (0.5, 0.5)])
def test_bandit(gamma, p, q):
    """One state, R = [[1,0],[0,2]]: r_π = (1−p)(1−q)·1 + pq·2, V = r_π/(1−γ), d = [1],
    Q(a) = R(a) + γV, A(a) = R(a) − r_π."""
    mdp = named_mdp("bandit", gamma)
    ev = evaluate(mdp, two_action_policy(mdp, [[p], [q]]))
    r = (1 - p) * (1 - q) + 2 * p * q
    V = r / (1 - gamma)
    np.testing.assert_allclose(ev.V, [V], **TOL)
    np.testing.assert_allclose(ev.J, V, **TOL)
    np.testing.assert_allclose(ev.d, [1.0], **TOL)
    R = np.array([1.0, 0.0, 0.0, 2.0])  # slots (0,0),(0,1),(1,0),(1,1)
    np.testing.assert_allclose(ev.Q[0], R + gamma * V, **TOL)
    np.testing.assert_allclose(ev.A[0], R - r, **TOL)


# ----------------------------------------------------------------------- chain
def chain_closed_form(gamma, p, L=5):
    """Chain of L states, agent s mod 2 moves right w.p. p[s mod 2], the last state absorbs
    and pays 1 per step. Backwards: V(L−1) = 1/(1−γ); for s < L−1 the agent stays w.p. 1−p_s,
    so V(s) = γ p_s V(s+1) + γ(1−p_s) V(s), i.e. V(s) = γ p_s V(s+1) / (1 − γ(1−p_s)).
    Occupancy: with α_0 = 1 the discounted "arrival weight" of state s and a geometric stay,
    d(s) = (1−γ) α_s / (1 − γ(1−p_s)) and α_{s+1} = α_s γ p_s / (1 − γ(1−p_s)); the last
    state is never left: d(L−1) = α_{L−1}."""
    ps = [p[s % 2] for s in range(L)]
    V = np.zeros(L)
    V[L - 1] = 1 / (1 - gamma)
    for s in range(L - 2, -1, -1):
        V[s] = gamma * ps[s] * V[s + 1] / (1 - gamma * (1 - ps[s]))
    d = np.zeros(L)
    alpha = 1.0
    for s in range(L - 1):
        stay = 1 - gamma * (1 - ps[s])
        d[s] = (1 - gamma) * alpha / stay
        alpha *= gamma * ps[s] / stay
    d[L - 1] = alpha
    return V, d


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("p", [(1.0, 1.0), (0.5, 0.25), (0.9, 0.1)])
def test_chain(gamma, p):
    mdp = named_mdp("chain", gamma)
    L = mdp.n_states
    ev = evaluate(mdp, two_action_policy(mdp, [np.full(L, p[0]), np.full(L, p[1])]))
    V, d = chain_closed_form(gamma, p, L)
    np.testing.assert_allclose(ev.V, V, **TOL)
    np.testing.assert_allclose(ev.d, d, **TOL)
    np.testing.assert_allclose(ev.J, V[0], **TOL)  # rho0 = e_0
    assert abs(d.sum() - 1) < 1e-12  # the hand derivation is itself a distribution


def test_chain_deterministic_is_geometric():
    """Always moving right: V(s) = γ^{L−1−s}/(1−γ) and d(s) = (1−γ)γ^s for s < L−1."""
    gamma, L = 0.9, 5
    mdp = named_mdp("chain", gamma)
    ev = evaluate(mdp, two_action_policy(mdp, [np.ones(L), np.ones(L)]))
    s = np.arange(L)
    np.testing.assert_allclose(ev.V, gamma ** (L - 1 - s) / (1 - gamma), **TOL)
    np.testing.assert_allclose(ev.d[:-1], (1 - gamma) * gamma ** s[:-1], **TOL)
    np.testing.assert_allclose(ev.d[-1], gamma ** (L - 1), **TOL)


# ------------------------------------------------------------------- two_state
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("p,q", [(1.0, 0.0), (1.0, 1.0), (0.3, 0.6), (0.0, 0.5)])
def test_two_state(gamma, p, q):
    """Agent 0 switches 0→1 w.p. p, agent 1 switches 1→0 w.p. q, reward 1 at state 1.
    V0 = γ(pV1 + (1−p)V0), V1 = 1 + γ(qV0 + (1−q)V1). With a = 1−γ(1−p), b = 1−γ(1−q):
    V0 = γp V1/a, V1 = 1/(b − γ²pq/a). Occupancy (ρ0 = e_0): d solves
    d0 = (1−γ) + γ((1−p)d0 + q d1), d1 = γ(p d0 + (1−q) d1) ⇒ d1 = γp d0/b,
    d0 = (1−γ)/(a − γ²pq/b)."""
    mdp = named_mdp("two_state", gamma)
    ev = evaluate(mdp, two_action_policy(mdp, [[p, 0.5], [0.5, q]]))  # inactive rows ignored
    a, b = 1 - gamma * (1 - p), 1 - gamma * (1 - q)
    V1 = 1 / (b - gamma**2 * p * q / a)
    V0 = gamma * p * V1 / a
    d0 = (1 - gamma) / (a - gamma**2 * p * q / b)
    d1 = gamma * p * d0 / b
    np.testing.assert_allclose(ev.V, [V0, V1], **TOL)
    np.testing.assert_allclose(ev.d, [d0, d1], **TOL)
    np.testing.assert_allclose(ev.J, V0, **TOL)


def test_two_state_alternating():
    """p = q = 1 alternates 0,1,0,1…: V0 = γ/(1−γ²), V1 = 1/(1−γ²), d = (1/(1+γ), γ/(1+γ))."""
    g = 0.9
    mdp = named_mdp("two_state", g)
    ev = evaluate(mdp, two_action_policy(mdp, [[1.0, 1.0], [1.0, 1.0]]))
    np.testing.assert_allclose(ev.V, [g / (1 - g * g), 1 / (1 - g * g)], **TOL)
    np.testing.assert_allclose(ev.d, [1 / (1 + g), g / (1 + g)], **TOL)


# ---------------------------------------------------------------- coordination
@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("x0,y0,x1,y1", [(1, 1, 1, 1), (0.5, 0.5, 0.5, 0.5), (0.2, 0.7, 0.9, 0.4)])
def test_coordination(gamma, x0, y0, x1, y1):
    """State 0: actions match w.p. m = x0y0 + (1−x0)(1−y0) and then move to state 1.
    State 1 pays 1 and stays w.p. k = x1y1 (both play 1), else returns to 0.
    V0 = γ(mV1 + (1−m)V0), V1 = 1 + γ(kV1 + (1−k)V0); with a = 1−γ(1−m), b = 1−γk:
    V0 = γm V1/a, V1 = 1/(b − γ²m(1−k)/a)."""
    mdp = named_mdp("coordination", gamma)
    ev = evaluate(mdp, two_action_policy(mdp, [[x0, x1], [y0, y1]]))
    m = x0 * y0 + (1 - x0) * (1 - y0)
    k = x1 * y1
    a, b = 1 - gamma * (1 - m), 1 - gamma * k
    V1 = 1 / (b - gamma**2 * m * (1 - k) / a)
    V0 = gamma * m * V1 / a
    np.testing.assert_allclose(ev.V, [V0, V1], **TOL)
    np.testing.assert_allclose(ev.J, V0, **TOL)
    # Q at state 1 for joint slot (1,1) (index 3): 1 + γV1; any other slot: 1 + γV0
    np.testing.assert_allclose(ev.Q[1], [1 + gamma * V0] * 3 + [1 + gamma * V1], **TOL)
