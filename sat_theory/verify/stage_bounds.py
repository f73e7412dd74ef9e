"""Single-step and stage lower bounds (docs/theory.md §4.3–§4.5).

Checks: single_step_bound, single_step_bound_max_kl, joint_stage_bound_all_orders,
stale_stage_bound, expected_kl_vacuity, estimated_advantage_bound. Their cases: random
(:mod:`.cases`), hand-built traps, and the saved adversarial cases of :mod:`.saved`, found by
``experiments/adversarial_search.py`` to use as much of each bound's slack as possible.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import os

import numpy as np

from ..certificates import (
    HOLD_TOL,
    penalty_constant,
    stage_certificate,
)
from ..evaluate import evaluate
from ..mdp import FactorizedMDP
from ..policy import (
    TeamPolicy,
    expected_advantage,
    factor_kl,
    joint_kl,
    joint_policy,
)
from . import CheckResult, check
from .cases import (
    Case,
    cases,
    stale_trap_case,
)
from .saved import load_case
from .tally import (
    SQ2,
    Tally,
    check_mutation,
    count,
    evals,
    expect,
    random_order,
    summary,
    trap_cases,
)


# ------------------------------------------------------------------ §4 step and stage bounds
def _step_cases(seed: int, quick: bool) -> list[Case]:
    return (cases(seed, count(quick, 80, 300)) + trap_cases(ts=(0.02, 0.3))
            + [stale_trap_case(g, 1e-6) for g in (0.5, 0.9, 0.95)]
            + list(_tight_cases(quick, seed)))


# ------------------------------------------------------------------ optimized tight cases
def _tight_unpack(x: np.ndarray, S: int, A: int):
    """Parameters → (P, R, π_cur, π_tar, ρ0) of a one-agent MDP (softmax/tanh maps)."""
    from scipy.special import softmax

    k = 0
    P = softmax(3 * x[k:k + S * A * S].reshape(S, A, S), axis=2)
    k += S * A * S
    R = np.tanh(x[k:k + S * A]).reshape(S, A)
    k += S * A
    cur = softmax(x[k:k + S * A].reshape(S, A), axis=1)
    k += S * A
    tar = softmax(x[k:k + S * A].reshape(S, A), axis=1)
    k += S * A
    rho = softmax(3 * x[k:k + S])
    return P, R, cur, tar, rho


def penalty_share(mdp: FactorizedMDP, cur: TeamPolicy, tar: TeamPolicy, form: str) -> float:
    """``(L^seq − ΔJ) / (c√δ)`` of one step ``π_cur → π_tar`` (all agents switched at once is
    one step only for ``n = 1``): the fraction of the single-step penalty actually needed.
    ``form``: ``"expected"`` (``δ = E_{d^π_cur} KL``) or ``"max"`` (``δ^max``)."""
    e0, e1 = evaluate(mdp, cur), evaluate(mdp, tar)
    f = expected_advantage(e1.pi, e0.A)
    L = float(e0.d @ f) / (1 - mdp.gamma)
    kl = joint_kl(mdp, cur, tar)
    delta = float(e0.d @ kl) if form == "expected" else float(kl.max())
    pen = penalty_constant(mdp.gamma, e0.A_max) * math.sqrt(max(delta, 0.0))
    return (L - (e1.J - e0.J)) / pen if pen > 1e-12 and np.isfinite(pen) else 0.0


def optimize_tight_case(gamma: float, form: str, *, S: int = 2, A: int = 2, seed: int = 0,
                        restarts: int = 2, maxfev: int = 3000) -> Case:
    """Adversarial search (Nelder–Mead then Powell from random starts) over one-agent MDPs
    with ``S`` states and ``A`` actions — transitions, rewards, start distribution, current and
    target policy all free — for the largest penalty share :func:`penalty_share`. Returns the
    best :class:`Case` found (kind ``"optimized"``)."""
    from scipy.optimize import minimize

    rng = np.random.default_rng([seed, 21, S, A, int(gamma * 1000), form == "max"])

    def build(x):
        P, R, cur, tar, rho = _tight_unpack(x, S, A)
        mdp = FactorizedMDP.factored(P, R, rho, gamma, name=f"tight-{form}-g{gamma:g}")
        return mdp, TeamPolicy((cur,)), TeamPolicy((tar,))

    def neg(x):
        return -penalty_share(*build(x), form)

    best_x, best = None, -np.inf
    n_par = S * A * S + 3 * S * A + S
    for _ in range(restarts):
        x = rng.normal(size=n_par) * 2
        r = minimize(neg, x, method="Nelder-Mead", options=dict(maxfev=maxfev, xatol=1e-8,
                                                                 fatol=1e-12))
        r = minimize(neg, r.x, method="Powell", options=dict(maxfev=maxfev))
        if -r.fun > best:
            best_x, best = r.x, -r.fun
    mdp, cur, tar = build(best_x)
    return Case(mdp, cur, tar, "optimized", None,
                f"optimized S={S} γ={gamma:g} {form}-form share {best:.3g}")


def tight_case_path(form: str) -> str:
    return os.path.join(os.path.dirname(os.path.dirname(__file__)), "data",
                        f"tight_step_{form}.npz")


@functools.lru_cache(maxsize=4)
def _tight_cases(quick: bool, seed: int) -> tuple[Case, ...]:
    """The saved optimized tight cases (both forms); in full mode also fresh searches at
    γ ∈ {0.2, 0.5, 0.9} (cached: several checks share them)."""
    out = []
    for form in ("expected", "max"):
        p = tight_case_path(form)
        if os.path.exists(p):
            c = load_case(p, f"saved tight case ({form} form)")
            out.append(Case(c.mdp, c.current, c.target, c.kind, None,
                            f"{c.label}, share {penalty_share(c.mdp, c.current, c.target, form):.3g}"))
    if not quick:
        for form in ("expected", "max"):
            for g in (0.2, 0.5, 0.9):
                out.append(optimize_tight_case(g, form, seed=seed, restarts=1, maxfev=1500))
    return tuple(out)


def _tight_table(form: str) -> str:
    """The worst penalty shares per γ from experiments/counterexamples/tight_single_step.json
    (written by that script), as a sentence; empty if the file is absent."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "experiments", "counterexamples", "tight_single_step.json")
    try:
        with open(path) as fh:
            rows = [r for r in json.load(fh)["results"] if r["form"] == form]
    except (OSError, ValueError, KeyError):
        return ""
    body = ", ".join(f"{r['share']:.2f} at γ={r['gamma']:g}" for r in rows)
    return (f". Worst share found by optimization (tight_single_step.py): {body} — it falls "
            "roughly like 1−γ, so the 1/(1−γ)² of c is not attained")


