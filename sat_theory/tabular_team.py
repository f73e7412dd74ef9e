"""The tabular backend of the :class:`~sat_theory.team.Team` interface.

Each agent ``j`` is a softmax-logit table ``z_j`` (S, A_j), ``π^(j)(·|s) = softmax(z_j[s])``.
Two modes:

``exact`` — the infinite-sample limit. ``rollout`` returns an ``exact=True`` batch holding the
current team policy and its exact evaluation (``d``, ``A``; THEORY §2). ``update`` solves the
KL-penalized exact surrogate per state (the occupancy weight ``d(s)`` multiplies both terms
and cancels)::

    π_new(·|s) = argmax_π  Σ_a π(a) g(s,a) − β KL(π_ref(·|s) ‖ π),  g = A_j(s,·)/(1−γ),

with ``A_j`` the agent's marginal advantage (:func:`sat_theory.policy.marginal_advantage`).
``exact_step="proximal"`` (default) solves it exactly: stationarity gives
``π(a) = β π_ref(a)/(λ − g(a))`` with the scalar ``λ ∈ [max_a(g_a + β π_ref(a)), max_a g_a + β]``
fixed by ``Σ_a π(a) = 1`` (bisection) — the penalty is in the trust region's own direction
(behaviour-to-updated). ``exact_step="npg"`` takes the natural-gradient step of softmax
policies, ``z ← z_ref + g/β`` (Kakade 2001; the exact maximizer with the KL reversed).
Backtracking's ``step_scale`` multiplies ``g``.

``sampled`` — ``rollout(B, G)`` draws ``B`` start states from ``ρ0`` and ``G`` episodes from
each (a group), truncated at the horizon ``H = ⌈log(horizon_tol)/log γ⌉`` (so ``γ^H ≤
horizon_tol``). Truncation bias, with ``R_max = max|R|``: returns and rewards-to-go are off by
at most ``γ^{H−t} R_max/(1−γ)``; the KL estimate ``δ̂`` (weights ``(1−γ)γ^t`` that sum to
``1 − γ^H``) by at most ``γ^H max_s KL_s``; the surrogate estimate ``L̂`` of the algorithm by at
most ``2 γ^H R_max/(1−γ) · (1/(1−γ) + H)``: the missing steps ``t ≥ H`` contribute
``Σ_{t≥H} γ^t |E_{s_t} E_{a∼π_new} A(s_t,a)| ≤ γ^H A_max/(1−γ)`` with ``A_max ≤ 2R_max/(1−γ)``
(``E_{π_beh} A = 0``), and each kept step ``t < H`` loses
``γ^t |E[(r_t − 1) γ^{H−t} V(s_H)]| ≤ γ^H · E|r_t − 1| · ‖V‖∞ ≤ 2γ^H R_max/(1−γ)``
(``E[G_t^H | s_t, a_t] = Q(s_t,a_t) − γ^{H−t} E[V(s_H) | s_t, a_t]``, ``E|r − 1| = 2 TV ≤ 2``);
the batch reports this last bound as ``extra["truncation_bias"]``. ``update`` runs ``epochs``
full-batch Adam steps (learning rate ``lr · step_scale``) on the clipped surrogate with the
per-turn advantages plus ``β · δ̂(θ)``, on the agent's visited states; the gradient per turn
at state ``s``, action ``a``, ratio ``r`` is ``1{unclipped} Ã r (e_a − π_s)/N −
β (1−γ)γ^t (π_s − π_ref,s)/N``.

Both modes evaluate the team exactly (``evaluate`` = ``J``) and provide the oracle hooks
``exact_step_terms`` / ``exact_stage_terms`` (THEORY §4 terms of the step/stage just taken).
Evaluations are cached by per-agent parameter versions, so snapshots and restores reuse them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, fields

import numpy as np
import scipy.sparse as sp
from scipy.special import log_softmax, softmax

from .certificates import stage_certificate
from .config_file import from_args, setting, to_values
from .errors import InputError
from .estimators import importance_weight_ess
from .evaluate import Evaluation, evaluate
from .mdp import FactorizedMDP
from .policy import (
    TeamPolicy,
    expected_advantage,
    factor_kl,
    factor_tv,
    kl_rows,
    marginal_advantage,
)
from .team import Batch, Episode, Turn, TurnArrays

__all__ = ["TabularTeam", "TabularConfig", "TabularBackend", "horizon_for", "proximal_step",
           "mdp_spec", "build_mdp_from_spec", "RANDOM_ENVS"]

MODES = ("exact", "sampled")
EXACT_STEPS = ("proximal", "npg")


def horizon_for(gamma: float, tol: float) -> int:
    """Smallest ``H`` with ``γ^H ≤ tol``: ``⌈log(tol)/log(γ)⌉``."""
    if not (0 < tol < 1):
        raise InputError(f"horizon_tol must lie in (0, 1), got {tol}")
    return max(1, math.ceil(math.log(tol) / math.log(gamma)))


def proximal_step(p: np.ndarray, g: np.ndarray, beta: float, iters: int = 200) -> np.ndarray:
    """Rows ``π = argmax_π Σ_a π_a g_a − β KL(p‖π)`` for (M, A) ``p`` and ``g``.

    ``π_a = β p_a/(λ − g_a)`` with ``λ`` the root of ``Σ_a β p_a/(λ − g_a) = 1`` in
    ``[max_a(g_a + β p_a), max_a g_a + β]`` (the sum is ``≥ 1`` at the left end, ``≤ 1`` at the
    right end and decreasing between); bisection, then rows renormalized. ``p_a = 0`` gives
    ``π_a = 0``.
    """
    lo = (g + beta * p).max(axis=1)
    hi = g.max(axis=1) + beta
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            h = np.where(p > 0, beta * p / np.maximum(mid[:, None] - g, 1e-300), 0.0).sum(axis=1)
        big = h > 1.0
        lo = np.where(big, mid, lo)
        hi = np.where(big, hi, mid)
        if np.all(hi - lo <= 1e-15 * np.maximum(1.0, np.abs(hi))):
            break
    lam = hi  # h(hi) ≤ 1: every denominator positive
    with np.errstate(divide="ignore", invalid="ignore"):
        pi = np.where(p > 0, beta * p / np.maximum(lam[:, None] - g, 1e-300), 0.0)
    return pi / pi.sum(axis=1, keepdims=True)


def _rewards_to_go(rew: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = Σ_{u≥t} γ^{u−t} r_u`` per episode (rows of ``rew``), by the backward recursion
    ``G_t = r_t + γ G_{t+1}``, ``G_H = 0``."""
    rtg = np.empty_like(rew)
    acc = np.zeros(rew.shape[0])
    for t in range(rew.shape[1] - 1, -1, -1):
        acc = rew[:, t] + gamma * acc
        rtg[:, t] = acc
    return rtg


