"""The certificate ladder (THEORY §4): the papers' stage lower bounds, this project's tighter
rungs, and the true improvement, against the per-agent radius δ.

For exact SAT stages (intermediate occupancy, exact trust-region steps with
``E_{d^{π̂^{i−1}}} KL = δ`` per agent, :func:`experiments.common.exact_stage`) the core's
:func:`sat_theory.certificates.stage_certificate` gives, per stage:

- ``lower_bound_stale`` — TeamTR Prop. 3.3 (stale occupancy, chained penalty);
- ``lower_bound_max`` — SAT Thm 4.4 (max-KL radii);
- ``lower_bound`` — TeamTR Thm 3.6 (expected-KL radii);
- ``lower_bound_fnorm`` — ``‖f_i‖∞`` in place of ``A_max`` (tighter, this project);
- ``lower_bound_tv`` — additionally the exact expected TV in place of Pinsker (tightest);
- ``true_improvement = J(π̄) − J(π_cur)``.

The figure shows mean ± std over seeds × stages; the CSV also has, per rung and δ, the
fraction of stages on which the bound holds (it must be 1: these are theorems) and the
fraction on which it is positive (informative).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from experiments.common import Options, exact_stage, run_study, write_csv
from sat_theory.certificates import BOUND_KEYS, holds
from sat_theory.envs import random_mdp
from sat_theory.plotting import paper_style, plot_certificate_ladder, save_figure
from sat_theory.policy import TeamPolicy

NAME = "fig_certificate_ladder"
QUANTITIES = ("true_improvement",) + BOUND_KEYS


@dataclass
class Config:
    deltas: tuple[float, ...] = field(default=(1e-5, 1e-4, 1e-3, 1e-2, 3e-2, 1e-1),
                                      metadata={"help": "per-agent radii δ (nats)"})
    n_agents: int = field(default=3, metadata={"help": "agents (TeamTR default team: 3)"})
    states_per_agent: int = field(default=6, metadata={"help": "turn-taking states per agent"})
    n_actions: int = field(default=3, metadata={"help": "actions per agent"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ"})
    stages: int = field(default=4, metadata={"help": "stages per run"})
    seeds: int = field(default=6, metadata={"help": "seeds (random turn-taking MDPs)"})


def config_for(opts: Options) -> Config:
    return Config(stages=2 if opts.quick else 5, seeds=opts.n_seeds(2, 8))


def simulate(cfg: Config) -> pd.DataFrame:
    rows = []
    n = cfg.n_agents
    for seed in range(cfg.seeds):
        mdp = random_mdp(cfg.states_per_agent * n, n, cfg.n_actions, layout="turn",
                         gamma=cfg.gamma, seed=seed, successors=3)
        start = TeamPolicy.random(mdp, seed)
        for delta in cfg.deltas:
            cur = start
            for k in range(cfg.stages):
                cur_next, cert, _ = exact_stage(mdp, cur, list(range(n)), delta)
                for q in QUANTITIES:
                    v = getattr(cert, q)
                    rows.append(dict(seed=seed, delta=delta, stage=k, quantity=q, value=v,
                                     holds=holds(cert.true_improvement, v) if q != "true_improvement" else True))
                cur = cur_next
    return pd.DataFrame(rows)


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    g = raw.groupby(["delta", "quantity"], as_index=False, sort=False)
    agg = g["value"].agg(mean="mean", std="std", n="count")
    agg["holds_rate"] = g["holds"].mean()["holds"].to_numpy()
    agg["positive_rate"] = g["value"].agg(lambda v: float(np.mean(v > 0)))["value"].to_numpy()
    # how much of the true improvement each rung certifies: mean of bound / true, per stage
    true = raw[raw.quantity == "true_improvement"].set_index(["seed", "delta", "stage"])["value"]
    frac = raw.join(true.rename("true"), on=["seed", "delta", "stage"])
    frac["ratio"] = frac["value"] / frac["true"]
    agg["mean_ratio_to_true"] = frac.groupby(["delta", "quantity"], sort=False)["ratio"].mean().to_numpy()
    return agg


def run(opts: Options) -> list[Path]:
    cfg = config_for(opts)
    agg = summarize(simulate(cfg))
    return [write_csv(agg, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_certificate_ladder.csv`` in ``out`` (the setting in
    the title is :class:`Config`'s, which ``--quick`` does not change; the stage count is the
    CSV's)."""
    out, cfg = Path(out), Config()
    agg = pd.read_csv(out / f"{NAME}.csv")
    with paper_style():
        fig = plot_certificate_ladder(agg)
        fig.axes[0].set_title(rf"Certificate ladder vs $\delta$ (exact SAT stages; turn-taking, $n$ = {cfg.n_agents}, "
                              rf"$\gamma$ = {cfg.gamma:g}; {int(agg.n.max())} stages per $\delta$)", fontsize=10)
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
