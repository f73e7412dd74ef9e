"""``eval_every``: the held-out evaluation only every K stages (and before training and after
the last), on both backends; training itself is untouched, and a killed run resumes exactly."""

from __future__ import annotations

import json
import signal

import pytest

from sat_theory.algorithm import RunState, TrainConfig, run_stage
from sat_theory.cli import main
from sat_theory.envs import random_mdp
from sat_theory.errors import InputError
from sat_theory.policy import TeamPolicy
from sat_theory.runner import RunFolder, Runner
from sat_theory.tabular_team import TabularTeam
from tests.faults import kill_chain, records

#: the fields the held-out evaluation feeds (the rest of a record is training)
EVAL_FIELDS = {"J_before", "J_after", "true_improvement", "holds", "violated", "eval_accuracy",
               "empirical_holds", "seconds", "peak_memory_bytes"}


class Counted:
    """A team that counts ``evaluate()`` calls and has per-problem ``eval_records()`` (so the
    runner writes ``eval_{k}.jsonl``); everything else is the wrapped team's."""

    def __init__(self, team):
        self._team, self.calls = team, 0

    def __getattr__(self, name):
        return getattr(self._team, name)

    def evaluate(self):
        self.calls += 1
        self._last = self._team.evaluate()
        return self._last

    def eval_records(self):
        return [dict(id=0, score=self._last)]


def tabular_team(mode="sampled"):
    mdp = random_mdp(4, 3, 2, layout="simultaneous", gamma=0.9, seed=3)
    return TabularTeam(mdp, TeamPolicy.uniform(mdp), mode=mode, seed=1)


def cfg(**kw):
    return TrainConfig(**{**dict(stages=7, n_groups=3, group_size=4, seed=2), **kw})


def run_folder(tmp_path, team, c, name="r"):
    with RunFolder(tmp_path / name) as folder:
        folder.claim(False)
        runner = Runner(team, c, folder=folder)
        log = []
        runner.log = lambda rec, _log=runner.log: (_log(rec), log.append(rec))
        summary = runner.start()
    return log, summary


def strip(rec, drop=("seconds",)):
    return {k: v for k, v in rec.items() if k not in drop}


def test_eval_every_1_gives_the_records_of_a_stage_loop_that_measures_every_stage(tmp_path):
    """The default is the old behaviour: every stage measured by ``run_stage`` itself."""
    for mode in ("exact", "sampled"):
        c = cfg(stages=4)
        runner_log, _ = run_folder(tmp_path, tabular_team(mode), c, name=mode)
        team, state, loop_log = tabular_team(mode), RunState.initial(c, 3), []
        team.evaluate()
        for _ in range(c.stages):
            run_stage(team, c, state, log=loop_log.append)
        assert [strip(r) for r in runner_log] == loop_log


@pytest.mark.parametrize("mode", ["exact", "sampled"])
def test_eval_every_3_over_7_stages_evaluates_after_0_3_6_and_7_stages_only(tmp_path, mode):
    team = Counted(tabular_team(mode))
    log, summary = run_folder(tmp_path, team, cfg(eval_every=3))
    assert team.calls == 4  # k = 0, 3, 6, 7: nothing else calls evaluate()
    files = sorted(p.name for p in (tmp_path / "r").glob("eval_*.jsonl"))
    assert files == ["eval_0.jsonl", "eval_3.jsonl", "eval_6.jsonl", "eval_7.jsonl"]
    stages = [r for r in log if r["kind"] == "stage"]
    measured_after = [r["stage"] + 1 for r in stages if r["J_after"] is not None]
    measured_before = [r["stage"] for r in stages if r["J_before"] is not None]
    assert measured_after == [3, 6, 7] and measured_before == [0, 3, 6]
    for r in stages:
        if r["J_after"] is None or r["J_before"] is None:
            if r["lower_bound_source"] == "estimated":  # J_after − J_before is unknown
                assert r["true_improvement"] is None and r["holds"] is None
        else:  # the next stage starts from the score measured here
            assert r["J_after"] == pytest.approx(r["J_before"] + r["true_improvement"])
    for a, b in zip(stages, stages[1:], strict=False):
        assert b["J_before"] == a["J_after"]
    assert summary["J_end"] == stages[-1]["J_after"] == TabularTeam.evaluate(team._team)
    # the scores that were measured are the ones eval_every=1 measures
    full, _ = run_folder(tmp_path, tabular_team(mode), cfg(), name="full")
    full_stages = [r for r in full if r["kind"] == "stage"]
    for a, b in zip(stages, full_stages, strict=True):
        if a["J_after"] is not None:
            assert a["J_after"] == b["J_after"]


