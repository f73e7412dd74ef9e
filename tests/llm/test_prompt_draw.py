"""``--prompt-draw epoch``: one permutation of the training pool per epoch, cut into chunks of
``prompts`` problems (TRL's ``RepeatSampler``), against the default independent draws; the
chunk of a rollout depends on its index and the seed only, so ``--resume`` draws the same."""

import json
from collections import Counter

import numpy as np
import pytest

from sat_llm.episodes import epoch_chunk
from sat_theory.cli import main
from sat_theory.errors import InputError


@pytest.mark.parametrize("N,B", [(10, 3), (8, 8), (100, 8), (7, 1)])
def test_an_epoch_draws_every_problem_at_most_once_and_drops_only_the_remainder(N, B):
    per = N // B
    for e in range(3):
        chunks = [epoch_chunk(N, B, e * per + c, seed=4) for c in range(per)]
        flat = np.concatenate(chunks)
        assert all(len(c) == B for c in chunks)
        assert len(set(flat.tolist())) == per * B  # distinct within the epoch: N mod B dropped
        assert set(flat.tolist()) <= set(range(N))


def test_over_whole_epochs_every_problem_is_drawn_equally_often_when_B_divides_N():
    counts = Counter(np.concatenate([epoch_chunk(12, 4, r, seed=0) for r in range(3 * 5)]).tolist())
    assert set(counts.values()) == {5} and len(counts) == 12


def test_the_epochs_differ_and_follow_the_seed():
    a = [epoch_chunk(20, 5, r, seed=1).tolist() for r in range(8)]
    assert a == [epoch_chunk(20, 5, r, seed=1).tolist() for r in range(8)]
    assert a != [epoch_chunk(20, 5, r, seed=2).tolist() for r in range(8)]
    assert sorted(sum(a[:4], [])) == sorted(sum(a[4:], [])) and a[:4] != a[4:]


def test_more_problems_per_rollout_than_the_pool_is_refused():
    with pytest.raises(InputError, match="at most 4 problems per rollout"):
        epoch_chunk(4, 5, 0, seed=0)


pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

TINY = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy", "--agents", "1",
        "--method", "no-tr", "--prompts", "3", "--group-size", "2", "--max-new-tokens", "3",
        "--n-train", "7", "--n-eval", "2", "--quiet"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


def _team(**kw):
    from sat_llm.config import LLMConfig
    from sat_llm.team import LLMTeam

    return LLMTeam(LLMConfig(model="tiny-random", task="copy", agents=1, max_new_tokens=3,
                             n_train=7, n_eval=2, **kw))


def test_the_team_draws_the_epoch_chunks_and_the_default_draws_independently():
    team = _team(prompt_draw="epoch", seed=3)
    got = [team.rollout(3, 2).extra["problems"] for _ in range(4)]
    assert got == [epoch_chunk(7, 3, r, seed=3).tolist() for r in range(4)]
    indep = _team(seed=3)
    assert [indep.rollout(3, 2).extra["problems"] for _ in range(4)] != got


def _records(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def test_epoch_draws_resume_exactly_and_config_json_records_them(tmp_path):
    whole, part = tmp_path / "whole", tmp_path / "part"
    flags = TINY + ["--prompt-draw", "epoch", "--seed", "5"]
    assert main(flags + ["--stages", "4", "--out", str(whole)]) == 0
    assert main(flags + ["--stages", "2", "--out", str(part)]) == 0
    assert main(["train", "--backend", "llm", "--resume", str(part), "--stages", "4",
                 "--quiet"]) == 0
    # the machine's measurements aside (tests/llm/test_llm_step_records.py's TIMING)
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("seconds", "peak_memory_bytes")}  # noqa: E731
                        for r in rs]
    assert strip(_records(part)) == strip(_records(whole))
    assert json.loads((whole / "config.json").read_text())["backend"]["llm"]["prompt_draw"] == "epoch"


def test_an_unknown_prompt_draw_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(TINY + ["--stages", "1", "--prompt-draw", "shuffle", "--out",
                        str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'shuffle'" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("method,seed,problem_seed", [("plain-epoch", 2, None),
                                                      ("plain-epoch-rerun", 1002, "2")])
def test_the_study_runs_plain_with_epoch_draws_and_its_rerun_on_the_same_problems(
        tmp_path, monkeypatch, method, seed, problem_seed):
    from experiments import llm_team_learning as study

    got = {}
    monkeypatch.setattr(study, "run_ours", lambda cfg, m, s, out, resume, units, **kw:
                        got.update(seed=s, flags=kw["flags"]))
    study._train_one(study.StudyConfig(), method, 2, tmp_path, tmp_path, False, 48,
                     list(range(4, 49, 4)), {})
    flags = got["flags"]
    assert flags[:len(study.PLAIN_FLAGS)] == study.PLAIN_FLAGS and got["seed"] == seed
    assert flags[flags.index("--prompt-draw") + 1] == "epoch"
    assert (flags[flags.index("--problem-seed") + 1] if "--problem-seed" in flags else None) \
        == problem_seed
    assert method in study.OURS_STUDY and study.parse_run(f"{method}_lr0.001_s2")[1] == method


def test_study_noise_replays_epoch_draws_from_the_runs_seed():
    from experiments.study_noise import epoch_prompt_counts, ours_prompt_counts

    c = epoch_prompt_counts(3, 100, 8, 48)  # a study run: 48 rollouts of 8 of 100 problems
    # 12 chunks an epoch, 4 epochs, each dropping 4 problems: at most one draw per epoch
    assert c.sum() == 48 * 8 and c.max() <= 4
    indep = ours_prompt_counts(3, 100, 8, 48)
    assert indep.max() > 4 and c.std() < indep.std()
    assert not np.array_equal(c, epoch_prompt_counts(4, 100, 8, 48))
