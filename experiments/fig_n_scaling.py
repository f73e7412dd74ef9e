"""TeamTR Table 5 / App. G.1: how the stale-occupancy gap and the occupancy drift grow with
the team size ``n ∈ {2,3,4,5,6,8}`` at a fixed per-agent radius ``δ``.

What is measured, exactly, per stage (THEORY §4; ``π̂^0 … π̂^n`` the stage's intermediate
policies, every term computed by the exact core):

- ``Delta_stale = Σ_i |L_i^seq − L_i^stale|`` — TeamTR App. G.1's definition: the surrogate of
  step i under the intermediate occupancy ``d^{π̂^{i−1}}`` vs under the stage-start ``d^{π̂^0}``;
- ``D_occ = Σ_i TV(d^{π̂^{i−1}}, d^{π̂^0})`` — TeamTR App. G.1's occupancy drift;
- ``surrogate_error = Σ_i |J(π̂^i) − J(π̂^{i−1}) − L_i^used|`` — how far the surrogate the method
  actually optimizes is from the true gain of its step: ``L^used = L^seq`` for SAT/TeamTR
  (intermediate occupancy), ``L^stale`` for naive sequential (stage-start occupancy). Its
  bounds are the theorems' penalties: ``c·√δ_i`` per step for SAT (sum ``∝ n√δ``) and
  ``c·(√δ_i + Σ_{k<i} √δ_k)`` for naive (sum ``∝ n(n+1)/2·√δ``).
- ``penalty``: the certificate's occupancy penalty itself, ``c Σ_i √δ_i`` (SAT, TeamTR
  Thm 3.6) and ``c Σ_i (√δ_i + Σ_{k<i} √δ_k)`` (naive, Prop. 3.3).

Both methods take exact trust-region steps of radius ``δ`` per agent
(:func:`experiments.common.tr_factor_step`): SAT with the intermediate team's advantage and
occupancy, naive with the stage-start team's. ``Delta_stale`` and ``D_occ`` are functions of
the stage's *policy sequence* only; the two methods differ in them only through the
sequences they produce. Each value is the mean over the stages of a run; the figure shows
mean ± std over seeds (one random MDP per seed and n); exponents are least-squares fits of
``log value`` on ``log n`` through the per-n means.

Two team layouts: turn-taking (TeamTR's protocol; ``states_per_agent·n`` states, one agent
acting per state) and simultaneous (SAT's factorized team; every agent acts everywhere).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the `experiments` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from experiments.common import (
    MODE_METHOD,
    OCCUPANCY_MODES,
    Options,
    exact_stage,
    fit_power_law,
    run_study,
    write_csv,
)
from sat_theory.envs import random_mdp
from sat_theory.plotting import paper_style, plot_n_scaling, save_figure
from sat_theory.policy import TeamPolicy, tv_rows

NAME = "fig_n_scaling"

METRICS = ("Delta_stale", "D_occ", "surrogate_error", "penalty")
METRIC_LABELS = {
    "Delta_stale": r"$\Delta_{\mathrm{stale}} = \sum_i |L_i^{\mathrm{seq}} - L_i^{\mathrm{stale}}|$",
    "D_occ": r"$D_{\mathrm{occ}} = \sum_i \mathrm{TV}(d^{i-1}, d^0)$",
    "surrogate_error": r"$\sum_i |\mathrm{true\ gain}_i - L_i^{\mathrm{used}}|$",
    "penalty": "certificate penalty (return units)",
}
LAYOUT_LABELS = {"turn": "turn-taking team (TeamTR protocol)",
                 "simultaneous": "simultaneous team (SAT factorized)"}


@dataclass
class Config:
    ns: tuple[int, ...] = field(default=(2, 3, 4, 5, 6, 8), metadata={"help": "team sizes (TeamTR G.1)"})
    delta: float = field(default=0.01, metadata={"help": "per-agent radius δ_i (TeamTR G.1: 0.01)"})
    layouts: tuple[str, ...] = field(default=("turn", "simultaneous"), metadata={"help": "team layouts"})
    states_per_agent: int = field(default=6, metadata={"help": "turn-taking: states per agent"})
    n_states_simultaneous: int = field(default=12, metadata={"help": "simultaneous: number of states"})
    n_actions_turn: int = field(default=3, metadata={"help": "actions per agent, turn-taking"})
    n_actions_simultaneous: int = field(default=2, metadata={"help": "actions per agent, simultaneous"})
    successors: int = field(default=3, metadata={"help": "random successors per (state, action)"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ"})
    stages: int = field(default=6, metadata={"help": "stages per run (values are stage means)"})
    seeds: int = field(default=5, metadata={"help": "seeds (one random MDP per seed and n)"})


def config_for(opts: Options) -> Config:
    return Config(stages=2 if opts.quick else 6, seeds=opts.n_seeds(2, 5))


def make_mdp(cfg: Config, layout: str, n: int, seed: int):
    if layout == "turn":
        return random_mdp(cfg.states_per_agent * n, n, cfg.n_actions_turn, layout="turn",
                          gamma=cfg.gamma, seed=1000 * n + seed, successors=cfg.successors)
    return random_mdp(cfg.n_states_simultaneous, n, cfg.n_actions_simultaneous,
                      layout="simultaneous", gamma=cfg.gamma, seed=1000 * n + seed,
                      successors=cfg.successors)


def stage_metrics(cert, evs, mode: str) -> dict:
    """The four per-stage quantities of the module docstring from one exact stage."""
    d0 = evs[0].d
    sq = np.sqrt([s.delta for s in cert.steps])
    used = "L_seq" if mode == "intermediate" else "L_stale"
    chained = sum(sq[i] + sq[:i].sum() for i in range(len(sq)))
    return {
        "Delta_stale": sum(abs(s.L_seq - s.L_stale) for s in cert.steps),
        "D_occ": sum(float(tv_rows(ev.d, d0)) for ev in evs[:-1]),
        "surrogate_error": sum(abs(s.true_gain - getattr(s, used)) for s in cert.steps),
        "penalty": cert.c * (sq.sum() if mode == "intermediate" else chained),
    }


def simulate(cfg: Config) -> pd.DataFrame:
    """Raw rows: layout, n, seed, method, stage, metric, value."""
    rows = []
    for layout in cfg.layouts:
        for n in cfg.ns:
            for seed in range(cfg.seeds):
                mdp = make_mdp(cfg, layout, n, seed)
                start = TeamPolicy.random(mdp, seed)
                for mode in OCCUPANCY_MODES:
                    cur = start
                    for k in range(cfg.stages):
                        cur_next, cert, evs = exact_stage(mdp, cur, list(range(n)), cfg.delta, mode)
                        for met, v in stage_metrics(cert, evs, mode).items():
                            rows.append(dict(layout=layout, n=n, seed=seed, method=MODE_METHOD[mode],
                                             stage=k, metric=met, value=v))
                        cur = cur_next
    return pd.DataFrame(rows)


def summarize(raw: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per-n mean ± std over seeds (of per-seed stage means), and the power-law fits."""
    per_seed = raw.groupby(["layout", "method", "metric", "n", "seed"], as_index=False)["value"].mean()
    agg = per_seed.groupby(["layout", "method", "metric", "n"], as_index=False)["value"].agg(
        mean="mean", std="std", n_seeds="count")
    agg["std"] = agg["std"].fillna(0.0)
    return agg, power_law_fits(agg)


