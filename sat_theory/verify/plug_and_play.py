"""Plug-and-play resumability and certificate tightening (docs/theory.md §5).

Checks: plug_and_play_resumability, certificate_tightening.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..certificates import (
    intermediate_policies,
    penalty_constant,
    stage_certificate,
    stage_lower_bound,
)
from ..evaluate import evaluate
from ..mdp import FactorizedMDP
from ..policy import (
    TeamPolicy,
    factor_kl,
    kl_rows,
    marginal_advantage,
)
from .base import CheckResult, check
from .cases import (
    adversarial_target,
    cases,
    greedy_target,
    random_mdps,
    random_policy,
    small_step_target,
)
from .tally import (
    Tally,
    check_mutation,
    count,
    random_order,
    summary,
)


# ------------------------------------------------------------------ §5 plug-and-play
def _align(pi_old: np.ndarray, init: np.ndarray, nu: np.ndarray, delta_align: float) -> np.ndarray:
    """TeamTR Stage-0 (sat_theory.stage0.align_distill): reverse-KL distillation from the new
    agent's initialization, early-stopped at ``E_ν KL(π_old‖π_θ) ≤ δ_align``."""
    from ..stage0 import align_distill

    q, trace = align_distill(pi_old, init, nu, delta_align)
    if not trace.converged:
        raise RuntimeError("stage-0 alignment did not converge")
    return q


def _swap_probe(mdp: FactorizedMDP, ev, j: int):
    """``ν = d^{π_cur}`` restricted to the states where agent ``j`` acts, normalized (``None``
    where it never acts)."""
    nu = ev.d * mdp.active[:, j]
    if nu.sum() <= 0:
        return None
    return nu / nu.sum()


def _pretrained_factor(mdp: FactorizedMDP, cur: TeamPolicy, rng, j: int, harmful: bool) -> np.ndarray:
    """The new agent's factor: an unrelated pretrained policy or, when ``harmful``, one far
    against the team's advantage — the kind of swap whose shock the alignment caps."""
    if harmful:
        pre = adversarial_target(mdp, cur, 3.0).factors[j]
    else:
        pre = random_policy(mdp, rng, temperature=3.0).factors[j]
    pre = np.clip(pre, 1e-12, None)
    return pre / pre.sum(axis=1, keepdims=True)


def _stage_target(mdp, base: TeamPolicy, rng, kind: str, r: float, j: int,
                  old_j: np.ndarray) -> TeamPolicy:
    """A target at radius ``r`` from ``base``: ``rollback`` (a small step with agent ``j`` back
    on the replaced factor), ``small``, ``greedy`` or ``adversarial``."""
    if kind == "rollback":
        return small_step_target(mdp, base, rng, r).with_factor(j, old_j)
    if kind == "small":
        return small_step_target(mdp, base, rng, r)
    if kind == "greedy":
        return greedy_target(mdp, base, r)
    return adversarial_target(mdp, base, r)


def _old_reference_bound(mdp, cert, evs, base, tar, order, j, old_j) -> float:
    """The ``old_reference`` mutation: ``Σ L_i − c Σ √δ_i`` with agent ``j``'s radius still
    measured from the replaced agent's factor (trust-region bookkeeping not re-established)."""
    sq = [math.sqrt(max(0.0, float(evs[i].d @ factor_kl(
        mdp, old_j if a == j else base.factors[a], tar.factors[a], a))))
        for i, a in enumerate(order)]
    return sum(s.L_seq for s in cert.steps) - cert.c * sum(sq)


def _resumed_stage(mdp, base, tar, order, swap: dict, first_after_swap: bool,
                   mutation: str | None) -> tuple[float, float]:
    """``(J(π̄) − J(base), Thm 3.6 bound)`` of one stage from the swapped team; under
    ``certify_swap`` the gain is counted from before the swap (``swap["J0"]``) on the stages
    right after it, where ``old_reference`` also applies."""
    evs = [evaluate(mdp, p_) for p_ in intermediate_policies(base, tar, order)]
    cert = stage_certificate(mdp, base, tar, order, evaluations=evs)
    b, true = cert.lower_bound, cert.true_improvement
    if mutation == "no_penalty":
        b = sum(s.L_seq for s in cert.steps)
    if mutation == "certify_swap" and first_after_swap:
        true = cert.J_after - swap["J0"]  # the swap shock is not covered by the bound
    if mutation == "old_reference" and first_after_swap:
        b = _old_reference_bound(mdp, cert, evs, base, tar, order, swap["j"], swap["old_j"])
    return true, b


