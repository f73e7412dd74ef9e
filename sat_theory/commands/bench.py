"""``sat bench [--quick] [--json] [--only NAME[,NAME]] [--out DIR] [--strict] [--smoke]``:
performance benchmarks.

Runs the scripts of ``experiments/benchmarks/`` (issue 7; see ``BENCHMARKS.md``) through
their ``main()`` functions: ``eval`` (exact evaluation vs QuantEcon, pymdptoolbox and one
bare LAPACK solve), ``sparse`` (our sparse evaluation vs value iteration on large MDPs),
``certificate`` (a full stage certificate vs a naive implementation), ``scaling``
(log-log fits of time vs S and n), ``suites`` (wall times of ``sat verify --quick`` and
``sat figures --quick``, run as subprocesses) and ``llm`` (the LLM backend on CPU: batched vs
per-sample generation, exact-KL monitor overhead, resampling overhead in tokens, model load,
rollout time vs G and n; skipped with a one-line note when torch/transformers/peft are
missing). Every comparison is a ratio measured in one run.

Each script writes its JSON to ``--out`` (default ``bench_out/`` in the current folder; with
``--smoke`` a temporary folder, removed afterwards) as ``bench_<name>[_quick].json`` — never
into the source tree, whose ``experiments/benchmarks/results/`` holds the reference results
quoted in ``BENCHMARKS.md``. This command prints each script's table and then every target as
MET or MISSED (:data:`MISSED_NOTE`), or with ``--json`` one object
``{"machine": …, "benchmarks": {name: result}, "targets": [...]}`` on stdout. Exit status 0,
or with ``--strict`` 1 when a target was missed; 2 on bad input.

The scripts live in the source checkout (they are experiments, not library code):
``--experiments DIR``, else ``$SAT_EXPERIMENTS``, else ``experiments/`` next to
``sat_theory/`` (:mod:`sat_theory.commands._studies`; a wheel install needs one of the first
two). Peers (quantecon, pymdptoolbox) come
with the ``dev`` extra; a missing peer is left out of the tables.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

from ..config_file import arg_type
from ..errors import InputError
from ..fileio import dumps
from ._io import pick_names, table
from ._studies import add_experiments_argument, bench_dir, import_bench

__all__ = ["BENCHES", "MISSED_NOTE", "add_arguments", "bench_dir", "out_folder", "run"]

BENCHES = ("eval", "sparse", "certificate", "scaling", "suites", "llm")

#: what MISSED means, printed under the targets table
MISSED_NOTE = ("MISSED: the measured value did not reach its goal in this run. A target is a "
               "performance goal (a ratio of two timings taken in the same run), not a "
               "correctness check; a loaded or different machine can miss it. BENCHMARKS.md "
               "has the calm-machine numbers; --strict makes a miss exit 1.")


def add_arguments(p):
    p.add_argument("--quick", action="store_true",
                   help="smaller grids (S up to 1000 dense, 10^5 sparse), each suite once, LLM on "
                        "tiny-random only; minutes instead of ~30")
    p.add_argument("--json", action="store_true",
                   help='print {"machine", "benchmarks", "targets"} as one JSON object on stdout')
    p.add_argument("--only", default=None, metavar="NAME[,NAME]",
                   help=f"run only these benchmarks ({', '.join(BENCHES)})")
    p.add_argument("--blas-threads", type=arg_type(("int", 1, None, True, False)), default=None,
                   metavar="N",
                   help="limit every BLAS library to N threads for the run (needs threadpoolctl); "
                        "1 is the stable comparison on a loaded machine")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="folder for the JSON results, bench_<name>[_quick].json (default: "
                        "./bench_out in the current folder; with --smoke a temporary folder)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when any target is MISSED (default: report it, exit 0)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes to check that the scripts run (numbers meaningless)")
    add_experiments_argument(p)
    p.epilog = MISSED_NOTE


def out_folder(out: str | None, smoke: bool) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The results folder (``--out``, else ``./bench_out``, else for ``--smoke`` a temporary
    one, returned too so that the caller removes it); an ``--out`` that is a file is refused."""
    tmp = tempfile.TemporaryDirectory(prefix="sat_bench_") if smoke and out is None else None
    folder = Path(tmp.name if tmp is not None else out or "bench_out")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out {folder} is a file, not a folder")
    return folder, tmp


def run(args) -> int:
    names = pick_names(args.only, BENCHES, "benchmark")
    experiments = getattr(args, "experiments", None)
    common = import_bench("_common", experiments)
    if args.blas_threads is not None and args.blas_threads < 1:
        raise InputError(f"--blas-threads must be >= 1, got {args.blas_threads}")
    try:
        limit = common.blas_threads(args.blas_threads)
    except ImportError:
        raise InputError("--blas-threads needs threadpoolctl (pip install threadpoolctl)") from None
    out, tmp = out_folder(args.out, args.smoke)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create --out {out}: {e.strerror}") from None
    with tmp or contextlib.nullcontext(), limit:
        results = {name: run_bench(name, args, out, experiments) for name in names}
        machine = common.machine_info()  # inside the limit: it reports the threads used
    targets = [{"benchmark": name, **t} for name, res in results.items()
               for t in res.get("targets", [])]
    missed = [t for t in targets if not t["met"]]
    status = 1 if args.strict and missed else 0
    if args.json:
        print(dumps({"machine": machine, "benchmarks": results, "targets": targets}))
        return status
    print(f"machine: {machine['cpu']}, {machine['nproc']} cores, BLAS {common.blas_summary(machine)}, "
          f"load {machine['loadavg']}")
    print_targets(targets, missed)
    if tmp is None:
        print(f"results: {out}")
    return status


def run_bench(name: str, args, out: Path, experiments: str | None) -> dict:
    """One benchmark script's ``main()`` result (its JSON written to ``out``), or
    ``{"skipped": reason}`` when its optional dependencies are missing (a note, not an
    error)."""
    mod = import_bench(f"bench_{name}", experiments)
    reason = mod.available() if hasattr(mod, "available") else None
    if reason is not None:
        print(f"{name}: skipped ({reason})", file=sys.stderr if args.json else sys.stdout,
              flush=True)
        return {"benchmark": name, "skipped": reason, "targets": []}
    kwargs = {"quick": args.quick, "verbose": not args.json,
              "out": str(out / f"bench_{name}{'_quick' if args.quick else ''}.json")}
    if args.smoke:
        kwargs["cfg"] = mod.SMOKE
    if not args.json:
        print(f"== {name} ==", flush=True)
    res = mod.main(**kwargs)
    if not args.json:
        print(flush=True)
    return res


def print_targets(targets: list[dict], missed: list[dict]) -> None:
    """Every target as MET or MISSED in one table, the count, and :data:`MISSED_NOTE` when
    one was missed."""
    if not targets:
        return
    rows = [{"benchmark": t["benchmark"], "target": t["target"], "value": t["value"],
             "goal": t["goal"], "status": "MET" if t["met"] else "MISSED"} for t in targets]
    print(table(rows, ["benchmark", "target", "value", "goal", "status"], fmt="{:.3g}"))
    print(f"{len(targets) - len(missed)}/{len(targets)} targets met")
    if missed:
        print(MISSED_NOTE)
