"""TeamTR Table 10 / App. G.6: importance-weight degeneracy when stage-start rollouts are
reused instead of resampled.

Within a stage, step i of a stale+IS method reweights stage-start trajectories (behaviour
``π̂^0``) to the intermediate team ``π̂^{i−1}`` with
``w(τ) = Π_{t: j_t ∈ U_{i−1}} π̂^{i−1}(a_t|s_t)/π̂^0(a_t|s_t)``, ``U_{i−1} = {σ(1)..σ(i−1)}``.

What is computed, per step i, for SAT stages (exact trust-region steps of radius δ per
agent, intermediate occupancy) on random turn-taking MDPs:

- ``ess_over_B = (E w)²/E[w²]`` exactly, by the linear recursion of
  :func:`sat_theory.estimators.importance_weight_ess` (episodes: the discounted problem read as
  a terminating one, continuing with probability γ, ``E T = 1/(1−γ)`` decisions);
- ``p95``, ``p99``, ``max_w``, ``pr_w_gt_10`` of the weights of ``B`` trajectories simulated
  under ``π̂^0`` (:func:`sat_theory.estimators.sample_trajectory_weights`; Monte Carlo, seeded).

Mean over seeds (std of ESS/B). δ = 0.01 is the paper's setting; larger δ are shown because
the degeneracy is governed by the accumulated KL per trajectory — roughly
``E T · δ · |U_{i−1}|`` — which is far smaller in a 10-decision tabular episode than in an LLM
episode of thousands of tokens.
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
from sat_theory.certificates import intermediate_policies
from sat_theory.envs import random_mdp
from sat_theory.estimators import importance_weight_ess, sample_trajectory_weights
from sat_theory.plotting import paper_style, plot_is_degeneracy, save_figure
from sat_theory.policy import TeamPolicy

NAME = "fig_is_degeneracy"


@dataclass
class Config:
    ns: tuple[int, ...] = field(default=(3, 5), metadata={"help": "team sizes (TeamTR Table 10)"})
    deltas: tuple[float, ...] = field(default=(0.01, 0.03, 0.1), metadata={
        "help": "per-agent radii δ (0.01 is TeamTR's)"})
    states_per_agent: int = field(default=6, metadata={"help": "turn-taking states per agent"})
    n_actions: int = field(default=4, metadata={"help": "actions per agent"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ (E T = 1/(1−γ) decisions)"})
    n_traj: int = field(default=2000, metadata={"help": "B: trajectories for the weight quantiles"})
    seeds: int = field(default=5, metadata={"help": "seeds (random MDP + start policy)"})


def config_for(opts: Options) -> Config:
    return Config(n_traj=500 if opts.quick else 4000, seeds=opts.n_seeds(2, 8))


def simulate(cfg: Config) -> pd.DataFrame:
    rows = []
    for n in cfg.ns:
        for seed in range(cfg.seeds):
            mdp = random_mdp(cfg.states_per_agent * n, n, cfg.n_actions, layout="turn",
                             gamma=cfg.gamma, seed=100 * n + seed, successors=3)
            cur = TeamPolicy.random(mdp, seed)
            for delta in cfg.deltas:
                order = list(range(n))
                tar, _, _ = exact_stage(mdp, cur, order, delta)
                pols = intermediate_policies(cur, tar, order)
                for i in range(2, n + 1):  # step i reuses π̂^0's rollouts for π̂^{i−1}
                    target = pols[i - 1]
                    w = sample_trajectory_weights(mdp, cur, target, cfg.n_traj, 10_000 * seed + i)
                    rows.append(dict(n=n, delta=delta, seed=seed, step=i, n_updated=i - 1,
                                     ess_over_B=importance_weight_ess(mdp, cur, target),
                                     ess_over_B_sampled=float(w.sum() ** 2 / (w ** 2).sum() / w.size),
                                     p95=float(np.quantile(w, 0.95)), p99=float(np.quantile(w, 0.99)),
                                     max_w=float(w.max()), pr_w_gt_10=float(np.mean(w > 10))))
    return pd.DataFrame(rows)


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    g = raw.groupby(["n", "delta", "step", "n_updated"], as_index=False)
    agg = g[["ess_over_B", "ess_over_B_sampled", "p95", "p99", "max_w", "pr_w_gt_10"]].mean()
    agg["ess_std"] = g["ess_over_B"].std()["ess_over_B"].fillna(0.0).to_numpy()
    agg["seeds"] = g.size()["size"].to_numpy()
    return agg


def run(opts: Options) -> list[Path]:
    cfg = config_for(opts)
    raw = simulate(cfg)
    agg = summarize(raw)
    return [write_csv(agg, opts.out, NAME), write_csv(agg, opts.out, "table_is_degeneracy")] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_is_degeneracy.csv`` in ``out`` (γ in the title is
    :class:`Config`'s, which ``--quick`` does not change)."""
    out = Path(out)
    agg = pd.read_csv(out / f"{NAME}.csv")
    with paper_style():
        fig = plot_is_degeneracy(agg)
        fig.suptitle(f"Importance-weight degeneracy of stage-start reuse (exact ESS; turn-taking, "
                     rf"$\gamma$ = {Config().gamma:g}, {int(agg.seeds.max())} seeds)", y=1.02, fontsize=11)
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