def _resume_after_swap(T: Tally, rng, mdp, team: TeamPolicy, tag: str, k: int, swap: dict,
                       mutation: str | None) -> None:
    """The stages after a swap: a rollback of the new agent to the old factor (from the swapped
    team), then two chained stages of small / greedy / adversarial targets; every order for
    ``n ≤ 3``, each recorded as ``true ≥ bound``."""
    j, old_j = swap["j"], swap["old_j"]
    plan = [("rollback", team)] + [(("small", "greedy", "adversarial")[(s_ + k) % 3], None)
                                   for s_ in range(2)]
    pol = team
    for stage, (kind, start) in enumerate(plan):
        base = start if start is not None else pol
        r = float(rng.choice([1e-4, 1e-3, 1e-2, 0.1]))
        tar = _stage_target(mdp, base, rng, kind, r, j, old_j)
        orders = (list(itertools.permutations(range(mdp.n_agents))) if mdp.n_agents <= 3
                  else [random_order(rng, mdp.n_agents)])
        first_after_swap = stage <= 1  # the rollback and the first chained stage
        for order in orders:
            true, b = _resumed_stage(mdp, base, tar, order, swap, first_after_swap, mutation)
            T.lower(true, b, f"{mdp.name} swap {tag} agent {j} stage {stage} "
                             f"{kind}({r:g}) order={order}")
        if start is None:
            pol = intermediate_policies(pol, tar, orders[0])[-1]


def _swap_findings(align_kl: list, shock_direct: list, shock_aligned: list) -> list[str]:
    """The alignment constraint's largest value and the (uncertified) swap shocks."""
    sd, sa = np.array(shock_direct), np.array(shock_aligned)
    return [
        f"alignment: E_ν KL(π_old‖π_new) ≤ δ_align on all {len(align_kl)} swaps "
        f"(max {summary(align_kl, np.max):.3g})",
        f"swap shock J(after swap) − J(before): direct median {summary(sd, np.median):.3g} "
        f"(negative in {(sd < 0).sum()}/{sd.size}), aligned median {summary(sa, np.median):.3g} "
        f"(negative in {(sa < 0).sum()}/{sa.size}); median |shock| direct "
        f"{summary(np.abs(sd), np.median):.3g} vs aligned {summary(np.abs(sa), np.median):.3g} — the swap "
        "itself is not certified; alignment shrinks it but does not make it non-negative",
        "after the swap every later stage satisfies the Thm 3.6 form with the swapped team as "
        "π_cur, aligned or not: in exact mode resumability needs no alignment, only radii "
        "measured from the swapped team (the old_reference mutation, radii still measured from "
        "the replaced agent, is violated); alignment only limits the uncertified swap shock",
    ]


@check("plug_and_play_resumability",
       "TeamTR Prop 3.8 / App. D.1–D.2; SAT §4.3 (plug-and-play invariance, Stage-0)",
       "docs/theory.md §5 plug-and-play",
       mutations=("certify_swap", "old_reference", "no_penalty"))
