"""TeamTR Fig. 4c: per-stage certificate against the measured improvement of that stage, with
the Spearman rank correlation and the violation rate (fraction of stages whose certificate
exceeds the measured improvement), for SAT runs (:mod:`experiments.runs`).

Left: the paper's practice (estimated terms in TeamTR Thm 3.6, ``lower_bound_estimated``).
Right: this project's tightest exact rung (``lower_bound_tv``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import matplotlib.pyplot as plt
import pandas as pd

from experiments.common import Options, run_study, write_csv
from experiments.runs import main_runset, trained
from sat_theory.plotting import paper_style, plot_certificate_vs_improvement, save_figure

NAME = "fig_certificate_vs_improvement"
PANELS = (("lower_bound_estimated", "TeamTR Thm 3.6, estimated terms (paper's practice)"),
          ("lower_bound_tv", "tightest exact rung (this project)"))
COLUMNS = ["method", "seed", "stage", "true_improvement", "lower_bound", *[p[0] for p in PANELS]]


def run(opts: Options) -> list[Path]:
    rs = main_runset(opts.quick, opts.seeds)
    _, stages, _ = trained(opts.out, rs, **opts.executor_kwargs())
    df = stages[stages.method == "sat"]
    df = df[[c for c in COLUMNS if c in df.columns]]
    return [write_csv(df, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_certificate_vs_improvement.csv`` in ``out``."""
    out = Path(out)
    df = pd.read_csv(out / f"{NAME}.csv")
    with paper_style():
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
        for ax, (col, title) in zip(axes, PANELS, strict=True):
            plot_certificate_vs_improvement(df, ax=ax, bound_col=col, title=title)
            ax.title.set_fontsize(10)
        fig.tight_layout()
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
