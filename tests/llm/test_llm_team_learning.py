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


# ------------------------------------------------------------------ the common-schedule study
def test_run_names_round_trip_and_bad_names_are_refused():
    for tune in (False, True):
        for m in study.STUDY_METHODS:
            name = study.run_name(m, 3e-4, 2, tune)
            assert study.parse_run(name) == (tune, m, 3e-4, 2)
    for bad in ("plain_s0", "ppo_lr0.001_s0", "plain_lr0.001_s0/../x"):
        with pytest.raises(SystemExit, match="not a run"):
            study.parse_run(bad)


def test_every_method_is_evaluated_on_the_same_message_grid():
    cfg = study.StudyConfig()
    for m in study.STUDY_METHODS:
        units, at = study.schedule(cfg, m)
        per = study.messages_per_unit(cfg, m)
        assert len(at) == cfg.budget and at[-1] == units
        for j, k in enumerate(at, 1):  # within half a unit of every grid point
            assert abs(k * per - j * study.GRID_MESSAGES) <= per / 2
    assert study.schedule(cfg, "plain") == (48, list(range(4, 49, 4)))
    assert study.schedule(cfg, "sat") == (12, list(range(1, 13)))
    # dr_grpo's minibatch loss is ours / c with c = L_max*mb/M = 16*8/32 = 4: clip 1 -> 0.25
    assert study.trl_drgrpo_clip(cfg) == 0.25


def _fake_run(out, name, scores, *, method_kl=0.01):
    """A finished run folder of the common-schedule study with hand-made eval files:
    ``scores[k]`` = the 0/1 list of checkpoint k (lenient; strict = lenient and format)."""
    tune, method, lr, seed = study.parse_run(name)
    d = out / name
    d.mkdir(parents=True)
    cfg = study.StudyConfig(budget=len(scores) - 1)
    units, at = study.schedule(cfg, method)
    for k, row in zip([0, *at], scores, strict=True):
        (d / f"eval_{k}.jsonl").write_text("".join(
            json.dumps(dict(id=i, prompt=f"p{i}", answer=1, final="Answer: 1" if x else "",
                            score=float(x), correct=bool(x), lenient=float(x), strict=float(x),
                            format_ok=bool(x))) + "\n" for i, x in enumerate(row)))
    (d / "metrics.jsonl").write_text(json.dumps(dict(kind="step", stage=0, seconds=60.0,
                                                     kl=method_kl, rollout_id=units)) + "\n")
    # the trainer's record, as each side writes it (what study_noise.py reads)
    conf = (dict(grpo=dict(seed=seed, generation_batch_size=cfg.prompts * cfg.group_size,
                           num_generations=cfg.group_size, max_grad_norm=1.0),
                 study=dict(n_train=cfg.n_train)) if method.startswith("trl") else
            dict(algorithm=dict(seed=seed, n_groups=cfg.prompts),
                 backend=dict(llm=dict(n_train=cfg.n_train, grad_clip=1.0))))
    (d / "config.json").write_text(json.dumps(conf))
    (d / "study.json").write_text(json.dumps(dict(
        run=name, method=method, lr=lr, seed=seed, tune=tune, finished=True, wall_seconds=120.0,
        study=study.asdict(cfg), load_start=[1.0, 1, 1], load_end=[2.0, 2, 2])))
    return d


def test_common_report_parity_numbers_recompute_from_the_eval_files(tmp_path):
    a = [[0, 0, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0]]  # accuracies 1/4, 1/2, 3/4
    b = [[0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]]  # 1/4, 1/4, 1/2
    _fake_run(tmp_path, "plain_lr0.001_s0", a)
    _fake_run(tmp_path, "trl-drgrpo_lr0.001_s0", b)
    t = study.report_common(tmp_path)
    (p,) = t["parity"]
    assert p["lenient_auc"][0] == pytest.approx((1 / 4 + 1 / 2 + 3 / 4) / 3 - (1 / 4 + 1 / 4 + 1 / 2) / 3)
    assert p["lenient_final"][0] == pytest.approx(0.25) and p["strict_final"][0] == pytest.approx(0.25)
    text = (tmp_path / "parity.md").read_text()
    assert "| 0 | 0.750 | 0.500 | 16.7 [" in text and text.count("not yet run") == 20
    assert p["noise_floor_auc"] is None and "- plain: seed 0 50.0" in text
    r = t["runs"]["plain_lr0.001_s0"]
    assert r["eval_share"] == pytest.approx(0.5) and r["kl_per_update"] == pytest.approx(0.01)
    assert "not yet (tuning runs missing)" in (tmp_path / "tuning.md").read_text()


