"""TeamTR Table 9: the ablation rows that have a tabular meaning, run with the shared
algorithm on the tabular backend (:mod:`experiments.runs`, sampled mode, matched budget).

Rows (paper label -> TrainConfig overrides): resampling strategy (none = naive, every 2
updates, stage-start reuse with importance weights), trust region (none, δ = 0.001, δ = 0.1,
adaptive δ), update order (fixed, reverse, random per stage), advantage estimation (no std
normalization, no hard clipping).

Columns, per row, mean (± std) over seeds:

- ``final_J`` — the exact team return after the last stage (the paper: AIME24 accuracy);
- ``delta_stale_final`` — TeamTR's Δ_stale = Σ_i |L_i^stale − L_i^seq| at the final stage (exact);
- ``surrogate_gap_final`` — Σ_i |L̂_i − L_i^seq| at the final stage: how far the surrogate the
  variant optimized was from the intermediate-occupancy one;
- ``stability`` — the std over stages of the per-stage improvement (the paper's "Stab.");
- ``out_of_region_rate`` — fraction of updates whose exact expected KL exceeds the radius
  enforced at that step (``delta_i``; for no-tr the nominal δ);
- ``adv_clip_frac`` — fraction of advantages the hard clip changed;
- ``bound_violations`` — stages whose exact certificate failed (must be 0);
- ``paper_acc``, ``paper_delta_stale`` — the paper's numbers for the row (quoted).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from experiments.common import Options, run_study, write_csv
from experiments.report import PAPER
from experiments.runs import RunSet, trained

NAME = "table_ablations"

#: (variant key, TeamTR Table 9 row, group, TrainConfig overrides)
ABLATIONS = (
    ("full", "TeamTR (full)", "", dict(method="sat")),
    ("no-resample", "No resampling (= Naive Seq.)", "resampling", dict(method="naive")),
    ("resample-2", "Resample every 2 updates", "resampling",
     dict(method="sat", occupancy="resample-every-k", resample_k=2)),
    ("stale-is", "Importance weighting (no resample)", "resampling", dict(method="sat", occupancy="stale+IS")),
    ("no-tr", "No trust region", "trust region", dict(method="no-tr")),
    ("delta-0.001", "Fixed δ=0.001", "trust region", dict(method="sat", delta=0.001)),
    ("delta-0.1", "Fixed δ=0.1", "trust region", dict(method="sat", delta=0.1)),
    ("adaptive", "Adaptive δ", "trust region", dict(method="sat", trust_region="adaptive")),
    ("order-fixed", "Fixed order", "update order", dict(method="sat", order="fixed")),
    ("order-reverse", "Reverse order", "update order", dict(method="sat", order="reverse")),
    ("order-random", "Random order", "update order", dict(method="sat", order="random")),
    ("no-std", "No group normalization", "advantage", dict(method="sat", normalize_std=False)),
    ("no-clip", "No hard clipping", "advantage", dict(method="sat", A_clip=None)),
)


def runset(opts: Options) -> RunSet:
    return RunSet(name="ablations", variants={k: o for k, _, _, o in ABLATIONS},
                  stages=5 if opts.quick else 20, seeds=opts.seeds or (2 if opts.quick else 3))


def per_seed(steps: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (v, s), g in stages.groupby(["method", "seed"], sort=False):
        st = steps[(steps.method == v) & (steps.seed == s)]
        last = st[st.stage == st.stage.max()]
        rows.append(dict(variant=v, seed=s,
                         final_J=float(g.sort_values("stage").J_after.iloc[-1]),
                         delta_stale_final=float((last.L_stale - last.L_seq).abs().sum()),
                         surrogate_gap_final=float((last.surrogate - last.L_seq).abs().sum()),
                         stability=float(g.true_improvement.std()),
                         # against the radius enforced at that step (adaptive δ moves it)
                         out_of_region_rate=float(np.mean(st.delta.astype(float) > st.delta_i.astype(float))),
                         adv_clip_frac=float(st.adv_clip_frac.astype(float).mean()),
                         bound_violations=int((g.holds == False).sum()),  # noqa: E712
                         episodes=int(g.episodes.max()) if "episodes" in g else -1))
    return pd.DataFrame(rows)


def run(opts: Options) -> list[Path]:
    rs = runset(opts)
    steps, stages, _ = trained(opts.out, rs, **opts.executor_kwargs())
    ps = per_seed(steps, stages)
    cols = ["final_J", "delta_stale_final", "surrogate_gap_final", "stability", "out_of_region_rate",
            "adv_clip_frac"]
    agg = ps.groupby("variant", sort=False)[cols].mean()
    std = ps.groupby("variant", sort=False)[["final_J", "delta_stale_final"]].std().add_suffix("_std")
    viol = ps.groupby("variant", sort=False).bound_violations.sum()
    paper = PAPER["ablations"]["rows"]
    out = []
    for key, label, group, _ in ABLATIONS:
        acc, dst = paper.get(label, (np.nan, np.nan))
        out.append(dict(variant=key, paper_row=label, group=group, seeds=int((ps.variant == key).sum()),
                        **agg.loc[key].to_dict(), **std.loc[key].to_dict(),
                        bound_violations=int(viol.loc[key]), paper_acc=acc, paper_delta_stale=dst))
    return [write_csv(pd.DataFrame(out), opts.out, NAME)]


def plot(out: Path | str) -> list[Path]:
    """A table only (``table_ablations.csv``): nothing to draw."""
    return []


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