_EXPLORE = ("no_sqrt", "drop_horizon")


def _single_step(name: str, form: str, *, quick: bool, seed: int,
                 mutation: str | None) -> CheckResult:
    rng = np.random.default_rng([seed, 15])
    T = Tally()
    used, used_plain, positive, elem_fail, elem_tighter, flip_fail = [], [], 0, 0, 0, 0
    for c in _step_cases(seed + 5, quick):
        order = random_order(rng, c.n)
        evs = evals(c, order)
        cert = stage_certificate(c.mdp, c.current, c.target, order, evaluations=evs)
        g = c.mdp.gamma
        for st in cert.steps:
            rad = st.delta if form == "expected" else st.delta_max
            cc = penalty_constant(g, st.A_max)
            L = st.L_stale if mutation == "stale_occupancy" else st.L_seq
            pen = {"no_penalty": 0.0, "halve_penalty": 0.5 * cc * math.sqrt(rad),
                   "no_sqrt": cc * rad, "drop_horizon": (1 - g) * cc * math.sqrt(rad)
                   }.get(mutation, cc * math.sqrt(rad))
            # elementary bound: ΔJ ≥ L − 2‖f_i‖∞/(1−γ) with ‖f_i‖∞ ≤ 2 TV^max A_max ≤ √2 A_max √δ^max
            elem = st.L_seq - 2 * SQ2 * st.A_max * math.sqrt(st.delta_max) / (1 - g)
            elem_fail += not (st.true_gain >= elem - HOLD_TOL * (1 + abs(elem)))
            elem_tighter += elem > st.bound_max
            bound = L - pen - st.zeta / (1 - g)
            if mutation is None:  # this check's formula and the certificate module agree
                ref = st.bound if form == "expected" else st.bound_max
                if abs(bound - ref) > 1e-9 * (1 + abs(bound)):
                    T._note(False, f"{c.label}: bound {bound:.10g} != certificate {ref:.10g}")
            # flipped KL direction KL_s(π_tar‖π_cur) as the radius (a finding, not a mutation)
            j = order[st.step - 1]
            fk = factor_kl(c.mdp, c.target.factors[j], c.current.factors[j], j)
            act = c.mdp.active[:, j]
            frad = (expect(evs[st.step - 1].d, fk) if form == "expected"
                    else (float(fk[act].max()) if act.any() else 0.0))
            fb = st.L_seq - cc * math.sqrt(frad) - st.zeta / (1 - g)
            flip_fail += not (st.true_gain >= fb - HOLD_TOL * (1 + abs(fb)))
            T.lower(st.true_gain, bound, f"{c.label} order={order} step {st.step}")
            positive += bound > 0
            full = cc * math.sqrt(rad)
            if full > 0 and np.isfinite(full):
                used.append((st.L_seq - st.true_gain) / full)
                if c.kind != "optimized":
                    used_plain.append(used[-1])
    return T.result(name, [
        f"share of the penalty used, (L−ΔJ)/(c√δ): max {summary(used, np.max):.3g} (on the "
        f"optimized tight cases), median {summary(used, np.median):.3g}; random and hand-built "
        f"cases max {summary(used_plain, np.max):.3g}" + _tight_table(form),
        f"non-vacuous (bound > 0) on {positive} of {T.cases} steps",
        f"with the KL direction flipped (radius from KL_s(π_tar‖π_cur)): {flip_fail} violations "
        "— Pinsker bounds TV by either direction, so the paper's reverse KL is a choice "
        "(estimability from behaviour samples), not needed for validity",
        f"elementary max-KL bound ΔJ ≥ L_seq − 2√2·A_max·√δ^max/(1−γ) (both sides of the PDL "
        f"bounded by ‖f_i‖∞/(1−γ), ‖f_i‖∞ ≤ 2·TV^max·A_max): {elem_fail} violations; tighter "
        f"than SAT Thm 4.2 on {elem_tighter} of {T.cases} steps — by the factor 2(1−γ)/γ, i.e. "
        "whenever γ > 2/3; so for γ ≥ 0.8 even SAT's max-KL penalty with half the constant is "
        "provably valid",
    ])