def _draw_actions(rng, cdfs, logf, s, counts, act_mask):
    """``a_j ∼ π^(j)(·|s)`` for every episode and agent (inverse CDF, one uniform per episode,
    agent by agent) and ``log π^(j)(a_j|s)``; inactive agents play the no-op 0, log-prob 0."""
    N = s.size
    acts = np.zeros((N, len(cdfs)), np.int64)
    logps = np.zeros((N, len(cdfs)))
    for j, (cdf, lf) in enumerate(zip(cdfs, logf, strict=True)):
        u = rng.random(N)
        a = np.minimum((cdf[s] < u[:, None]).sum(axis=1), counts[j] - 1)
        a = np.where(act_mask[:, j], a, 0)
        acts[:, j] = a
        logps[:, j] = np.where(act_mask[:, j], lf[s, a], 0.0)
    return acts, logps


def _joint_slot(mdp: FactorizedMDP, acts: np.ndarray, s: np.ndarray, counts) -> np.ndarray:
    """Slot ``k`` of the joint actions ``acts`` (N, n): the acting agent's action
    ``a_{turn(s)}`` (turn-taking), else the C-order ravel of ``(a_1..a_n)``."""
    if mdp.kind == "turn":
        return acts[np.arange(s.size), mdp.turn[s]]
    return np.ravel_multi_index(tuple(acts[:, j] for j in range(acts.shape[1])), tuple(counts))


def _next_states(rng, transitions, rows: np.ndarray) -> np.ndarray:
    """``s' ∼ P(·|s,a)`` for each CSR row ``s·K + k``: inverse CDF on the row's slice of the
    cumulated nonzeros ``cum`` (one uniform per row)."""
    P, cum = transitions
    start, end = P.indptr[rows], P.indptr[rows + 1]
    base = np.where(start > 0, cum[np.maximum(start - 1, 0)], 0.0)
    total = cum[end - 1] - base
    idx = np.searchsorted(cum, base + rng.random(rows.size) * total, side="right")
    idx = np.clip(idx, start, end - 1)
    return P.indices[idx]


def _simulate(mdp: FactorizedMDP, rng, transitions, cdfs, logf, s: np.ndarray, H: int):
    """``H`` steps of the episodes starting at ``s`` (N,): states ``s_t`` (N, H), actions and
    log-probs (N, H, n) and rewards ``r_t = R(s_t, a_t)`` (N, H)."""
    N, n, K = s.size, mdp.n_agents, mdp.n_joint
    counts = np.array(mdp.action_counts)
    states = np.empty((N, H), np.int64)
    acts = np.zeros((N, H, n), np.int64)
    logps = np.zeros((N, H, n))
    rew = np.empty((N, H))
    for t in range(H):
        states[:, t] = s
        acts[:, t], logps[:, t] = _draw_actions(rng, cdfs, logf, s, counts, mdp.active[s])
        k = _joint_slot(mdp, acts[:, t], s, counts)
        rew[:, t] = mdp.R[s, k]
        s = _next_states(rng, transitions, s * K + k)
    return states, acts, logps, rew


def _episodes(group, states, acts, logps, rtg, ret, active) -> list[Episode]:
    """The episodes' turns in batch order (episode, then time, then agent): one per active
    agent and step, built in one pass."""
    e_all, t_all, j_all = np.nonzero(active)
    turns = list(map(Turn, j_all.tolist(), states[e_all, t_all].tolist(),
                     acts[e_all, t_all, j_all].tolist(), logps[e_all, t_all, j_all].tolist(),
                     t_all.tolist(), rtg[e_all, t_all].tolist()))
    N = states.shape[0]
    bounds = np.searchsorted(e_all, np.arange(N + 1)).tolist()
    groups, rets = group.tolist(), ret.tolist()
    return [Episode(groups[e], turns[bounds[e]:bounds[e + 1]], rets[e]) for e in range(N)]