def plug_and_play_resumability(*, quick: bool = False, seed: int = 0,
                               mutation: str | None = None) -> CheckResult:
    """Swap agent ``j`` for a new agent (a random 'pretrained' factor), align it by TeamTR's
    Stage-0 (``E_{s∼ν} KL_s(π_old‖π_new) ≤ δ_align`` on ``ν = d^{π_cur}``), then run later
    stages from the swapped team — a rollback of the new agent to the old factor, and two
    chained stages of small, greedy and adversarial targets, every order for ``n ≤ 3`` — each
    must satisfy the same certificate form (TeamTR Thm 3.6) with radii measured from the
    swapped team. Also checked: the alignment constraint itself. The swap is not certified
    (reported: swap shock).

    Mutations: ``certify_swap`` (credit the post-swap stage bound to ``J(π̄) − J(π_before swap)``,
    i.e. pretend the swap is certified — harmful swaps break it), ``old_reference`` (the
    swapped agent's radius still measured from the replaced agent: the bookkeeping TeamTR
    App. D.2 requires to be re-established), ``no_penalty``.
    """
    name = "plug_and_play_resumability"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 19])
    T = Tally()
    shock_direct, shock_aligned, align_kl = [], [], []
    mdps = random_mdps(seed + 8, count(quick, 16, 60), max_agents=3, max_states=6)
    for k, mdp in enumerate(mdps):
        cur = random_policy(mdp, rng)
        ev = evaluate(mdp, cur)
        j = int(rng.integers(mdp.n_agents))
        nu = _swap_probe(mdp, ev, j)
        if nu is None:
            continue
        # every other swap is a harmful one
        pre = _pretrained_factor(mdp, cur, rng, j, harmful=bool(k % 2))
        delta_align = float(rng.choice([0.01, 0.05]))
        new = _align(cur.factors[j], pre, nu, delta_align)
        kl_probe = float(nu @ kl_rows(cur.factors[j], new))
        T.upper(kl_probe, delta_align, f"{mdp.name} agent {j} alignment")
        align_kl.append(kl_probe)
        direct, aligned = cur.with_factor(j, pre), cur.with_factor(j, new)
        shock_direct.append(evaluate(mdp, direct).J - ev.J)
        shock_aligned.append(evaluate(mdp, aligned).J - ev.J)
        swap = dict(j=j, old_j=cur.factors[j], J0=ev.J)
        for team, tag in ((aligned, "aligned"), (direct, "direct")):
            _resume_after_swap(T, rng, mdp, team, tag, k, swap, mutation)
    return T.result(name, _swap_findings(align_kl, shock_direct, shock_aligned))


def _checked_stage_bound(L, delta, zeta, g: float, A: float, mutation: str | None) -> float:
    """``LB(L, δ, ζ) = Σ L_i − c Σ √δ_i − Σ ζ_i/(1−γ)`` (:func:`stage_lower_bound`) or its
    mutation: ``penalty_sign`` ``+c Σ √δ_i``, ``radius_inverse`` penalty ``c Σ 1/(1+δ_i)``."""
    L, delta = np.asarray(L), np.asarray(delta)
    c = penalty_constant(g, A)
    if mutation == "penalty_sign":
        return float(L.sum() + c * np.sqrt(delta).sum() - np.sum(zeta) / (1 - g))
    if mutation == "radius_inverse":
        return float(L.sum() - c * np.sum(1.0 / (1.0 + np.asarray(delta)))
                     - np.sum(zeta) / (1 - g))
    return stage_lower_bound(L, delta, zeta, g, A)


def _coordinate_monotonicity(T: Tally, rng, mutation: str | None) -> None:
    """On random inputs: raising one ``L_i`` or shrinking one ``δ_i`` does not lower ``LB``."""
    n = int(rng.integers(1, 6))
    g = float(rng.uniform(0.5, 0.999))
    A = float(rng.uniform(0.01, 5))
    L = rng.normal(size=n)
    delta = rng.exponential(0.1, size=n)
    zeta = rng.exponential(0.01, size=n)
    base = _checked_stage_bound(L, delta, zeta, g, A, mutation)
    i = int(rng.integers(n))
    up = L.copy()
    up[i] += rng.exponential(0.1)
    T.lower(_checked_stage_bound(up, delta, zeta, g, A, mutation) - base, 0.0, f"raise L_{i}")
    dn = delta.copy()
    dn[i] *= rng.uniform(0, 1)
    T.lower(_checked_stage_bound(L, dn, zeta, g, A, mutation) - base, 0.0, f"shrink δ_{i}")


