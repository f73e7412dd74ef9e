"""``--problem-seed``: the problems (training pool, held-out set) follow it; everything random
else follows ``--seed``. A rerun of a run is the same ``--problem-seed`` with another
``--seed`` (the noise floor of the study's parity test, experiments/llm_team_learning.py)."""

import json

import pytest

from sat_llm.config import LLMConfig
from sat_llm.team import task_setup
from sat_theory.cli import main


def _problems(**kw):
    _, _, pool, held_out = task_setup(LLMConfig(task="arithmetic", n_train=40, n_eval=20, **kw))
    return [p.prompt for p in pool], [p.prompt for p in held_out]


def test_the_problems_follow_problem_seed_not_seed():
    assert _problems(seed=7, problem_seed=3) == _problems(seed=0, problem_seed=3) == _problems(seed=3)
    assert _problems(seed=7, problem_seed=3) != _problems(seed=7)


def test_without_problem_seed_the_seed_chooses_the_problems():
    assert LLMConfig(seed=5).problems_seed == 5 and LLMConfig(seed=5, problem_seed=2).problems_seed == 2
    assert _problems(seed=1) != _problems(seed=2)


pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

TINY = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy", "--agents", "1",
        "--stages", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4",
        "--n-train", "8", "--n-eval", "2", "--quiet"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


def _eval_prompts(out):
    return [json.loads(x)["prompt"] for x in (out / "eval_0.jsonl").read_text().splitlines()]


def test_a_rerun_with_another_seed_sees_the_same_problems_and_records_problem_seed(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(TINY + ["--seed", "0", "--out", str(a)]) == 0
    assert main(TINY + ["--seed", "1000", "--problem-seed", "0", "--out", str(b)]) == 0
    assert main(TINY + ["--seed", "1000", "--out", str(c)]) == 0
    assert json.loads((b / "config.json").read_text())["backend"]["llm"]["problem_seed"] == 0
    assert _eval_prompts(a) == _eval_prompts(b) != _eval_prompts(c)


def test_a_saved_run_from_before_problem_seed_resumes(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(TINY + ["--stages", "2", "--out", str(out)]) == 0
    # an older config.json has no problem_seed: it means the seed chose the problems
    conf = json.loads((out / "config.json").read_text())
    del conf["backend"]["llm"]["problem_seed"]
    (out / "config.json").write_text(json.dumps(conf))
    assert main(["train", "--backend", "llm", "--resume", str(out), "--quiet"]) == 0
