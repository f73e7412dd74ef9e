"""Smoke tests of the LLM learning study (experiments/llm_team_learning.py) on tiny-random,
and its statistics (the paired bootstrap of the held-out gain)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")
pytest.importorskip("peft")

from experiments import llm_team_learning as study  # noqa: E402

TINY = ["--model", "tiny-random", "--n-train", "12", "--n-eval", "8", "--prompts", "2",
        "--group-size", "2", "--max-new-tokens", "4", "--minibatch", "4"]


def test_paired_bootstrap_exact_cases():
    same = {i: float(i % 2) for i in range(20)}
    assert study.paired_bootstrap(same, same) == (0.0, 0.0, 0.0)
    flipped = {i: 1.0 for i in range(20)}
    zeros = {i: 0.0 for i in range(20)}
    assert study.paired_bootstrap(zeros, flipped) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError):
        study.paired_bootstrap(zeros, {0: 1.0})


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=5, max_size=60))
def test_paired_bootstrap_interval_contains_the_gain(pairs):
    before = {i: float(b) for i, (b, _) in enumerate(pairs)}
    after = {i: float(a) for i, (_, a) in enumerate(pairs)}
    gain, lo, hi = study.paired_bootstrap(before, after, reps=2000)
    assert gain == pytest.approx(np.mean([a - b for b, a in pairs]))
    assert lo <= gain + 1e-12 and gain <= hi + 1e-12


def test_study_runs_resumes_and_reports(tmp_path):
    out = tmp_path / "study"
    assert study.main(["--method", "sat", "--seed", "0", "--stages", "2", *TINY,
                       "--out", str(out)]) == 0
    d = out / "sat_s0"
    assert json.loads((d / "study.json").read_text())["finished"]
    assert not list(d.glob("checkpoint*"))  # adapters stay out of git
    rows = [json.loads(x) for x in (d / "eval_2.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {"id", "answer", "final", "correct"} <= set(rows[0])
    # a finished run is skipped, not retrained
    assert study.main(["--method", "sat", "--seed", "0", "--stages", "2", *TINY, "--resume",
                       "--out", str(out)]) == 0
    assert study.main(["--report", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    (row,) = summary
    recomputed = np.mean([r["score"] for r in rows]) - np.mean(
        [json.loads(x)["score"] for x in (d / "eval_0.jsonl").read_text().splitlines()])
    assert row["gain"] == pytest.approx(recomputed)
    assert (out / "learning.png").is_file() and (out / "learning.pdf").is_file()


def test_study_refuses_to_overwrite_a_run(tmp_path):
    out = tmp_path / "study"
    (out / "naive_s0").mkdir(parents=True)
    (out / "naive_s0" / "metrics.jsonl").write_text("")
    with pytest.raises(SystemExit):
        study.main(["--method", "naive", "--seed", "0", "--stages", "1", *TINY, "--out", str(out)])


def test_a_task_too_small_fails_before_any_model_loads(tmp_path, capsys, monkeypatch):
    """The README's old example asked one-digit arithmetic (243 problems) for 512 training
    problems: now one line naming the numbers, exit 2, and no model is ever loaded."""
    import sat_llm.models as models
    from sat_theory.cli import main

    def boom(*a, **k):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(models, "load_model", boom)
    rc = main(["train", "--backend", "llm", "--task-option", "digits=1", "--n-train", "512",
               "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "243" in err and "512" in err and "--n-eval 200" in err
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_llm_defaults_are_the_studys_settings():
    """``sat train --backend llm`` with no tuning flags trains with the study's settings."""
    import argparse

    from sat_llm.cli_args import LLM_DEFAULTS
    from sat_llm.tasks import make_task
    from sat_theory.commands.train import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--backend", "llm"])
    s = study.StudyConfig()
    assert (a.model, a.max_new_tokens, a.temperature, a.llm_lr, a.minibatch, a.n_train,
            a.n_eval) == (s.model, s.max_new_tokens, s.temperature, s.lr, s.minibatch,
                          s.n_train, s.n_eval)
    assert (LLM_DEFAULTS["groups"], LLM_DEFAULTS["group_size"], LLM_DEFAULTS["delta"]) == (
        s.prompts, s.group_size, s.delta)
    t = make_task("arithmetic")
    assert (t.lo, t.hi, t.ops) == (s.lo, s.hi, s.ops) and t.capacity() == 300


def test_plug_and_play_study_swaps_in_the_single_agent(tmp_path):
    out = tmp_path / "study"
    for method in ("sat", "single", "swap-stage0"):
        assert study.main(["--method", method, "--seed", "0", "--stages", "1", *TINY,
                           "--out", str(out)]) == 0
    d = out / "swap-stage0_s0"
    recs = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    (swap,) = [r for r in recs if r["kind"] == "swap"]
    assert swap["strategy"] == "stage0" and swap["agent"] == 1
    assert (d / "eval_0_swap.jsonl").is_file()
    assert study.main(["--report", "--out", str(out)]) == 0
    row = next(r for r in json.loads((out / "summary.json").read_text())
               if r["run"] == "swap-stage0_s0")
    assert row["shock"] == pytest.approx(swap["J_after_swap"] - swap["J_before_swap"])
    assert (out / "plug_and_play.png").is_file()


@pytest.mark.parametrize("peer", ["trl", "comlrl"])
def test_peer_runs_are_evaluated_by_our_held_out_evaluation(tmp_path, peer):
    pytest.importorskip(peer)
    out = tmp_path / "study"
    assert study.main(["--method", peer, "--seed", "0", "--stages", "1", *TINY,
                       "--out", str(out)]) == 0
    d = out / f"{peer}_s0"
    assert json.loads((d / "study.json").read_text())["finished"]
    evals = sorted(d.glob("eval_*.jsonl"))
    assert len(evals) == 2  # untrained and after the run
    tokens, secs, acc = study.curve(d)
    assert tokens[0] == 0 and tokens[-1] > 0 and len(acc) == 2
