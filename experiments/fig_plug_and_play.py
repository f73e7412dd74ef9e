"""TeamTR Fig. 6 / Table 11 (and SAT Table 3): plug-and-play replacement of one agent
mid-training — direct swap vs Stage-0 aligned swap vs retraining from scratch.

SAT runs (:mod:`experiments.runs`, sampled mode, matched budget) of ``stages`` stages; before
stage ``k_swap = stages // 2`` agent 0 is replaced by a "stronger" agent (the tabular
backend's ``new_agent``: trained alone against random partners, so competent but unaware of
this team's conventions — the analogue of a stronger pretrained model). Strategies
(:func:`sat_theory.algorithm.swap_agent`):

- ``direct`` — swap and resume;
- ``stage0`` — TeamTR's Stage-0: distil the new agent toward the old one on probe states
  drawn from the team's occupancy until the probe KL is ≤ δ, then swap (THEORY §5);
- ``stage0-project`` — SAT's Stage-0 form: per-state geometric projection onto the KL ball;
- ``retrain`` — swap and reset every other agent to its initial parameters;
- ``no swap`` — the SAT run without replacement, for reference.

Two kinds of replacement: ``stronger`` (above) and ``random`` (Gaussian logits: an agent whose
behaviour the team has never seen, the tabular analogue of the paper's protocol mismatch).

Measured: the swap shock ``J(after swap) − J(before swap)`` and the final ``J``; also as a
percentage of the pre-swap ``J`` (the paper reports accuracy points).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from experiments.common import Options, run_study, write_csv
from experiments.runs import RunSet, trained
from sat_theory.plotting import paper_style, plot_plug_and_play, save_figure

NAME = "fig_plug_and_play"
#: replacement kinds: a stronger agent (trained apart from the team) and a random one (an agent
#: whose behaviour the team has never seen: the tabular analogue of a protocol mismatch)
KINDS = ("stronger", "random")


def runset(opts: Options) -> RunSet:
    stages = 8 if opts.quick else 30
    variants = {"none/no swap": dict(method="sat")}
    for kind in KINDS:
        swap = dict(method="sat", swap_stage=stages // 2, swap_agent=0, swap_kind=kind)
        variants[f"{kind}/direct"] = dict(swap, swap_strategy="direct")
        variants[f"{kind}/stage0"] = dict(swap, swap_strategy="stage0", stage0_form="distill")
        if kind == "stronger":
            variants[f"{kind}/stage0-project"] = dict(swap, swap_strategy="stage0", stage0_form="project")
        variants[f"{kind}/retrain"] = dict(swap, swap_strategy="retrain")
    return RunSet(name="plug_and_play", variants=variants, stages=stages,
                  seeds=opts.seeds or (2 if opts.quick else 5))


def trajectories(stages: pd.DataFrame, swaps: pd.DataFrame) -> pd.DataFrame:
    """J at x = 0 (start), x = k+1 after stage k; at the swap an extra point just after x = k_swap."""
    rows = []
    for (m, s), g in stages.groupby(["method", "seed"]):
        g = g.sort_values("stage")
        kind, strategy = m.split("/")
        base = dict(variant=m, kind=kind, strategy=strategy, seed=s)
        rows.append(dict(base, stage=0.0, J=float(g.J_before.iloc[0])))
        for r in g.itertuples():
            rows.append(dict(base, stage=float(r.stage + 1), J=float(r.J_after)))
        if not swaps.empty:
            sw = swaps[(swaps.method == m) & (swaps.seed == s)]
            for r in sw.itertuples():
                rows.append(dict(base, stage=float(r.stage) + 0.05, J=float(r.J_after_swap)))
    return pd.DataFrame(rows).sort_values(["variant", "seed", "stage"])


def summary(stages: pd.DataFrame, swaps: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for m, g in stages.groupby("method", sort=False):
        final = g[g.stage == g.stage.max()].groupby("seed").J_after.first()
        sw = swaps[swaps.method == m] if not swaps.empty else pd.DataFrame()
        shock = sw.swap_shock.to_numpy(float) if len(sw) else np.array([np.nan])
        rel = (100 * sw.swap_shock / sw.J_before_swap.abs()).to_numpy(float) if len(sw) else np.array([np.nan])
        kind, strategy = m.split("/")
        rows.append(dict(variant=m, kind=kind, strategy=strategy, seeds=len(final), final_J_mean=final.mean(), final_J_std=final.std(),
                         swap_shock_mean=float(np.mean(shock)), swap_shock_std=float(np.std(shock)),
                         swap_shock_pct_mean=float(np.mean(rel)),
                         align_kl_exact=float(sw.align_kl_exact.mean()) if "align_kl_exact" in sw else np.nan,
                         J_before_swap_mean=float(sw.J_before_swap.mean()) if len(sw) else np.nan))
    return pd.DataFrame(rows)


def run(opts: Options) -> list[Path]:
    rs = runset(opts)
    _, stages, swaps = trained(opts.out, rs, **opts.executor_kwargs())
    traj = trajectories(stages, swaps)
    paths = [write_csv(traj, opts.out, NAME),
             write_csv(summary(stages, swaps), opts.out, "table_plug_and_play")]
    return paths + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_plug_and_play.csv`` in ``out``; the swap stage is
    the one whose extra just-after-swap point (``k + 0.05``) the trajectories carry."""
    out = Path(out)
    traj = pd.read_csv(out / f"{NAME}.csv")
    k = int(np.floor(traj.stage[traj.stage % 1 != 0].min()))
    with paper_style():
        fig, axes = plt.subplots(1, len(KINDS), figsize=(6 * len(KINDS), 4.3), sharey=True)
        for ax, kind in zip(axes, KINDS, strict=True):
            sel = traj[traj.kind.isin([kind, "none"])]
            plot_plug_and_play(sel, k, ax=ax)
            ax.set_title(f"{kind} replacement of agent 0 before stage {k} ({sel.seed.nunique()} seeds)",
                         fontsize=10)
        fig.tight_layout()
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