def _turn_arrays(active_j, states, acts_j, logps_j, rtg) -> TurnArrays:
    """One agent's turns as arrays (the steps where it is active, in batch order)."""
    e_idx, t_idx = np.nonzero(active_j)
    return TurnArrays(episode=e_idx, t=t_idx, logp=logps_j[e_idx, t_idx],
                      reward_to_go=rtg[e_idx, t_idx], context=states[e_idx, t_idx],
                      action=acts_j[e_idx, t_idx])


class TabularTeam:
    """A team of softmax-logit agents on a :class:`FactorizedMDP` (module docstring)."""

    def __init__(self, mdp: FactorizedMDP, policy: TeamPolicy | None = None, *,
                 mode: str = "exact", seed: int = 0, exact_step: str = "proximal",
                 lr: float = 0.5, epochs: int = 10, clip_eps: float = 0.2,
                 horizon: int | None = None, horizon_tol: float = 1e-3, n_probe: int = 500):
        if mode not in MODES:
            raise InputError(f"unknown mode {mode!r}; choose exact or sampled")
        if exact_step not in EXACT_STEPS:
            raise InputError(f"unknown exact_step {exact_step!r}; choose proximal or npg")
        self.mdp = mdp
        self.mode = mode
        self.exact_step = exact_step
        self.lr, self.epochs, self.clip_eps = float(lr), int(epochs), float(clip_eps)
        self.n_agents = mdp.n_agents
        self.gamma = float(mdp.gamma)
        self.horizon = int(horizon) if horizon is not None else horizon_for(self.gamma, horizon_tol)
        if self.horizon < 1:
            raise InputError(f"horizon must be >= 1, got {self.horizon}")
        self.n_probe = int(n_probe)
        self.seed = int(seed)
        self.rng = np.random.default_rng(seed)
        pol = TeamPolicy.uniform(mdp) if policy is None else policy
        with np.errstate(divide="ignore"):
            self.logits = [np.log(np.asarray(f, dtype=np.float64)) for f in pol.factors]
        self._init = [z.copy() for z in self.logits]
        self._next_version = 0
        self._ver = [self._new_version() for _ in range(self.n_agents)]
        self._cache: OrderedDict = OrderedDict()
        self._rollout_id = 0
        self._ctx: dict = {}  # (agent, rollout_id) -> (d, A_j) of the last exact update
        R_max = float(np.abs(mdp.R).max())
        self.R_max = R_max
        #: a-priori |A| bound (reward units): |Q − V| ≤ 2 R_max/(1−γ)
        self.advantage_bound = 2.0 * R_max / (1.0 - self.gamma)
        self._P_csr = None

    # ---------------------------------------------------------------- helpers
    def _new_version(self) -> int:
        self._next_version += 1
        return self._next_version

    def factor(self, j: int, logits: np.ndarray | None = None) -> np.ndarray:
        return softmax(self.logits[j] if logits is None else logits, axis=1)

    @property
    def policy(self) -> TeamPolicy:
        return TeamPolicy.from_logits(self.logits)

    def _policy_of(self, logits: list[np.ndarray]) -> TeamPolicy:
        return TeamPolicy.from_logits(logits)

    def _eval(self, versions: tuple, logits: list[np.ndarray]) -> Evaluation:
        ev = self._cache.get(versions)
        if ev is None:
            ev = evaluate(self.mdp, self._policy_of(logits))
            self._cache[versions] = ev
            if len(self._cache) > 16:  # each entry may hold an (S, S) LU factorization
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(versions)
        return ev

    def _eval_now(self) -> Evaluation:
        return self._eval(tuple(self._ver), self.logits)

    def _set(self, j: int, logits: np.ndarray, version: int | None = None) -> None:
        self.logits[j] = np.asarray(logits, dtype=np.float64)
        self._ver[j] = self._new_version() if version is None else version

    # ------------------------------------------------------------ Team protocol
    def snapshot(self, agent: int):
        return (self.logits[agent].copy(), self._ver[agent])

    def restore(self, agent: int, snap) -> None:
        self._set(agent, snap[0].copy(), snap[1])

    def evaluate(self) -> float:
        return self._eval_now().J

    def replace(self, agent: int, new) -> None:
        new = np.asarray(new, dtype=np.float64)
        if new.shape != self.logits[agent].shape:
            raise InputError(f"replacement for agent {agent} has shape {new.shape}, "
                             f"expected {self.logits[agent].shape}")
        self._set(agent, new.copy())

    def rollout(self, n_groups: int, group_size: int) -> Batch:
        self._rollout_id += 1
        self._ctx.clear()  # the algorithm never returns to an older batch after a fresh one
        if self.mode == "exact":
            self._eval_now()  # cached under the batch's versions (see _batch_eval)
            return Batch([], self._rollout_id, extra=dict(
                policy=self.policy, versions=tuple(self._ver)), exact=True)
        return self._sample(n_groups, group_size)

    def update(self, agent: int, batch: Batch, advantages, beta: float, reference, *,
               step_scale: float = 1.0, correction: str = "none") -> dict:
        if batch.exact:
            return self._update_exact(agent, batch, beta, reference, step_scale, correction)
        if advantages is None:
            raise InputError("sampled batches need advantages")
        return self._update_sampled(agent, batch, np.asarray(advantages, dtype=np.float64),
                                    beta, reference, step_scale)

    def kl(self, agent: int, batch: Batch, reference) -> dict:
        p_ref = self.factor(agent, reference[0])
        p_now = self.factor(agent)
        if batch.exact:
            d, Aj = self._exact_context(agent, batch, "none")
            kl_s = factor_kl(self.mdp, p_ref, p_now, agent)
            act = self.mdp.active[:, agent]
            m = d > 0
            surrogate = float(d @ np.einsum("sa,sa->s", p_now, Aj)) / (1.0 - self.gamma)
            return dict(kl=float(d[m] @ kl_s[m]),
                        kl_max=float(kl_s[act].max()) if act.any() else 0.0,
                        surrogate=surrogate)
        ta = batch.arrays(agent)
        s = ta.context.astype(np.int64)
        a = ta.action.astype(np.int64)
        kl_t = kl_rows(p_ref[s], p_now[s])
        w = (1.0 - self.gamma) * np.power(self.gamma, ta.t.astype(np.float64))
        logp = log_softmax(self.logits[agent][s], axis=1)[np.arange(s.size), a]
        return dict(kl=float(w @ kl_t) / max(batch.n_episodes, 1),
                    kl_max=float(kl_t.max()) if kl_t.size else 0.0, logp=logp)

    # ---------------------------------------------------------------- exact mode
    def _exact_context(self, agent: int, batch: Batch, correction: str):
        """(d, A_j) of an exact update: state weights and the agent's marginal advantage."""
        key = (agent, batch.rollout_id)
        if correction == "none" and key in self._ctx:
            return self._ctx[key]
        ev = self._batch_eval(batch)
        if correction == "trajectory":  # exact IS: the current team's occupancy/advantages
            ev_now = self._eval_now()
            d, A, pol = ev_now.d, ev_now.A, self.policy
        elif correction == "step":  # HAPPO M-factor: stale states, current partners
            d, A, pol = ev.d, ev.A, self.policy
        elif correction == "none":
            d, A, pol = ev.d, ev.A, batch.extra["policy"]
        else:
            raise InputError(f"unknown correction {correction!r}")
        out = (d, marginal_advantage(self.mdp, pol, A, agent))
        self._ctx[key] = out
        return out

    def _batch_eval(self, batch: Batch) -> Evaluation:
        """The exact evaluation of an exact batch's policy: cached under its versions, else
        (evicted, or a batch restored from a checkpoint) recomputed from the stored policy —
        the same numbers, since the batch's policy is ``TeamPolicy.from_logits`` of the
        logits that were evaluated."""
        versions = tuple(batch.extra["versions"])
        ev = self._cache.get(versions)
        if ev is None:
            ev = self._cache[versions] = evaluate(self.mdp, batch.extra["policy"])
            if len(self._cache) > 16:
                self._cache.popitem(last=False)
        return ev

    def _update_exact(self, agent, batch, beta, reference, step_scale, correction) -> dict:
        self._ctx.pop((agent, batch.rollout_id), None)
        d, Aj = self._exact_context(agent, batch, correction)
        out = {}
        if correction == "trajectory":
            # exact ESS/B of the trajectory weights π̂^{i−1}/π̂^0 this correction stands for
            out["ess"] = importance_weight_ess(self.mdp, batch.extra["policy"], self.policy)
        act = self.mdp.active[:, agent]
        z = reference[0].copy()
        g = step_scale * Aj[act] / (1.0 - self.gamma)
        if self.exact_step == "npg":
            z_new = z[act] + g / beta
            z[act] = z_new - z_new.max(axis=1, keepdims=True)
        else:
            pi = proximal_step(softmax(z[act], axis=1), g, beta)
            with np.errstate(divide="ignore"):
                z[act] = np.log(pi)
        self._set(agent, z)
        return out

    # -------------------------------------------------------------- sampled mode
    def _transition_sampler(self):
        if self._P_csr is None:
            P = self.mdp.P_rows()
            P = P if sp.issparse(P) else sp.csr_matrix(P)
            cum = np.cumsum(P.data)
            self._P_csr = (P, cum)
        return self._P_csr

    def _sample(self, B: int, G: int) -> Batch:
        """``G`` episodes from each of ``B`` start states ``s_0 ∼ ρ0``, truncated at ``H``."""
        mdp, rng, H, n = self.mdp, self.rng, self.horizon, self.n_agents
        starts = rng.choice(mdp.n_states, size=B, p=mdp.rho0)
        cdfs = [np.cumsum(self.factor(j), axis=1) for j in range(n)]
        logf = [log_softmax(self.logits[j], axis=1) for j in range(n)]
        states, acts, logps, rew = _simulate(mdp, rng, self._transition_sampler(), cdfs, logf,
                                             np.repeat(starts, G), H)
        rtg = _rewards_to_go(rew, self.gamma)
        ret = rew @ self.gamma ** np.arange(H)
        active = mdp.active[states]  # (N, H, n)
        episodes = _episodes(np.repeat(np.arange(B), G), states, acts, logps, rtg, ret, active)
        batch = Batch(episodes, self._rollout_id, extra=dict(
            horizon=H, truncation_bias=self.truncation_bias(),
            versions=tuple(self._ver)))
        for j in range(n):
            batch._arrays[j] = _turn_arrays(active[:, :, j], states, acts[:, :, j],
                                            logps[:, :, j], rtg)
        return batch

    def truncation_bias(self) -> float:
        """Bound on ``|E L̂ − L|`` from the horizon: ``2γ^H R_max/(1−γ) · (1/(1−γ) + H)``."""
        g, H = self.gamma, self.horizon
        return 2.0 * g ** H * self.R_max / (1.0 - g) * (1.0 / (1.0 - g) + H)

    def _update_sampled(self, agent, batch, adv, beta, reference, step_scale) -> dict:
        ta = batch.arrays(agent)
        s = ta.context.astype(np.int64)
        a = ta.action.astype(np.int64)
        M = s.size
        N = max(batch.n_episodes, 1)
        z = reference[0].copy()
        if M == 0:
            self._set(agent, z)
            return dict(ratio_clip_frac=0.0)
        p_ref = softmax(z[s], axis=1)
        wkl = (1.0 - self.gamma) * np.power(self.gamma, ta.t.astype(np.float64)) / N
        onehot = np.zeros_like(p_ref)
        onehot[np.arange(M), a] = 1.0
        m1 = np.zeros_like(z)
        m2 = np.zeros_like(z)
        b1, b2, eps = 0.9, 0.999, 1e-8
        lr = self.lr * step_scale
        ce = self.clip_eps
        for it in range(1, self.epochs + 1):
            pi = softmax(z[s], axis=1)
            r = np.exp(np.log(pi[np.arange(M), a]) - ta.logp)
            live = np.where(adv >= 0, r <= 1 + ce, r >= 1 - ce)
            coef = live * adv * r / N
            gturn = coef[:, None] * (onehot - pi) - beta * wkl[:, None] * (pi - p_ref)
            grad = np.zeros_like(z)
            np.add.at(grad, s, gturn)
            m1 = b1 * m1 + (1 - b1) * grad
            m2 = b2 * m2 + (1 - b2) * grad * grad
            step = lr * (m1 / (1 - b1 ** it)) / (np.sqrt(m2 / (1 - b2 ** it)) + eps)
            z = z + step  # ascent; unvisited rows have zero gradient and stay put
        self._set(agent, z)
        pi = softmax(z[s], axis=1)
        r = np.exp(np.log(pi[np.arange(M), a]) - ta.logp)
        return dict(ratio_clip_frac=float(np.mean((r > 1 + ce) | (r < 1 - ce))))

    # ------------------------------------------------------------- oracle hooks
    def exact_step_terms(self, agent: int, reference, stage_start, delta_i: float | None = None) -> dict:
        """Exact THEORY §4 terms of the step just taken by ``agent`` (from ``reference`` to
        its current factor), with ``π̂^{i−1}`` = the current team with the reference factor,
        ``π̂^i`` = the current team and ``π̂^0`` = ``stage_start`` (all agents' snapshots).
        ``occ_drift = ½‖d^{π̂^{i−1}} − d^{π̂^0}‖_1`` is the occupancy drift of the step's states
        from the stage start (TeamTR's D_occ). With ``delta_i``: ``kl_violation_frac`` (fraction of the agent's states with
        ``KL_s > δ_i``, SAT Fig. 1c) and ``kl_violation_mass`` (their ``d^{π̂^{i−1}}`` mass)."""
        mdp, g = self.mdp, self.gamma
        prev_logits = list(self.logits)
        prev_logits[agent] = reference[0]
        prev_ver = list(self._ver)
        prev_ver[agent] = reference[1]
        ev_prev = self._eval(tuple(prev_ver), prev_logits)
        ev_now = self._eval_now()
        ev0 = self._eval(tuple(sn[1] for sn in stage_start), [sn[0] for sn in stage_start])
        p_ref, p_now = self.factor(agent, reference[0]), self.factor(agent)
        kl = factor_kl(mdp, p_ref, p_now, agent)
        act = mdp.active[:, agent]
        f = expected_advantage(ev_now.pi, ev_prev.A)
        m = ev_prev.d > 0
        return dict(
            L_seq=float(ev_prev.d @ f) / (1 - g), L_stale=float(ev0.d @ f) / (1 - g),
            delta=float(ev_prev.d[m] @ kl[m]),
            delta_max=float(kl[act].max()) if act.any() else 0.0,
            tv=float(ev_prev.d @ factor_tv(mdp, p_ref, p_now, agent)),
            A_max=ev_prev.A_max, f_inf=float(np.abs(f).max()),
            true_gain=ev_now.J - ev_prev.J, J=ev_now.J,
            occ_drift=0.5 * float(np.abs(ev_prev.d - ev0.d).sum()),
            kl_violation_frac=(float(np.mean(kl[act] > delta_i)) if delta_i is not None
                               and act.any() else None),
            kl_violation_mass=(float(ev_prev.d[act & (kl > delta_i)].sum())
                               if delta_i is not None else None))

    def exact_stage_terms(self, stage_start, order) -> dict:
        """:func:`stage_certificate` of stage-start → now in ``order`` (as a dict)."""
        logits = [sn[0] for sn in stage_start]
        versions = [sn[1] for sn in stage_start]
        evs = [self._eval(tuple(versions), logits)]
        for j in order:  # π̂^i: the stage-start team with σ(1..i) at their current factors
            logits, versions = list(logits), list(versions)
            logits[j], versions[j] = self.logits[j], self._ver[j]
            evs.append(self._eval(tuple(versions), logits))
        cert = stage_certificate(self.mdp, self._policy_of([sn[0] for sn in stage_start]),
                                 self.policy, order, evaluations=evs)
        return cert.to_dict()

    # ------------------------------------------------------------- plug-and-play
    def new_agent(self, agent: int, kind: str, seed: int) -> np.ndarray:
        """Logits of a replacement for ``agent``: ``random`` (Gaussian logits) or
        ``stronger`` — trained elsewhere: 30 exact natural-gradient iterations of this agent
        alone against a random team of partners, i.e. a competent agent that never saw this
        team's conventions (the tabular analogue of a stronger pretrained model)."""
        rng = np.random.default_rng(seed)
        shape = self.logits[agent].shape
        if kind == "random":
            return rng.standard_normal(shape)
        if kind != "stronger":
            raise InputError(f"unknown replacement kind {kind!r}; choose stronger or random")
        partners = [rng.standard_normal(z.shape) for z in self.logits]
        act = self.mdp.active[:, agent]
        for _ in range(30):
            pol = TeamPolicy.from_logits(partners)
            ev = evaluate(self.mdp, pol)
            Aj = marginal_advantage(self.mdp, pol, ev.A, agent)
            z = partners[agent]
            z[act] = z[act] + Aj[act] / max(ev.A_max, 1e-12)
        return partners[agent]

    def align(self, agent: int, new, delta_align: float, form: str):
        """Stage-0 alignment of ``new`` (logits) toward the current agent (THEORY §5).

        Probe states: ``n_probe`` draws from the current team's exact occupancy, restricted to
        states where the agent acts. ``distill``: TeamTR reverse-KL distillation with early stop
        at ``δ_align`` (:func:`sat_theory.stage0.align_distill`); ``project``: SAT's geometric
        projection of the new factor onto ``KL_s(π‖π_cur) ≤ δ_align`` at every state
        (:func:`sat_theory.stage0.project_geometric`). Returns the aligned logits and the
        exact ``E_d KL_s(π_cur‖π_aligned)`` (the certificate's direction) among its info."""
        from .stage0 import align_distill, probe_distribution, project_geometric

        p_old = self.factor(agent)
        p_new = softmax(np.asarray(new, dtype=np.float64), axis=1)
        ev = self._eval_now()
        act = self.mdp.active[:, agent]
        d_act = np.where(act, ev.d, 0.0)
        rng = np.random.default_rng(self.seed + 104729)
        info: dict = {}
        if form == "distill":
            nu = probe_distribution(d_act, self.n_probe, rng)
            q, trace = align_distill(p_old, p_new, nu, delta_align)
            info.update(steps=trace.steps, kl_probe=float(trace.kl[-1]),
                        converged=trace.converged)
        elif form == "project":
            res = project_geometric(p_new, p_old, delta_align, constraint="sat")
            q = res.pi
            info.update(kl_new_cur_max=float(res.kl_new_cur[act].max()) if act.any() else 0.0)
        else:
            raise InputError(f"unknown Stage-0 form {form!r}; choose distill or project")
        kl = factor_kl(self.mdp, p_old, q, agent)
        info["kl_exact"] = float(ev.d @ np.where(np.isfinite(kl), kl, 0.0)) if np.all(
            np.isfinite(kl[ev.d > 0])) else float("inf")
        info["kl_before"] = float(ev.d @ factor_kl(self.mdp, p_old, p_new, agent))
        with np.errstate(divide="ignore"):
            return np.log(q), info

    def reset(self, agents) -> None:
        for k in agents:
            self._set(k, self._init[k].copy())

    def save(self, path: str) -> None:
        """The current team policy in the core's ``.npz`` format (``pi_0 … pi_{n−1}``)."""
        self.policy.save(path)

    # ------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Everything that changes during training (the runner checkpoints it): the logits,
        their versions, the initial logits (``reset``), the sampling RNG and the rollout
        counter. Caches are rebuilt on demand with the same numbers."""
        return dict(logits=[z.copy() for z in self.logits], init=[z.copy() for z in self._init],
                    versions=list(self._ver), next_version=self._next_version,
                    rng=self.rng.bit_generator.state, rollout_id=self._rollout_id)

    def load_state_dict(self, d: dict) -> None:
        shapes = [z.shape for z in self.logits]
        for key in ("logits", "init"):  # a NaN logit resumed with exit 0 and J = nan
            if len(d[key]) != len(shapes) or [np.shape(z) for z in d[key]] != shapes:
                raise InputError(f"checkpoint does not match this MDP ({key} shapes differ)")
            if any(np.asarray(z).dtype.kind != "f" or not np.isfinite(z).all() for z in d[key]):
                raise InputError(f"checkpoint {key} are not finite floats")
        self.logits = [np.array(z, dtype=np.float64) for z in d["logits"]]
        self._init = [np.array(z, dtype=np.float64) for z in d["init"]]
        self._ver = [int(v) for v in d["versions"]]
        self._next_version = int(d["next_version"])
        self.rng.bit_generator.state = d["rng"]
        self._rollout_id = int(d["rollout_id"])
        self._cache.clear()
        self._ctx.clear()


# ------------------------------------------------------------------ the tabular backend
#: the seeded random MDP generators of ``--env`` and their layouts
RANDOM_ENVS = {"random-simultaneous": "simultaneous", "random-masked": "masked",
               "random-turn": "turn"}


@dataclass
class TabularConfig:
    """The tabular world's settings (``sat train --backend tabular``; each field one flag,
    :func:`sat_theory.config_file.setting`). The saved ``config.json`` ``backend`` section
    is :meth:`TabularBackend.configure`'s resolved form (paths, hashes, the MDP's sizes)."""

    mdp: str | None = setting(None, "MDP .npz file")
    env: str | None = setting(None, "named MDP (bandit, chain, two_state, coordination, "
                              "naive_reuse) or random-simultaneous | random-masked | random-turn")
    states: int = setting(8, "random envs: number of states", range=("int", 1, None, True, False))
    actions: int = setting(2, "random envs: actions per agent",
                           range=("int", 1, None, True, False))
    agents: int | None = setting(None, "number of agents (random envs: required size; "
                                 "otherwise checked)", range=("int", 1, None, True, False))
    gamma: float | None = setting(None, "discount for --env (none: the env's own, 0.9 for "
                                  "random envs)", range=("float", 0.0, 1.0, False, False))
    env_seed: int | None = setting(None, "random envs: seed (none: --seed)",
                                   range=("int", 0, None, True, False))
    init: str = setting("uniform", "initial team policy: uniform | random | a policy .npz file")
    exact: bool = setting(False, "exact mode: expectations computed exactly (the default)")
    sampled: bool = setting(False, "sampled mode (implied by --group-size/--groups)")
    exact_step: str = setting("proximal", "exact mode: the trust-region step on the exact "
                              "surrogate", choices=EXACT_STEPS)
    lr: float = setting(0.5, "sampled mode: Adam learning rate (0.5: the trust region δ = "
                        "0.01 binds)", range=("float", 0.0, None, False, False))
    epochs: int = setting(10, "sampled mode: Adam steps per update",
                          range=("int", 1, None, True, False))
    horizon_tol: float = setting(1e-3, "sampled mode: truncate episodes at H with γ^H ≤ this",
                                 range=("float", 0.0, 1.0, False, False))


def _sha256(path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _sha256_or_none(path):
    import os

    return _sha256(path) if os.path.isfile(path) else None


def mdp_spec(t: TabularConfig, seed: int) -> dict:
    """What identifies the run's MDP (saved in config.json, so ``--resume`` rebuilds it)."""
    import os

    if (t.mdp is None) == (t.env is None):
        raise InputError("give exactly one of --mdp FILE or --env NAME")
    if t.mdp is not None:
        path = os.path.abspath(t.mdp)
        if not os.path.isfile(path):
            raise InputError(f"MDP file not found: {t.mdp}")
        return dict(mdp=path, mdp_sha256=_sha256(path), env=None)
    if t.env in RANDOM_ENVS and t.agents is None:
        raise InputError(f"--env {t.env} needs --agents N")
    return dict(mdp=None, env=t.env, states=t.states, actions=t.actions, env_agents=t.agents,
                env_gamma=t.gamma, env_seed=seed if t.env_seed is None else t.env_seed)


