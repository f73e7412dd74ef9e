"""TeamTR Fig. 3: the team's return over stages for sat, naive, joint, no-tr and happo under a
matched rollout budget (every method sees the same number of episodes per stage; see
:mod:`experiments.runs`), mean ± std over seeds.

The runs are sampled-mode tabular runs of the shared algorithm on one random turn-taking MDP
(n = 3, δ = 0.01); the score is the exact ``J`` of the team after each stage (the tabular
world can evaluate it exactly, where the paper measures held-out accuracy). The CSV holds the
stage records the figure is drawn from. Note: with one batch per stage an agent's update does
not depend on the other agents' new parameters, so ``joint`` coincides with ``naive`` in this
implementation (same seed, same order); the two curves overlap by construction.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib.pyplot as plt
import pandas as pd

from experiments.common import Options, run_study, write_csv
from experiments.runs import RunSet, main_runset, trained
from sat_theory.plotting import paper_style, plot_training_curves, save_figure

NAME = "fig_training_curves"
COLUMNS = ["method", "seed", "stage", "J_before", "J_after", "true_improvement", "rollouts",
           "episodes", "rejected_steps", "out_of_region_steps"]


def exact_runset(opts: Options) -> RunSet:
    """n = 8 agents, exact mode (the infinite-sample limit)."""
    return RunSet(name="exact_n8", n_agents=8, mode="exact", stages=8 if opts.quick else 30,
                  seeds=opts.seeds or (2 if opts.quick else 3))


def run(opts: Options) -> list[Path]:
    panels = [("sampled, n=3, matched budget", main_runset(opts.quick, opts.seeds)),
              ("exact (infinite samples), n=8", exact_runset(opts))]
    frames = []
    for setting, rs in panels:
        _, stages, _ = trained(opts.out, rs, **opts.executor_kwargs())
        df = stages[[c for c in COLUMNS if c in stages.columns]].copy()
        df.insert(0, "setting", setting)
        frames.append(df)
    data = pd.concat(frames, ignore_index=True)
    return [write_csv(data, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_training_curves.csv`` in ``out`` (one panel per
    setting; the per-stage episode budget is the CSV's, δ the run sets' fixed radius)."""
    out = Path(out)
    data = pd.read_csv(out / f"{NAME}.csv")
    settings = list(dict.fromkeys(data.setting))
    with paper_style():
        fig, axes = plt.subplots(1, len(settings), figsize=(6 * len(settings), 4.4), squeeze=False)
        for ax, setting in zip(axes[0], settings, strict=True):
            df = data[data.setting == setting]
            first = df[df.stage == 0].episodes
            budget = f"{int(first.iloc[0])} episodes per stage, " if first.notna().all() and first.gt(0).all() else ""
            plot_training_curves(df, ax=ax, title=rf"{setting} ({budget}$\delta$ = {RunSet().delta:g})")
            ax.title.set_fontsize(10)
        fig.tight_layout()
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
