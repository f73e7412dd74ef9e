"""Seeded case generators shared by every check of ``sat verify``.

A :class:`Case` is one exact instance a statement is evaluated on: a team MDP, the current
team policy ``π_cur`` and a per-agent target ``π_tar`` (the stage of docs/theory.md §4 replaces agent
``σ(i)``'s factor by the target's at step ``i``). Everything is deterministic given ``seed``.

MDPs (:func:`random_mdps`): random factored (every agent active), masked (random non-empty
active sets) and turn-taking MDPs from :func:`sat_theory.envs.random_mdp`, with ``S`` in 2..8,
``n`` in 1..4 agents, 2..3 actions and ``γ`` drawn from :data:`GAMMAS` (which includes 0.99,
where the ``1/(1−γ)²`` constants are largest), plus hand-built extremal cases:
:func:`trap_mdp` (occupancy-shift inequalities nearly tight) and :func:`stale_trap_case`
(the stage-start occupancy misjudges a single step).

Targets (all built from the current policy's logits ``z_cur = log π_cur``):

- ``random``: an independent random policy (large steps, often ``KL`` of order 1);
- ``small``: logit interpolation ``z_t = (1−t) z_cur + t z_rand`` toward a random policy, with
  ``t`` per agent found by bisection so that ``max_{s: j active} KL_s(π_cur^j‖π_tar^j)`` equals a
  radius (``KL(p‖q_t)`` is non-decreasing in ``t`` along this exponential-family path, since
  ``d/dt KL = Cov``-type term ``E_{q_t} h − E_p h ≥ 0`` with ``h = z_rand − z_cur``);
- ``greedy``: ``z = z_cur + η A_j`` with ``A_j`` agent ``j``'s marginal advantage under
  ``π_cur`` (an improving natural-gradient-like step), ``η`` set to a KL radius;
- ``adversarial``: ``z = z_cur − η A_j`` (a step *against* the advantage: every local
  surrogate is negative, the regime where the lower bounds are closest to tight), ``η`` set
  to a KL radius; radii include large ones (0.5–3 nats).

Use :func:`cases` for a mixed list, or the building blocks (:func:`random_mdps`,
:func:`small_step_target`, :func:`greedy_target`, :func:`adversarial_target`,
:func:`scale_to_radius`) directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import softmax

from ..envs import random_mdp
from ..evaluate import evaluate
from ..mdp import FactorizedMDP
from ..policy import TeamPolicy, factor_kl, marginal_advantage

__all__ = ["Case", "GAMMAS", "LAYOUTS", "TARGET_KINDS", "SMALL_RADII", "LARGE_RADII",
           "random_mdps", "random_policy", "scale_to_radius", "small_step_target",
           "greedy_target", "adversarial_target", "make_target", "cases", "trap_mdp", "stale_trap_case",
           "max_factor_kl"]

LAYOUTS = ("simultaneous", "masked", "turn")
#: discounts drawn for random MDPs; 0.99 is where the 1/(1−γ)² constants bite hardest
GAMMAS = (0.5, 0.8, 0.9, 0.95, 0.99)
TARGET_KINDS = ("random", "small", "greedy", "adversarial")
#: radii (nats, in max-over-states factor KL) of small steps and of large steps
SMALL_RADII = (1e-4, 1e-3, 1e-2, 5e-2)
LARGE_RADII = (0.2, 0.5, 1.0, 3.0)


@dataclass(frozen=True)
class Case:
    """One exact instance: ``mdp``, ``current`` (π_cur), ``target`` (π_tar) and labels."""

    mdp: FactorizedMDP
    current: TeamPolicy
    target: TeamPolicy
    kind: str  # one of TARGET_KINDS, or "trap"
    radius: float | None  # KL radius the target was scaled to (None: unscaled)
    label: str

    @property
    def n(self) -> int:
        return self.mdp.n_agents


# ------------------------------------------------------------------ MDPs
def random_mdps(seed: int, count: int, *, max_agents: int = 4, max_states: int = 8,
                layouts=LAYOUTS, gammas=GAMMAS, max_joint: int = 81) -> list[FactorizedMDP]:
    """``count`` random team MDPs cycling through ``layouts``, with S, n, A and γ drawn from
    ``seed`` (``A^n ≤ max_joint`` joint slots so that dense evaluation stays cheap)."""
    rng = np.random.default_rng([seed, 7001])
    out = []
    for k in range(count):
        layout = layouts[k % len(layouts)]
        n = int(rng.integers(1, max_agents + 1))
        S = int(rng.integers(2, max_states + 1))
        A = int(rng.integers(2, 4))
        while A ** n > max_joint and A > 2:
            A -= 1
        g = float(gammas[int(rng.integers(len(gammas)))])
        # sparse successor sets make occupancy shifts larger than smooth Dirichlet mixing
        succ = None if rng.random() < 0.5 else int(rng.integers(1, max(2, S // 2) + 1))
        conc = float(rng.choice([0.1, 1.0]))
        m = random_mdp(S, n, A, layout=layout, gamma=g, seed=int(rng.integers(2**31)),
                       successors=succ, concentration=conc)
        out.append(m)
    return out


def trap_mdp(gamma: float = 0.95, n_agents: int = 1, stay: float = 1.0) -> FactorizedMDP:
    """A hand-built extremal MDP: simultaneous agents with 2 actions at two states.

    State 0 (start): if every agent plays 0 the team stays at 0 with probability ``stay``;
    any agent playing 1 moves the team to the absorbing state 1. Rewards: 1 at state 0, 0 at
    state 1. A small probability ``t`` of playing 1 shifts occupancy by
    ``‖d'−d‖_1 = 2γt/(1−γ+γt)`` against the occupancy-shift bound ``2γt/(1−γ)``: tight as
    ``t → 0``.
    """
    n = n_agents
    shape = (2,) + (2,) * n
    P = np.zeros(shape + (2,))
    R = np.zeros(shape)
    zero = (0,) + (0,) * n
    P[(0,) + (Ellipsis,)] = np.array([0.0, 1.0])
    P[zero] = np.array([stay, 1.0 - stay])
    P[(1,) + (Ellipsis,)] = np.array([0.0, 1.0])
    R[0] = 1.0
    rho0 = np.array([1.0, 0.0])
    return FactorizedMDP.factored(P, R, rho0, gamma, name=f"trap-n{n}-g{gamma:g}")


def stale_trap_case(gamma: float = 0.9, eta: float = 1e-6, eps: float = 0.1) -> Case:
    """A hand-built case where the stale occupancy misleads a single step.

    Two simultaneous agents, three states: the start 0, a paying state 1 and an absorbing
    dead end 2. At 0 agent 0's action 0 leads to 1 (absorbing; reward 1 when agent 1 plays
    1), action 1 to 2 (reward 0 forever). ``π_cur``: agent 0 goes to 1 w.p. ``1−η``, agent 1
    uniform. ``π_tar``: agent 0 goes to 1 w.p. ``η`` only; agent 1 plays 1 w.p. ``½+ε`` at
    state 1. With order (0, 1) step 2 is judged by ``d^{π̂^0}`` (state 1 visited) although
    ``d^{π̂^1}`` barely reaches state 1: ``L_2^stale ≈ γε/(1−γ)`` while the true gain and the
    penalty ``c√δ_2`` (``δ_2`` weighted by ``d^{π̂^1}(1) ≈ γη``) are both tiny.
    """
    P = np.zeros((3, 2, 2, 3))
    P[0, 0, :, 1] = 1.0
    P[0, 1, :, 2] = 1.0
    P[1, :, :, 1] = 1.0
    P[2, :, :, 2] = 1.0
    R = np.zeros((3, 2, 2))
    R[1, :, 1] = 1.0
    mdp = FactorizedMDP.factored(P, R, [1.0, 0.0, 0.0], gamma, name=f"stale-trap-g{gamma:g}")
    a0 = np.full((3, 2), 0.5)
    a0[0] = [1 - eta, eta]
    t0 = a0.copy()
    t0[0] = [eta, 1 - eta]
    a1 = np.full((3, 2), 0.5)
    t1 = a1.copy()
    t1[1] = [0.5 - eps, 0.5 + eps]
    return Case(mdp, TeamPolicy((a0, a1)), TeamPolicy((t0, t1)), "trap", None,
                f"stale-trap γ={gamma:g} η={eta:g} ε={eps:g}")


# ------------------------------------------------------------------ policies and targets
def random_policy(mdp: FactorizedMDP, rng, temperature: float = 1.5) -> TeamPolicy:
    """Softmax of Gaussian logits times ``temperature`` (seeded by ``rng``)."""
    return TeamPolicy.random(mdp, rng, temperature=temperature)


def max_factor_kl(mdp: FactorizedMDP, p: np.ndarray, q: np.ndarray, j: int) -> float:
    """``max_{s: j active} KL_s(p‖q)`` for agent ``j``'s factors."""
    kl = factor_kl(mdp, p, q, j)
    act = mdp.active[:, j]
    return float(kl[act].max()) if act.any() else 0.0


