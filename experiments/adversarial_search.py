"""Adversarial search for cases that press every certificate bound, saved for ``sat verify``.

A bound ``ΔJ ≥ L − pen`` (or an upper bound ``lhs ≤ pen``) is only tested where a case uses a
large share of its slack: a case that uses the share ``u = (L − ΔJ)/pen`` exposes every wrong
penalty that is smaller than ``u·pen`` (e.g. ``(1−γ)`` for ``(1−γ)²`` needs ``u > 1−γ``; a
missing ``√2`` needs ``u > 1/√2``; half the constant needs ``u > ½``). For each objective
below and each ``γ``, this script maximizes the share over small team MDPs — transitions,
rewards, start distribution, activity layout (simultaneous, masked, turn-taking), current and
target policies all free — by Nelder–Mead then Powell from seeded random starts, and saves the
best case per (objective, γ) as ``sat_theory/data/adv_{objective}_g{γ}.npz``, which
:func:`sat_theory.verify.saved.adversarial_cases` loads and every matching check runs.

Objectives (``u ≤ 1`` is the proven statement; see docs/theory.md for each):

- ``step_expected`` / ``step_max``: ``max_i (L_i^seq − ΔJ_i)/(c_i √δ_i)`` (TeamTR Thm 3.4) and
  the same with ``δ_i^max`` (SAT Thm 4.2);
- ``stage``: ``(Σ L_i^seq − ΔJ)/(c Σ √δ_i)`` (TeamTR Thm 3.6);
- ``stage_fnorm`` / ``stage_tv``: the same against the tighter ladder rungs' penalties
  ``Σ √2γ‖f_i‖∞√δ_i/(1−γ)²`` and ``Σ 2γ‖f_i‖∞ E TV_i/(1−γ)²``;
- ``stale``: ``(Σ L_i^stale − ΔJ)/(c Σ_i (√δ_i + Σ_{k<i} √δ_k))`` (TeamTR Prop 3.3);
- ``stale_compounding``: ``(Σ L_i^stale − c Σ √δ_i − ΔJ)/(c Σ_i Σ_{k<i} √δ_k)``: > 0 means the
  compounding term is necessary (the linear bound fails);
- ``chained``: ``max_i |E_{d^{i−1}} f − E_{d^0} f| / (√2γ/(1−γ) ‖f‖∞ Σ_{k<i} √δ_k)`` with the
  extremal ``f = sign(d^{i−1} − d^0)`` (TeamTR eq. 8);
- ``stage_amax_min``: the stage share against the penalty with the *smallest* per-step
  ``A_max,i`` in place of the largest; > 1 shows that the stage constant must take the max;
- ``step_delta_stage_start``: ``max_i (L_i^seq − ΔJ_i)/(c_i √δ_i⁰)`` with ``δ_i⁰`` measured
  under ``d^{π̂^0}``; > 1 shows that the radius must be measured under ``d^{π̂^{i−1}}``.

Writes ``experiments/counterexamples/adversarial_search.json`` (share per objective, γ,
layout and n, with the search settings that found it). A saved case is replaced only by a
case with a larger share (a shorter search never loses a better case). Each run of the
default grid stays within a few minutes of one core.

Run: ``python experiments/adversarial_search.py [--only stage,stale] [--restarts 2]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
from scipy.optimize import minimize
from scipy.special import softmax

from sat_theory.certificates import stage_certificate
from sat_theory.evaluate import evaluate
from sat_theory.mdp import FactorizedMDP
from sat_theory.policy import TeamPolicy, factor_kl
from sat_theory.verify.cases import Case
from sat_theory.verify.saved import adversarial_path, save_case

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "counterexamples", "adversarial_search.json")
GAMMAS = (0.1, 0.5, 0.9, 0.99)
SQ2 = math.sqrt(2.0)


# ------------------------------------------------------------------ parameterization
def n_params(layout: str, S: int, n: int) -> int:
    """Length of the parameter vector of :func:`build` (2 actions per agent)."""
    K = 2 if layout == "turn" else 2 ** n
    return S * K * S + S * K + 2 * n * S * 2 + S + (S * n if layout == "masked" else 0)


def build(x: np.ndarray, layout: str, S: int, n: int, gamma: float):
    """Parameter vector → ``(mdp, current, target)``: softmax transitions (sharpened ×3),
    tanh rewards, softmax policies and start distribution; ``masked``: agent ``j`` is active
    at ``s`` where its activity logit is positive (at least one agent per state), and ``P``,
    ``R`` are made independent of inactive agents' actions by reading them at action 0."""
    k = 0

    def take(m):
        nonlocal k
        k += m
        return x[k - m:k]

    if layout == "turn":
        P = softmax(3 * take(S * 2 * S).reshape(S, 2, S), axis=-1)
        R = np.tanh(take(S * 2)).reshape(S, 2)
    else:
        shape = (S,) + (2,) * n
        P = softmax(3 * take(int(np.prod(shape)) * S).reshape(shape + (S,)), axis=-1)
        R = np.tanh(take(int(np.prod(shape)))).reshape(shape)
    facs = [softmax(take(S * 2).reshape(S, 2), axis=1) for _ in range(2 * n)]
    rho = softmax(3 * take(S))
    if layout == "turn":
        mdp = FactorizedMDP.turn_taking(P, R, np.arange(S) % n, n, rho, gamma, name=f"adv-turn-n{n}")
    elif layout == "simultaneous":
        mdp = FactorizedMDP.factored(P, R, rho, gamma, name=f"adv-simultaneous-n{n}")
    else:
        act = take(S * n).reshape(S, n) > 0
        act[~act.any(axis=1), 0] = True
        for s in range(S):
            for j in np.flatnonzero(~act[s]):
                idx = [slice(None)] * n
                idx[j] = 0
                P[s] = np.broadcast_to(np.expand_dims(P[s][tuple(idx)], j), P[s].shape)
                R[s] = np.broadcast_to(np.expand_dims(R[s][tuple(idx)], j), R[s].shape)
        mdp = FactorizedMDP.factored(P, R, rho, gamma, act, name=f"adv-masked-n{n}")
    return mdp, TeamPolicy(tuple(facs[:n])), TeamPolicy(tuple(facs[n:]))


