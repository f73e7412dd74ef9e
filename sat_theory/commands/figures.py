"""``sat figures [--quick] [--out DIR] [--only NAME[,NAME...]] [--seeds N]``.

Runs the study scripts of ``experiments/`` (one per figure or table of the two papers), each
writing its CSV, PNG and PDF to ``--out``, then writes ``REPORT.md`` there from the CSVs
(:mod:`experiments.report`). The wall time of every study is recorded in ``timings.json`` (written
atomically) and reported; a torn or invalid ``timings.json`` is ignored with a one-line warning
(timings are a record, not an input). Training runs shared by several figures are cached under ``OUT/runs`` (keyed by their
settings; ``--retrain`` clears them); ``--executor process|ray`` trains those independent runs
in parallel with identical results. The scripts live in the source checkout: ``--experiments
DIR``, else ``$SAT_EXPERIMENTS``, else the ``experiments/`` folder next to ``sat_theory/``
(:mod:`sat_theory.commands._studies`; a wheel install needs one of the first two).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from ..config_file import arg_type
from ..errors import InputError
from ..executor import add_executor_arguments
from ..metrics import write_json_atomic
from ..ownership import is_run_set
from . import _studies
from ._io import pick_names, refuse_source_tree

#: every study, in the order they run (cheap exact studies first, training-based after)
STUDIES = (
    "fig_n_scaling",
    "fig_violation_rate",
    "fig_certificate_ladder",
    "fig_order_sensitivity",
    "fig_is_degeneracy",
    "fig_stale_gap",
    "fig_training_curves",
    "fig_kl_distribution",
    "fig_certificate_tracking",
    "fig_certificate_vs_improvement",
    "fig_plug_and_play",
    "table_ablations",
)


def add_arguments(p):
    p.add_argument("--quick", action="store_true",
                   help="small settings: every study in a few minutes in total")
    p.add_argument("--out", default="figures",
                   help="output directory (default: figures/; inside the source checkout only "
                        "when typed)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated studies to run (default: all): {', '.join(STUDIES)}")
    p.add_argument("--seeds", type=arg_type(("int", 1, None, True, False)), default=None,
                   help="seeds per study (default: the study's quick/full setting)")
    p.add_argument("--retrain", action="store_true",
                   help="delete OUT/runs first: training runs are cached there by their "
                        "settings, not by the code version, so retrain after changing the algorithm")
    p.add_argument("--no-report", action="store_true", help="do not (re)write REPORT.md")
    p.add_argument("--plot-only", action="store_true",
                   help="redraw the figures from the CSVs already in OUT (each study's plot()): "
                        "nothing is computed or trained and timings.json is left as it is")
    _studies.add_experiments_argument(p)
    add_executor_arguments(p)


def read_timings(path: Path, warn: str = "sat figures") -> dict:
    """The ``timings.json`` at ``path`` as a dict, ``{}`` when there is none. A file that is not
    one in the shape this command writes (torn by a kill, edited by hand, not UTF-8) is
    ignored with one warning line on stderr starting with ``warn``: the timings of earlier
    runs are a record, never worth blocking the figures for."""
    if not path.exists():
        return {}
    try:
        timings = json.loads(path.read_text(encoding="utf-8"))
        problem = _timings_problem(timings)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        problem = f"not valid JSON ({type(e).__name__})"
    if problem is not None:
        print(f"{warn}: warning: ignoring {path}: {problem}", file=sys.stderr, flush=True)
        return {}
    return timings


def _timings_problem(t) -> str | None:
    """What makes ``t`` unlike the ``timings.json`` :func:`run` writes (``None``: nothing):
    ``{"studies": {name: {"seconds": x, ...}}, "last_invocation"/"complete_run":
    {"studies": [...], "seconds": x, ...}}``, every part optional."""
    def timed(v) -> bool:
        return isinstance(v, dict) and isinstance(v.get("seconds"), int | float)

    if not isinstance(t, dict):
        return "not a JSON object"
    studies = t.get("studies", {})
    if not isinstance(studies, dict) or not all(timed(v) for v in studies.values()):
        return "'studies' is not a map of {\"seconds\": ...} objects"
    for key in ("last_invocation", "complete_run"):
        if key in t and not (timed(t[key]) and isinstance(t[key].get("studies"), list)):
            return f"'{key}' is not a {{\"studies\": [...], \"seconds\": ...}} object"
    return None


def plot_only(names: list[str], out: Path, report: bool, experiments: str | None = None) -> int:
    """``--plot-only``: every study's ``plot(out)`` on the CSVs already in ``out``."""
    import_study = _studies.import_study
    for name in names:
        try:
            paths = import_study(name, experiments).plot(out)
        except FileNotFoundError as e:
            raise InputError(f"--plot-only: {name}: {e.filename} is missing; run the study first") from None
        print(f"[{name}] " + (", ".join(p.name for p in paths) or "a table: nothing to draw"), flush=True)
    if report:
        print(f"wrote {import_study('report', experiments).write_report(out)}")
    return 0