def power_law_fits(agg: pd.DataFrame) -> pd.DataFrame:
    """Least-squares fits of ``log mean`` on ``log n`` per (layout, method, metric), and the
    analytic penalty shapes ``n`` and ``n(n+1)/2`` fitted over the same grid of n."""
    fits = []
    for (lay, m, met), g in agg.groupby(["layout", "method", "metric"], sort=False):
        g = g.sort_values("n")
        a, c = fit_power_law(g.n, g["mean"])
        fits.append(dict(layout=lay, method=m, metric=met, exponent=a, prefactor=c,
                         n_min=int(g.n.min()), n_max=int(g.n.max()), n_points=len(g)))
    # the analytic penalty shapes fitted over the same grid of n (unit constant c·√δ = 1)
    ns = np.array(sorted(agg.n.unique()), dtype=float)
    for met, vals in (("analytic_n", ns), ("analytic_n(n+1)/2", ns * (ns + 1) / 2)):
        a, c = fit_power_law(ns, vals)
        fits.append(dict(layout="any", method="analytic", metric=met, exponent=a, prefactor=c,
                         n_min=int(ns.min()), n_max=int(ns.max()), n_points=len(ns)))
    return pd.DataFrame(fits)


def run(opts: Options) -> list[Path]:
    cfg = config_for(opts)
    raw = simulate(cfg)
    agg, fits = summarize(raw)
    agg.insert(0, "delta", cfg.delta)
    table = agg.merge(fits[["layout", "method", "metric", "exponent", "prefactor"]],
                      on=["layout", "method", "metric"], how="left")
    table = pd.concat([table, fits[fits.method == "analytic"]], ignore_index=True)
    paths = [write_csv(agg, opts.out, NAME), write_csv(raw, opts.out, NAME + "_raw"),
             write_csv(table, opts.out, "table_n_scaling")]
    return paths + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_n_scaling.csv`` and ``_raw.csv`` in ``out``."""
    out = Path(out)
    agg = pd.read_csv(out / f"{NAME}.csv")
    stages = pd.read_csv(out / f"{NAME}_raw.csv", usecols=["stage"])["stage"].nunique()
    with paper_style():
        fig = plot_n_scaling(agg, power_law_fits(agg), list(METRICS), METRIC_LABELS, LAYOUT_LABELS)
        fig.suptitle(rf"Team-size scaling at fixed per-agent $\delta$ = {agg.delta.iloc[0]:g} "
                     f"(exact, {int(agg.n_seeds.max())} seeds × {stages} stages)", y=1.03)
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
