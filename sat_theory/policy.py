"""Factorized team policies ``π(a|s) = Π_{j ∈ active(s)} π^(j)(a_j|s)`` (THEORY §1).

A :class:`TeamPolicy` holds one stochastic factor per agent, an array of shape ``(S, A_j)``
of probabilities. Logits (the softmax parameterization used for gradients) are
``log π^(j)``; :meth:`TeamPolicy.from_logits` goes the other way. Rows at states where an
agent is inactive are ignored by every computation (the agent plays the no-op ``0`` there).

Policy files are ``.npz`` with keys ``pi_0 … pi_{n-1}``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
from scipy.special import softmax

from .errors import InputError
from .mdp import FactorizedMDP, _load_npz, as_real, check_distribution_rows, save_npz_atomic

__all__ = ["TeamPolicy", "joint_policy", "kl_rows", "tv_rows", "joint_kl", "joint_tv",
           "marginal_advantage", "expected_advantage"]


@dataclass(frozen=True, eq=False)
class TeamPolicy:
    """One probability table per agent: ``factors[j]`` has shape (S, A_j), rows sum to 1."""

    factors: tuple[np.ndarray, ...]

    @property
    def n_agents(self) -> int:
        return len(self.factors)

    @property
    def logits(self) -> tuple[np.ndarray, ...]:
        """``log π^(j)``: softmax logits of each factor (``-inf`` where a probability is 0)."""
        with np.errstate(divide="ignore"):
            return tuple(np.log(f) for f in self.factors)

    # ----------------------------------------------------------- constructors
    @classmethod
    def from_factors(cls, factors, mdp: FactorizedMDP, *, what: str = "policy") -> TeamPolicy:
        """Validate ``factors`` against ``mdp`` (shapes, distributions at active states)."""
        factors = list(factors)
        if len(factors) != mdp.n_agents:
            raise InputError(f"{what} has {len(factors)} factors, the MDP has {mdp.n_agents} agents")
        out = []
        for j, f in enumerate(factors):
            f = as_real(f, f"{what} factor pi_{j}")
            want = (mdp.n_states, mdp.action_counts[j])
            if f.shape != want:
                raise InputError(f"{what} factor pi_{j} has shape {f.shape}, expected {want}")
            act = mdp.active[:, j]
            checked = check_distribution_rows(f[act], f"{what} factor pi_{j}")
            full = np.zeros(want)
            full[:, 0] = 1.0  # inactive rows: the no-op
            full[act] = checked
            out.append(full)
        return cls(tuple(out))

    @classmethod
    def from_logits(cls, logits) -> TeamPolicy:
        """``π^(j) = softmax(logits[j])`` row-wise."""
        return cls(tuple(softmax(np.asarray(z, dtype=np.float64), axis=-1) for z in logits))

    @classmethod
    def uniform(cls, mdp: FactorizedMDP) -> TeamPolicy:
        return cls(tuple(np.full((mdp.n_states, a), 1.0 / a) for a in mdp.action_counts))

    @classmethod
    def random(cls, mdp: FactorizedMDP, rng: np.random.Generator | int, *,
               temperature: float = 1.0) -> TeamPolicy:
        """Softmax of Gaussian logits scaled by ``temperature`` (0 gives the uniform policy)."""
        rng = np.random.default_rng(rng)
        return cls.from_logits(
            [temperature * rng.standard_normal((mdp.n_states, a)) for a in mdp.action_counts]
        )

    def with_factor(self, j: int, factor: np.ndarray) -> TeamPolicy:
        """This policy with agent ``j``'s factor replaced (the π̂^i construction of THEORY §4)."""
        f = list(self.factors)
        f[j] = np.asarray(factor, dtype=np.float64)
        return TeamPolicy(tuple(f))

    # -------------------------------------------------------------------- I/O
    @classmethod
    def load(cls, path: str | os.PathLike, mdp: FactorizedMDP) -> TeamPolicy:
        data = _load_npz(path, "policy")
        keys = [f"pi_{j}" for j in range(mdp.n_agents)]
        missing = [k for k in keys if k not in data]
        if missing:
            shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
            raise InputError(f"policy file {path} is missing key(s) {shown}")
        extra = sorted(k for k in data if k.startswith("pi_") and k not in keys)[:5]
        if extra:
            raise InputError(
                f"policy file {path} has factor(s) {', '.join(extra)} but the MDP has {mdp.n_agents} agents"
            )
        return cls.from_factors([data[k] for k in keys], mdp, what=f"policy {os.path.basename(os.fspath(path))}")

    def save(self, path: str | os.PathLike) -> None:
        save_npz_atomic(path, {f"pi_{j}": f for j, f in enumerate(self.factors)})


# ------------------------------------------------------------------ joint form
def effective_factor(mdp: FactorizedMDP, policy: TeamPolicy, j: int) -> np.ndarray:
    """(S, A_j): ``π^(j)`` at states where agent j is active, the no-op ``e_0`` elsewhere."""
    f = policy.factors[j]
    act = mdp.active[:, j]
    if act.all():
        return f
    out = np.zeros_like(f)
    out[:, 0] = 1.0
    out[act] = f[act]
    return out


