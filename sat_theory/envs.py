"""Seeded random team MDPs and named toy MDPs with closed-form values.

Random generators (all deterministic given ``seed``):

- :func:`random_mdp` — ``layout="simultaneous"`` (every agent acts everywhere),
  ``"masked"`` (a random non-empty active set per state), or ``"turn"`` (one agent per
  state, turn-taking); dense Dirichlet transitions or ``successors`` random successors per
  state/joint action; ``sparse=True`` returns CSR transitions (turn-taking only).

Named toy MDPs (:data:`NAMED`, :func:`named_mdp`), each with values derivable by hand
(see ``tests/theory/test_closed_form.py``):

- ``bandit``: one state, two agents with two actions, coordination payoff
  ``R = [[1, 0], [0, 2]]``; ``V = r_π/(1−γ)``.
- ``chain``: a deterministic turn-taking chain of ``L = 5`` states, agent ``s mod 2`` acts
  at state ``s``; action 1 moves right (the last state absorbs), action 0 stays; reward 1
  for acting at the last state.
- ``two_state``: two states, agent 0 acts at state 0, agent 1 at state 1; action 1 switches
  state, action 0 stays; reward 1 at state 1 for any action.
- ``coordination``: two simultaneous agents, two states; matching actions move to the
  paying state. Where naive (stale) sequential updates mislead, see the verify suite.
- ``naive_reuse``: the saved counterexample of ``sat verify``'s naive_reuse_counterexample
  (turn-taking, 3 states, 2 agents: a router and a branch agent), loaded from
  ``sat_theory/data/naive_reuse.npz``; its policies via
  ``sat_theory.verify.naive_reuse.load_naive_reuse()``.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import InputError
from .mdp import FactorizedMDP, check_memory

__all__ = ["random_mdp", "named_mdp", "NAMED", "LAYOUTS"]

LAYOUTS = ("simultaneous", "masked", "turn")


def _rows(rng: np.random.Generator, n_rows: int, S: int, successors: int | None,
          concentration: float) -> np.ndarray:
    """(n_rows, S) random transition rows: Dirichlet over all states or over k successors."""
    if successors is None or successors >= S:
        return rng.dirichlet(np.full(S, concentration), size=n_rows)
    out = np.zeros((n_rows, S))
    idx = _successor_indices(rng, n_rows, S, successors)
    w = rng.dirichlet(np.full(successors, concentration), size=n_rows)
    np.put_along_axis(out, idx, w, axis=1)
    return out


def _successor_indices(rng, n_rows, S, k):
    """(n_rows, k) distinct random successor states per row (sorted)."""
    # k draws per row; the (rare, for k ≪ S) rows with a repeated state are drawn again
    idx = rng.integers(0, S, size=(n_rows, k))
    idx.sort(axis=1)
    dup = np.diff(idx, axis=1) == 0
    while dup.any():  # rare for k ≪ S; redraw rows with duplicates
        rows = np.flatnonzero(dup.any(axis=1))
        new = rng.integers(0, S, size=(rows.size, k))
        new.sort(axis=1)
        idx[rows] = new
        dup = np.diff(idx, axis=1) == 0
    return idx


def random_mdp(n_states: int, n_agents: int, n_actions: int | tuple[int, ...] = 2, *,
               layout: str = "simultaneous", gamma: float = 0.9, seed: int = 0,
               successors: int | None = None, sparse: bool = False,
               concentration: float = 1.0, reward_scale: float = 1.0) -> FactorizedMDP:
    """A random team MDP.

    Rewards are uniform on ``[−reward_scale, reward_scale]``; ``rho0`` is Dirichlet(1).
    ``n_actions`` may be per agent (simultaneous/masked layouts only).

    The memory budget (:func:`sat_theory.mdp.check_memory`, ``sat --max-memory``) covers a
    generated MDP as it covers a loaded one: its dense transition array (8·S·K·S bytes for
    K joint actions; 12·S·A·k for sparse rows) is checked before anything is drawn.
    """
    if layout not in LAYOUTS:
        raise InputError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    if n_states < 1 or n_agents < 1:
        raise InputError("n_states and n_agents must be >= 1")
    rng = np.random.default_rng(seed)
    draw = dict(successors=successors, concentration=concentration, reward_scale=reward_scale)
    if layout == "turn":
        P, R, turn, rho0 = _random_turn(rng, n_states, n_agents, n_actions, sparse=sparse, **draw)
        return FactorizedMDP.turn_taking(P, R, turn, n_agents, rho0, gamma,
                                         name=f"random-turn-{seed}")
    if sparse:
        raise InputError("sparse random MDPs are turn-taking only (layout='turn')")
    P, R, rho0 = _random_factored(rng, n_states, _action_counts(n_actions, n_agents),
                                  f"a random {layout} MDP with {n_states} states", **draw)
    active = _mask_inactive(rng, P, R) if layout == "masked" else None
    return FactorizedMDP.factored(P, R, rho0, gamma, active, name=f"random-{layout}-{seed}")


def _action_counts(n_actions, n: int) -> tuple[int, ...]:
    """``(A_1..A_n)``: one count for every agent, or one per agent."""
    counts = (int(n_actions),) * n if isinstance(n_actions, int | np.integer) else tuple(n_actions)
    if len(counts) != n:
        raise InputError(f"n_actions has {len(counts)} entries for {n} agents")
    return counts


def _random_turn(rng, S: int, n: int, n_actions, *, sparse: bool, successors: int | None,
                 concentration: float, reward_scale: float):
    """``(P, R, turn, ρ0)`` of a random turn-taking MDP: every agent acts at ``⌊S/n⌋`` or more
    states when ``S ≥ n`` (a shuffled round robin), else at uniformly random ones."""
    if not isinstance(n_actions, int | np.integer):
        raise InputError("turn-taking MDPs give every agent the same number of actions")
    A = int(n_actions)
    k = min(successors or 5, S)
    check_memory(12 * S * A * k if sparse else 8 * S * A * S,
                 f"a random turn MDP with {S} states")
    turn = np.arange(S) % n if S >= n else rng.integers(0, n, size=S)
    rng.shuffle(turn)
    R = rng.uniform(-reward_scale, reward_scale, size=(S, A))
    rho0 = rng.dirichlet(np.ones(S))
    if sparse:
        P = _sparse_rows(rng, S * A, S, k, concentration)
    else:
        P = _rows(rng, S * A, S, successors, concentration).reshape(S, A, S)
    return P, R, turn, rho0


def _sparse_rows(rng, n_rows: int, S: int, k: int, concentration: float) -> sp.csr_matrix:
    """(n_rows, S) CSR transition rows, each Dirichlet over ``k`` distinct random successors."""
    idx = _successor_indices(rng, n_rows, S, k)
    w = rng.dirichlet(np.full(k, concentration), size=n_rows)
    indptr = np.arange(0, n_rows * k + 1, k)
    return sp.csr_matrix((w.ravel(), idx.ravel(), indptr), shape=(n_rows, S))


def _random_factored(rng, S: int, counts: tuple[int, ...], what: str, *,
                     successors: int | None, concentration: float, reward_scale: float):
    """``(P, R, ρ0)`` of a random factored MDP: ``P`` (S, A_1..A_n, S), ``R`` (S, A_1..A_n)."""
    K = int(np.prod(counts, dtype=np.float64))
    check_memory(8 * S * K * S, what)
    P = _rows(rng, S * K, S, successors, concentration).reshape((S, *counts, S))
    R = rng.uniform(-reward_scale, reward_scale, size=(S, *counts))
    rho0 = rng.dirichlet(np.ones(S))
    return P, R, rho0


def _mask_inactive(rng, P: np.ndarray, R: np.ndarray) -> np.ndarray:
    """A random masked layout: each agent active w.p. 0.6 per state (one random agent where none
    is), and ``P``, ``R`` made independent of inactive agents' actions, in place."""
    S, n = R.shape[0], R.ndim - 1
    active = rng.random((S, n)) < 0.6
    empty = ~active.any(axis=1)
    active[empty, rng.integers(0, n, size=int(empty.sum()))] = True
    # inactive agents' actions must not matter: copy the a_j = 0 slice over the axis
    for j in range(n):
        idle = ~active[:, j]
        P[idle] = np.take(P[idle], [0], axis=1 + j)
        R[idle] = np.take(R[idle], [0], axis=1 + j)
    return active