def remove_run_sets(runs: Path) -> None:
    """``--retrain``: delete the cached run sets under ``OUT/runs`` — only when every entry
    there is one ``sat figures`` wrote (:func:`~sat_theory.ownership.is_run_set`); anything else is an InputError
    and nothing is deleted (``--out`` may be a folder that holds other things)."""
    entries = sorted(runs.iterdir())
    foreign = [p.name for p in entries if not is_run_set(p)]
    if foreign:
        raise InputError(f"--retrain: {runs} holds {foreign[0]!r}, which sat figures did not "
                         "write; nothing was deleted (move it away or choose another --out)")
    for p in entries:
        shutil.rmtree(p)


def run(args) -> int:
    if args.seeds is not None and args.seeds < 1:
        raise InputError(f"--seeds must be >= 1, got {args.seeds}")
    names = pick_names(args.only, STUDIES, "study")
    refuse_source_tree(args.out, "out" in getattr(args, "given", {"out"}))
    experiments = getattr(args, "experiments", None)
    _studies.experiments_dir(experiments)  # no studies folder: one line before anything is written
    if args.plot_only:
        return plot_only(names, Path(args.out), not args.no_report, experiments)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.retrain and (out / "runs").is_dir():
        remove_run_sets(out / "runs")

    def import_study(name):
        return _studies.import_study(name, experiments)

    opts = import_study("common").Options(out=out, quick=args.quick, seeds=args.seeds,
                                          executor=args.executor, workers=args.workers,
                                          ray_address=args.ray_address)
    tpath = out / "timings.json"
    timings = read_timings(tpath)
    timings.setdefault("studies", {})
    t_all = time.perf_counter()
    failed = run_studies(names, opts, timings, import_study, args)
    total = time.perf_counter() - t_all
    record_invocation(timings, names, failed, total, args)
    write_json_atomic(str(tpath), timings)
    if not args.no_report:
        report = import_study("report").write_report(out)
        print(f"wrote {report}")
    print(f"sat figures: {len(names) - len(failed)}/{len(names)} studies in {total:.1f} s -> {out}")
    if failed:
        print(f"sat figures: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def run_studies(names: list[str], opts, timings: dict, import_study, args) -> list[str]:
    """Run each study's ``run(opts)``, timing it into ``timings["studies"]``; the names of
    those that failed (a broken study is reported and the others still run; bad input
    stops everything)."""
    failed = []
    for name in names:
        t0 = time.perf_counter()
        print(f"[{name}] running ...", flush=True)
        try:
            paths = import_study(name).run(opts)
        except InputError:
            raise
        except Exception as e:  # keep going: one broken study must not lose the others
            print(f"[{name}] FAILED: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            failed.append(name)
            continue
        dt = time.perf_counter() - t0
        timings["studies"][name] = {"seconds": round(dt, 2), "quick": bool(args.quick),
                                    "seeds": args.seeds}
        print(f"[{name}] {dt:.1f} s: " + ", ".join(p.name for p in paths), flush=True)
    return failed


def record_invocation(timings: dict, names: list[str], failed: list[str], total: float,
                      args) -> None:
    """``timings["last_invocation"]``, and ``"complete_run"`` when every study ran and none
    failed (the wall time of a complete run: later partial runs may find the training runs
    cached and show only plotting time)."""
    timings["last_invocation"] = {"studies": names, "seconds": round(total, 2),
                                  "quick": bool(args.quick), "seeds": args.seeds}
    if set(names) == set(STUDIES) and not failed:
        timings["complete_run"] = dict(timings["last_invocation"])
