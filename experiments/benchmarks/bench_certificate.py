"""A full stage certificate vs a naive term-by-term implementation (issue 7 item 1, last part).

``stage_certificate(mdp, cur, tar, order)`` evaluates the n+1 intermediate policies once each
(one LU per policy serves V, d and Q) and assembles every term of THEORY §4. The naive
reference computes the same terms the way one writes them down: per intermediate policy
``V = solve(I − γP_π, r_π)``, ``d = (1−γ) solve((I − γP_π)ᵀ, ρ0)`` and
``Q = R + γ P solve(I − γP_π, r_π)`` — three separate dense solves (``numpy.linalg.solve``),
no factorization shared. Both give the same numbers (checked); ratio naive/ours, target ≥ 3.

Run: ``python experiments/benchmarks/bench_certificate.py [--quick]``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

import numpy as np
from _common import (
    fmt_table,
    interleaved,
    machine_info,
    print_targets,
    save_json,
    script_main,
    target_line,
)

from sat_theory import (
    TeamPolicy,
    intermediate_policies,
    joint_policy,
    random_mdp,
    stage_certificate,
)
from sat_theory.policy import factor_kl


@dataclass
class CertBenchConfig:
    cases: tuple[tuple[str, int, int, int], ...] = field(
        default=(("turn", 1000, 4, 4), ("turn", 2000, 4, 4), ("simultaneous", 500, 3, 3),
                 ("masked", 500, 3, 3)),
        metadata={"help": "(layout, S, n, A) of each MDP"})
    gamma: float = field(default=0.95, metadata={"help": "discount"})
    repeats: int = field(default=3, metadata={"help": "timed rounds (min kept)"})
    seed: int = field(default=0, metadata={"help": "RNG seed"})


QUICK = CertBenchConfig(cases=(("turn", 500, 4, 4), ("simultaneous", 300, 3, 3)), repeats=2)

#: tiny sizes to check that the script runs (numbers meaningless)
SMOKE = CertBenchConfig(cases=(("turn", 30, 3, 2), ("masked", 20, 2, 2)), repeats=1)


def naive_certificate(mdp, cur: TeamPolicy, tar: TeamPolicy, order) -> dict:
    """The stage terms from three separate solves per intermediate policy (see module doc)."""
    S, K, g = mdp.n_states, mdp.n_joint, mdp.gamma
    P = mdp.P  # (S, K, S)
    evs = []
    for pol in intermediate_policies(cur, tar, order):
        pi = joint_policy(mdp, pol)
        P_pi = np.einsum("sk,skt->st", pi, P)
        r_pi = (pi * mdp.R).sum(axis=1)
        M = np.eye(S) - g * P_pi
        V = np.linalg.solve(M, r_pi)
        d = (1 - g) * np.linalg.solve(M.T, mdp.rho0)
        Q = mdp.R + g * (P.reshape(S * K, S) @ np.linalg.solve(M, r_pi)).reshape(S, K)
        evs.append(dict(pi=pi, V=V, d=d, A=Q - V[:, None], J=float(mdp.rho0 @ V)))
    L, sq, A_max = 0.0, 0.0, 0.0
    for i, j in enumerate(order, start=1):
        prev, nxt = evs[i - 1], evs[i]
        kl = factor_kl(mdp, cur.factors[j], tar.factors[j], j)
        L += prev["d"] @ (nxt["pi"] * prev["A"]).sum(axis=1) / (1 - g)
        sq += math.sqrt(prev["d"] @ kl)
        A_max = max(A_max, float(np.abs(prev["A"][mdp.admissible]).max()))
    c = math.sqrt(2) * g * A_max / (1 - g) ** 2
    return {"lower_bound": L - c * sq, "true_improvement": evs[-1]["J"] - evs[0]["J"]}


def one(cfg: CertBenchConfig, layout: str, S: int, n: int, A: int) -> dict:
    mdp = random_mdp(S, n, A, layout=layout, gamma=cfg.gamma, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    cur = TeamPolicy.random(mdp, rng)
    tar = TeamPolicy.from_logits([np.log(f) + 0.3 * rng.standard_normal(f.shape) for f in cur.factors])
    order = list(range(n))
    ours = stage_certificate(mdp, cur, tar, order)
    ref = naive_certificate(mdp, cur, tar, order)
    diff = max(abs(ours.lower_bound - ref["lower_bound"]),
               abs(ours.true_improvement - ref["true_improvement"]))
    t = interleaved({"ours": lambda: (lambda: stage_certificate(mdp, cur, tar, order)),
                     "naive": lambda: (lambda: naive_certificate(mdp, cur, tar, order))},
                    cfg.repeats)
    return {"layout": layout, "S": S, "n": n, "A": A, "K": mdp.n_joint,
            "ours": t["ours"]["min"], "naive": t["naive"]["min"],
            "naive/ours": t["naive"]["min"] / t["ours"]["min"], "max_abs_diff": diff}


def main(quick: bool = False, out: str | None = None, cfg: CertBenchConfig | None = None,
         verbose: bool = True) -> dict:
    cfg = cfg or (QUICK if quick else CertBenchConfig())
    info = machine_info()
    rows = [one(cfg, *c) for c in cfg.cases]
    targets = [target_line(f"{r['layout']} S={r['S']} n={r['n']}: naive/ours", r["naive/ours"], 3.0)
               for r in rows]
    result = {"benchmark": "certificate", "quick": quick, "config": asdict(cfg), "machine": info,
              "rows": rows, "targets": targets,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    path = save_json(result, "bench_certificate" + ("_quick" if quick else ""), out)
    if verbose:
        print("full stage certificate (n+1 evaluations with d, Q, A), seconds")
        print(fmt_table(rows, ["layout", "S", "n", "K", "ours", "naive", "naive/ours", "max_abs_diff"]))
        print_targets(targets, path)
    return result


if __name__ == "__main__":
    script_main(main, __doc__, "bench_certificate", "small cases")
