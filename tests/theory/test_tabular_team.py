"""TabularTeam: the exact step solves its objective, sampled estimates converge to the exact
terms of THEORY §4, and the Team-protocol plumbing (snapshots, turn arrays, files) is exact."""

import math

import numpy as np
import pytest
from scipy.special import softmax

from sat_theory import InputError, TeamPolicy, evaluate, random_mdp, stage_certificate
from sat_theory.algorithm import sampled_surrogate
from sat_theory.policy import marginal_advantage
from sat_theory.tabular_team import TabularTeam, horizon_for, proximal_step
from sat_theory.team import Batch


# ------------------------------------------------------------------ exact step
def _objective(pi, p, g, beta):
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.where(p > 0, p * (np.log(p) - np.log(pi)), 0.0).sum(axis=1)
    return (pi * g).sum(axis=1) - beta * kl


@pytest.mark.parametrize("beta", [0.05, 1.0, 20.0])
def test_proximal_step_maximizes_penalized_surrogate(beta):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), size=50)
    g = rng.standard_normal((50, 4)) * 3
    pi = proximal_step(p, g, beta)
    np.testing.assert_allclose(pi.sum(axis=1), 1.0, rtol=0, atol=1e-14)
    # stationarity: β p_a / π_a + g_a is the same λ for every action
    lam = beta * p / pi + g
    np.testing.assert_allclose(lam, lam[:, :1].repeat(4, axis=1), rtol=1e-9, atol=1e-9)
    best = _objective(pi, p, g, beta)
    for _ in range(20):  # no random point of the simplex does better (strictly concave)
        q = rng.dirichlet(np.ones(4), size=50)
        assert np.all(_objective(q, p, g, beta) <= best + 1e-12)


def test_proximal_step_limits():
    p = np.array([[0.2, 0.3, 0.5]])
    g = np.array([[1.0, 0.0, -1.0]])
    np.testing.assert_allclose(proximal_step(p, g, 1e7), p, atol=1e-6)
    assert proximal_step(p, g, 1e-4)[0, 0] > 0.999
    # zero probabilities stay zero (KL(p‖π) would be infinite otherwise anyway)
    assert proximal_step(np.array([[0.0, 1.0]]), np.array([[5.0, 0.0]]), 1.0)[0, 0] == 0.0


@pytest.mark.parametrize("step", ["proximal", "npg"])
@pytest.mark.parametrize("layout", ["simultaneous", "masked", "turn"])
def test_exact_update_formula_and_only_the_agent_changes(step, layout):
    mdp = random_mdp(5, 3, 2, layout=layout, seed=1)
    pol = TeamPolicy.random(mdp, 2)
    team = TabularTeam(mdp, pol, exact_step=step)
    batch = team.rollout(1, 1)
    j, beta = 1, 0.7
    ref = team.snapshot(j)
    before = [team.factor(k).copy() for k in range(3)]
    team.update(j, batch, None, beta, ref)
    ev = evaluate(mdp, pol)
    g = marginal_advantage(mdp, pol, ev.A, j) / (1 - mdp.gamma)
    act = mdp.active[:, j]
    p = pol.factors[j]
    want = proximal_step(p[act], g[act], beta) if step == "proximal" else softmax(
        np.log(p[act]) + g[act] / beta, axis=1)
    np.testing.assert_allclose(team.factor(j)[act], want, rtol=1e-10, atol=1e-14)
    np.testing.assert_array_equal(team.factor(j)[~act], before[j][~act])
    for k in (0, 2):
        np.testing.assert_array_equal(team.factor(k), before[k])
    # kl/surrogate are the exact δ and L_seq of this one-agent step
    out = team.kl(j, batch, ref)
    order = (j, 0, 2)
    cert = stage_certificate(mdp, pol, pol.with_factor(j, team.factor(j)), order)
    assert out["kl"] == pytest.approx(cert.steps[0].delta, rel=1e-10)
    assert out["surrogate"] == pytest.approx(cert.steps[0].L_seq, rel=1e-10, abs=1e-12)


def test_snapshot_restore_is_exact_and_reuses_evaluations():
    mdp = random_mdp(4, 2, 2, layout="turn", seed=3)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0))
    J0 = team.evaluate()
    snap = team.snapshot(0)
    team.update(0, team.rollout(1, 1), None, 0.1, snap)
    assert team.evaluate() != J0
    team.restore(0, snap)
    assert team.evaluate() == J0
    # a snapshot is a copy, not a view
    snap[0][:] = 0.0
    assert team.evaluate() == J0


def test_save_writes_the_core_policy_format(tmp_path):
    mdp = random_mdp(4, 3, 2, layout="masked", seed=4)
    pol = TeamPolicy.random(mdp, 1)
    team = TabularTeam(mdp, pol)
    team.save(tmp_path / "p.npz")
    back = TeamPolicy.load(tmp_path / "p.npz", mdp)
    assert evaluate(mdp, back).J == pytest.approx(evaluate(mdp, pol).J, rel=1e-12)