@check("single_step_bound",
       "TeamTR Thm 3.4 (expected-KL form)",
       "THEORY §4 step and stage bounds",
       mutations=("no_penalty", "stale_occupancy", "halve_penalty"))
def single_step_bound(*, quick: bool = False, seed: int = 0,
                      mutation: str | None = None) -> CheckResult:
    """``J(π̂^i) − J(π̂^{i−1}) ≥ L_i^seq − c·√δ_i − ζ_i/(1−γ)``, ``c = √2γA_max/(1−γ)²``, per step
    of random orders (``A_max`` of the step, ``ζ = 0`` in exact mode).

    Mutations: ``no_penalty`` (drop ``c√δ``), ``stale_occupancy`` (``L_i^stale`` in place of
    ``L_i^seq``; caught on :func:`~sat_theory.verify.cases.stale_trap_case`), ``halve_penalty``
    (caught on the optimized tight cases, :func:`optimize_tight_case`). Accepted but not
    declared (never caught, see findings): ``no_sqrt`` (``c·δ``), ``drop_horizon``.
    """
    check_mutation(mutation, "single_step_bound", _EXPLORE)
    return _single_step("single_step_bound", "expected", quick=quick, seed=seed, mutation=mutation)


@check("single_step_bound_max_kl",
       "SAT Thm 4.2 (max-KL form, 2γ/(1−γ)²·A_max·√(δ^max/2))",
       "THEORY §4 step and stage bounds",
       mutations=("no_penalty", "halve_penalty"))
