"""Faults injected into runs, shared by the CLI and LLM tests: a ``sat train`` child that
SIGKILLs itself at one point (``update:N``, ``write:N``, ``record:N``; the kill points are
described in tests/cli/test_fault_injection.py), a chain of such children on one run folder,
and a signal delivered right after a run folder's replacement or deletion.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import signal

from sat_theory.cli import main

#: the kill points of one chain (see tests/cli/test_fault_injection.py): a fresh run, then
#: three resumes
CHAIN = ("write:1", "update:4", "record:3", "write:3")


def records(folder) -> list[dict]:
    """The run's records without the machine's measurements (wall time, peak memory)."""
    out = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds")
        r.pop("peak_memory_bytes", None)  # LLM step records: a measurement of the machine too
        out.append(r)
    return out


def _die_at(point: str, team_cls) -> None:
    """Patch this (child) process so that it SIGKILLs itself at ``point``."""
    import sat_theory.checkpoint as ck
    from sat_theory.metrics import RunWriter

    what, n = point.split(":")
    left = [int(n)]

    def countdown() -> bool:
        left[0] -= 1
        return left[0] == 0

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    if what == "update":
        orig_update = team_cls.update

        def update(self, *a, **kw):
            out = orig_update(self, *a, **kw)
            if countdown():
                die()
            return out

        team_cls.update = update
    elif what == "write":
        orig_write = ck.write_atomic

        def write_atomic(path, write):
            if not countdown():
                return orig_write(path, write)
            tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
            write(tmp)
            with open(tmp, "r+b") as f:  # torn: half written when the process dies
                f.truncate(os.path.getsize(tmp) // 2)
            die()

        ck.write_atomic = write_atomic
    elif what == "record":
        orig_log = RunWriter.log

        def log(self, rec):
            orig_log(self, rec)
            if rec["kind"] == "step" and countdown():
                die()

        RunWriter.log = log
    else:
        raise ValueError(point)


def _child(argv, point, team_path):
    module, name = team_path.rsplit(".", 1)
    import importlib

    _die_at(point, getattr(importlib.import_module(module), name))
    os._exit(main(argv))


def run_killed(argv: list[str], point: str, team_path: str) -> int:
    """Run ``main(argv)`` in a forked child that kills itself at ``point``; its exit code
    (``-SIGKILL`` when the point was reached, else the command's status)."""
    ctx = multiprocessing.get_context("fork")
    p = ctx.Process(target=_child, args=(argv, point, team_path))
    p.start()
    p.join(120)
    assert p.exitcode is not None, "child hung"
    return p.exitcode


def kill_chain(argv: list[str], out, team_path: str, chain=CHAIN) -> list[int]:
    """The chain of killed children on ``out`` (tests/cli/test_fault_injection.py's docstring); their exit codes."""
    codes = [run_killed(argv + ["--out", str(out)], chain[0], team_path)]
    for point in chain[1:]:
        codes.append(run_killed(["train", "--resume", str(out), "--quiet"], point, team_path))
    return codes


def interrupt_after(monkeypatch, target, sig):
    """The first ``os.replace``/``shutil.rmtree`` that moves or deletes ``target`` is followed
    at once by ``sig`` to this process (an interrupt in the worst moment)."""
    real_replace, real_rmtree = os.replace, shutil.rmtree
    fired = []

    def fire(path):
        if not fired and os.path.abspath(path) == os.path.abspath(target):
            fired.append(path)
            os.kill(os.getpid(), sig)

    def replace(src, dst, *a, **kw):
        real_replace(src, dst, *a, **kw)
        fire(src)

    def rmtree(path, *a, **kw):
        real_rmtree(path, *a, **kw)
        fire(path)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    return fired