# ------------------------------------------------------------------ objectives (shares)
#: penalties below this are not scored: their shares would be roundoff of J (|J| up to 1/(1−γ))
MIN_PENALTY = 1e-7


def _ratio(num: float, den: float) -> float:
    return num / den if den > MIN_PENALTY and np.isfinite(den) else -np.inf


def _step_share(cert, radius) -> float:
    return max(_ratio(s.L_seq - s.true_gain, math.sqrt(2) * cert.gamma * s.A_max
                      / (1 - cert.gamma) ** 2 * math.sqrt(radius(s))) for s in cert.steps)


def _stage_pen(cert, per_step) -> float:
    return sum(per_step(s) for s in cert.steps)


def share(objective: str, mdp: FactorizedMDP, cur: TeamPolicy, tar: TeamPolicy) -> float:
    """The share of the slack that ``objective`` (module docstring) uses on one case, with the
    update order ``0..n−1``."""
    order = tuple(range(mdp.n_agents))
    cert = stage_certificate(mdp, cur, tar, order)
    g, L = cert.gamma, sum(s.L_seq for s in cert.steps)
    gap = L - cert.true_improvement
    sq = np.sqrt([s.delta for s in cert.steps])
    comp = sum(sq[:i].sum() for i in range(len(sq)))
    if objective == "step_expected":
        return _step_share(cert, lambda s: s.delta)
    if objective == "step_max":
        return _step_share(cert, lambda s: s.delta_max)
    if objective == "stage":
        return _ratio(gap, cert.c * sq.sum())
    if objective == "stage_fnorm":
        return _ratio(gap, _stage_pen(cert, lambda s: SQ2 * g * s.f_inf * math.sqrt(s.delta)) / (1 - g) ** 2)
    if objective == "stage_tv":
        return _ratio(gap, _stage_pen(cert, lambda s: 2 * g * s.f_inf * s.tv) / (1 - g) ** 2)
    if objective == "stage_amax_min":
        c_min = SQ2 * g * min(s.A_max for s in cert.steps) / (1 - g) ** 2
        return _ratio(gap, c_min * sq.sum())
    stale = sum(s.L_stale for s in cert.steps) - cert.true_improvement
    if objective == "stale":
        return _ratio(stale, cert.c * (sq.sum() + comp))
    if objective == "stale_compounding":
        return _ratio(stale - cert.c * sq.sum(), cert.c * comp)
    if objective == "step_delta_stage_start":
        d0 = evaluate(mdp, cur).d
        return _step_share(cert, lambda s: float(d0 @ factor_kl(mdp, cur.factors[s.agent],
                                                                 tar.factors[s.agent], s.agent)))
    if objective == "chained":
        return _chained_share(mdp, cur, tar, order)
    raise ValueError(f"unknown objective {objective!r}")


def _chained_share(mdp, cur, tar, order) -> float:
    from sat_theory.certificates import intermediate_policies

    evs = [evaluate(mdp, p) for p in intermediate_policies(cur, tar, order)]
    g = mdp.gamma
    sq = [math.sqrt(max(0.0, float(evs[k].d @ factor_kl(mdp, cur.factors[j], tar.factors[j], j))))
          for k, j in enumerate(order)]
    best = -np.inf
    for i in range(2, len(order) + 1):
        lhs = float(np.abs(evs[i - 1].d - evs[0].d).sum())  # f = sign(d^{i−1} − d^0)
        best = max(best, _ratio(lhs, SQ2 * g / (1 - g) * sum(sq[: i - 1])))
    return best


