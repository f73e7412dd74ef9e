"""Fault injection: ``sat train`` runs killed with SIGKILL resume to the uninterrupted run.

Each run is a chain of child processes on one run folder; each child (a fresh run, then
``--resume`` runs) kills itself with SIGKILL at one injected point:

- ``update:N`` — inside the N-th agent update (parameters changed, nothing saved);
- ``write:N`` — inside the N-th checkpoint write (a torn temporary file is left; ``write:1``
  of the fresh run is the very first checkpoint);
- ``record:N`` — right after the N-th step record reached ``metrics.jsonl``, before its
  checkpoint.

A last in-process ``--resume`` finishes the run. Every record must equal the uninterrupted
run's in every field but ``seconds`` (wall time), and no temporary file may be left. The
children are forked (the parent has imported everything), so a chain costs milliseconds
of start-up, not a fresh interpreter per kill.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal

import pytest

from sat_theory.cli import main

TABULAR = ["train", "--env", "random-turn", "--agents", "3", "--states", "5", "--stages", "3",
           "--horizon-tol", "0.1", "--seed", "4", "--delta", "0.05", "--quiet"]
SAMPLED = ["--groups", "2", "--group-size", "3"]

METHODS = {
    "sat": SAMPLED,
    "naive": SAMPLED + ["--method", "naive"],
    "stale+IS": SAMPLED + ["--method", "naive", "--occupancy", "stale+IS"],
    "greedy": SAMPLED + ["--order", "greedy"],
    "adaptive": SAMPLED + ["--trust-region", "adaptive"],
    "swap-stage0": SAMPLED + ["--method", "naive", "--swap-stage", "1", "--swap-agent", "2",
                              "--save-policies"],
    "exact-retrain": ["--exact", "--method", "naive", "--swap-stage", "2",
                      "--swap-strategy", "retrain", "--order", "random"],
}

#: the kill points of one chain (module docstring): a fresh run, then three resumes
CHAIN = ("write:1", "update:4", "record:3", "write:3")


def records(folder) -> list[dict]:
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
    """The chain of killed children on ``out`` (module docstring); their exit codes."""
    codes = [run_killed(argv + ["--out", str(out)], chain[0], team_path)]
    for point in chain[1:]:
        codes.append(run_killed(["train", "--resume", str(out), "--quiet"], point, team_path))
    return codes


@pytest.mark.parametrize("method", list(METHODS))
def test_tabular_runs_killed_anywhere_resume_exactly(tmp_path, method):
    argv = TABULAR + METHODS[method]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    codes = kill_chain(argv, tmp_path / "killed", "sat_theory.tabular_team.TabularTeam")
    assert codes.count(-signal.SIGKILL) >= 3, codes  # the kills really happened
    assert main(["train", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    full, killed = records(tmp_path / "full"), records(tmp_path / "killed")
    assert len(full) == len(killed)
    for a, b in zip(full, killed, strict=True):
        assert a == b, (a["kind"], a.get("stage"), a.get("step"),
                        {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    assert not list((tmp_path / "killed").glob(".*.tmp*"))  # torn writes cleaned up
    if "--save-policies" in argv:
        for f in sorted((tmp_path / "full" / "policies").iterdir()):
            assert f.read_bytes() == (tmp_path / "killed" / "policies" / f.name).read_bytes()


def test_kill_during_the_first_checkpoint_leaves_a_resumable_folder(tmp_path):
    out = tmp_path / "r"
    assert run_killed(TABULAR + SAMPLED + ["--out", str(out)], "write:1",
                      "sat_theory.tabular_team.TabularTeam") == -signal.SIGKILL
    assert (out / "config.json").is_file() and not (out / "checkpoint.safetensors").exists()
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    assert main(TABULAR + SAMPLED + ["--out", str(tmp_path / "full")]) == 0
    assert records(out) == records(tmp_path / "full")


# ------------------------------------------------------------------ tiny-random LLM teams
LLM = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy", "--agents", "2",
       "--stages", "2", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "3",
       "--n-train", "8", "--n-eval", "2", "--delta", "0.002", "--llm-lr", "0.01",
       "--threads", "1", "--quiet"]
LLM_METHODS = {
    "sat": [],
    "naive": ["--method", "naive"],
    "stale+IS": ["--method", "naive", "--occupancy", "stale+IS"],
    "greedy": ["--order", "greedy"],
    "adaptive": ["--trust-region", "adaptive"],
}


@pytest.fixture
def _llm_env(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


@pytest.mark.parametrize("method", list(LLM_METHODS))
def test_llm_runs_killed_anywhere_resume_exactly(tmp_path, method, _llm_env):
    argv = LLM + LLM_METHODS[method]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    codes = kill_chain(argv, tmp_path / "killed", "sat_llm.team.LLMTeam",
                       chain=("write:1", "update:2", "record:2", "write:2"))
    assert codes.count(-signal.SIGKILL) >= 3, codes
    assert main(["train", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    full, killed = records(tmp_path / "full"), records(tmp_path / "killed")
    assert len(full) == len(killed) == 2 * (2 + 1)
    assert any(r.get("opt_steps") for r in full), "the updates should change the adapters"
    for a, b in zip(full, killed, strict=True):
        assert a == b, (a["kind"], a.get("stage"), a.get("step"),
                        {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)})
    for k in range(3):  # per-problem held-out results after k stages, also after kills
        name = f"eval_{k}.jsonl"
        assert (tmp_path / "full" / name).read_text() == (tmp_path / "killed" / name).read_text()
        assert (tmp_path / "full" / name).read_text().count("\n") == 2  # --n-eval 2