def test_bad_construction():
    mdp = random_mdp(3, 2, 2, seed=0)
    with pytest.raises(InputError):
        TabularTeam(mdp, mode="approximate")
    with pytest.raises(InputError):
        TabularTeam(mdp, exact_step="newton")
    with pytest.raises(InputError):
        TabularTeam(mdp).replace(0, np.zeros((2, 2)))


# ------------------------------------------------------------------ sampled mode
def test_horizon_for():
    for g, tol in [(0.9, 1e-3), (0.5, 0.1), (0.99, 1e-2)]:
        H = horizon_for(g, tol)
        assert g ** H <= tol < g ** (H - 1)


def test_turn_arrays_match_the_turn_objects():
    mdp = random_mdp(5, 3, 2, layout="masked", seed=5)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0), mode="sampled", horizon=6)
    batch = team.rollout(3, 2)
    assert batch.n_episodes == 6 and batch.groups.tolist() == [0, 0, 1, 1, 2, 2]
    plain = Batch(batch.episodes, batch.rollout_id)  # no pre-filled arrays
    for j in range(3):
        a, b = batch.arrays(j), plain.arrays(j)
        for k in ("episode", "t", "logp", "reward_to_go"):
            np.testing.assert_array_equal(getattr(a, k), getattr(b, k))
        np.testing.assert_array_equal(a.context, b.context.astype(np.int64))
        np.testing.assert_array_equal(a.action, b.action.astype(np.int64))
        # behaviour log-probs are those of the acting agent's factor
        np.testing.assert_allclose(a.logp, np.log(team.factor(j)[a.context, a.action]))
        assert np.all(mdp.active[a.context, j])


def test_sampled_returns_estimate_J():
    mdp = random_mdp(5, 2, 2, layout="turn", gamma=0.8, seed=6)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0), mode="sampled", seed=1, horizon_tol=1e-3)
    R = team.rollout(2000, 1).returns  # one episode per group: i.i.d. returns
    bias = team.gamma ** team.horizon * team.R_max / (1 - team.gamma)
    se = R.std() / math.sqrt(R.size)
    assert abs(R.mean() - team.evaluate()) <= 4 * se + bias


@pytest.mark.parametrize("layout", ["turn", "simultaneous"])
def test_sampled_estimates_converge_to_exact_terms(layout):
    """L̂ (the algorithm's surrogate estimate) and δ̂ (team.kl) from a batch of the current
    team, after agent j moves to a target factor, against the exact L_1^seq and δ_1 of the
    core's certificate, as the batch grows from B×G = 8×8 to 64×32 episodes.

    Episodes of one group share a start state, so standard errors are computed from the B
    group means (cluster standard errors). Tolerance: 4 standard errors plus the documented
    truncation bias; the standard error must shrink with the batch (by at least 2×; 8× the
    groups give √8 ≈ 2.8 when start states dominate the variance) and the final estimates
    must be within 10% (+1e-3) of the exact terms."""
    mdp = random_mdp(5, 2, 2, layout=layout, gamma=0.8, seed=7)
    cur = TeamPolicy.random(mdp, 1)
    j = 1
    rng = np.random.default_rng(2)
    tar_j = softmax(np.log(cur.factors[j]) + 0.5 * rng.standard_normal(cur.factors[j].shape), axis=1)
    cert = stage_certificate(mdp, cur, cur.with_factor(j, tar_j), (j, 0))
    L, delta = cert.steps[0].L_seq, cert.steps[0].delta
    ses = []
    for B, G in ((8, 8), (64, 32)):
        team = TabularTeam(mdp, cur, mode="sampled", seed=B, horizon_tol=1e-3)
        batch = team.rollout(B, G)
        ref = team.snapshot(j)
        team.replace(j, np.log(tar_j))
        out = team.kl(j, batch, ref)
        ta = batch.arrays(j)
        L_hat = sampled_surrogate(team.gamma, ta.t, out["logp"], ta.logp, ta.reward_to_go,
                                  batch.n_episodes)
        # per-episode terms, recomputed here from the definitions
        disc = team.gamma ** ta.t
        per_L = np.bincount(ta.episode, disc * np.expm1(out["logp"] - ta.logp) * ta.reward_to_go,
                            minlength=batch.n_episodes)
        kl_t = np.array([np.sum(cur.factors[j][s] * np.log(cur.factors[j][s] / tar_j[s]))
                         for s in ta.context])
        per_d = np.bincount(ta.episode, (1 - team.gamma) * disc * kl_t, minlength=batch.n_episodes)
        assert L_hat == pytest.approx(per_L.mean(), rel=1e-12, abs=1e-15)
        assert out["kl"] == pytest.approx(per_d.mean(), rel=1e-12)
        se_L = per_L.reshape(B, G).mean(axis=1).std(ddof=1) / math.sqrt(B)
        se_d = per_d.reshape(B, G).mean(axis=1).std(ddof=1) / math.sqrt(B)
        assert abs(L_hat - L) <= 4 * se_L + team.truncation_bias()
        assert abs(out["kl"] - delta) <= 4 * se_d + team.gamma ** team.horizon * out["kl_max"]
        ses.append((se_L, se_d))
    # B: 8 → 64 groups, G: 8 → 32: the group-level SE should shrink by √8 ≈ 2.8 at least
    assert ses[1][0] < ses[0][0] / 2 and ses[1][1] < ses[0][1] / 2
    assert abs(L_hat - L) < 0.1 * abs(L) + 1e-3
    assert abs(out["kl"] - delta) < 0.1 * delta + 1e-3


