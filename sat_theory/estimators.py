"""Sample-based estimators and their finite-sample terms (THEORY §6).

- Group-normalized, clipped advantage over the ``G`` rollouts of one group (start state /
  prompt): ``Ã_g = clip((R_g − μ̂)/σ̂, −A_clip, A_clip)`` with ``μ̂ = mean_g R_g`` and
  ``σ̂ = sqrt(mean_g (R_g − μ̂)² + ε_norm)`` (TeamTR §4).
- Hoeffding deviation (TeamTR Lemma E.8): ``Pr(|L̂ − E L̂| > ε) ≤ 2 exp(−N ε²/(2B²))`` with
  ``B = (1+ε_w) A_clip/(1−γ)``, i.e. ``ε = B sqrt(2 log(2/η)/N)``.
- Empirical stage certificate (TeamTR Thm E.10) and SAT's finite-sample term (SAT Thm 4.9):
  :func:`empirical_stage_bound`, :func:`sat_finite_sample_term`.
- Group-mean baseline bias (TeamTR Lemma E.1) computed exactly on a finite return
  distribution: :func:`group_mean_conditional_bias`.
- Importance-weight degeneracy of stage-start reuse (TeamTR App. G.6): exact moments
  ``E[w^k]`` of the trajectory weight by a linear recursion, the normalized effective sample
  size ``ESS/B = (E w)²/E[w²]``, and a Monte Carlo sampler of the weights
  (:func:`trajectory_weight_moment`, :func:`importance_weight_ess`,
  :func:`sample_trajectory_weights`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .errors import InputError
from .mdp import FactorizedMDP
from .policy import TeamPolicy, joint_policy

__all__ = ["group_advantages", "hoeffding_epsilon", "sat_epsilon", "dkw_epsilon", "ratio_clipping_term",
           "empirical_stage_bound",
           "sat_finite_sample_term", "group_mean_conditional_bias", "step_weight_ratio",
           "trajectory_weight_moment", "importance_weight_ess", "sample_trajectory_weights"]


def group_advantages(returns, groups, *, eps_norm: float = 1e-6, A_clip: float | None = 5.0,
                     normalize_std: bool = True) -> np.ndarray:
    """Per-episode ``Ã_g = clip((R_g − μ̂)/σ̂, −A_clip, A_clip)`` within each group.

    ``returns`` (N,), ``groups`` (N,) int labels. ``normalize_std=False`` drops the division
    by ``σ̂`` (ablation); ``A_clip=None`` drops the clipping (ablation). A group of size 1
    gets advantage 0 (its own mean).
    """
    R = np.asarray(returns, dtype=np.float64)
    g = np.asarray(groups)
    if R.shape != g.shape or R.ndim != 1:
        raise InputError(f"returns and groups must be 1-D of equal length, got {R.shape}, {g.shape}")
    if eps_norm < 0:
        raise InputError(f"eps_norm must be >= 0, got {eps_norm}")
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    mu = np.bincount(inv, weights=R) / counts
    dev = R - mu[inv]
    out = dev
    if normalize_std:
        var = np.bincount(inv, weights=dev * dev) / counts
        out = dev / np.sqrt(var + eps_norm)[inv]
    if A_clip is not None:
        out = np.clip(out, -A_clip, A_clip)
    return out


def hoeffding_epsilon(B: float, N: int, eta: float) -> float:
    """``ε`` with ``2 exp(−N ε²/(2B²)) = η``: ``ε = B sqrt(2 log(2/η) / N)`` (Lemma E.8)."""
    if N < 1 or not (0 < eta < 1):
        raise InputError(f"need N >= 1 and 0 < eta < 1, got N={N}, eta={eta}")
    return B * math.sqrt(2.0 * math.log(2.0 / eta) / N)


def sat_epsilon(B: float, N: int, eta: float) -> float:
    """SAT's deviation ``ε = B sqrt(log(2/η) / (2N))``: Hoeffding for values in a range of
    length ``B`` (``2 exp(−2Nε²/B²) = η``). For values in ``[−B, B]`` it is half of
    :func:`hoeffding_epsilon`, which is the correct one there."""
    if N < 1 or not (0 < eta < 1):
        raise InputError(f"need N >= 1 and 0 < eta < 1, got N={N}, eta={eta}")
    return B * math.sqrt(math.log(2.0 / eta) / (2.0 * N))


def dkw_epsilon(N: int, eta: float) -> float:
    """Probe-set relaxation ``ε(N, η) = sqrt(log(2/η) / (2N))`` (SAT, DKW): Massart's
    ``Pr(sup_x |F_N(x) − F(x)| > ε) ≤ 2 exp(−2Nε²) = η`` for the empirical CDF of ``N`` draws."""
    if N < 1 or not (0 < eta < 1):
        raise InputError(f"need N >= 1 and 0 < eta < 1, got N={N}, eta={eta}")
    return math.sqrt(math.log(2.0 / eta) / (2.0 * N))


def ratio_clipping_term(A_clip, kl):
    """Ratio-clipping bias bound ``A_clip √(2 KL)`` (TeamTR Cor. E.9: Lemma E.6 gives
    ``A_clip E_P|1 − w| = 2 A_clip TV``, Pinsker ``TV ≤ √(KL/2)``); per step of a stage,
    divided by ``1 − γ`` with ``KL = δ_i`` (Jensen over ``s ∼ d``). ``kl`` may be an array."""
    return A_clip * np.sqrt(2.0 * np.asarray(kl, dtype=np.float64))


# ------------------------------------------------------------------ certificates with sampling
def _per_step(x, n: int | None, what: str) -> np.ndarray:
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    if n is not None and x.shape != (n,):
        x = np.broadcast_to(x, (n,)).copy() if x.size == 1 else x
        if x.shape != (n,):
            raise InputError(f"{what} must have one entry per step ({n}), got shape {x.shape}")
    return x


def empirical_stage_bound(L_hat, delta, N, *, gamma: float, A_max: float, A_clip: float,
                          eps_w: float, delta_conf: float, zeta=None) -> float:
    """TeamTR Thm E.10: with probability ``≥ 1 − δ_conf``, ``J(π̄) − J(π_cur)`` is at least

        Σ_i L̂_i − c Σ_i √δ_i − Σ_i ζ_i/(1−γ)
          − Σ_i (1+ε_w) A_clip/(1−γ) · √(2 log(2n/δ_conf)/N_i) − Σ_i A_clip/(1−γ) · √(2δ_i),

    ``c = √2 γ A_max/(1−γ)²``. The fourth sum is Hoeffding (Lemma E.8) at ``δ_conf/n`` per step
    for per-sample values in ``[−B, B]``, ``B = (1+ε_w)A_clip/(1−γ)``; the last is the
    ratio-clipping bias (Cor. E.9, Lemma E.6 + Pinsker + Jensen). ``L_hat``, ``delta``, ``N``,
    ``zeta``: per step (``N`` and ``zeta`` may be scalars).
    """
    L_hat = _per_step(L_hat, None, "L_hat")
    n = L_hat.size
    delta = _per_step(delta, n, "delta")
    N = _per_step(N, n, "N")
    zeta = np.zeros(n) if zeta is None else _per_step(zeta, n, "zeta")
    if not (0 < delta_conf < 1) or not (0 < gamma < 1) or N.min() < 1 or delta.min() < 0:
        raise InputError("need 0 < delta_conf < 1, 0 < gamma < 1, N_i >= 1 and delta_i >= 0")
    g = gamma
    c = math.sqrt(2.0) * g * A_max / (1 - g) ** 2
    B = (1 + eps_w) * A_clip / (1 - g)
    hoeff = np.array([hoeffding_epsilon(B, k, delta_conf / n) for k in N])
    ratio = ratio_clipping_term(A_clip, delta) / (1 - g)
    return float(L_hat.sum() - c * np.sqrt(delta).sum() - zeta.sum() / (1 - g) - hoeff.sum()
                 - ratio.sum())


def sat_finite_sample_term(N, *, gamma: float, A_max: float, delta_conf: float,
                           n: int | None = None) -> float:
    """SAT's finite-sample error ``Σ_i A_max/(1−γ) · √(log(2n/δ_conf)/(2N_i))`` (SAT Thm 4.9).

    This is Hoeffding for values in a range of length ``A_max/(1−γ)``; a sampled surrogate
    ``A/(1−γ)`` with ``|A| ≤ A_max`` ranges over ``[−B, B]``, length ``2B``, for which Hoeffding
    gives twice this (see ``finite_sample_coverage`` in ``sat verify``). ``n`` defaults to the
    number of entries of ``N``; a scalar ``N`` with ``n`` given means ``N_i = N`` for all ``n``
    steps (the sum then has ``n`` equal terms; the per-step term is :func:`sat_epsilon`).
    """
    N = _per_step(N, n, "N")
    n = N.size if n is None else n
    if not (0 < delta_conf < 1) or not (0 < gamma < 1) or N.min() < 1:
        raise InputError("need 0 < delta_conf < 1, 0 < gamma < 1 and N_i >= 1")
    return float(sum(sat_epsilon(A_max / (1 - gamma), int(k), delta_conf / n) for k in N))


# ------------------------------------------------------------------ group-mean baseline
def group_mean_conditional_bias(values, probs, G: int) -> np.ndarray:
    """Exact ``E[R_g − μ̂ | R_g = r]`` for every support point ``r`` of an i.i.d. return law.

    ``values`` (K,), ``probs`` (K,): the law of each of the ``G`` returns in one group;
    ``μ̂ = mean_g R_g`` (self-included baseline). Computed by enumerating the ``K^{G−1}``
    other returns and averaging :func:`group_advantages` without normalization or clipping,
    so it tests the estimator code. Lemma E.1 says the result is ``(1 − 1/G)(r − μ)``,
    ``μ = Σ p r``.
    """
    v = np.asarray(values, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    if v.ndim != 1 or v.shape != p.shape or G < 1 or abs(p.sum() - 1) > 1e-9 or p.min() < 0:
        raise InputError("values and probs must be 1-D of equal length, probs a distribution, G >= 1")
    K = v.size
    if K ** (G - 1) > 2_000_000:
        raise InputError(f"K^(G-1) = {K}^{G - 1} tuples is too many to enumerate")
    if G == 1:
        return np.zeros(K)  # μ̂ = R_1
    others = np.array(list(itertools.product(range(K), repeat=G - 1)), dtype=np.intp)
    w_others = np.prod(p[others], axis=1)
    out = np.empty(K)
    for r in range(K):
        idx = np.concatenate([np.full((others.shape[0], 1), r), others], axis=1)  # (T, G)
        T = idx.shape[0]
        adv = group_advantages(v[idx].ravel(), np.repeat(np.arange(T), G), normalize_std=False,
                               A_clip=None).reshape(T, G)[:, 0]
        out[r] = w_others @ adv
    return out


# ------------------------------------------------------------------ importance weights (G.6)
def step_weight_ratio(mdp: FactorizedMDP, behavior: TeamPolicy, target: TeamPolicy) -> np.ndarray:
    """(S, K) per-decision ratio ``ρ(s,a) = π_target(a|s)/π_behavior(a|s)`` on joint slots.

    For ``target = π̂^{i−1}`` and ``behavior = π̂^0`` the two differ only in the factors of the
    updated agents ``U_{i−1}``, so ``ρ(s,a) = Π_{j ∈ U_{i−1} ∩ active(s)} π̂^{i−1,(j)}(a_j|s)/
    π̂^{0,(j)}(a_j|s)`` (TeamTR App. G.6). Slots with zero behavior probability get ``ρ = 0``
    (they are never sampled); a target that puts mass there is not absolutely continuous and
    raises :class:`InputError`.
    """
    pb, pt = joint_policy(mdp, behavior), joint_policy(mdp, target)
    if np.any((pb == 0) & (pt > 0)):
        raise InputError("target puts mass where the behavior policy has none: weights are unbounded")
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(pb > 0, pt / pb, 0.0)


def trajectory_weight_moment(mdp: FactorizedMDP, behavior: TeamPolicy, target: TeamPolicy, k: float,
                             *, horizon: int | None = None) -> float:
    """Exact ``E_{τ∼behavior}[w(τ)^k]``, ``w(τ) = Π_t ρ(s_t, a_t)`` (see :func:`step_weight_ratio`).

    Episodes (this is the precise meaning of "trajectory" here):

    - ``horizon=None``: the discounted problem read as a terminating one. ``s_0 ∼ ρ0``; at each
      visited state an action is drawn from the behavior policy, then the episode continues to
      ``s_{t+1} ∼ P(·|s_t,a_t)`` with probability ``γ`` and stops with probability ``1−γ``
      (so ``T ≥ 1`` decisions, ``E T = 1/(1−γ)``, and state visits follow ``d^π``). With
      ``m_k(s) = Σ_a π_b(a|s) ρ(s,a)^k`` and ``M_k(s,s') = Σ_a π_b(a|s) ρ(s,a)^k P(s'|s,a)``
      the moment from ``s`` solves ``u = (1−γ) m_k + γ M_k u``, so
      ``E w^k = ρ0ᵀ (1−γ)(I − γM_k)^{-1} m_k``; it is ``+∞`` when the spectral radius of
      ``γ M_k`` is ``≥ 1`` (the series diverges).
    - ``horizon=H``: exactly ``H`` decisions, no discounting: ``u_0 = 1``, ``u_h = M_k u_{h−1}``,
      ``E w^k = ρ0ᵀ u_H``.

    ``k = 1`` gives 1 (the target is a distribution); ``k = 2`` gives the second moment.
    """
    rho = step_weight_ratio(mdp, behavior, target)
    pb = joint_policy(mdp, behavior)
    with np.errstate(divide="ignore", invalid="ignore"):
        wk = np.where(pb > 0, pb * rho ** k, 0.0)  # (S, K)
    S, K = wk.shape
    if mdp.is_sparse and S > _DENSE_MAX_STATES:
        return _moment_sparse(mdp, wk, horizon)
    dense = mdp.to_dense() if mdp.is_sparse else mdp
    M = np.einsum("sk,skt->st", wk, dense.P)
    if horizon is not None:
        if horizon < 0:
            raise InputError(f"horizon must be >= 0, got {horizon}")
        u = np.ones(mdp.n_states)
        for _ in range(int(horizon)):
            u = M @ u
        return float(mdp.rho0 @ u)
    g = mdp.gamma
    if np.max(np.abs(np.linalg.eigvals(g * M))) >= 1.0:
        return math.inf
    u = np.linalg.solve(np.eye(mdp.n_states) - g * M, (1 - g) * wk.sum(axis=1))
    return float(mdp.rho0 @ u)


#: sparse MDPs with more states use sparse matrices (Perron root by ARPACK, sparse LU solve)
_DENSE_MAX_STATES = 2000


def _moment_sparse(mdp: FactorizedMDP, wk: np.ndarray, horizon: int | None) -> float:
    """The recursion of :func:`trajectory_weight_moment` with ``M_k`` as a sparse matrix."""
    import scipy.sparse as sp
    import scipy.sparse.linalg as spla

    S, K = wk.shape
    W = sp.csr_matrix((wk.ravel(), (np.repeat(np.arange(S), K), np.arange(S * K))), shape=(S, S * K))
    M = sp.csr_matrix(W @ mdp.P_rows())
    if horizon is not None:
        if horizon < 0:
            raise InputError(f"horizon must be >= 0, got {horizon}")
        u = np.ones(S)
        for _ in range(int(horizon)):
            u = M @ u
        return float(mdp.rho0 @ u)
    g = mdp.gamma
    # M ≥ 0 entrywise: its spectral radius is the Perron root, the largest-magnitude eigenvalue
    radius = float(np.abs(spla.eigs(M.astype(np.float64), k=1, which="LM",
                                    return_eigenvectors=False, tol=1e-10)[0]))
    if g * radius >= 1.0:
        return math.inf
    u = spla.spsolve(sp.csc_matrix(sp.identity(S) - g * M), (1 - g) * wk.sum(axis=1))
    return float(mdp.rho0 @ u)


def importance_weight_ess(mdp: FactorizedMDP, behavior: TeamPolicy, target: TeamPolicy, *,
                          horizon: int | None = None) -> float:
    """Exact normalized effective sample size ``ESS/B = (E w)² / E[w²]`` of trajectory weights
    (TeamTR App. G.6; episodes as in :func:`trajectory_weight_moment`).

    ``B`` i.i.d. trajectories with weights ``w_b`` have ``ESS = (Σ w_b)²/Σ w_b²``; as ``B → ∞``,
    ``ESS/B → (E w)²/E[w²]``, the value returned. ``0`` when ``E[w²] = ∞``.
    """
    m1 = trajectory_weight_moment(mdp, behavior, target, 1, horizon=horizon)
    m2 = trajectory_weight_moment(mdp, behavior, target, 2, horizon=horizon)
    return 0.0 if math.isinf(m2) else m1 * m1 / m2


def sample_trajectory_weights(mdp: FactorizedMDP, behavior: TeamPolicy, target: TeamPolicy,
                              n_traj: int, rng, *, horizon: int | None = None,
                              max_steps: int = 100_000) -> np.ndarray:
    """(n_traj,) weights ``w(τ)`` of trajectories simulated under ``behavior`` (episodes as in
    :func:`trajectory_weight_moment`); the Monte Carlo counterpart of the exact moments."""
    rng = np.random.default_rng(rng)
    dense = mdp.to_dense() if mdp.is_sparse else mdp
    rho = step_weight_ratio(mdp, behavior, target)
    with np.errstate(divide="ignore"):
        logrho = np.log(rho)
    cum_pi = np.cumsum(joint_policy(mdp, behavior), axis=1)
    cum_P = np.cumsum(dense.P, axis=2)
    S, K = cum_pi.shape
    s = np.minimum(np.searchsorted(np.cumsum(mdp.rho0), rng.random(n_traj), side="right"), S - 1)
    logw = np.zeros(n_traj)
    alive = np.ones(n_traj, dtype=bool)
    steps = 0
    while alive.any():
        if steps >= (horizon if horizon is not None else max_steps):
            break
        idx = np.flatnonzero(alive)
        si = s[idx]
        a = np.minimum((rng.random(idx.size)[:, None] >= cum_pi[si]).sum(axis=1), K - 1)
        logw[idx] += logrho[si, a]
        nxt = np.minimum((rng.random(idx.size)[:, None] >= cum_P[si, a]).sum(axis=1), S - 1)
        s[idx] = nxt
        if horizon is None:
            alive[idx[rng.random(idx.size) >= mdp.gamma]] = False
        steps += 1
    return np.exp(logw)
