"""TeamTR Fig. 4b: cumulative measured improvement vs the cumulative certified lower bound,
over the stages of SAT runs (:mod:`experiments.runs`).

Three certificates, all in THEORY §4's form: ``lower_bound_estimated`` — the paper's practice,
the logged surrogates ``L̂_i``, monitored KL ``δ̂_i`` and ζ̂ proxies plugged into TeamTR
Thm 3.6; ``lower_bound`` — the same theorem with the exact terms; ``lower_bound_tv`` — this
project's tightest rung (exact TV, ``‖f_i‖∞``), never the paper's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.common import Options, run_study, write_csv
from experiments.runs import main_runset, trained
from sat_theory.plotting import paper_style, plot_certificate_tracking, save_figure

NAME = "fig_certificate_tracking"
BOUNDS = ("lower_bound_estimated", "lower_bound", "lower_bound_tv")
COLUMNS = ["method", "seed", "stage", "true_improvement", *BOUNDS, "empirical_certificate", "holds"]


def run(opts: Options) -> list[Path]:
    rs = main_runset(opts.quick, opts.seeds)
    _, stages, _ = trained(opts.out, rs, **opts.executor_kwargs())
    df = stages[stages.method == "sat"]
    df = df[[c for c in COLUMNS if c in df.columns]]
    return [write_csv(df, opts.out, NAME)] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_certificate_tracking.csv`` in ``out``."""
    out = Path(out)
    df = pd.read_csv(out / f"{NAME}.csv")
    with paper_style():
        fig = plot_certificate_tracking(
            df, bound_cols=[b for b in BOUNDS if b in df.columns],
            title=f"SAT: measured vs certified improvement ({df.seed.nunique()} seeds)")
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