def test_sampled_update_moves_only_visited_rows_and_respects_step_scale():
    mdp = random_mdp(6, 2, 3, layout="turn", seed=8)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0), mode="sampled", seed=0, horizon=3)
    batch = team.rollout(2, 2)
    j = 0
    ta = batch.arrays(j)
    ref = team.snapshot(j)
    adv = np.random.default_rng(0).standard_normal(ta.episode.size)
    team.update(j, batch, adv, 0.1, ref)
    big = team.kl(j, batch, ref)["kl"]
    moved = np.flatnonzero(np.abs(team.logits[j] - ref[0]).max(axis=1) > 0)
    assert set(moved.tolist()) <= set(ta.context.tolist())
    team.restore(j, ref)
    team.update(j, batch, adv, 0.1, ref, step_scale=0.1)
    assert team.kl(j, batch, ref)["kl"] < big


def _expected_truncated_surrogate(mdp, cur, tar_j, j, H):
    """Exact ``E L̂_H = Σ_{t<H} γ^t E_{s_t} Σ_a (π_tar − π_cur)(a|s_t) Q_{H−t}(s_t, a)`` for a
    turn-taking MDP (agent j's states only), with the k-step values ``Q_k = R + γ P V_{k−1}``,
    ``V_k = Σ_a π_cur Q_k``, ``V_0 = 0`` and ``s_t ∼ ρ0ᵀ P_π^t``: the expectation of the
    algorithm's estimator on episodes truncated after H decisions."""
    g = mdp.gamma
    pi = cur.factors
    pol = np.stack([pi[mdp.turn[s]][s] for s in range(mdp.n_states)])  # (S, A) acting agent's row
    P = np.asarray(mdp.P)
    Q = [None]
    V = np.zeros(mdp.n_states)
    for _ in range(H):
        Qk = mdp.R + g * P @ V
        Q.append(Qk)
        V = (pol * Qk).sum(axis=1)
    mine = mdp.turn == j
    diff = np.where(mine[:, None], tar_j - pi[j], 0.0)
    p = mdp.rho0.copy()
    P_pi = np.einsum("sa,sat->st", pol, P)
    total = 0.0
    for t in range(H):
        total += g ** t * p @ (diff * Q[H - t]).sum(axis=1)
        p = p @ P_pi
    return total


@pytest.mark.parametrize("H", [2, 5, 20])
def test_truncation_bias_bound_holds_exactly(H):
    mdp = random_mdp(4, 2, 3, layout="turn", gamma=0.7, seed=9)
    cur = TeamPolicy.random(mdp, 0)
    j = 0
    tar_j = softmax(np.log(cur.factors[j]) + np.random.default_rng(1).standard_normal((4, 3)), axis=1)
    L = stage_certificate(mdp, cur, cur.with_factor(j, tar_j), (j, 1)).steps[0].L_seq
    team = TabularTeam(mdp, cur, mode="sampled", horizon=H)
    EL_H = _expected_truncated_surrogate(mdp, cur, tar_j, j, H)
    bias = abs(EL_H - L)
    assert bias <= team.truncation_bias()
    if H == 2:  # the oracle is the estimator's mean: sampled check, 4 standard errors
        batch = team.rollout(4000, 1)
        ref = team.snapshot(j)
        team.replace(j, np.log(tar_j))
        ta = batch.arrays(j)
        logp = team.kl(j, batch, ref)["logp"]
        per = np.bincount(ta.episode, team.gamma ** ta.t * np.expm1(logp - ta.logp)
                          * ta.reward_to_go, minlength=batch.n_episodes)
        assert abs(per.mean() - EL_H) <= 4 * per.std() / math.sqrt(per.size)
        assert bias > 0.1 * abs(L)  # at H = 2 the truncation is visible
    if H == 20:
        assert bias < 1e-3 * abs(L)  # and it vanishes as H grows


@pytest.mark.parametrize("key,bad", [("logits", np.nan), ("init", np.inf), ("logits", "shape")])
def test_a_checkpoint_with_non_finite_or_misshapen_logits_is_refused(key, bad):
    """A NaN logit in a checkpoint resumed with exit 0 and J = nan."""
    mdp = random_mdp(4, 2, 2, layout="turn", seed=0)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0))
    d = team.state_dict()
    d[key] = [np.array(z, dtype=np.float64) for z in d[key]]
    if bad == "shape":
        d[key][0] = d[key][0][:1]
    else:
        d[key][0][0, 0] = bad
    with pytest.raises(InputError, match=key):
        team.load_state_dict(d)
    team.load_state_dict(team.state_dict())  # the team's own state still loads