def build_mdp_from_spec(spec: dict):
    """The MDP of a saved :func:`mdp_spec` (a changed ``--mdp`` file is refused)."""
    from .envs import NAMED, named_mdp, random_mdp

    if spec["mdp"] is not None:
        if spec.get("mdp_sha256") and _sha256_or_none(spec["mdp"]) != spec["mdp_sha256"]:
            raise InputError(f"the MDP file {spec['mdp']} is missing or changed since the run "
                             "started (sha256 differs)")
        return FactorizedMDP.load(spec["mdp"])
    env = spec["env"]
    if env in RANDOM_ENVS:
        return random_mdp(spec["states"], spec["env_agents"], spec["actions"],
                          layout=RANDOM_ENVS[env],
                          gamma=0.9 if spec["env_gamma"] is None else spec["env_gamma"],
                          seed=spec["env_seed"])
    if env in NAMED:
        return named_mdp(env, spec["env_gamma"])
    raise InputError(f"unknown env {env!r}; choose one of "
                     f"{', '.join(sorted(NAMED) + sorted(RANDOM_ENVS))}")


#: where :meth:`TabularBackend.configure` saves a :class:`TabularConfig` field in
#: config.json's ``backend`` section when not under the field's own name (``exact`` and
#: ``sampled`` are saved together as ``mode``)
SAVED_AS = {"agents": "env_agents", "gamma": "env_gamma", "exact": None, "sampled": None}
#: the fields that describe an ``--env`` MDP (an ``--mdp`` run saves only the file)
ENV_FIELDS = ("env", "states", "actions", "agents", "gamma", "env_seed")


