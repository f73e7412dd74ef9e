"""``sat plot RUN_DIR [RUN_DIR ...] [--out DIR]``: draw the run-log figures (training curve,
KL distribution, certificate tracking, certificate vs improvement, stale gap) from the
``metrics.jsonl`` + ``config.json`` of run directories — tabular or LLM runs alike."""

from __future__ import annotations

from pathlib import Path

from ..errors import InputError
from ._io import refuse_source_tree


def add_arguments(p):
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="run directories with metrics.jsonl (several: drawn together, one "
                        "line per method, mean ± std over seeds)")
    p.add_argument("--out", default=None,
                   help="output directory (default: RUN_DIR/plots for one run, ./plots otherwise; "
                        "inside the source checkout only when typed)")
    p.add_argument("--delta", type=float, default=None,
                   help="trust-region radius to mark on the KL figure (default: from config.json)")


def run(args) -> int:
    from ..plotting import plot_runs  # matplotlib loads only for this command

    dirs = [Path(d) for d in args.run_dirs]
    for d in dirs:
        if not d.is_dir():
            raise InputError(f"not a run directory: {d}")
        if not (d / "metrics.jsonl").exists():
            raise InputError(f"{d} has no metrics.jsonl")
    out = Path(args.out) if args.out else (dirs[0] / "plots" if len(dirs) == 1 else Path("plots"))
    refuse_source_tree(out, args.out is not None)
    paths = plot_runs(dirs, out, delta=args.delta)
    if not paths:
        raise InputError("the metrics have none of the columns the figures need")
    for p in paths:
        print(p)
    return 0
