"""Exact certificates for one stage of sequential agent updates (docs/theory.md §4).

Order ``σ``; ``π̂^0 = π_cur`` and ``π̂^i`` is ``π̂^{i−1}`` with agent ``σ(i)``'s factor replaced
by the target's; ``π̄ = π̂^n``. Per step ``i`` (agent ``j = σ(i)``), with ``d^{i−1} = d^{π̂^{i−1}}``
and ``A^{i−1} = A^{π̂^{i−1}}``:

- ``δ_i = E_{s∼d^{i−1}} KL_s(π_cur^j ‖ π_tar^j)``, ``δ_i^max = max_{s: j active} KL_s(·)``;
- ``f_i(s) = E_{a∼π̂^i(·|s)} A^{i−1}(s,a)``;
- ``L_i^seq = E_{d^{i−1}} f_i / (1−γ)``, ``L_i^stale = E_{d^0} f_i / (1−γ)``;
- ``A_max,i = max_{s, admissible a} |A^{i−1}(s,a)|``, ``c_i = √2 γ A_max,i / (1−γ)²``;
- ``true_gain_i = J(π̂^i) − J(π̂^{i−1})``.

Stage: ``A_max = max_i A_max,i``, ``c = √2 γ A_max / (1−γ)²`` and

- ``lower_bound       = Σ L_i^seq − c Σ √δ_i − Σ ζ_i/(1−γ)``            (TeamTR Thm 3.6)
- ``lower_bound_max   = Σ L_i^seq − c Σ √δ_i^max − Σ ζ_i/(1−γ)``        (SAT Thm 4.4)
- ``lower_bound_stale = Σ (L_i^stale − ζ_i/(1−γ)) − c Σ_i (√δ_i + Σ_{k<i} √δ_k)`` (TeamTR Prop 3.3)

Tighter ladder (this project's extension, same proofs; never reported as the paper's):

- ``lower_bound_fnorm = Σ L_i^seq − Σ √2 γ ‖f_i‖∞ √δ_i / (1−γ)² − Σ ζ_i/(1−γ)``
  (``‖f_i‖∞`` in place of ``A_max``);
- ``lower_bound_tv = Σ L_i^seq − Σ 2γ ‖f_i‖∞ E_{d^{i−1}} TV_i / (1−γ)² − Σ ζ_i/(1−γ)``
  (additionally the exact expected TV in place of Pinsker's ``√(δ/2)``).

In exact mode ``ζ_i = 0``; with estimated advantages (``advantages=``) the surrogates use
``f̂_i = E_{π̂^i} Â_{i−1}`` and ``ζ_i`` defaults to ``max_s |f̂_i − f_i|``. Every term and
result is stated, with its paper reference and check, in docs/theory.md §4. A bound "holds" when ``true ≥ bound − HOLD_TOL·(1 + |bound|)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .errors import InputError
from .evaluate import Evaluation, evaluate
from .mdp import FactorizedMDP
from .policy import TeamPolicy, expected_advantage, factor_kl, factor_tv

__all__ = ["StepCertificate", "StageCertificate", "stage_certificate", "intermediate_policies",
           "check_order", "penalty_constant", "stage_lower_bound", "HOLD_TOL", "BOUND_KEYS"]

#: Relative slack for floating-point roundoff when deciding whether a bound holds.
HOLD_TOL = 1e-9

#: Every stage-level bound, the paper's forms first, then the tighter ladder.
BOUND_KEYS = ("lower_bound", "lower_bound_max", "lower_bound_stale", "lower_bound_fnorm",
              "lower_bound_tv")


def penalty_constant(gamma: float, A_max: float) -> float:
    """``c = √2 γ A_max / (1−γ)²`` (equals SAT's ``2γ/(1−γ)² A_max √(½δ)`` per unit √δ)."""
    return math.sqrt(2.0) * gamma * A_max / (1.0 - gamma) ** 2


def stage_lower_bound(L, delta, zeta, gamma: float, A_max: float) -> float:
    """``Σ L_i − c Σ √δ_i − Σ ζ_i/(1−γ)`` with ``c = √2 γ A_max/(1−γ)²`` (TeamTR Thm 3.6);
    NaN for ``γ ≥ 1`` (episodic scores: the bound is undefined)."""
    if gamma >= 1:
        return float("nan")
    L, delta, zeta = (np.asarray(x, dtype=np.float64) for x in (L, delta, zeta))
    return float(L.sum() - penalty_constant(gamma, A_max) * np.sqrt(np.maximum(delta, 0.0)).sum()
                 - zeta.sum() / (1.0 - gamma))


def holds(true: float, bound: float) -> bool:
    return bool(true >= bound - HOLD_TOL * (1.0 + abs(bound)))


def check_order(order, n_agents: int) -> tuple[int, ...]:
    """Validate that ``order`` is a permutation of ``0..n−1``."""
    try:
        order = tuple(int(x) for x in order)
    except (TypeError, ValueError):
        raise InputError(f"order must be a list of agent indices, got {order!r}") from None
    if sorted(order) != list(range(n_agents)):
        raise InputError(
            f"order {','.join(map(str, order))} is not a permutation of the agents 0..{n_agents - 1}"
        )
    return order


def intermediate_policies(current: TeamPolicy, target: TeamPolicy, order) -> list[TeamPolicy]:
    """``[π̂^0, …, π̂^n]``: agent ``σ(i)``'s factor swapped to the target's at step i."""
    pols = [current]
    for j in order:
        pols.append(pols[-1].with_factor(j, target.factors[j]))
    return pols


@dataclass
class StepCertificate:
    """Exact terms of one step of the stage (see module docstring)."""

    step: int
    agent: int
    L_seq: float
    L_stale: float
    delta: float
    delta_max: float
    tv: float  # E_{d^{i−1}} TV_s(π_cur^j, π_tar^j)
    A_max: float
    f_inf: float
    zeta: float
    true_gain: float
    bound: float  # L_seq − c_i √δ_i − ζ_i/(1−γ)      (TeamTR Thm 3.4)
    bound_max: float  # L_seq − c_i √δ_i^max − ζ_i/(1−γ)  (SAT Thm 4.2)
    holds: bool


@dataclass
class StageCertificate:
    order: tuple[int, ...]
    steps: list[StepCertificate]
    gamma: float
    A_max: float
    c: float
    J_before: float
    J_after: float
    true_improvement: float
    lower_bound: float
    lower_bound_max: float
    lower_bound_stale: float
    lower_bound_fnorm: float
    lower_bound_tv: float
    holds: bool
    violated: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["order"] = list(self.order)
        return d


def stage_certificate(mdp: FactorizedMDP, current: TeamPolicy, target: TeamPolicy, order,
                      *, zeta=None, advantages=None,
                      evaluations: list[Evaluation] | None = None) -> StageCertificate:
    """Every certificate term of docs/theory.md §4 for one stage, computed exactly.

    ``advantages``: per-step estimates ``Â_{i−1}`` of ``A^{π̂^{i−1}}``, each (S, K), in update
    order (default: the exact advantages). The surrogates then use
    ``f̂_i(s) = E_{a∼π̂^i} Â_{i−1}(s,a)``; ``‖f_i‖∞`` of the ladder stays that of the exact
    ``f_i`` (the occupancy-shift lemma bounds the exact one) and ``A_max`` that of the exact
    advantages. ``zeta``: per-step bounds ``ζ_i`` in update order; default 0 in exact mode
    and, with ``advantages``, the smallest valid one, ``ζ_i = max_s |f̂_i(s) − f_i(s)|``.
    ``evaluations``: the n+1 evaluations of :func:`intermediate_policies` if already known.
    See docs/theory.md §4.
    """
    order = check_order(order, mdp.n_agents)
    n = len(order)
    if evaluations is None:
        evaluations = [evaluate(mdp, p) for p in intermediate_policies(current, target, order)]
    if advantages is not None and len(advantages) != n:
        raise InputError(f"advantages must have one (S, K) array per step ({n}), got {len(advantages)}")
    f_exact = [expected_advantage(evaluations[i].pi, evaluations[i - 1].A) for i in range(1, n + 1)]
    f_hat, zeta = _estimated_surrogates(evaluations, f_exact, advantages, zeta)
    steps = [_step_certificate(mdp, current, target, evaluations, i, j, f_hat[i - 1],
                               f_exact[i - 1], zeta)
             for i, j in enumerate(order, start=1)]
    return _assemble(order, steps, mdp.gamma, evaluations[0].J, evaluations[-1].J)


def _step_certificate(mdp: FactorizedMDP, current: TeamPolicy, target: TeamPolicy,
                      evaluations: list[Evaluation], i: int, j: int, f: np.ndarray,
                      f_exact: np.ndarray, zeta: np.ndarray) -> StepCertificate:
    """The exact terms of step ``i`` (agent ``j = σ(i)``), module docstring: ``δ_i``,
    ``δ_i^max``, ``L_i^seq``, ``L_i^stale``, ``E_{d^{i−1}} TV_i``, ``A_max,i``, ``‖f_i‖∞``,
    ``true_gain_i`` and the step bounds (TeamTR Thm 3.4, SAT Thm 4.2). ``f``: the surrogate's
    ``f̂_i`` (S,); ``f_exact``: the exact ``f_i`` (S,); ``zeta``: every ``ζ`` in update order."""
    g, ev0, prev, nxt = mdp.gamma, evaluations[0], evaluations[i - 1], evaluations[i]
    kl = factor_kl(mdp, current.factors[j], target.factors[j], j)
    act = mdp.active[:, j]
    delta = _expect(prev.d, kl)
    delta_max = float(kl[act].max()) if act.any() else 0.0
    L_seq = float(prev.d @ f) / (1 - g)
    c_i = penalty_constant(g, prev.A_max)
    step = StepCertificate(
        step=i, agent=j, L_seq=L_seq, L_stale=float(ev0.d @ f) / (1 - g),
        delta=delta, delta_max=delta_max,
        tv=float(prev.d @ factor_tv(mdp, current.factors[j], target.factors[j], j)),
        A_max=prev.A_max, f_inf=float(np.abs(f_exact).max()), zeta=float(zeta[i - 1]),
        true_gain=nxt.J - prev.J,
        bound=L_seq - c_i * math.sqrt(delta) - zeta[i - 1] / (1 - g),
        bound_max=L_seq - c_i * math.sqrt(delta_max) - zeta[i - 1] / (1 - g),
        holds=False,
    )
    step.holds = holds(step.true_gain, step.bound)
    return step


def _estimated_surrogates(evaluations: list[Evaluation], f_exact: list[np.ndarray], advantages,
                          zeta) -> tuple[list[np.ndarray], np.ndarray]:
    """``(f̂_i, ζ_i)`` per step: ``f̂_i(s) = E_{a∼π̂^i} Â_{i−1}(s,a)`` (the exact ``f_i`` without
    ``advantages``) and ``ζ`` as given, by default the smallest valid ``max_s |f̂_i − f_i|``."""
    n = len(f_exact)
    f_hat = (f_exact if advantages is None else
             [expected_advantage(evaluations[i].pi, np.asarray(advantages[i - 1], dtype=np.float64))
              for i in range(1, n + 1)])
    if zeta is None:
        zeta = np.array([float(np.abs(fh - f).max()) for fh, f in zip(f_hat, f_exact, strict=True)])
    zeta = np.asarray(zeta, dtype=np.float64)
    if zeta.shape != (n,):
        raise InputError(f"zeta must have one entry per step ({n}), got shape {zeta.shape}")
    return f_hat, zeta


def _expect(d: np.ndarray, x: np.ndarray) -> float:
    """``E_{s∼d} x(s)``, with ``+∞`` entries counted only where ``d(s) > 0``."""
    mask = d > 0
    return float(d[mask] @ x[mask])


def _assemble(order, steps: list[StepCertificate], g: float, J_before: float,
              J_after: float) -> StageCertificate:
    A_max = max(s.A_max for s in steps)
    c = penalty_constant(g, A_max)
    Ls, deltas, zetas = ([getattr(s, k) for s in steps] for k in ("L_seq", "delta", "zeta"))
    sq = np.sqrt(deltas)
    L = sum(Ls)
    Z = sum(zetas) / (1 - g)
    chained = sum(sq[i] + sq[:i].sum() for i in range(len(steps)))
    bounds = dict(
        lower_bound=stage_lower_bound(Ls, deltas, zetas, g, A_max),
        lower_bound_max=stage_lower_bound(Ls, [s.delta_max for s in steps], zetas, g, A_max),
        lower_bound_stale=sum(s.L_stale for s in steps) - Z - c * chained,
        lower_bound_fnorm=L - Z - sum(math.sqrt(2) * g * s.f_inf * math.sqrt(s.delta)
                                      for s in steps) / (1 - g) ** 2,
        lower_bound_tv=L - Z - sum(2 * g * s.f_inf * s.tv for s in steps) / (1 - g) ** 2,
    )
    true = J_after - J_before
    violated = [k for k in BOUND_KEYS if not holds(true, bounds[k])]
    return StageCertificate(
        order=tuple(order), steps=steps, gamma=g, A_max=A_max, c=c, J_before=J_before,
        J_after=J_after, true_improvement=true, holds=holds(true, bounds["lower_bound"]),
        violated=violated, **bounds,
    )
