"""The parity test's noise floor on our side: ``plain-rerun`` is ours-plain again on the same
seed's problems (``--problem-seed s``) with other random streams (``--seed RERUN_SEED + s``),
and the parity table sets it against the plain run of its seed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from experiments import llm_team_learning as study  # noqa: E402
from tests.llm.test_llm_team_learning import _fake_run  # noqa: E402


def _eval(d, k):
    return [json.loads(x) for x in (d / f"eval_{k}.jsonl").read_text().splitlines()]


def test_plain_rerun_keeps_the_seeds_problems_and_changes_our_seed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(study, "GRID_MESSAGES", 8)  # 2 stages of 2 prompts x 2 episodes
    cfg = study.StudyConfig(model="tiny-random", n_train=12, n_eval=8, prompts=2, group_size=2,
                            max_new_tokens=4, minibatch=4, budget=1, threads=1)
    runs = {m: study.run_one(cfg, study.run_name(m, 1e-3, 0), tmp_path, resume=False)
            for m in ("plain", "plain-rerun")}
    seeds = {m: (json.loads((d / "config.json").read_text())["algorithm"]["seed"],
                 json.loads((d / "config.json").read_text())["backend"]["llm"]["problem_seed"])
             for m, d in runs.items()}
    assert seeds == {"plain": (0, None), "plain-rerun": (study.RERUN_SEED, 0)}
    a, b = (_eval(runs[m], 2) for m in ("plain", "plain-rerun"))
    assert [r["prompt"] for r in a] == [r["prompt"] for r in b]


def test_parity_table_sets_plain_against_its_rerun(tmp_path):
    b = [[0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]]  # 1/4, 1/4, 1/2
    c = [[0, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # 1/4, 3/4, 1
    _fake_run(tmp_path, "plain_lr0.001_s0", c)
    _fake_run(tmp_path, "trl-drgrpo_lr0.001_s0", b)
    _fake_run(tmp_path, "plain-rerun_lr0.001_s0", b)
    (p,) = study.report_common(tmp_path)["parity"]
    assert p["noise_floor_auc"] is None
    assert p["noise_floor_plain_auc"][0] == pytest.approx((1 / 4 + 3 / 4 + 1 - 1 / 4 - 1 / 4 - 1 / 2) / 3)
    assert "| 33.3 [" in (tmp_path / "parity.md").read_text().splitlines()[2]
    assert study.queue_issue21()[9:12] == [f"plain-rerun_lr0.001_s{s}" for s in range(3)]


def test_the_plain_rerun_is_also_set_against_trl(tmp_path):
    from experiments.report import _run_noise_paragraph

    b = [[0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]]  # 1/4, 1/4, 1/2
    c = [[0, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # 1/4, 3/4, 1
    for name, sc in (("plain", c), ("trl-drgrpo", b), ("plain-rerun", c), ("trl-rerun", b)):
        _fake_run(tmp_path, f"{name}_lr0.001_s0", sc)
        _fake_run(tmp_path, f"{name}_lr0.001_s1", b)
    p0, p1 = study.report_common(tmp_path)["parity"]
    assert p0["plain_rerun_minus_trl_auc"][0] == pytest.approx(1 / 3)
    assert "the plain rerun against TRL dr_grpo, lenient AUC with its paired CI: seed 0 +33.3 [" \
        in _run_noise_paragraph([p0, p1])