def _last_agent_upgrades(T: Tally, c, order, base_cert, mutation: str | None) -> None:
    """Upgrade the LAST agent of ``order`` (every other term, ``A_max`` included, unchanged):
    greedy at the same expected radius ``δ_n`` under ``d^{π̂^{n−1}}`` (higher ``L_n^seq``), or
    pulled back toward ``π_cur`` (smaller ``δ_n``, compared at the old ``L``); neither may
    lower the bound."""
    last = order[-1]
    pre = intermediate_policies(c.current, c.target, order)[-2]
    ev = evaluate(c.mdp, pre)
    delta_n = base_cert.steps[-1].delta
    dz = marginal_advantage(c.mdp, pre, ev.A, last)
    up_f = _scale_expected(c.mdp, c.current.factors[last], dz, last, ev.d, delta_n)
    for tag, fac in (("greedy same δ", up_f),
                     ("shrunk δ", _shrink(c.mdp, c.current.factors[last], c.target.factors[last], last, ev.d))):
        cert2 = stage_certificate(c.mdp, c.current, c.target.with_factor(last, fac), order)
        s1, s2 = base_cert.steps[-1], cert2.steps[-1]
        L1 = [s.L_seq for s in base_cert.steps]
        L2 = [s.L_seq for s in cert2.steps]
        if tag == "greedy same δ" and not (s2.L_seq >= s1.L_seq - 1e-12):
            continue  # not an upgrade of the surrogate
        if tag == "shrunk δ":
            # same surrogate is not guaranteed by shrinking: compare the bound at the
            # old L with the new δ (the 'same surrogate, smaller radius' clause)
            L2 = L1
        b1 = _checked_stage_bound(L1, [s.delta for s in base_cert.steps], [0.0] * c.n,
                                  c.mdp.gamma, base_cert.A_max, mutation)
        b2 = _checked_stage_bound(L2, [s.delta for s in cert2.steps], [0.0] * c.n,
                                  c.mdp.gamma, cert2.A_max, mutation)
        T.lower(b2 - b1, 0.0, f"{c.label} last agent {last} {tag}")


def _first_agent_upgrade(c, order):
    """``(bound before, bound after, description)`` of the whole stage when the FIRST agent of
    ``order`` is upgraded (:func:`earlier_upgrade`); ``None`` where that does not raise
    ``L_1^seq``."""
    up = earlier_upgrade(c.mdp, c.current, c.target, order)
    if up is None:
        return None
    before, after = up[0], up[1]
    base_b, new_b = before.lower_bound, after.lower_bound
    return base_b, new_b, (f"{c.label} order={order}: L_1 {before.steps[0].L_seq:.4g}"
                           f"→{after.steps[0].L_seq:.4g} at δ_1={before.steps[0].delta:.3g}, "
                           f"bound {base_b:.4g}→{new_b:.4g}")


def _tightening_findings(upgrades: list) -> list[str]:
    """How often a first-agent upgrade (:func:`_first_agent_upgrade`) lowered the realized
    stage bound, by how much at most, and the first such case."""
    drops = [(base_b - new_b, ex) for base_b, new_b, ex in upgrades if new_b < base_b - 1e-12]
    worst_drop = max((d for d, _ in drops), default=0.0)
    findings = [f"upgrading the FIRST agent (higher L_1 at equal δ_1) lowered the whole stage "
                f"bound in {len(drops)} of {len(upgrades)} cases (by up to {worst_drop:.3g}; "
                "later L_i, δ_i and A_max move with it): TeamTR Prop 3.9's 'the lower bound in "
                "Thm 3.6 does not decrease' holds term by term (ceteris paribus), not for the "
                "realized stage; one such case is saved in "
                "experiments/counterexamples/tightening_earlier_agent.npz (regenerate: python "
                "experiments/counterexamples/tightening_earlier_agent.py)"]
    if drops:
        findings.append("e.g. " + drops[0][1])
    return findings