def _logits(f: np.ndarray) -> np.ndarray:
    # floor at log(1e-300) so interpolation never produces -inf − -inf = nan
    return np.log(np.clip(f, 1e-300, None))


def scale_to_radius(mdp: FactorizedMDP, current: TeamPolicy, directions, radius: float, *,
                    t_max: float = 1e3, iters: int = 60) -> TeamPolicy:
    """Target with factors ``softmax(z_cur^j + t_j · directions[j])``, where ``t_j ∈ [0, t_max]``
    is found by bisection so that ``max_{s: j active} KL_s(π_cur^j‖π_tar^j) = radius`` (or the
    largest reachable KL, if the direction cannot reach the radius within ``t_max``)."""
    out = []
    for j, (f, dz) in enumerate(zip(current.factors, directions, strict=True)):
        z = _logits(f)

        def kl_at(t, f=f, z=z, dz=dz, j=j):
            return max_factor_kl(mdp, f, softmax(z + t * dz, axis=1), j)

        if not np.any(dz[mdp.active[:, j]] != 0) or kl_at(t_max) <= radius:
            t = t_max if np.any(dz != 0) else 0.0
        else:
            lo, hi = 0.0, 1.0
            while kl_at(hi) < radius:
                lo, hi = hi, 2 * hi
            for _ in range(iters):
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if kl_at(mid) < radius else (lo, mid)
            t = 0.5 * (lo + hi)
        out.append(softmax(z + t * dz, axis=1))
    return TeamPolicy(tuple(out))