def saved_settings(b: dict) -> dict:
    """The :class:`TabularConfig` fields of a saved ``backend`` section ``b``: field ``f`` is
    ``b[SAVED_AS.get(f, f)]`` (an ``--mdp`` run has no :data:`ENV_FIELDS` but ``mdp``, an
    ``--env`` run no ``mdp``), and ``sampled`` is ``mode == "sampled"``. A missing key is one
    InputError line."""
    env_run = not b.get("mdp")
    out = {}
    try:
        for f in fields(TabularConfig):
            key = SAVED_AS.get(f.name, f.name)
            if key is None or (f.name in ENV_FIELDS and not env_run):
                continue
            out[f.name] = b[key]
        out["sampled"] = b["mode"] == "sampled"
    except KeyError as e:
        raise InputError(f"config.json: backend setting {e} missing") from None
    return out


def sampled_mode(t: TabularConfig, args) -> bool:
    """Whether the run is sampled: ``--sampled``, or ``--group-size``/``--groups`` given
    (they size the batches); ``--exact`` with either is refused."""
    if t.exact and t.sampled:
        raise InputError("--exact cannot be combined with --sampled")
    groups_given = any(getattr(args, d, None) is not None for d in ("group_size", "groups"))
    sampled = bool(t.sampled or groups_given)
    if sampled and t.exact:
        raise InputError("--exact cannot be combined with --group-size/--groups")
    return sampled


