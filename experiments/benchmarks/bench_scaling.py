"""How evaluation time grows with S and n: log-log fits (issue 7 item 5, tabular part).

Series (each point: min over rounds of one timed call):

- ``dense_S``: ``evaluate(mdp, π)`` with V and d, dense turn-taking n=4, A=4, S doubling;
  one LU is ``(2/3)S³`` flops and collapse reads ``K·S²`` floats, so the slope lies between
  2 and 3 and approaches 3 as S grows;
- ``sparse_S``: the sparse path on sparse turn-taking MDPs (5 successors), S ×10 per point;
  expected slope ~1 (products of O(nnz) = O(S), iteration count independent of S);
- ``certificate_n_turn``: a full stage certificate on dense turn-taking S=500, A=4, n agents:
  n+1 evaluations of fixed cost, slope in n ~1;
- ``certificate_n_simultaneous``: the same on simultaneous teams, S=100, 2 actions each:
  K = 2^n joint actions, so time grows exponentially in n (the log-log "slope" is reported,
  the per-agent growth factor too).

The fit is ``log t = a + b log x`` by least squares; ``b`` is the reported exponent.
Run: ``python experiments/benchmarks/bench_scaling.py [--quick]``.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np
from _common import fmt_table, interleaved, machine_info, save_json, script_main

from sat_theory import TeamPolicy, evaluate, random_mdp, stage_certificate


@dataclass
class ScalingConfig:
    dense_states: tuple[int, ...] = field(default=(250, 500, 1000, 2000, 4000),
                                          metadata={"help": "S of the dense series"})
    sparse_states: tuple[int, ...] = field(default=(10_000, 100_000, 1_000_000),
                                           metadata={"help": "S of the sparse series"})
    turn_agents: tuple[int, ...] = field(default=(2, 3, 4, 6, 8),
                                         metadata={"help": "n of the turn-taking certificate series"})
    simultaneous_agents: tuple[int, ...] = field(default=(1, 2, 3, 4, 5, 6),
                                                 metadata={"help": "n of the simultaneous series"})
    gamma: float = field(default=0.95, metadata={"help": "discount"})
    repeats: int = field(default=3, metadata={"help": "timed rounds per point (min kept)"})
    seed: int = field(default=0, metadata={"help": "RNG seed"})


QUICK = ScalingConfig(dense_states=(125, 250, 500, 1000), sparse_states=(10_000, 100_000),
                      turn_agents=(2, 4, 8), simultaneous_agents=(1, 2, 3, 4), repeats=2)

#: tiny sizes to check that the script runs (numbers meaningless)
SMOKE = ScalingConfig(dense_states=(20, 40, 80), sparse_states=(300, 600), turn_agents=(2, 3),
                      simultaneous_agents=(1, 2), repeats=1)


def fit(xs, ts) -> dict:
    """Least-squares ``log t = a + b log x``; returns exponent ``b`` and prefactor ``e^a``."""
    b, a = np.polyfit(np.log(xs), np.log(ts), 1)
    return {"exponent": float(b), "prefactor": float(np.exp(a))}


def timed(fn, repeats: int) -> float:
    return interleaved({"x": lambda: fn}, repeats, warmup=1)["x"]["min"]


def eval_vd(mdp, pol):
    ev = evaluate(mdp, pol, tol=1e-8)
    return ev.V, ev.d


def series_dense(cfg):
    pts = []
    for S in cfg.dense_states:
        mdp = random_mdp(S, 4, 4, layout="turn", gamma=cfg.gamma, seed=cfg.seed)
        pol = TeamPolicy.random(mdp, 1)
        pts.append({"x": S, "t": timed(lambda m=mdp, p=pol: eval_vd(m, p), cfg.repeats)})
    return pts


def series_sparse(cfg):
    pts = []
    for S in cfg.sparse_states:
        mdp = random_mdp(S, 4, 4, layout="turn", sparse=True, successors=5, gamma=cfg.gamma,
                         seed=cfg.seed)
        pol = TeamPolicy.random(mdp, 1)
        reps = 1 if S >= 1_000_000 else cfg.repeats
        pts.append({"x": S, "t": timed(lambda m=mdp, p=pol: eval_vd(m, p), reps)})
        del mdp
    return pts


def series_cert(cfg, layout: str, agents, S: int, A: int):
    pts = []
    for n in agents:
        mdp = random_mdp(S, n, A, layout=layout, gamma=cfg.gamma, seed=cfg.seed)
        rng = np.random.default_rng(cfg.seed)
        cur = TeamPolicy.random(mdp, rng)
        tar = TeamPolicy.random(mdp, rng)
        order = list(range(n))
        pts.append({"x": n, "K": mdp.n_joint,
                    "t": timed(lambda m=mdp, c=cur, t=tar, o=order: stage_certificate(m, c, t, o),
                               cfg.repeats)})
    return pts


def main(quick: bool = False, out: str | None = None, cfg: ScalingConfig | None = None,
         verbose: bool = True) -> dict:
    cfg = cfg or (QUICK if quick else ScalingConfig())
    info = machine_info()
    series = {
        "dense_S": series_dense(cfg),
        "sparse_S": series_sparse(cfg),
        "certificate_n_turn": series_cert(cfg, "turn", cfg.turn_agents, 500, 4),
        "certificate_n_simultaneous": series_cert(cfg, "simultaneous", cfg.simultaneous_agents, 100, 2),
    }
    fits = {k: fit([p["x"] for p in v], [p["t"] for p in v]) for k, v in series.items()}
    sim = series["certificate_n_simultaneous"]
    growth = float(np.exp(np.polyfit([p["x"] for p in sim], np.log([p["t"] for p in sim]), 1)[0]))
    fits["certificate_n_simultaneous"]["per_agent_factor"] = growth
    # the dense fit over the largest points only: the asymptotic regime
    big = series["dense_S"][-3:]
    fits["dense_S_largest3"] = fit([p["x"] for p in big], [p["t"] for p in big])
    result = {"benchmark": "scaling", "quick": quick, "config": asdict(cfg), "machine": info,
              "series": series, "fits": fits,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    path = save_json(result, "bench_scaling" + ("_quick" if quick else ""), out)
    if verbose:
        for k, v in series.items():
            print(f"{k}: " + ", ".join(f"{p['x']}: {p['t']:.3g}s" for p in v))
        rows = [{"series": k, **v} for k, v in fits.items()]
        print(fmt_table(rows, ["series", "exponent", "prefactor", "per_agent_factor"]))
        print(f"JSON: {path}")
    return result


if __name__ == "__main__":
    script_main(main, __doc__, "bench_scaling", "smaller ranges")
