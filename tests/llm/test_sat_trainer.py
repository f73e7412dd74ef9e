"""``SATTrainer`` (TRL-style Python API): one agent with a reward function gives the records
of the equivalent ``sat train``; it resumes, and its settings are ``sat train``'s."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

pytest.importorskip("torch")
pytest.importorskip("datasets")

from sat_llm.config import ALGORITHM_DEFAULTS, LLMConfig  # noqa: E402
from sat_llm.trainer import SATConfig, SATTrainer  # noqa: E402
from sat_theory.algorithm import TrainConfig  # noqa: E402
from sat_theory.cli import main  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402
from tests.llm.trainer_data import EVAL, SIZES, TRAIN, exact_answer, records  # noqa: E402


def test_sat_config_is_made_of_the_fields_sat_train_makes_its_flags_from():
    names = {f.name: f for f in fields(SATConfig)}
    algorithm = {f.name for f in fields(TrainConfig)}
    for f in fields(TrainConfig):
        assert names[f.name].metadata == f.metadata
    for f in fields(LLMConfig):  # seed and eps_w: one setting, the algorithm's
        assert names[f.name].metadata == f.metadata or f.name in algorithm
    c = SATConfig()
    assert c.train_config() == TrainConfig(**ALGORITHM_DEFAULTS)
    assert c.llm_config() == LLMConfig()
    with pytest.raises(InputError, match="eps_w"):
        SATConfig(eps_w=2.0)


def test_one_agent_with_a_reward_function_gives_the_records_of_sat_train(tmp_path):
    out = tmp_path / "trainer"
    trainer = SATTrainer(models=["tiny-random"], reward_funcs=exact_answer,
                         args=SATConfig(output_dir=str(out), **{k: v for k, v in SIZES.items()
                                                                if k != "model"}),
                         train_dataset=TRAIN, eval_dataset=EVAL)
    summary = trainer.train()
    assert summary["stages"] == 2
    cli = tmp_path / "cli"
    assert main(["train", "--backend", "llm", "--model", "tiny-random", "--agents", "1",
                 "--stages", "2", "--groups", "2", "--group-size", "2", "--n-train", "4",
                 "--n-eval", "2", "--max-new-tokens", "4", "--threads", "1",
                 "--dataset", str(trainer.data_dir), "--split", "train", "--eval-split", "test",
                 "--checker", "exact", "--report-to", "none", "--out", str(cli), "--quiet"]) == 0
    a, b = records(out), records(cli)
    assert len(a) == len(b) == 4 and a == b
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (out, cli))
    assert ca["algorithm"] == cb["algorithm"] and ca["backend"]["llm"] == cb["backend"]["llm"]
    assert ca["backend"]["reward_funcs"] == [f"{exact_answer.__module__}.exact_answer"]
    assert (out / "eval_2.jsonl").read_text() == (cli / "eval_2.jsonl").read_text()


def test_a_reward_function_run_resumes_through_the_trainer_only(tmp_path, capsys):
    def constant(prompts, completions, **kw):
        return [0.5 for _ in completions]

    args = dict(SIZES, model=None)
    args.pop("model")
    full = SATTrainer("tiny-random", [constant, exact_answer], reward_weights=[1.0, 0.5],
                      args=SATConfig(output_dir=str(tmp_path / "full"), **args),
                      train_dataset=TRAIN)
    full.train()
    part = SATTrainer("tiny-random", [constant, exact_answer], reward_weights=[1.0, 0.5],
                      args=SATConfig(output_dir=str(tmp_path / "part"), **{**args, "stages": 1}),
                      train_dataset=TRAIN)
    part.train()
    rc = main(["train", "--resume", str(tmp_path / "part"), "--stages", "2"])
    assert rc == 2 and "SATTrainer" in capsys.readouterr().err
    again = SATTrainer("tiny-random", [constant, exact_answer], reward_weights=[1.0, 0.5],
                       args=SATConfig(output_dir=str(tmp_path / "part"), **args),
                       train_dataset=TRAIN)
    again.train(resume_from_checkpoint=True)
    assert records(tmp_path / "part") == records(tmp_path / "full")
    stage = [r for r in records(tmp_path / "full") if r["kind"] == "stage"][0]
    assert stage["J_before"] >= 0.5  # the constant reward is in every score


def test_bad_trainer_arguments_are_one_clear_error(tmp_path):
    args = SATConfig(output_dir=str(tmp_path / "r"))
    with pytest.raises(InputError, match="PreTrainedModel"):
        SATTrainer(models=[object()], reward_funcs=exact_answer, args=args, train_dataset=TRAIN)
    with pytest.raises(InputError, match="callable"):
        SATTrainer(models="tiny-random", reward_funcs=[3], args=args, train_dataset=TRAIN)
    with pytest.raises(InputError, match="reward_weights"):
        SATTrainer("tiny-random", exact_answer, args=args, train_dataset=TRAIN,
                   reward_weights=[1.0, 2.0])
    (tmp_path / "r.dataset").mkdir()
    with pytest.raises(InputError, match="not written by SATTrainer"):
        SATTrainer("tiny-random", exact_answer, args=args, train_dataset=TRAIN).train()