def test_parity_noise_floor_is_trl_against_its_rerun_on_the_same_problems(tmp_path):
    """The parity table's last column: TRL dr_grpo minus the same algorithm rerun with TRL's
    own other seed (same problems), on the common checkpoints."""
    b = [[0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]]  # 1/4, 1/4, 1/2
    c = [[0, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # 1/4, 3/4, 1
    _fake_run(tmp_path, "plain_lr0.001_s0", b)
    _fake_run(tmp_path, "trl-drgrpo_lr0.001_s0", b)
    _fake_run(tmp_path, "trl-rerun_lr0.001_s0", c)
    (p,) = study.report_common(tmp_path)["parity"]
    assert p["noise_floor_auc"][0] == pytest.approx((1 / 4 + 1 / 4 + 1 / 2 - 1 / 4 - 3 / 4 - 1) / 3)
    assert "| yes | -33.3 [" in (tmp_path / "parity.md").read_text()
    assert study.queue_issue21()[6:9] == [f"trl-rerun_lr0.001_s{s}" for s in range(3)]


def test_chosen_rate_is_the_best_validation_auc_and_waits_for_every_tuning_run(tmp_path):
    rows = {3e-4: [[0, 0], [0, 1]], 1e-3: [[0, 0], [1, 1]], 3e-3: [[0, 0], [1, 1]]}
    for lr, sc in list(rows.items())[:2]:
        _fake_run(tmp_path, study.run_name("plain", lr, 0, tune=True), sc)
    assert study.chosen_lr(tmp_path, "plain") is None
    assert study.resolve(tmp_path, "plain_lr@3_s1") is None
    _fake_run(tmp_path, study.run_name("plain", 3e-3, 0, tune=True), rows[3e-3])
    assert study.chosen_lr(tmp_path, "plain") == 1e-3  # a tie with 3e-3: the smaller rate
    assert study.resolve(tmp_path, "plain_lr@3_s1") == study.run_name("plain", 3e-3, 1)


def test_rescore_fixes_old_records_from_their_final_messages(tmp_path):
    d = tmp_path / "single_s0"
    d.mkdir()
    (d / "study.json").write_text(json.dumps(dict(method="single", seed=0, finished=True,
                                                  study=study.asdict(study.StudyConfig()))))
    recs = [dict(id=0, prompt="Compute 4 + 5.", answer=9, final="Answer: 1 + 7 = 8. Answer: 9",
                 score=1.0, correct=True),
            dict(id=1, prompt="Compute 4 + 4.", answer=8, final="Answer: 8 + 0 = 8", score=1.0,
                 correct=True)]
    (d / "eval_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    counts = study.rescore(tmp_path)
    got = [json.loads(x) for x in (d / "eval_0.jsonl").read_text().splitlines()]
    assert counts == dict(files=1, records=2, lenient_changed=0)
    assert [(r["lenient"], r["strict"], r["format_ok"]) for r in got] == [(1.0, 1.0, True),
                                                                          (1.0, 0.0, False)]
    assert study.read_eval(d / "eval_0.jsonl", "strict") == {0: 1.0, 1: 0.0}


def test_report_section_of_the_common_study_is_generated_from_the_run_folders(tmp_path):
    from experiments import report

    assert "Not yet run" in report.section_llm_common(tmp_path / "nowhere")
    _fake_run(tmp_path, "plain_lr0.001_s0", [[0, 1, 0, 1], [1, 1, 0, 1], [1, 1, 0, 1]])
    _fake_run(tmp_path, "trl-drgrpo_lr0.001_s0", [[0, 1, 0, 1], [1, 0, 1, 1], [1, 0, 1, 1]])
    text = report.section_llm_common(tmp_path)
    assert "includes 0 on 1 of 1 seed(s) run" in text and f"Finished: 2 of the queue's {len(study.queue_issue21())}" in text
    assert (tmp_path / "parity.md").read_text() in text
    # the run-noise tables: the one pair (plain - TRL, equal accuracies: AUC difference 0)
    assert (tmp_path / "noise.md").read_text() in text
    assert "| plain_lr0.001_s0 − trl-drgrpo_lr0.001_s0 | +0.0 |" in text


def test_trl_rerun_keeps_the_seeds_problems_and_changes_trls_own_seed(tmp_path):
    """The noise-floor run: the same problems (held-out prompts) as trl-drgrpo of its seed,
    TRL's own seed RERUN_SEED + s, and therefore other samples."""
    pytest.importorskip("trl")
    cfg = study.StudyConfig(model="tiny-random", n_train=12, n_eval=8, prompts=2, group_size=2,
                            max_new_tokens=4, minibatch=4)
    runs = {}
    for m, kw in (("trl-drgrpo", {}), ("trl-rerun", dict(trainer_seed=study.RERUN_SEED))):
        d = study.run_study_trl(cfg, 0, tmp_path / m, steps=1, eval_every=1, loss_type="dr_grpo",
                                scale_rewards="none", **kw)
        conf = json.loads((d / "config.json").read_text())
        runs[m] = (conf["grpo"]["seed"], [json.loads(x) for x in
                                          (d / "eval_1.jsonl").read_text().splitlines()])
    (s0, e0), (s1, e1) = runs["trl-drgrpo"], runs["trl-rerun"]
    assert (s0, s1) == (0, study.RERUN_SEED)
    assert [r["prompt"] for r in e0] == [r["prompt"] for r in e1]
