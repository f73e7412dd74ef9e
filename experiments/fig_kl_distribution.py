"""TeamTR Fig. 4a: the distribution of per-update KL divergences per method, with the
trust-region radius δ marked and the out-of-region rate (fraction of updates with KL > δ).

Two panels from the same runs (:mod:`experiments.runs`): the *monitored* KL ``δ̂`` the
algorithm estimates from the step's batch (what the paper plots), and the *exact*
``δ_i = E_{s∼d^{π̂^{i−1}}} KL_s(π_cur^j‖π_new^j)`` the certificate needs, which the tabular
world computes. A step can be in-region by ``δ̂`` and out of region in truth (and vice versa).
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
from sat_theory.plotting import paper_style, plot_kl_distribution, save_figure

NAME = "fig_kl_distribution"
COLUMNS = ["method", "seed", "stage", "step", "agent", "kl", "delta", "delta_i", "kl_max",
           "backtracks", "rejected", "out_of_region"]


def run(opts: Options) -> list[Path]:
    rs = main_runset(opts.quick, opts.seeds)
    steps, _, _ = trained(opts.out, rs, **opts.executor_kwargs())
    df = steps[[c for c in COLUMNS if c in steps.columns]]
    return [write_csv(df, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_kl_distribution.csv`` in ``out`` (δ: the runs'
    per-agent radius ``delta_i``)."""
    out = Path(out)
    df = pd.read_csv(out / f"{NAME}.csv")
    radius = float(df.delta_i.iloc[0])
    with paper_style():
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.4), sharey=True)
        plot_kl_distribution(df, radius, ax=axes[0], kl_col="kl",
                             title=r"monitored KL $\hat\delta$ (batch estimate)")
        plot_kl_distribution(df, radius, ax=axes[1], kl_col="delta",
                             title=r"exact KL $\delta_i$ under $d^{\hat\pi^{i-1}}$")
        axes[1].set_ylabel("")
        fig.tight_layout()
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