@check("certificate_tightening",
       "TeamTR Prop 3.9 / App. D.2; SAT §4.3 (certificate tightening)",
       "docs/theory.md §5 plug-and-play",
       mutations=("penalty_sign", "radius_inverse"))
def certificate_tightening(*, quick: bool = False, seed: int = 0,
                           mutation: str | None = None) -> CheckResult:
    """The stage bound ``LB(L, δ, ζ) = Σ L_i − c Σ √δ_i − Σ ζ_i/(1−γ)`` is non-decreasing in each
    ``L_i`` and non-increasing in each ``δ_i``: checked (a) on random inputs by coordinate
    perturbations and (b) on MDP stages, upgrading the LAST agent of the order (so every other
    term, including ``A_max``, is unchanged): a target with higher ``L_n^seq`` at equal ``δ_n``
    (greedy vs random direction at the same expected-KL radius), or equal ``L_n^seq`` with a
    smaller ``δ_n``, cannot lower the bound.

    Upgrading an EARLIER agent also changes later surrogates and ``A_max``; whether the whole
    bound can drop then is measured and reported as a finding (not the docs/theory.md statement).
    Mutations: ``penalty_sign`` (``+c Σ √δ``), ``radius_inverse`` (penalty ``c Σ 1/(1+δ)``,
    decreasing in δ).
    """
    name = "certificate_tightening"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 20])
    T = Tally()
    for _ in range(count(quick, 200, 2000)):
        _coordinate_monotonicity(T, rng, mutation)
    upgrades = []
    for c in cases(seed + 9, count(quick, 40, 200), kinds=("small",)):
        order = random_order(rng, c.n)
        base_cert = stage_certificate(c.mdp, c.current, c.target, order)
        if base_cert.steps[-1].delta <= 1e-12:
            continue
        _last_agent_upgrades(T, c, order, base_cert, mutation)
        up = _first_agent_upgrade(c, order)  # measured, not checked
        if up is not None:
            upgrades.append(up)
    return T.result(name, _tightening_findings(upgrades), tightness=False)


def earlier_upgrade(mdp: FactorizedMDP, current: TeamPolicy, target: TeamPolicy, order):
    """Upgrade the FIRST agent of ``order``: its target replaced by the advantage tilt
    ``π_cur^j exp(η A_j)`` at the same expected radius ``δ_1``. Returns ``(certificate before,
    certificate after, upgraded target)`` when the upgrade does raise ``L_1^seq``, else ``None``."""
    first = order[0]
    base = stage_certificate(mdp, current, target, order)
    d1 = base.steps[0].delta
    if d1 <= 1e-12:
        return None
    ev0 = evaluate(mdp, current)
    dz0 = marginal_advantage(mdp, current, ev0.A, first)
    f0 = _scale_expected(mdp, current.factors[first], dz0, first, ev0.d, d1)
    tar2 = target.with_factor(first, f0)
    new = stage_certificate(mdp, current, tar2, order)
    if new.steps[0].L_seq < base.steps[0].L_seq - 1e-12:
        return None
    return base, new, tar2


def _scale_expected(mdp, f, dz, j, d, radius) -> np.ndarray:
    """``softmax(log f + t dz)`` with ``t`` by bisection so that ``E_{s∼d} KL_s(f‖·) = radius``
    (capped at what ``t ≤ 1e3`` reaches)."""
    from scipy.special import softmax

    z = np.log(np.clip(f, 1e-300, None))

    def kl(t):
        return float(d @ factor_kl(mdp, f, softmax(z + t * dz, axis=1), j))

    hi = 1.0
    while kl(hi) < radius and hi < 1e3:
        hi *= 2
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if kl(mid) < radius else (lo, mid)
    return softmax(z + lo * dz, axis=1)


def _shrink(mdp, f, tar, j, d) -> np.ndarray:
    """The target factor pulled halfway back toward ``f`` in logits (a smaller radius)."""
    from scipy.special import softmax

    z, zt = np.log(np.clip(f, 1e-300, None)), np.log(np.clip(tar, 1e-300, None))
    return softmax(0.5 * (z + zt), axis=1)