# ------------------------------------------------------------------ named MDPs
def _bandit(gamma: float = 0.9) -> FactorizedMDP:
    P = np.ones((1, 2, 2, 1))
    R = np.array([[[1.0, 0.0], [0.0, 2.0]]])
    return FactorizedMDP.factored(P, R, [1.0], gamma, name="bandit")


def _chain(gamma: float = 0.9, length: int = 5) -> FactorizedMDP:
    L = length
    P = np.zeros((L, 2, L))
    for s in range(L):
        P[s, 0, s] = 1.0
        P[s, 1, min(s + 1, L - 1)] = 1.0
    R = np.zeros((L, 2))
    R[L - 1, :] = 1.0
    rho0 = np.zeros(L)
    rho0[0] = 1.0
    return FactorizedMDP.turn_taking(P, R, np.arange(L) % 2, 2, rho0, gamma, name="chain")


def _two_state(gamma: float = 0.9) -> FactorizedMDP:
    P = np.zeros((2, 2, 2))
    P[0, 0, 0] = P[0, 1, 1] = 1.0
    P[1, 0, 1] = P[1, 1, 0] = 1.0
    R = np.array([[0.0, 0.0], [1.0, 1.0]])
    return FactorizedMDP.turn_taking(P, R, [0, 1], 2, [1.0, 0.0], gamma, name="two_state")