def single_step_bound_max_kl(*, quick: bool = False, seed: int = 0,
                             mutation: str | None = None) -> CheckResult:
    """``J(π̂^i) − J(π̂^{i−1}) ≥ L_i^seq − 2γ/(1−γ)²·A_max·√(δ_i^max/2) − ζ_i/(1−γ)`` (equal to
    ``c·√δ_i^max``, see tests' sympy proof). Mutations: ``no_penalty``, ``halve_penalty``
    (caught only at small γ, on the optimized tight case). Stale occupancy is NOT a
    mutation of this form for ``γ ≥ 2/3``: ``|L_i^stale − ΔJ_i| ≤ 2‖f_i‖∞/(1−γ) ≤ 2√2 A_max
    √δ^max/(1−γ) = c√δ^max · 2(1−γ)/γ`` — see the findings."""
    check_mutation(mutation, "single_step_bound_max_kl", _EXPLORE + ("stale_occupancy",))
    return _single_step("single_step_bound_max_kl", "max", quick=quick, seed=seed + 1,
                        mutation=mutation)


def greedy_order(mdp: FactorizedMDP, current: TeamPolicy, target: TeamPolicy, *,
                 key: str = "gain") -> tuple[int, ...]:
    """A data-dependent order: at each step take the remaining agent with the largest
    (``key="gain"``) or smallest (``"worst"``) surrogate ``L^seq`` under the current
    intermediate policy, or the largest radius ``δ`` (``"radius"``)."""
    pol, left, order = current, list(range(mdp.n_agents)), []
    while left:
        ev = evaluate(mdp, pol)
        scores = []
        for j in left:
            nxt = pol.with_factor(j, target.factors[j])
            if key == "radius":
                scores.append(float(ev.d @ factor_kl(mdp, current.factors[j], target.factors[j], j)))
            else:
                L = float(ev.d @ expected_advantage(joint_policy(mdp, nxt), ev.A))
                scores.append(L if key == "gain" else -L)
        j = left[int(np.argmax(scores))]
        order.append(j)
        left.remove(j)
        pol = pol.with_factor(j, target.factors[j])
    return tuple(order)


def _stage_bound(cert, mutation: str | None) -> float:
    """The joint stage bound (expected form), or its mutated version."""
    sq = np.sqrt([s.delta for s in cert.steps])
    Z = sum(s.zeta for s in cert.steps) / (1 - cert.gamma)
    if mutation == "no_penalty":
        return sum(s.L_seq for s in cert.steps) - Z
    if mutation == "stale_occupancy":
        return sum(s.L_stale for s in cert.steps) - cert.c * sq.sum() - Z
    if mutation == "halve_penalty":
        return sum(s.L_seq for s in cert.steps) - 0.5 * cert.c * sq.sum() - Z
    return cert.lower_bound


@check("joint_stage_bound_all_orders",
       "TeamTR Thm 3.6; SAT Thm 4.4 (sequence-agnostic)",
       "THEORY §4 step and stage bounds",
       mutations=("no_penalty", "halve_penalty"))
