"""Order sensitivity (TeamTR App. F.7 checklist; SAT "sequence-agnosticism"): the certified
stage bound and the true improvement under fixed / reverse / random / greedy update orders.

Two kinds of stage, both exact (:mod:`experiments.common`):

- ``fixed targets``: every agent's target is its trust-region step computed at the
  stage-start team (radius δ under ``d^{π̂^0}``), so the final team ``π̄`` is the same for every
  order and so is the true improvement; only the certificate (TeamTR Thm 3.6, whose terms
  ``L_i^seq``, ``δ_i`` are evaluated along the order) changes. Every one of the ``n!`` orders is
  evaluated ("all permutations").
- ``sequential (SAT)``: step i's target is computed at the intermediate team ``π̂^{i−1}``, as
  SAT/TeamTR do, so the final team — and the true improvement — depend on the order.

Named orders: ``fixed`` (0..n−1), ``reverse``, ``random`` (several draws), ``greedy`` (at each
step the remaining agent whose step has the largest ``L^seq`` at the current intermediate
team). The figure shows each order's value minus the fixed order's, per instance.
"""

from __future__ import annotations

import itertools
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from experiments.common import (
    Options,
    exact_stage,
    run_study,
    tr_factor_step,
    write_csv,
)
from sat_theory.certificates import stage_certificate
from sat_theory.envs import random_mdp
from sat_theory.evaluate import evaluate
from sat_theory.plotting import paper_style, plot_order_sensitivity, save_figure
from sat_theory.policy import TeamPolicy, expected_advantage

NAME = "fig_order_sensitivity"


@dataclass
class Config:
    n_agents: int = field(default=4, metadata={"help": "agents (4! = 24 orders)"})
    states_per_agent: int = field(default=5, metadata={"help": "turn-taking states per agent"})
    n_actions: int = field(default=3, metadata={"help": "actions per agent"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ"})
    delta: float = field(default=0.01, metadata={"help": "per-agent radius δ"})
    random_orders: int = field(default=4, metadata={"help": "random orders per instance"})
    seeds: int = field(default=8, metadata={"help": "instances (random MDP + random start policy)"})


def config_for(opts: Options) -> Config:
    return Config(seeds=opts.n_seeds(3, 10))


def named_orders(n: int, rng, k_random: int) -> list[tuple[str, tuple[int, ...]]]:
    out = [("fixed", tuple(range(n))), ("reverse", tuple(range(n - 1, -1, -1)))]
    out += [("random", tuple(int(x) for x in rng.permutation(n))) for _ in range(k_random)]
    return out


def greedy_order(mdp, cur: TeamPolicy, delta: float, fixed_targets: TeamPolicy | None) -> tuple[int, ...]:
    """At each step, the remaining agent whose step has the largest exact ``L^seq``."""
    g, pol, left, order = mdp.gamma, cur, set(range(mdp.n_agents)), []
    while left:
        ev = evaluate(mdp, pol)
        best, best_L, best_f = None, -np.inf, None
        for j in sorted(left):
            f_j = (fixed_targets.factors[j] if fixed_targets is not None
                   else tr_factor_step(mdp, pol, ev.A, ev.d, j, delta))
            nxt = pol.with_factor(j, f_j)
            L = float(ev.d @ expected_advantage(evaluate(mdp, nxt).pi, ev.A)) / (1 - g)
            if L > best_L:
                best, best_L, best_f = j, L, f_j
        order.append(best)
        left.remove(best)
        pol = pol.with_factor(best, best_f)
    return tuple(order)


def simulate(cfg: Config) -> pd.DataFrame:
    rows = []
    n = cfg.n_agents
    for seed in range(cfg.seeds):
        rng = np.random.default_rng(seed)
        mdp = random_mdp(cfg.states_per_agent * n, n, cfg.n_actions, layout="turn",
                         gamma=cfg.gamma, seed=seed, successors=3)
        cur = TeamPolicy.random(mdp, seed)
        ev0 = evaluate(mdp, cur)
        fixed = TeamPolicy(tuple(tr_factor_step(mdp, cur, ev0.A, ev0.d, j, cfg.delta) for j in range(n)))
        orders = named_orders(n, rng, cfg.random_orders)
        for targets in ("fixed targets", "sequential (SAT)"):
            kinds = orders + [("greedy", greedy_order(mdp, cur, cfg.delta,
                                                      fixed if targets == "fixed targets" else None))]
            if targets == "fixed targets":
                kinds += [("all permutations", p) for p in itertools.permutations(range(n))]
            for kind, order in kinds:
                if targets == "fixed targets":
                    cert = stage_certificate(mdp, cur, fixed, order)
                else:
                    _, cert, _ = exact_stage(mdp, cur, order, cfg.delta)
                rows.append(dict(targets=targets, instance=seed, order_kind=kind,
                                 order="-".join(map(str, order)), lower_bound=cert.lower_bound,
                                 lower_bound_tv=cert.lower_bound_tv,
                                 true_improvement=cert.true_improvement, holds=cert.holds))
    return pd.DataFrame(rows)


def run(opts: Options) -> list[Path]:
    cfg = config_for(opts)
    df = simulate(cfg)
    return [write_csv(df, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_order_sensitivity.csv`` in ``out`` (n and δ in the
    title are :class:`Config`'s, which ``--quick`` does not change)."""
    out, cfg = Path(out), Config()
    df = pd.read_csv(out / f"{NAME}.csv")
    with paper_style():
        fig = plot_order_sensitivity(df)
        fig.suptitle(rf"Update-order sensitivity (exact; turn-taking $n$ = {cfg.n_agents}, $\delta$ = {cfg.delta:g})",
                     y=1.02)
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
