"""Stage-0 alignment of a replacement agent (THEORY §5; TeamTR App. D.1, SAT Stage-0).

Both papers let a new agent replace agent ``j`` between stages, provided it first lands inside
the per-agent trust region around the old factor. They propose two ways to get there; both act
on one agent's factor, an ``(S, A)`` array of per-state action distributions.

- **TeamTR distillation** (:func:`align_distill`): gradient descent on softmax logits ``θ``
  (Armijo steps that double after each step: see its docstring),
  started from the new agent's own initialization, on the reverse-KL projection objective

      D(θ) = E_{s∼ν} KL_s(π_old‖π_θ),   ∂D/∂θ(s,a) = ν(s) (π_θ(a|s) − π_old(a|s)),

  stopping as soon as ``D(θ) ≤ δ_align``. ``ν`` is a probe distribution over states (TeamTR:
  contexts drawn from the current team's rollouts; :func:`probe_distribution` draws it from
  the exact occupancy ``d^{π_cur}``). The early stop is the point: the new agent keeps as
  much of its own behaviour as the trust region allows, instead of being distilled into a
  copy of the old one.

- **SAT projection** (:func:`project_geometric`): the per-state reverse-KL projection of the
  pretrained upgrade ``π_pre`` onto the ball around the current factor,

      π_new = argmin_π E_{s∼d} KL_s(π‖π_pre)  s.t.  KL_s(π‖π_cur) ≤ δ_0(s) for all s,

  which decouples over states and has the closed form (Lagrangian stationarity)

      π_new(a|s) ∝ π_pre(a|s)^{1/(1+λ(s))} · π_cur(a|s)^{λ(s)/(1+λ(s))},  λ(s) ≥ 0,

  with ``λ(s) = 0`` when ``π_pre`` is already inside the ball and otherwise the ``λ(s)`` at
  which the constraint is active. Writing ``t = 1/(1+λ) ∈ (0, 1]`` the candidates form the
  geometric path ``π_t ∝ π_cur exp(t h)``, ``h = log(π_pre/π_cur)``, an exponential family in
  ``t`` with log-partition ``ψ``; ``KL(π_t‖π_cur) = tψ'(t) − ψ(t)`` has derivative
  ``tψ''(t) ≥ 0``, so it is non-decreasing in ``t`` and ``t`` is found by bisection.

Note the KL directions. The certificates of THEORY §4 bound ``KL_s(π_cur‖π_new)``
("behavior-to-updated"). TeamTR's distillation controls exactly that direction (with
``π_old = π_cur``). SAT's projection constrains the *other* direction, ``KL_s(π_new‖π_cur)``;
its result need not satisfy ``KL_s(π_cur‖π_new) ≤ δ_0(s)``. :func:`project_geometric` with
``constraint="trust_region"`` instead bisects along the same geometric path for the largest
``t`` with ``KL_s(π_cur‖π_t) ≤ δ_0(s)`` (``KL(π_0‖π_t) = ψ(t) − t E_{π_0} h`` has derivative
``E_{π_t} h − E_{π_0} h ≥ 0``, also monotone): feasible in the certificate's direction, but
no longer the closed-form optimum of SAT's objective.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import numpy as np
from scipy.special import log_softmax, logsumexp

from .errors import InputError
from .mdp import check_distribution_rows
from .policy import kl_rows, kl_rows_log

__all__ = ["AlignTrace", "ProjectionResult", "align_distill", "project_geometric",
           "probe_distribution", "probe_kl", "geometric_path"]


# ------------------------------------------------------------------ helpers
def _factor(x, what: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise InputError(f"{what} must be an (S, A) array of per-state distributions, got shape {x.shape}")
    return check_distribution_rows(x, what)


def _weights(nu, S: int, what: str = "probe distribution nu") -> np.ndarray:
    nu = np.asarray(nu, dtype=np.float64)
    if nu.shape != (S,):
        raise InputError(f"{what} must have shape ({S},), got {nu.shape}")
    if not np.all(np.isfinite(nu)) or nu.min() < 0 or nu.sum() <= 0:
        raise InputError(f"{what} must be non-negative, finite and not all zero")
    return nu / nu.sum()


def _probe_mean(nu: np.ndarray, kl: np.ndarray) -> float:
    """``D = Σ_{s: ν(s)>0} ν(s) KL_s`` (states with ``ν(s) = 0`` do not count, even if infinite)."""
    m = nu > 0
    return float(nu[m] @ kl[m])


def probe_kl(pi_old: np.ndarray, pi_new: np.ndarray, nu: np.ndarray) -> float:
    """``E_{s∼ν} KL_s(π_old‖π_new)`` (states with ``ν(s) = 0`` do not count, even if infinite)."""
    kl = kl_rows(pi_old, pi_new)
    return _probe_mean(nu, kl)


def probe_distribution(d: np.ndarray, n_probe: int, rng) -> np.ndarray:
    """Empirical probe distribution ``ν`` of ``n_probe`` states drawn i.i.d. from ``d`` (S,).

    TeamTR aligns on 500 probe contexts from the current team's rollouts; in the tabular world
    the exact ``d^{π_cur}`` stands in for the rollout distribution.
    """
    d = _weights(d, np.asarray(d).shape[0], "occupancy d")
    if n_probe < 1:
        raise InputError(f"n_probe must be >= 1, got {n_probe}")
    rng = np.random.default_rng(rng)
    counts = rng.multinomial(n_probe, d)
    return counts / n_probe


# ------------------------------------------------------------------ TeamTR: distillation
@dataclass
class AlignTrace:
    """What :func:`align_distill` did: ``kl[t] = E_ν KL_s(π_old‖π_θt)`` after ``t`` steps
    (``kl[0]`` is the initialization's), ``steps = len(kl) − 1``, ``converged`` iff
    ``kl[-1] ≤ δ_align``."""

    steps: int
    kl: np.ndarray
    converged: bool
    delta_align: float
    lr: float


def _align_inputs(pi_old, init, nu, delta_align: float, lr: float | None):
    """Validated ``(π_old, init, ν normalized, lr)`` of :func:`align_distill`; ``lr`` defaults
    to ``1/ν_max``."""
    pi_old = _factor(pi_old, "old factor pi_old")
    init = _factor(init, "new agent's initialization")
    if init.shape != pi_old.shape:
        raise InputError(f"initialization has shape {init.shape}, the old factor {pi_old.shape}")
    if init.min() <= 0:
        raise InputError("the new agent's initialization must be strictly positive (softmax logits)")
    nu = _weights(nu, pi_old.shape[0])
    if not delta_align > 0:
        raise InputError(f"delta_align must be > 0, got {delta_align}")
    if lr is None:
        lr = 1.0 / float(nu.max())
    if not lr > 0:
        raise InputError(f"lr must be > 0, got {lr}")
    return pi_old, init, nu, lr


def _distill_point(pi_old: np.ndarray, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(π_θ, KL_s(π_old‖π_θ) per state)`` from log-softmax: ``π_θ`` itself can be
    subnormal (a logit gap of 744 gives 1e-323, with 2 significant bits), and a KL from
    it would not move under steps that move ``θ``."""
    logq = log_softmax(theta, axis=1)
    return np.exp(logq), kl_rows_log(pi_old, logq)


def _armijo_steps(pi_old, nu, theta, g, kl, eta, floor: float):
    """Per-state Armijo backtracking: halve each ``η_s`` (not below ``floor``) until
    ``ν(s)KL_s(θ_s − η_s g_s) ≤ ν(s)KL_s(θ_s) − η_s‖g_s‖²/2`` on every probed state (met by
    every ``η_s ≤ 2/ν_max``, since ``D`` is ``ν_max/2``-smooth). One step size per state,
    because ``D`` is a ``ν``-weighted sum of independent per-state problems: from a
    near-deterministic initialization a state's gradient is as small as the old factor's
    smallest probability there, and a step shared with well-conditioned states would need
    millions of steps. Returns ``(η, π_θ', KL_s(π_old‖π_θ'))`` at ``θ' = θ − η∘g``."""
    eta = eta.copy()
    m = nu > 0
    gg = np.sum(g * g, axis=1)
    while True:
        q_new, kl_new = _distill_point(pi_old, theta - eta[:, None] * g)
        bad = m & (nu * kl_new > nu * kl - 0.5 * eta * gg) & (eta > floor)
        if not bad.any():
            return eta, q_new, kl_new
        eta[bad] *= 0.5


def _boundary_fraction(pi_old, nu, theta, g, eta, delta_align: float) -> float:
    """The first point ``c ∈ (0, 1]`` of the segment ``θ − c η∘g`` with ``D ≤ δ_align``, by 60
    bisections (the returned end is inside): ``D`` is convex along the segment and ``D > δ_align``
    at ``c = 0``, so that point is the boundary ``D = δ_align`` to roundoff."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _probe_mean(nu, _distill_point(pi_old, theta - mid * eta[:, None] * g)[1]) <= delta_align:
            hi = mid
        else:
            lo = mid
    return hi


def align_distill(pi_old, init, nu, delta_align: float, *, lr: float | None = None,
                  max_steps: int = 100_000) -> tuple[np.ndarray, AlignTrace]:
    """TeamTR Stage-0: ``min_θ D(θ) = E_{s∼ν} KL_s(π_old‖softmax θ_s)`` by gradient descent
    from ``θ^0 = log init``, stopping at the first point with ``D ≤ δ_align``.

    ``pi_old``, ``init``: (S, A) factors (``init`` strictly positive: softmax logits cannot
    represent a zero). ``nu`` (S,): probe state weights (normalized here). Step
    ``θ ← θ − η_t∘g_t``, ``g = ν(s) (π_θ − π_old)``. ``D`` is convex and ``ν_max/2``-smooth
    (the Hessian per state is ``ν(s)(diag π_θ − π_θ π_θᵀ)``, top eigenvalue at most ``½``), so
    ``lr = 1/ν_max`` (the default first step; half the largest stable one) decreases ``D``.
    Each state's step doubles after every step and is cut back by :func:`_armijo_steps`, so
    every ``KL_s`` and ``D`` decrease at every step, and a flat region is crossed in a few
    dozen steps. The step that crosses ``δ_align`` is cut back to the boundary
    (:func:`_boundary_fraction`): the early stop keeps as much of the new agent as the radius
    allows, however long the last step was.

    Returns the aligned factor (S, A) — rows with ``ν(s) = 0`` keep the initialization — and
    an :class:`AlignTrace` (``lr``: the first step size).
    """
    pi_old, init, nu, lr = _align_inputs(pi_old, init, nu, delta_align, lr)
    D = partial(_probe_mean, nu)
    theta = np.log(init)
    q, kl = _distill_point(pi_old, theta)
    eta = np.full(pi_old.shape[0], float(lr))
    floor = lr * 2.0 ** -60
    kls = [D(kl)]
    while kls[-1] > delta_align and len(kls) <= max_steps:
        g = nu[:, None] * (q - pi_old)
        eta, q_new, kl_new = _armijo_steps(pi_old, nu, theta, g, kl, eta, floor)
        step = eta
        if D(kl_new) <= delta_align:  # the first point of this step inside the radius
            step = _boundary_fraction(pi_old, nu, theta, g, eta, delta_align) * eta
            q_new, kl_new = _distill_point(pi_old, theta - step[:, None] * g)
        theta, q, kl = theta - step[:, None] * g, q_new, kl_new
        kls.append(D(kl))
        eta = np.minimum(2.0 * eta, 1e300)  # g = 0 rows must not overflow to inf·0
    kl = np.array(kls)
    return q, AlignTrace(steps=len(kls) - 1, kl=kl, converged=bool(kl[-1] <= delta_align),
                         delta_align=float(delta_align), lr=float(lr))


# ------------------------------------------------------------------ SAT: projection
def geometric_path(pi_pre: np.ndarray, pi_cur: np.ndarray, t) -> np.ndarray:
    """Rows ``π_t(a|s) ∝ π_pre(a|s)^{t(s)} π_cur(a|s)^{1−t(s)}``, ``t ∈ [0, 1]`` per state.

    Zero probabilities are exact: ``0^t = 0`` for ``t > 0`` and ``0^0 = 1``. A row whose
    supports make every entry zero (disjoint supports, ``0 < t < 1``) is returned as NaN.
    """
    t = np.broadcast_to(np.asarray(t, dtype=np.float64), (pi_pre.shape[0],))[:, None]
    with np.errstate(divide="ignore"):
        lp, lc = np.log(pi_pre), np.log(pi_cur)
    with np.errstate(invalid="ignore"):  # 0·(−inf) is discarded by the where
        z = np.where(t > 0, t * lp, 0.0) + np.where(t < 1, (1 - t) * lc, 0.0)
        out = np.exp(z - logsumexp(z, axis=1, keepdims=True))
    return out


@dataclass
class ProjectionResult:
    """``pi`` (S, A) the projected factor; ``lam`` (S,) the multipliers ``λ(s)`` (``inf`` where
    the result is ``π_cur`` itself); ``t = 1/(1+λ)``; ``kl_new_cur = KL_s(π_new‖π_cur)`` and
    ``kl_cur_new = KL_s(π_cur‖π_new)`` per state; ``constraint`` which of the two was bounded."""

    pi: np.ndarray
    lam: np.ndarray
    t: np.ndarray
    kl_new_cur: np.ndarray
    kl_cur_new: np.ndarray
    constraint: str
    iterations: int = field(default=0)


def project_geometric(pi_pre, pi_cur, delta0, *, constraint: str = "sat",
                      iterations: int = 100) -> ProjectionResult:
    """SAT Stage-0: per-state projection of ``π_pre`` onto ``{π : KL_s(π‖π_cur) ≤ δ_0(s)}``.

    ``π_new = π_t``, ``π_t ∝ π_pre^t π_cur^{1−t}`` with ``t(s) = 1/(1+λ(s))``: ``t = 1`` (``λ = 0``)
    when ``KL_s(π_pre‖π_cur) ≤ δ_0(s)``, else the largest ``t`` (smallest ``λ``) with
    ``KL_s(π_t‖π_cur) ≤ δ_0(s)``, found by ``iterations`` bisection steps on ``t ∈ [0, 1]``
    (the returned ``t`` is the feasible end of the final bracket, so the constraint holds
    exactly, and the result is within ``2^−iterations`` in ``t`` of the active point).

    ``constraint="trust_region"`` bounds ``KL_s(π_cur‖π_t)`` instead (the direction the
    certificates use) along the same path; see the module docstring.
    ``delta0``: scalar or (S,) radii ``≥ 0``.
    """
    pi_pre = _factor(pi_pre, "pretrained factor pi_pre")
    pi_cur = _factor(pi_cur, "current factor pi_cur")
    if pi_pre.shape != pi_cur.shape:
        raise InputError(f"pi_pre has shape {pi_pre.shape}, pi_cur {pi_cur.shape}")
    if constraint not in ("sat", "trust_region"):
        raise InputError(f"constraint must be 'sat' or 'trust_region', got {constraint!r}")
    S = pi_pre.shape[0]
    d0 = np.broadcast_to(np.asarray(delta0, dtype=np.float64), (S,)).copy()
    if not np.all(np.isfinite(d0)) or d0.min() < 0:
        raise InputError("delta0 must be finite and >= 0")

    def kl_of(t):
        pt = geometric_path(pi_pre, pi_cur, t)
        kl = kl_rows(pt, pi_cur) if constraint == "sat" else kl_rows(pi_cur, pt)
        return np.where(np.isnan(kl), np.inf, kl)

    lo, hi = np.zeros(S), np.ones(S)
    inside = kl_of(hi) <= d0
    lo[inside] = 1.0
    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        ok = kl_of(mid) <= d0
        lo = np.where(ok & ~inside, mid, lo)
        hi = np.where(ok | inside, hi, mid)
    t = lo
    pi = geometric_path(pi_pre, pi_cur, t)
    with np.errstate(divide="ignore"):
        lam = np.where(t > 0, 1.0 / np.where(t > 0, t, 1.0) - 1.0, np.inf)
    return ProjectionResult(pi=pi, lam=lam, t=t, kl_new_cur=kl_rows(pi, pi_cur),
                            kl_cur_new=kl_rows(pi_cur, pi), constraint=constraint,
                            iterations=iterations)