def joint_stage_bound_all_orders(*, quick: bool = False, seed: int = 0,
                                 mutation: str | None = None) -> CheckResult:
    """``J(π̄) − J(π_cur) ≥ Σ L_i^seq − c Σ √δ_i − Σ ζ_i/(1−γ)`` for EVERY permutation (n ≤ 4)
    and for data-dependent orders (greedy by surrogate gain, worst-first, largest radius first).

    Also checked, reported in findings: the SAT max-KL form and the tighter ladder
    (``‖f_i‖∞`` for ``A_max``; exact ``E TV`` for Pinsker) — never as the paper's.
    Mutations: ``no_penalty``, ``halve_penalty`` (caught on the optimized tight one-agent
    case). Explored but never violated (reported in findings): ``stale_occupancy``
    (``Σ L_i^stale`` with the linear penalty).
    """
    name = "joint_stage_bound_all_orders"
    check_mutation(mutation, name, ("stale_occupancy",))
    T = Tally()
    other = {k: 0 for k in ("lower_bound_max", "lower_bound_fnorm", "lower_bound_tv")}
    spread, positive, ladder, share, stale_lin_fail = [], 0, [], [], 0
    pool = (cases(seed + 6, count(quick, 30, 120)) + trap_cases(gammas=(0.9,), ts=(0.02, 0.3))
            + list(_tight_cases(quick, seed)))
    dd_orders = 0
    for c in pool:
        perms = list(itertools.permutations(range(c.n)))
        data = {greedy_order(c.mdp, c.current, c.target, key=k) for k in ("gain", "worst", "radius")}
        dd_orders += len(data)
        bounds = []
        for order in perms + sorted(data):
            cert = stage_certificate(c.mdp, c.current, c.target, order)
            b = _stage_bound(cert, mutation)
            T.lower(cert.true_improvement, b, f"{c.label} order={order}")
            bounds.append(b)
            positive += b > 0
            stale_lin = _stage_bound(cert, "stale_occupancy")
            stale_lin_fail += cert.true_improvement < stale_lin - HOLD_TOL * (1 + abs(stale_lin))
            pen = cert.c * sum(math.sqrt(s.delta) for s in cert.steps)
            if pen > 0:
                share.append((sum(s.L_seq for s in cert.steps) - cert.true_improvement) / pen)
            for k in other:
                other[k] += cert.true_improvement < getattr(cert, k) - HOLD_TOL * (1 + abs(getattr(cert, k)))
            if cert.lower_bound < 0 and cert.lower_bound_tv < cert.true_improvement:
                ladder.append((cert.true_improvement - cert.lower_bound_tv)
                              / max(cert.true_improvement - cert.lower_bound, 1e-300))
        spread.append(max(bounds) - min(bounds))
    return T.result(name, [
        f"{T.cases} (case, order) pairs: all n! orders of {len(pool)} cases (by n: "
        f"{dict(sorted(collections.Counter(c.n for c in pool).items()))}) plus {dd_orders} "
        f"data-dependent orders (greedy by L^seq, worst-first, largest-δ-first); bound > 0 "
        f"(non-vacuous) on {positive}",
        f"violations of SAT max-KL form {other['lower_bound_max']}, ‖f‖∞ rung "
        f"{other['lower_bound_fnorm']}, exact-TV rung {other['lower_bound_tv']} (extension)",
        f"the tightest rung (‖f_i‖∞ and exact E TV) leaves median {summary(ladder, np.median):.3g} of the "
        "paper-form slack" if ladder else "ladder: no comparable cases",
        f"share of the penalty used, (Σ L_seq − ΔJ)/(c Σ √δ_i): max {summary(share, np.max):.3g}, "
        f"median {summary(share, np.median):.3g} — so halving c was never caught",
        f"stale surrogates with the LINEAR penalty (Σ L_stale − c Σ √δ_i) violated in "
        f"{stale_lin_fail} of {T.cases}: the quadratic stale penalty is a worst case these "
        "cases never needed (see stale_stage_bound)",
        f"bound spread across orders of one case: median {summary(spread, np.median):.3g} "
        "(the value depends on the order, its validity does not)",
    ])