def _coordination(gamma: float = 0.9) -> FactorizedMDP:
    # state 0: matching actions (0,0) or (1,1) move to state 1 w.p. 1; state 1 pays 1 and
    # returns to state 0 unless both play 1.
    P = np.zeros((2, 2, 2, 2))
    for a in range(2):
        for b in range(2):
            P[0, a, b, 1 if a == b else 0] = 1.0
            P[1, a, b, 1 if (a == 1 and b == 1) else 0] = 1.0
    R = np.zeros((2, 2, 2))
    R[1] = 1.0
    return FactorizedMDP.factored(P, R, [1.0, 0.0], gamma, name="coordination")


def _naive_reuse(gamma: float | None = None) -> FactorizedMDP:
    # The saved naive-reuse counterexample of the verify suite (router + two branches,
    # turn-taking, S=3, n=2): see sat_theory/verify/naive_reuse.py and
    # experiments/counterexamples/naive_reuse.py. Its policies (current, naive targets,
    # intermediate-occupancy targets, order) are in the same file:
    # sat_theory.verify.naive_reuse.load_naive_reuse(). The counterexample holds at the stored γ.
    import os

    path = os.path.join(os.path.dirname(__file__), "data", "naive_reuse.npz")
    mdp = FactorizedMDP.load(path)
    if gamma is None:
        return mdp
    return FactorizedMDP.turn_taking(mdp.P, mdp.R, mdp.turn, mdp.n_agents, mdp.rho0, gamma,
                                     name=mdp.name)


NAMED = {"bandit": _bandit, "chain": _chain, "two_state": _two_state, "coordination": _coordination,
         "naive_reuse": _naive_reuse}


def named_mdp(name: str, gamma: float | None = None) -> FactorizedMDP:
    """One of the named toy MDPs (:data:`NAMED`), optionally with another discount."""
    if name not in NAMED:
        raise InputError(f"unknown MDP {name!r}; named MDPs: {', '.join(sorted(NAMED))}")
    return NAMED[name]() if gamma is None else NAMED[name](gamma)
