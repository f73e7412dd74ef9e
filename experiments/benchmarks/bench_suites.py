"""Wall times of the two suites a user runs first (issue 7 item 3).

- ``sat verify --quick`` (every THEORY.md check, CI mode): target < 60 s;
- ``sat figures --quick --out <fresh temporary folder>`` (every study, small settings, no
  cached training runs since the folder is new): target < 5 min.

Each suite runs as a subprocess (``python -m sat_theory.cli ...``), so the time includes
the interpreter start and the imports a user pays. The per-check seconds come from
``sat verify --json``, the per-study seconds from the ``timings.json`` that ``sat figures``
writes into its output folder. The load average is recorded before and after every run:
these machines are shared, and the suite times scale with the CPU share they get.

Run: ``python experiments/benchmarks/bench_suites.py [--quick] [--out PATH]``
(``--quick``: each suite once; default: ``sat verify --quick`` three times, figures once).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _common import fmt_table, machine_info, print_targets, save_json, target_line

REPO = Path(__file__).resolve().parents[2]


@dataclass
class SuitesConfig:
    verify_runs: int = field(default=3, metadata={"help": "runs of sat verify --quick (min kept)"})
    figures_runs: int = field(default=1, metadata={"help": "runs of sat figures --quick"})
    verify_args: tuple[str, ...] = field(default=(), metadata={
        "help": "extra arguments of sat verify --quick (smoke: --only one check)"})
    figures_args: tuple[str, ...] = field(default=(), metadata={
        "help": "extra arguments of sat figures --quick (smoke: --only one study)"})
    verify_goal_s: float = field(default=60.0, metadata={"help": "target: sat verify --quick under"})
    figures_goal_s: float = field(default=300.0, metadata={"help": "target: sat figures --quick under"})
    timeout_s: float = field(default=1800.0, metadata={"help": "kill a suite after this long"})


QUICK = SuitesConfig(verify_runs=1, figures_runs=1)

#: tiny: one check and one short study, to check that the script runs (numbers meaningless)
SMOKE = SuitesConfig(verify_runs=1, figures_runs=1,
                     verify_args=("--only", "performance_difference"),
                     figures_args=("--only", "fig_kl_distribution", "--no-report"))


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_suite(argv: list[str], timeout: float) -> dict:
    """One subprocess ``python -m sat_theory.cli *argv``: wall seconds, exit code, stdout,
    the load average before and after, and the child's CPU seconds (user+system) — the CPU
    time says how much of the wall time was spent waiting for a core on a shared machine."""
    cmd = [sys.executable, "-m", "sat_theory.cli", *argv]
    before = _load()
    r0 = os.times()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
        rc, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out, err = None, e.stdout or "", f"timed out after {timeout} s"
    wall = time.perf_counter() - t0
    r1 = os.times()
    cpu = (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)
    return {"command": "sat " + " ".join(argv), "seconds": wall, "cpu_seconds": cpu,
            "returncode": rc, "loadavg_before": before, "loadavg_after": _load(),
            "stdout": out if isinstance(out, str) else out.decode(errors="replace"),
            "stderr_tail": (err if isinstance(err, str) else err.decode(errors="replace"))[-2000:]}


def bench_verify(cfg: SuitesConfig) -> dict:
    runs = []
    for _ in range(cfg.verify_runs):
        r = run_suite(["verify", "--quick", "--json", *cfg.verify_args], cfg.timeout_s)
        try:
            rep = json.loads(r.pop("stdout"))
            r["passed"] = bool(rep.get("passed"))
            r["checks"] = {c["name"]: c.get("seconds") for c in rep.get("checks", [])}
        except (json.JSONDecodeError, TypeError):
            r["passed"], r["checks"] = False, {}
        runs.append(r)
    return {"runs": runs, "min": min(r["seconds"] for r in runs),
            "median": sorted(r["seconds"] for r in runs)[len(runs) // 2]}


def bench_figures(cfg: SuitesConfig) -> dict:
    runs = []
    for _ in range(cfg.figures_runs):
        with tempfile.TemporaryDirectory(prefix="sat_figures_bench_") as tmp:
            r = run_suite(["figures", "--quick", "--out", tmp, *cfg.figures_args], cfg.timeout_s)
            r.pop("stdout")
            tpath = Path(tmp) / "timings.json"
            studies = json.loads(tpath.read_text()).get("studies", {}) if tpath.exists() else {}
            r["studies"] = {k: v.get("seconds") for k, v in studies.items()}
            r["passed"] = r["returncode"] == 0
        runs.append(r)
    return {"runs": runs, "min": min(r["seconds"] for r in runs),
            "median": sorted(r["seconds"] for r in runs)[len(runs) // 2]}


def main(quick: bool = False, out: str | None = None, cfg: SuitesConfig | None = None,
         verbose: bool = True) -> dict:
    cfg = cfg or (QUICK if quick else SuitesConfig())
    info = machine_info()
    ver = bench_verify(cfg)
    fig = bench_figures(cfg)
    rows = []
    for name, res in (("verify", ver), ("figures", fig)):
        for i, r in enumerate(res["runs"]):
            rows.append({"suite": name, "run": i + 1, "seconds": r["seconds"],
                         "cpu_seconds": r["cpu_seconds"], "exit": r["returncode"],
                         "load_before": r["loadavg_before"][0], "load_after": r["loadavg_after"][0]})
    targets = [
        target_line(f"sat verify --quick wall seconds (min of {len(ver['runs'])})", ver["min"],
                    cfg.verify_goal_s, higher_is_better=False),
        target_line("sat figures --quick wall seconds", fig["min"], cfg.figures_goal_s,
                    higher_is_better=False),
    ]
    # a suite that failed does not meet its target however fast it was
    for t, res in zip(targets, (ver, fig), strict=True):
        if not all(r["returncode"] == 0 for r in res["runs"]):
            t["met"] = False
            t["note"] = "suite exited non-zero"
    result = {"benchmark": "suites", "quick": quick, "config": asdict(cfg), "machine": info,
              "verify": ver, "figures": fig, "rows": rows, "targets": targets,
              "loadavg_after": _load()}
    path = save_json(result, "bench_suites" + ("_quick" if quick else ""), out)
    if verbose:
        print(fmt_table(rows, ["suite", "run", "seconds", "cpu_seconds", "exit", "load_before",
                               "load_after"]))
        slow = sorted(fig["runs"][0]["studies"].items(), key=lambda kv: -(kv[1] or 0))[:5]
        if slow:
            print("slowest studies: " + ", ".join(f"{k} {v:.1f}s" for k, v in slow))
        slow = sorted(ver["runs"][0]["checks"].items(), key=lambda kv: -(kv[1] or 0))[:5]
        if slow:
            print("slowest checks: " + ", ".join(f"{k} {v:.1f}s" for k, v in slow))
        print_targets(targets, path)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="each suite once")
    ap.add_argument("--smoke", action="store_true", help="one check and one study only")
    ap.add_argument("--out", help="JSON output path (default results/bench_suites.json)")
    a = ap.parse_args()
    main(quick=a.quick, out=a.out, cfg=SMOKE if a.smoke else None)