def joint_policy(mdp: FactorizedMDP, policy: TeamPolicy) -> np.ndarray:
    """(S, K) joint-slot probabilities ``π(a|s) = Π_{j ∈ active(s)} π^(j)(a_j|s)``.

    Factored layout: the outer product of the effective factors, raveled in C order (slot k).
    Turn-taking: ``π(k|s) = π^(turn[s])(k|s)``.
    """
    S = mdp.n_states
    if mdp.kind == "turn":
        # row s from the factor of the agent whose turn it is, without an (n, S, A) stack
        # (at S=10⁶, n=A=4 a 128 MB temporary: 0.06-0.56 s, against 0.07 s for this loop)
        out = np.empty_like(policy.factors[0])
        for j, f in enumerate(policy.factors):
            rows = mdp.turn == j
            out[rows] = f[rows]
        return out
    joint = effective_factor(mdp, policy, 0)
    for j in range(1, mdp.n_agents):
        joint = (joint[:, :, None] * effective_factor(mdp, policy, j)[:, None, :]).reshape(S, -1)
    return joint


# ------------------------------------------------------------------ divergences
def kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise ``KL(p‖q) = Σ_a p log(p/q)`` with ``0 log 0 = 0`` and ``+∞`` where q=0<p."""
    with np.errstate(divide="ignore"):
        return kl_rows_log(p, np.log(np.asarray(q, dtype=np.float64)))


def kl_rows_log(p: np.ndarray, log_q: np.ndarray) -> np.ndarray:
    """:func:`kl_rows` from ``log q`` (e.g. a log-softmax, exact where ``q`` itself would be
    subnormal or underflow to 0)."""
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.asarray(log_q, dtype=np.float64)), 0.0)
    # KL ≥ 0 (Gibbs); nearly equal rows otherwise sum to ~−1e-16, and √δ of that fails
    return np.maximum(terms.sum(axis=-1), 0.0)


def tv_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Row-wise total variation ``½ ‖p − q‖_1``."""
    return 0.5 * np.abs(np.asarray(p) - np.asarray(q)).sum(axis=-1)


def joint_kl(mdp: FactorizedMDP, pi: TeamPolicy, pi2: TeamPolicy) -> np.ndarray:
    """(S,) per-state ``KL_s(π‖π')`` of the joint team policies, computed on joint actions."""
    return kl_rows(joint_policy(mdp, pi), joint_policy(mdp, pi2))


def joint_tv(mdp: FactorizedMDP, pi: TeamPolicy, pi2: TeamPolicy) -> np.ndarray:
    """(S,) per-state ``TV_s(π, π')`` of the joint team policies."""
    return tv_rows(joint_policy(mdp, pi), joint_policy(mdp, pi2))


def factor_kl(mdp: FactorizedMDP, p: np.ndarray, q: np.ndarray, j: int) -> np.ndarray:
    """(S,) ``KL_s(p‖q)`` of agent j's factors where j is active, 0 elsewhere."""
    out = np.zeros(mdp.n_states)
    act = mdp.active[:, j]
    out[act] = kl_rows(p[act], q[act])
    return out


def factor_tv(mdp: FactorizedMDP, p: np.ndarray, q: np.ndarray, j: int) -> np.ndarray:
    """(S,) ``TV_s(p, q)`` of agent j's factors where j is active, 0 elsewhere."""
    out = np.zeros(mdp.n_states)
    act = mdp.active[:, j]
    out[act] = tv_rows(p[act], q[act])
    return out


# ---------------------------------------------------------- advantage helpers
def expected_advantage(joint_probs: np.ndarray, A: np.ndarray) -> np.ndarray:
    """(S,) ``f(s) = Σ_a π(a|s) A(s,a)`` for joint probabilities (S, K) and advantages (S, K)."""
    return np.einsum("sk,sk->s", joint_probs, A)


def marginal_advantage(mdp: FactorizedMDP, policy: TeamPolicy, A: np.ndarray, j: int) -> np.ndarray:
    """(S, A_j) agent-j advantage ``A_j(s, a_j) = E_{a_{-j} ∼ π_{-j}} A(s, a_j, a_{-j})``.

    With only agent j's factor changed to ``π'^(j)``, ``E_{a∼π̂'} A(s,a) = Σ_{a_j} π'^(j)(a_j|s)
    A_j(s,a_j)`` at states where j is active, and ``E_{a∼π} A(s,a)`` elsewhere.
    At states where j is inactive the rows are those of the no-op: every column equals
    ``E_{a∼π} A(s,a)`` (which is 0 when ``A`` is π's own advantage).
    """
    S = mdp.n_states
    if mdp.kind == "turn":
        out = np.empty((S, mdp.action_counts[j]))
        mine = mdp.turn == j
        out[mine] = A[mine]
        other = ~mine
        if other.any():
            fj = joint_policy(mdp, policy)[other]
            out[other] = expected_advantage(fj, A[other])[:, None]
        return out
    shape = (S, *mdp.action_counts)
    Ar = A.reshape(shape)
    # contract every other agent's axis with its effective factor
    operands = [Ar, list(range(mdp.n_agents + 1))]
    for k in range(mdp.n_agents):
        if k != j:
            operands += [effective_factor(mdp, policy, k), [0, k + 1]]
    Aj = np.einsum(*operands, [0, j + 1])
    idle = ~mdp.active[:, j]
    if idle.any():
        # inactive: a_j is pinned to 0, so every column is the value at the no-op
        Aj[idle] = Aj[idle, :1]
    return Aj

