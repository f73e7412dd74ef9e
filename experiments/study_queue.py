"""Running a study's queue of runs: a few at a time, each a separate process, resumable.

Shared by the studies that run many resumable runs one after another (the relay study,
``experiments/llm_team_task.py --queue``; it is the loop of ``experiments/llm_team_learning.py``'s
``run_queue`` with the study-specific parts passed in):

- :func:`run_queue`: ``jobs`` runs at a time, each ``command(name)`` in its own process with its
  log in ``logs/<name with / as _>.log``; finished runs are skipped, an entry whose name cannot
  be resolved yet (it needs the learning rate chosen by tuning runs) waits for them;
- :func:`wall_clock`: the wall seconds of a run summed over the sessions of a resumed run (a
  heartbeat file outside the run folder, rewritten every ``period`` seconds).
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

__all__ = ["run_queue", "wall_clock", "log_name"]


def log_name(name: str) -> str:
    """A run name as one file name (``n2/tune/sat_lr0.001_s0`` → ``n2_tune_sat_lr0.001_s0``)."""
    return name.replace("/", "_")


def run_queue(entries: list[str], resolve: Callable[[str], str | None],
              command: Callable[[str], list[str]], finished: Callable[[str], bool],
              logs: Path, jobs: int = 2, poll: float = 10.0) -> int:
    """Run the queue ``entries`` in order, ``jobs`` at a time. ``resolve(entry)``: the run name
    of an entry, ``None`` while it waits (e.g. for its tuning runs); ``command(name)``: the
    argv of one run (its own process; stdout and stderr appended to ``logs/<name>.log``);
    ``finished(name)``: the run is complete (skipped). Returns 0 when every entry finished,
    else 1 (a failed run is not retried in the same call: run the queue again)."""
    logs.mkdir(parents=True, exist_ok=True)
    running: dict[str, subprocess.Popen] = {}
    failed: set[str] = set()
    pending = list(entries)
    while pending or running:
        for name, proc in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                print(f"{time.strftime('%H:%M:%S')} {name}: exit {proc.returncode}", flush=True)
                if proc.returncode != 0:
                    failed.add(name)
        progressed = False
        for entry in list(pending):
            if len(running) >= jobs:
                break
            name = resolve(entry)
            if name is None:
                continue  # waits for the runs it needs
            pending.remove(entry)
            progressed = True
            if name in running or name in failed or finished(name):
                continue
            print(f"{time.strftime('%H:%M:%S')} start {name}", flush=True)
            with open(logs / (log_name(name) + ".log"), "a") as fh:
                running[name] = subprocess.Popen(command(name), stdout=fh,
                                                 stderr=subprocess.STDOUT)
        if not running and not progressed and pending:
            print(f"cannot resolve {pending}: the runs they need failed", flush=True)
            break
        if running:
            time.sleep(poll)
    left = [e for e in entries if (n := resolve(e)) is None or not finished(n)]
    print(f"{len(entries) - len(left)} of {len(entries)} finished; failed: {sorted(failed)}",
          flush=True)
    return 0 if not left else 1


@contextmanager
def wall_clock(wall_file: Path, resumed: bool, period: float = 30.0):
    """Track a run's wall seconds over every session: yields a function returning the seconds
    so far (the earlier sessions' from ``wall_file`` when ``resumed``, plus this one's) and
    rewrites ``wall_file`` atomically every ``period`` seconds and at the end."""
    wall_file.parent.mkdir(parents=True, exist_ok=True)
    before = float(wall_file.read_text() or 0.0) if resumed and wall_file.is_file() else 0.0
    t0, stop = time.time(), threading.Event()

    def now() -> float:
        return before + time.time() - t0

    def write() -> None:
        tmp = wall_file.with_suffix(".tmp")
        tmp.write_text(f"{now():.1f}")
        os.replace(tmp, wall_file)

    def beat() -> None:
        while not stop.wait(period):
            write()

    threading.Thread(target=beat, daemon=True).start()
    try:
        yield now
    finally:
        stop.set()
        write()
