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

import signal

import pytest

from sat_theory.cli import main
from tests.faults import kill_chain, records, run_killed

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
