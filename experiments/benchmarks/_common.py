"""Shared helpers of the benchmark scripts: interleaved timing, machine description, output.

Timing rule (issue 7): these machines are shared and noisy, so every comparison is a ratio
measured in one run. The contenders of one comparison are timed *interleaved* (round-robin,
rotating the order each round) and each is summarised by its minimum over the rounds (the
least disturbed run) and its median; ratios are taken of the minima.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def interleaved(cases: dict[str, Callable[..., Callable[[], object]]], repeats: int,
                warmup: int = 1, min_time: float = 0.02) -> dict:
    """Time each case ``repeats`` times, round-robin, after ``warmup`` untimed rounds.

    ``cases[name]()`` prepares one timing (untimed: fresh copies, warm caches) and returns the
    zero-argument callable that is timed. Calls much shorter than ``min_time`` are repeated
    ``number`` times per timing (chosen from the warm-up call) so that the timer and cache
    effects of a single call do not dominate; a preparer that takes an argument receives
    ``number`` and must return a callable good for that many calls (e.g. a stack of fresh
    copies for an in-place LAPACK routine). Returns ``{name: {"min": s, "median": s,
    "number": k}}`` with seconds per call.
    """
    import inspect

    names = list(cases)
    takes_n = {k: len(inspect.signature(cases[k]).parameters) > 0 for k in names}

    def prepare(name, number):
        return cases[name](number) if takes_n[name] else cases[name]()

    number = {k: 1 for k in names}
    for w in range(warmup):  # page cache, BLAS thread pools, lazy imports
        for name in names:
            fn = prepare(name, 1)
            t0 = time.perf_counter()
            fn()
            dt = time.perf_counter() - t0
            if w == warmup - 1 and min_time > 0 and dt < min_time:
                number[name] = int(min(1000, max(1, min_time / max(dt, 1e-7))))
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            k = number[name]
            fn = prepare(name, k)
            gc.collect()
            gc.disable()  # a collection inside a timed region is noise, not cost
            try:
                t0 = time.perf_counter()
                for _ in range(k):
                    fn()
                times[name].append((time.perf_counter() - t0) / k)
            finally:
                gc.enable()
    return {k: {"min": min(v), "median": statistics.median(v), "number": number[k]}
            for k, v in times.items()}


def blas_threads(n: int | None):
    """Context: every BLAS library (numpy's and SciPy's OpenBLAS) limited to ``n`` threads;
    ``None`` leaves the defaults. Needs threadpoolctl for ``n`` not None.

    Why offer it: on a 2-core machine shared with other jobs (load average > 2), OpenBLAS's
    spinning worker threads get descheduled and a 2-thread LU can take 5-10x its idle time,
    for every contender alike but not by the same factor. One thread each is the stable
    comparison under load; BENCHMARKS.md says which setting each table used.
    """
    import contextlib

    if n is None:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=n, user_api="blas")


def time_once(fn: Callable[[], object]) -> tuple[float, object]:
    """Wall time of one call and its result."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def machine_info() -> dict:
    """What the numbers ran on: CPU, cores, BLAS kernel (threadpoolctl), versions, load."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    blas = []
    try:
        import scipy.linalg  # noqa: F401  (load scipy's BLAS so threadpoolctl sees it)
        from threadpoolctl import threadpool_info

        blas = [
            {k: d.get(k) for k in ("internal_api", "version", "architecture", "num_threads",
                                   "threading_layer")}
            | {"library": os.path.basename(d.get("filepath", ""))}
            for d in threadpool_info() if d.get("user_api") == "blas"
        ]
    except ImportError:
        blas = [{"note": "threadpoolctl not installed; BLAS kernel unknown"}]
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for mod in ("scipy", "quantecon", "mdptoolbox"):
        try:
            versions[mod] = getattr(__import__(mod), "__version__", "installed")
        except ImportError:
            versions[mod] = None
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE",
                                          "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    return {
        "cpu": cpu,
        "nproc": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "blas": blas,
        "blas_env": env,
        "versions": versions,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def blas_summary(info: dict) -> str:
    """One line such as ``openblas 0.3.31 Haswell x2``."""
    parts = []
    for b in info.get("blas", []):
        if "internal_api" in b:
            parts.append(f"{b['internal_api']} {b['version']} {b['architecture']} x{b['num_threads']}"
                         f" ({b['library']})")
        else:
            parts.append(b.get("note", "?"))
    return "; ".join(parts)


def save_json(obj: dict, name: str, out: str | os.PathLike | None = None) -> Path:
    """Write ``obj`` as JSON to ``out`` (default ``results/<name>.json``); return the path."""
    from sat_theory.checkpoint import write_atomic
    from sat_theory.fileio import dumps

    path = Path(out) if out is not None else RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json.loads(dumps(obj)), indent=1) + "\n"
    write_atomic(path, lambda tmp: tmp.write_text(text))  # render.py reads it later
    return path


def fmt_table(rows: list[dict], columns: list[str]) -> str:
    from sat_theory.commands._io import table

    return table(rows, columns, fmt="{:.4g}")


def target_line(name: str, value: float, goal: float, higher_is_better: bool = True) -> dict:
    """A target check: ``met`` is whether ``value`` reaches ``goal``."""
    met = value >= goal if higher_is_better else value <= goal
    return {"target": name, "value": value, "goal": goal, "met": bool(met)}


def print_targets(targets: list[dict], path) -> None:
    """One MET/MISSED line per target (:func:`target_line`), then where the JSON went."""
    for t in targets:
        print(f"  {'MET   ' if t['met'] else 'MISSED'} {t['target']}: {t['value']:.3g} (goal {t['goal']:g})")
    print(f"JSON: {path}")


def script_main(main: Callable, doc: str, name: str, quick_help: str) -> None:
    """The command line shared by the tabular benchmark scripts: ``--quick``, ``--out``,
    ``--blas-threads``; runs ``main(quick=..., out=...)`` under the BLAS thread limit."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", help=f"JSON output path (default results/{name}.json)")
    ap.add_argument("--blas-threads", type=int, default=None,
                    help="limit every BLAS library to this many threads (default: unchanged)")
    a = ap.parse_args()
    with blas_threads(a.blas_threads):
        main(quick=a.quick, out=a.out)