def small_step_target(mdp: FactorizedMDP, current: TeamPolicy, rng, radius: float) -> TeamPolicy:
    """Logit interpolation toward a random policy, each factor at max-KL ``radius``."""
    other = random_policy(mdp, rng, temperature=2.0)
    dirs = [_logits(o) - _logits(f) for o, f in zip(other.factors, current.factors, strict=True)]
    return scale_to_radius(mdp, current, dirs, radius)


def _advantage_directions(mdp: FactorizedMDP, current: TeamPolicy) -> list[np.ndarray]:
    A = evaluate(mdp, current).A
    return [marginal_advantage(mdp, current, A, j) for j in range(mdp.n_agents)]


def greedy_target(mdp: FactorizedMDP, current: TeamPolicy, radius: float) -> TeamPolicy:
    """``π_tar^j ∝ π_cur^j exp(η_j A_j)`` (agent j's marginal advantage), KL radius ``radius``."""
    return scale_to_radius(mdp, current, _advantage_directions(mdp, current), radius)


def adversarial_target(mdp: FactorizedMDP, current: TeamPolicy, radius: float) -> TeamPolicy:
    """``π_tar^j ∝ π_cur^j exp(−η_j A_j)``: a step against the advantage, KL radius ``radius``."""
    return scale_to_radius(mdp, current, [-d for d in _advantage_directions(mdp, current)], radius)


def make_target(kind: str, mdp: FactorizedMDP, current: TeamPolicy, rng,
                radius: float | None) -> TeamPolicy:
    """Dispatch on ``kind`` (one of :data:`TARGET_KINDS`)."""
    if kind == "random":
        return random_policy(mdp, rng, temperature=float(rng.choice([1.0, 2.0, 4.0])))
    if kind == "small":
        return small_step_target(mdp, current, rng, radius)
    if kind == "greedy":
        return greedy_target(mdp, current, radius)
    if kind == "adversarial":
        return adversarial_target(mdp, current, radius)
    raise ValueError(f"unknown target kind {kind!r}")


def cases(seed: int, count: int, *, kinds=TARGET_KINDS, layouts=LAYOUTS, gammas=GAMMAS,
          max_agents: int = 4, max_states: int = 8, large: bool = True) -> list[Case]:
    """``count`` mixed cases: MDP ``k`` from :func:`random_mdps`, a random current policy, and a
    target of kind ``kinds[k % len(kinds)]``. Scaled kinds draw their radius from
    :data:`SMALL_RADII` and, when ``large``, also from :data:`LARGE_RADII` (alternating)."""
    mdps = random_mdps(seed, count, max_agents=max_agents, max_states=max_states,
                       layouts=layouts, gammas=gammas)
    rng = np.random.default_rng([seed, 7002])
    out = []
    for k, mdp in enumerate(mdps):
        kind = kinds[k % len(kinds)]
        cur = random_policy(mdp, rng, temperature=float(rng.choice([0.5, 1.5, 3.0])))
        radius = None
        if kind != "random":
            pool = SMALL_RADII + LARGE_RADII if (large and (k // len(kinds)) % 2) else SMALL_RADII
            radius = float(pool[int(rng.integers(len(pool)))])
        tar = make_target(kind, mdp, cur, rng, radius)
        label = (f"{mdp.name} S={mdp.n_states} n={mdp.n_agents} A={mdp.action_counts[0]} "
                 f"γ={mdp.gamma:g} {kind}" + (f"({radius:g})" if radius is not None else ""))
        out.append(Case(mdp, cur, tar, kind, radius, label))
    return out