@check("stale_stage_bound",
       "TeamTR Prop 3.3 / App. C.3",
       "THEORY §4 step and stage bounds",
       mutations=("no_penalty", "halve_penalty"))
def stale_stage_bound(*, quick: bool = False, seed: int = 0,
                      mutation: str | None = None) -> CheckResult:
    """``J(π̄) − J(π_cur) ≥ Σ (L_i^stale − ζ_i/(1−γ)) − c Σ_i (√δ_i + Σ_{k<i} √δ_k)``.

    Mutations: ``no_penalty``, ``halve_penalty`` (caught on the optimized one-agent case).
    Explored, never violated (reported in findings): ``linear_penalty`` (``c Σ √δ_i`` only: stale surrogates with the intermediate-occupancy
    penalty, i.e. dropping the compounding ``Σ_{k<i}`` term).
    """
    name = "stale_stage_bound"
    check_mutation(mutation, name, ("linear_penalty",))
    rng = np.random.default_rng([seed, 17])
    T = Tally()
    gap_vs_comp, lin_fail = [], 0
    pool = [c for c in cases(seed + 7, count(quick, 60, 300)) if c.n >= 2]
    pool += trap_cases(n_agents=(2, 3), ts=(0.02, 0.3))
    pool += list(_tight_cases(quick, seed))  # n = 1: the stale and intermediate forms agree
    for c in pool:
        for order in {random_order(rng, c.n), tuple(range(c.n))}:
            cert = stage_certificate(c.mdp, c.current, c.target, order)
            sq = np.sqrt([s.delta for s in cert.steps])
            Ls = sum(s.L_stale for s in cert.steps)
            Z = sum(s.zeta for s in cert.steps) / (1 - cert.gamma)
            comp = sum(sq[:i].sum() for i in range(len(sq)))
            if mutation == "no_penalty":
                b = Ls - Z
            elif mutation == "halve_penalty":
                b = Ls - Z - 0.5 * cert.c * (sq.sum() + comp)
            elif mutation == "linear_penalty":
                b = Ls - Z - cert.c * sq.sum()
            else:
                b = cert.lower_bound_stale
            T.lower(cert.true_improvement, b, f"{c.label} order={order}")
            lin = Ls - Z - cert.c * sq.sum()
            lin_fail += cert.true_improvement < lin - HOLD_TOL * (1 + abs(lin))
            gap = abs(Ls - sum(s.L_seq for s in cert.steps))
            if comp > 0:
                gap_vs_comp.append(gap / (cert.c * comp))
    return T.result(name, [
        f"|Σ L_stale − Σ L_seq| / (c Σ_i Σ_{{k<i}} √δ_k): median {summary(gap_vs_comp, np.median):.3g}, "
        f"max {summary(gap_vs_comp, np.max):.3g} — the share of the compounding penalty actually used",
        f"dropping the compounding term (linear penalty with stale surrogates): {lin_fail} "
        f"violations in {T.cases} — the n² penalty is a worst case, not observed here; it is "
        "needed only when one step both shifts occupancy at nearly the Pinsker rate and leaves "
        "its own penalty unused while a later ‖f_i‖∞ is close to A_max" + _stale_search_note(),
    ])


def _stale_search_note() -> str:
    """Summary of experiments/counterexamples/stale_compounding_search.json, if present."""
    import json

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "experiments", "counterexamples", "stale_compounding_search.json")
    try:
        with open(path) as fh:
            rows = json.load(fh)["results"]
    except (OSError, ValueError, KeyError):
        return ""
    worst = max(rows, key=lambda r: r["max_need"])
    return (f". Adversarial optimization over {len(rows)} settings (stale_compounding_search.py) "
            f"never needed it either: the largest share of the compounding term used was "
            f"{worst['max_need']:.2f} ({worst['layout']} S={worst['S']} n={worst['n']} "
            f"γ={worst['gamma']:g}; > 0 would mean the linear bound fails)")