def test_eval_every_changes_no_training_number(tmp_path):
    a, _ = run_folder(tmp_path, tabular_team(), cfg(eval_every=2), name="a")
    b, _ = run_folder(tmp_path, tabular_team(), cfg(), name="b")
    assert [strip(r, EVAL_FIELDS) for r in a] == [strip(r, EVAL_FIELDS) for r in b]
    assert [r["J_after"] for r in a if r["kind"] == "stage"] != \
        [r["J_after"] for r in b if r["kind"] == "stage"]  # and it does skip evaluations


def test_eval_every_is_refused_with_adaptive_delta_which_evaluates_every_step(capsys):
    with pytest.raises(InputError, match="adaptive"):
        TrainConfig(trust_region="adaptive", eval_every=2)
    TrainConfig(trust_region="adaptive", eval_every=1)  # the default is fine
    rc = main(["train", "--env", "chain", "--stages", "3", "--eval-every", "2",
               "--trust-region", "adaptive", "--out", "/nonexistent/never"])
    assert rc == 2 and "adaptive" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-1", "1.5", "x"])
def test_eval_every_flag_range_is_checked_while_parsing(capsys, bad):
    rc = main(["train", "--env", "chain", "--eval-every", bad, "--out", "/nonexistent/never"])
    assert rc == 2 and "--eval-every" in capsys.readouterr().err


def test_eval_every_is_in_help_config_json_and_a_repeated_run(tmp_path, capsys):
    main(["train", "--help"])
    assert "--eval-every" in capsys.readouterr().out
    argv = ["train", "--env", "chain", "--stages", "4", "--eval-every", "3", "--groups", "2",
            "--group-size", "3", "--quiet"]
    assert main(argv + ["--out", str(tmp_path / "a")]) == 0
    conf = json.loads((tmp_path / "a" / "config.json").read_text())
    assert conf["algorithm"]["eval_every"] == 3
    assert main(["train", "--config", str(tmp_path / "a" / "config.json"), "--out",
                 str(tmp_path / "b"), "--quiet"]) == 0
    assert records(tmp_path / "a") == records(tmp_path / "b")
    assert [r["J_after"] is None for r in records(tmp_path / "a") if r["kind"] == "stage"] == \
        [True, True, False, False]  # measured after 3 and 4 stages


def test_a_run_with_eval_every_killed_anywhere_resumes_exactly(tmp_path):
    argv = ["train", "--env", "random-turn", "--agents", "3", "--states", "5", "--stages", "5",
            "--horizon-tol", "0.1", "--seed", "4", "--delta", "0.05", "--groups", "2",
            "--group-size", "3", "--eval-every", "2", "--quiet"]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    chain = ("update:2", "write:6", "record:4", "update:3")
    codes = kill_chain(argv, tmp_path / "killed", "sat_theory.tabular_team.TabularTeam", chain)
    assert codes.count(-signal.SIGKILL) >= 3, codes
    assert main(["train", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    assert records(tmp_path / "full") == records(tmp_path / "killed")
    # more stages on resume: the new last stage is measured, the old last one stays measured
    assert main(["train", "--resume", str(tmp_path / "killed"), "--stages", "7", "--quiet"]) == 0
    stages = [r for r in records(tmp_path / "killed") if r["kind"] == "stage"]
    assert [r["J_after"] is not None for r in stages] == [False, True, False, True, True,
                                                         True, True]


def test_a_checkpoint_without_J_now_resumes_by_measuring_the_score(tmp_path):
    """Checkpoints written before eval_every lack ``J_now``: the runner measures it."""
    argv = ["train", "--env", "chain", "--stages", "3", "--groups", "2", "--group-size", "3",
            "--quiet"]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    assert main(argv[:4] + ["2"] + argv[5:] + ["--out", str(tmp_path / "old")]) == 0
    from sat_theory.checkpoint import load_state, save_state

    path = tmp_path / "old" / "checkpoint.safetensors"
    state = load_state(path)
    del state["J_now"]
    save_state(path, state)
    assert main(["train", "--resume", str(tmp_path / "old"), "--stages", "3", "--quiet"]) == 0
    assert records(tmp_path / "full") == records(tmp_path / "old")


def test_llm_team_with_eval_every_2_evaluates_three_times_in_3_stages(tmp_path):
    pytest.importorskip("torch")
    import sat_llm.checkpoint  # noqa: F401  (registers the LLM state types of checkpoints)
    from tests.llm.helpers import make_team

    team = make_team(agents=1)
    calls = []
    orig = team.evaluate
    team.evaluate = lambda: calls.append(1) or orig()
    c = TrainConfig(stages=3, eval_every=2, n_groups=2, group_size=2, delta=0.05)
    log, _ = run_folder(tmp_path, team, c)
    assert len(calls) == 3  # k = 0, 2, 3
    assert sorted(p.name for p in (tmp_path / "r").glob("eval_*.jsonl")) == \
        ["eval_0.jsonl", "eval_2.jsonl", "eval_3.jsonl"]
    stages = [r for r in log if r["kind"] == "stage"]
    assert [r["eval_accuracy"] is None for r in stages] == [True, False, False]
