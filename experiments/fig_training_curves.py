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

from experiments.common import Options, parse_options, write_csv
from experiments.runs import ensure_runs, load, main_runset
from sat_theory.plotting import paper_style, plot_training_curves, save_figure

NAME = "fig_training_curves"
COLUMNS = ["method", "seed", "stage", "J_before", "J_after", "true_improvement", "rollouts",
           "episodes", "rejected_steps", "out_of_region_steps"]


def run(opts: Options) -> list[Path]:
    rs = main_runset(opts.quick, opts.seeds)
    ensure_runs(opts.out, rs)
    _, stages, _ = load(opts.out, rs)
    df = stages[[c for c in COLUMNS if c in stages.columns]]
    paths = [write_csv(df, opts.out, NAME)]
    with paper_style():
        fig = plot_training_curves(df, title=f"Training curves at a matched budget "
                                             f"({rs.budget_groups}×{rs.group_size} episodes per stage, "
                                             f"δ={rs.delta:g}, {rs.seeds} seeds)")
        fig.axes[0].title.set_fontsize(10)
        paths += save_figure(fig, opts.out, NAME)
    return paths


def main(argv=None) -> int:
    for p in run(parse_options(argv, __doc__)):
        print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
