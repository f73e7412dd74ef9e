"""Is the compounding (n²) term of the stale-occupancy stage bound ever needed?

TeamTR Prop 3.3 / App. C.3 bounds a stage judged by stale surrogates:
``ΔJ ≥ Σ L_i^stale − c Σ_i (√δ_i + Σ_{k<i} √δ_k)`` (ζ = 0). Dropping the compounding term
``Σ_{k<i} √δ_k`` leaves the linear bound ``Σ L_i^stale − c Σ √δ_i``. This script maximizes

    need = (Σ L_i^stale − c Σ √δ_i − ΔJ) / (c Σ_i Σ_{k<i} √δ_k)

over small team MDPs (transitions, rewards, start distribution, current and target policies
all free; Nelder–Mead then Powell from seeded random starts). ``need > 0`` would be a case
where the linear bound fails, i.e. the compounding term is necessary; ``need ≤ 1`` always
(that is the proven bound). Results go to ``stale_compounding_search.json``.

Run: ``python experiments/counterexamples/stale_compounding_search.py [--restarts 2]``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from scipy.optimize import minimize
from scipy.special import softmax

from sat_theory.certificates import stage_certificate
from sat_theory.mdp import FactorizedMDP
from sat_theory.policy import TeamPolicy

HERE = os.path.dirname(os.path.abspath(__file__))


def build(x: np.ndarray, layout: str, S: int, n: int, gamma: float):
    """Parameter vector → (mdp, current, target); 2 actions per agent."""
    A = 2
    k = 0
    if layout == "turn":
        shape, rshape = (S, A, S), (S, A)
    else:
        shape, rshape = (S,) + (A,) * n + (S,), (S,) + (A,) * n
    m = int(np.prod(shape))
    P = softmax(3 * x[k:k + m].reshape(shape), axis=-1)
    k += m
    r = int(np.prod(rshape))
    R = np.tanh(x[k:k + r]).reshape(rshape)
    k += r
    facs = []
    for _ in range(2 * n):
        facs.append(softmax(x[k:k + S * A].reshape(S, A), axis=1))
        k += S * A
    rho = softmax(3 * x[k:k + S])
    if layout == "turn":
        mdp = FactorizedMDP.turn_taking(P, R, np.arange(S) % n, n, rho, gamma)
    else:
        mdp = FactorizedMDP.factored(P, R, rho, gamma)
    return mdp, TeamPolicy(tuple(facs[:n])), TeamPolicy(tuple(facs[n:]))


def n_params(layout: str, S: int, n: int) -> int:
    A = 2
    if layout == "turn":
        return S * A * S + S * A + 2 * n * S * A + S
    return S * A ** n * S + S * A ** n + 2 * n * S * A + S


def need(x, layout, S, n, gamma) -> float:
    mdp, cur, tar = build(x, layout, S, n, gamma)
    cert = stage_certificate(mdp, cur, tar, tuple(range(n)))
    sq = np.sqrt([s.delta for s in cert.steps])
    comp = sum(sq[:i].sum() for i in range(n))
    if cert.c * comp < 1e-12:
        return -np.inf
    lin = sum(s.L_stale for s in cert.steps) - cert.c * sq.sum()
    return (lin - cert.true_improvement) / (cert.c * comp)


def search(layout, S, n, gamma, restarts, seed, maxfev=4000) -> float:
    rng = np.random.default_rng([seed, S, n, int(1000 * gamma), layout == "turn"])
    best = -np.inf
    for _ in range(restarts):
        x0 = rng.normal(size=n_params(layout, S, n)) * 2

        def f(x):
            v = need(x, layout, S, n, gamma)
            return -v if np.isfinite(v) else 1e9

        r = minimize(f, x0, method="Nelder-Mead", options=dict(maxfev=maxfev))
        r = minimize(f, r.x, method="Powell", options=dict(maxfev=maxfev))
        best = max(best, -r.fun)
    return float(best)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--restarts", type=int, default=2, help="random starts per setting")
    ap.add_argument("--seed", type=int, default=0, help="search seed")
    args = ap.parse_args(argv)
    settings = [("turn", 3, 2), ("turn", 3, 3), ("simultaneous", 2, 2)]
    rows = []
    for layout, S, n in settings:
        for g in (0.2, 0.5, 0.9):
            v = search(layout, S, n, g, args.restarts, args.seed)
            print(f"{layout:12s} S={S} n={n} γ={g:<4g} max need = {v:.4f}", flush=True)
            rows.append(dict(layout=layout, S=S, n=n, gamma=g, max_need=v,
                             linear_bound_violated=v > 0))
    with open(os.path.join(HERE, "stale_compounding_search.json"), "w") as fh:
        json.dump(dict(seed=args.seed, restarts=args.restarts, results=rows), fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