#: objective → (minimum number of agents, the (layout, S, n) settings searched)
SETTINGS = {
    "step_expected": [("simultaneous", 2, 1), ("simultaneous", 3, 1), ("turn", 3, 2)],
    "step_max": [("simultaneous", 2, 1), ("simultaneous", 3, 1), ("turn", 3, 2)],
    "stage": [("simultaneous", 2, 1), ("simultaneous", 2, 2), ("masked", 3, 2), ("turn", 3, 3),
              ("turn", 4, 4)],
    "stage_fnorm": [("simultaneous", 2, 1), ("simultaneous", 2, 2), ("turn", 3, 2)],
    "stage_tv": [("simultaneous", 2, 1), ("simultaneous", 2, 2), ("turn", 3, 2)],
    "stage_amax_min": [("simultaneous", 2, 2), ("masked", 3, 2), ("turn", 3, 2), ("turn", 3, 3)],
    "stale": [("simultaneous", 2, 2), ("masked", 3, 2), ("turn", 3, 3), ("turn", 4, 4)],
    "stale_compounding": [("simultaneous", 2, 2), ("masked", 3, 2), ("turn", 3, 2), ("turn", 3, 3)],
    "chained": [("simultaneous", 2, 2), ("masked", 3, 3), ("turn", 3, 3)],
    "step_delta_stage_start": [("simultaneous", 3, 2), ("turn", 3, 2), ("masked", 3, 2)],
}


def search(objective: str, layout: str, S: int, n: int, gamma: float, *, restarts: int,
           seed: int, maxfev: int):
    """Best ``(share, x)`` over ``restarts`` Nelder–Mead + Powell runs from seeded starts."""
    rng = np.random.default_rng([seed, S, n, int(1000 * gamma), sum(map(ord, layout + objective))])

    def neg(x):
        try:
            v = share(objective, *build(x, layout, S, n, gamma))
        except (ValueError, np.linalg.LinAlgError):
            return 1e9
        return -v if np.isfinite(v) else 1e9

    best = (-np.inf, None)
    for _ in range(restarts):
        x0 = rng.normal(size=n_params(layout, S, n)) * 2
        r = minimize(neg, x0, method="Nelder-Mead", options=dict(maxfev=maxfev, fatol=1e-12))
        r = minimize(neg, r.x, method="Powell", options=dict(maxfev=maxfev))
        if -r.fun > best[0]:
            best = (float(-r.fun), r.x)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated objectives (default all)")
    ap.add_argument("--gammas", default=",".join(map(str, GAMMAS)), help="discounts to search")
    ap.add_argument("--restarts", type=int, default=2, help="random starts per setting")
    ap.add_argument("--maxfev", type=int, default=1500, help="evaluations per optimizer run")
    ap.add_argument("--seed", type=int, default=0, help="search seed")
    args = ap.parse_args(argv)
    objectives = [o for o in args.only.split(",") if o] or list(SETTINGS)
    unknown = [o for o in objectives if o not in SETTINGS]
    if unknown:
        ap.error(f"unknown objective(s) {', '.join(unknown)}; known: {', '.join(SETTINGS)}")
    try:
        with open(RESULTS) as fh:
            saved = json.load(fh)
        # rows written before the settings were stored per row carry the file's header
        header = {k: saved[k] for k in ("seed", "restarts", "maxfev") if k in saved}
        rows = [{**header, **r} for r in saved["results"]]
    except (OSError, ValueError, KeyError):
        rows = []
    for obj in objectives:
        for g in (float(v) for v in args.gammas.split(",")):
            t0, best = time.perf_counter(), None
            rows = [r for r in rows if not (r["objective"] == obj and r["gamma"] == g)]
            for layout, S, n in SETTINGS[obj]:
                u, x = search(obj, layout, S, n, g, restarts=args.restarts, seed=args.seed,
                              maxfev=args.maxfev)
                rows.append(dict(objective=obj, gamma=g, layout=layout, S=S, n=n, share=u,
                                 seed=args.seed, restarts=args.restarts, maxfev=args.maxfev))
                if x is not None and (best is None or u > best[0]):
                    best = (u, build(x, layout, S, n, g))
            kept = saved_share(obj, g)
            if best is not None and best[0] > kept:
                mdp, cur, tar = best[1]
                save_case(adversarial_path(obj, g), Case(mdp, cur, tar, "optimized", None, ""))
            print(f"{obj:24s} γ={g:<5g} best share {best[0] if best else float('nan'):.4f} "
                  f"({time.perf_counter() - t0:.0f} s)"
                  + (f"; kept the saved case (share {kept:.4f})" if best and best[0] <= kept else ""),
                  flush=True)
            _write(rows)
    return 0


def saved_share(objective: str, gamma: float) -> float:
    """The share of the case saved for ``(objective, γ)`` (``−inf`` when there is none)."""
    from sat_theory.verify.saved import load_case

    path = adversarial_path(objective, gamma)
    if not os.path.exists(path):
        return -np.inf
    c = load_case(path, "")
    return share(objective, c.mdp, c.current, c.target)


def _write(rows) -> None:
    from sat_theory.metrics import write_json_atomic

    rows = sorted(rows, key=lambda r: (r["objective"], r["gamma"], r["layout"], r["n"], r["S"]))
    write_json_atomic(RESULTS, dict(results=rows))


if __name__ == "__main__":
    raise SystemExit(main())