class TabularBackend:
    """The tabular backend (:class:`sat_theory.backends.Backend`): checks the settings and
    builds a :class:`TabularTeam` from the saved configuration."""

    name = "tabular"
    #: the algorithm's defaults are TrainConfig's own (TeamTR: δ = 0.01)
    algorithm_defaults: dict = {}
    settings = (TabularConfig,)

    def __init__(self):
        self._mdp = None  # the MDP loaded while configuring (reused by make_team)

    def configure(self, args) -> tuple:
        """``(TrainConfig, {"backend": ...})`` of the parsed settings ``args`` (any object
        with the settings' flag names as attributes), every cross-setting rule checked:
        the mode (:func:`sampled_mode`), the MDP and its agents, β > 0, the initial policy."""
        from .algorithm import TrainConfig

        t = TabularConfig(**from_args(TabularConfig, args))
        if getattr(args, "executor", "serial") != "serial":
            raise InputError("--executor ray runs LLM agents as Ray actors; it needs --backend llm")
        sampled = sampled_mode(t, args)
        seed = int(getattr(args, "seed", 0) or 0)
        spec = mdp_spec(t, seed)
        mdp = self._mdp = build_mdp_from_spec(spec)
        if t.agents is not None and t.agents != mdp.n_agents:
            raise InputError(f"--agents {t.agents} does not match the MDP, which has "
                             f"{mdp.n_agents} agents")
        cfg = TrainConfig.from_args(args, mdp.n_agents, self.algorithm_defaults)
        if cfg.beta_init == 0:  # proximal_step divides by β: β = 0 made every factor NaN
            raise InputError("--beta 0: the tabular update is the β-penalised maximiser "
                             "(proximal_step) and needs β > 0; use a small β instead")
        backend = dict(backend="tabular", mode="sampled" if sampled else "exact", **spec,
                       mdp_description=mdp.describe(), agents=mdp.n_agents,
                       gamma=mdp.gamma, **self._init_setting(t, mdp), exact_step=t.exact_step,
                       lr=t.lr, epochs=t.epochs, horizon_tol=t.horizon_tol,
                       horizon=horizon_for(mdp.gamma, t.horizon_tol), seed=seed)
        return cfg, {"backend": backend}

    def _init_setting(self, t: TabularConfig, mdp) -> dict:
        """The saved ``init``: ``uniform``/``random``, or a policy file's absolute path and
        sha256 (read now, so a bad file fails before the run starts)."""
        import os

        if t.init in ("uniform", "random"):
            return dict(init=t.init)
        self._init_policy(dict(init=t.init), mdp)
        return dict(init=os.path.abspath(t.init), init_sha256=_sha256(t.init))

    @staticmethod
    def sampled(config: dict) -> bool:
        return config["backend"].get("mode") == "sampled"

    @staticmethod
    def flag_values(config: dict) -> dict:
        """The tabular flags of a saved run (``--config RUN/config.json``): every
        :class:`TabularConfig` field under its flag's name
        (:func:`sat_theory.config_file.to_values`) from :func:`saved_settings`."""
        return to_values(TabularConfig, saved_settings(config["backend"]))

    @staticmethod
    def unused_algorithm_settings(config: dict) -> tuple:
        """Algorithm settings the saved run did not use (exact mode draws no batches)."""
        return () if config["backend"].get("mode") == "sampled" else ("n_groups", "group_size")

    @staticmethod
    def _init_policy(b: dict, mdp):
        if b["init"] == "uniform":
            return TeamPolicy.uniform(mdp)
        if b["init"] == "random":
            return TeamPolicy.random(mdp, b["seed"])
        if b.get("init_sha256") and _sha256_or_none(b["init"]) != b["init_sha256"]:
            raise InputError(f"the initial policy {b['init']} is missing or changed since the "
                             "run started (sha256 differs)")
        return TeamPolicy.load(b["init"], mdp)

    def make_team(self, config: dict, cfg, out):
        b = config["backend"]
        try:
            mdp = self._mdp if self._mdp is not None else build_mdp_from_spec(b)
            return TabularTeam(mdp, self._init_policy(b, mdp), mode=b["mode"], seed=b["seed"],
                               exact_step=b["exact_step"], lr=b["lr"], epochs=b["epochs"],
                               horizon_tol=b["horizon_tol"])
        except KeyError as e:
            raise InputError(f"config.json: backend setting {e} missing") from None

    @staticmethod
    def report(summary: dict, cfg, out) -> int:
        print(f"{cfg.method}: {summary['stages']} stage{'' if summary['stages'] == 1 else 's'}, J {summary['J_start']:.6g} -> "
              f"{summary['J_end']:.6g}, certificate violations {summary['bound_violations']}, "
              f"rejected steps {summary['rejected_steps']}, rollouts {summary['rollouts']}, "
              f"{summary['seconds']:.2f}s -> {out}")
        return 0
