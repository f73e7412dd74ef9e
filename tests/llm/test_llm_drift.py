"""Drift of the upstream agents within a stage (issue 22 item 4;
``experiments/llm_team_task.py``): the exact KL of each upstream adapter from its stage-start
weights, and the stale contexts of a reused batch, on a tiny random relay team."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import sat_llm.team as team_mod  # noqa: E402
from experiments.llm_team_task import drift_team_class, study_schedule  # noqa: E402
from sat_llm.kl import context_log_weights, upstream_agents  # noqa: E402
from sat_llm.tasks import Problem, Task  # noqa: E402
from sat_llm.team import LLMConfig  # noqa: E402
from sat_theory.algorithm import RunState, TrainConfig, run_stage  # noqa: E402
from sat_theory.cli import main  # noqa: E402

torch.set_num_threads(1)


class LowercaseTask(Task):
    """Score: the fraction of lowercase letters in the final message (varies even for a
    random character model, so advantages are not zero and the agents move)."""

    name = "lowercase"

    def _generate(self, rng):
        return Problem(f"Write lowercase letters. #{rng.randrange(10**6)}", None)

    def score(self, problem, final_message):
        return sum(c.islower() for c in final_message) / max(len(final_message), 1)


TASK = f"{__name__}:LowercaseTask"


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


def _stage(method, agents=3):
    """One stage of a tiny team with drift logging; the steps, the team and the
    adapters at the stage start (snapshots taken by the test, independently of the team)."""
    team = drift_team_class()(LLMConfig(model="tiny-random", task=TASK, agents=agents,
                                        max_new_tokens=4, n_train=16, n_eval=2, minibatch=8,
                                        lr=5e-2, seed=0, threads=1, device="cpu"))
    start = [team.snapshot(j) for j in range(agents)]
    cfg = TrainConfig(method=method, stages=1, n_groups=2, group_size=2, delta=10.0)
    steps, batches = [], []
    real = team.step_metrics

    def spy(agent, batch, update, kl):
        batches.append(batch)
        return real(agent, batch, update, kl)

    team.step_metrics = spy
    run_stage(team, cfg, RunState.initial(cfg, agents),
              log=lambda r: steps.append(r) if r["kind"] == "step" else None)
    return team, steps, batches, start


def test_naive_reuse_logs_upstream_kl_and_stale_weights():
    team, steps, batches, start = _stage("naive")
    assert [r["agent"] for r in steps] == [0, 1, 2]
    assert steps[0]["drift_upstream"] == [] and steps[0]["stale_logw_mean"] == 0.0
    last, batch = steps[-1], batches[-1]
    assert last["drift_upstream"] == [0, 1] and last["drift_kl"][2] is None
    for k in (0, 1):  # the stage-start adapters the team kept are the true ones
        want = team.kl(k, batch, start[k])["kl"]
        assert last["drift_kl"][k] == pytest.approx(want, rel=1e-9) and want > 0
    # log w recomputed turn by turn from the current upstream adapters
    logw = []
    for e, turn in batch.turns_of(2):
        total = 0.0
        for u in batch.episodes[e].turns:
            if u is turn:
                break
            now = team._score(u.agent, [u.context.ids], [u.action])[0].sum()
            total += now - u.logp
        logw.append(total)
    # (one row at a time vs the batched pass: float32 logits, roundoff ~1e-7)
    assert last["stale_logw_mean"] == pytest.approx(np.mean(logw), abs=1e-5)
    assert abs(last["stale_logw_mean"]) > 1e-3  # the upstream agents moved
    assert last["stale_frac"] == pytest.approx(np.mean(np.array(logw) < np.log(0.5)))


def test_sat_batches_are_fresh_but_upstream_drift_is_measured():
    team, steps, batches, start = _stage("sat")
    last, batch = steps[-1], batches[-1]
    assert last["stale_frac"] == 0.0 and abs(last["stale_logw_mean"]) < 1e-4
    assert last["drift_kl"][0] == pytest.approx(team.kl(0, batch, start[0])["kl"], rel=1e-9)
    assert last["drift_kl"][0] > 0


def test_context_weights_sum_the_upstream_turns_only():
    from sat_theory.team import Batch, Episode, Turn

    ep = Episode(group=0, ret=1.0, turns=[Turn(0, "c0", "m0", -1.0), Turn(1, "c1", "m1", -2.0),
                                          Turn(2, "c2", "m2", -3.0)])
    b = Batch(episodes=[ep], rollout_id=0)
    assert upstream_agents(b, 2) == [0, 1] and upstream_agents(b, 0) == []
    w = context_log_weights(b, 2, {0: [-0.5], 1: [-2.5]})
    assert w.tolist() == [(-0.5 + 1.0) + (-2.5 + 2.0)]
    assert context_log_weights(b, 1, {0: [-1.0]}).tolist() == [0.0]


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("method", ["sat", "naive", "joint", "no-tr"])
def test_every_method_samples_the_same_message_budget_in_training(tmp_path, method, n):
    """The study's schedule (:func:`study_schedule`) gives every method the stages that
    sample one budget unit, ``n² · episodes`` messages, counted from what training actually
    drew (the last stage record's cumulative episodes, ``n`` messages each); no-tr resamples
    before every update as SAT does (intermediate occupancy)."""
    import json

    from experiments.llm_team_task import messages_per_stage

    episodes = 2 * 2  # prompts x group size
    stages, every = study_schedule(method, n, episodes, 1)
    assert every * messages_per_stage(method, n, episodes) == n * n * episodes
    out = tmp_path / "run"
    assert main(["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
                 "--agents", str(n), "--stages", str(stages), "--prompts", "2",
                 "--group-size", "2", "--max-new-tokens", "2", "--n-train", "8",
                 "--n-eval", "2", "--threads", "1", "--quiet", "--method", method,
                 "--out", str(out)]) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in recs if r["kind"] == "stage"][-1]
    assert last["episodes"] * n == n * n * episodes


@pytest.mark.parametrize("method", ["naive", "sat"])
def test_drift_records_survive_kill_and_resume(tmp_path, monkeypatch, method):
    import signal

    from tests.faults import records, run_killed

    monkeypatch.setattr(team_mod, "LLMTeam", drift_team_class())
    argv = ["train", "--backend", "llm", "--model", "tiny-random", "--task", TASK,
            "--agents", "3", "--stages", "2", "--prompts", "2", "--group-size", "2",
            "--max-new-tokens", "3", "--n-train", "8", "--n-eval", "2", "--delta", "0.002",
            "--llm-lr", "0.01", "--threads", "1", "--quiet", "--method", method]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    out = str(tmp_path / "killed")
    resume = ["--allow-task-import", "train", "--resume", out, "--quiet"]  # the task is a class
    codes = [run_killed(argv + ["--out", out], "write:1", "sat_llm.team.LLMTeam")]
    codes += [run_killed(resume, p, "sat_llm.team.LLMTeam") for p in ("update:2", "record:2")]
    assert codes.count(-signal.SIGKILL) == 3, codes
    assert main(resume) == 0
    full = records(tmp_path / "full")
    steps = [r for r in full if r["kind"] == "step"]
    assert all("stale_frac" in r for r in steps)
    assert any(r["drift_kl"][0] for r in steps if r["agent"] > 0)  # agent 0 did move
    assert full == records(tmp_path / "killed")


def test_study_run_smoke(tmp_path, monkeypatch):
    """One relay study run end to end (tiny model, one budget unit): sat train with the
    method's flags, the common evaluation schedule, drift fields, study.json, the report."""
    import json

    from experiments.llm_team_task import report, run_study

    # run_study installs drift logging into sat_llm.team: undone after the test
    monkeypatch.setattr(team_mod, "LLMTeam", team_mod.LLMTeam)
    tiny = dict(model="tiny-random", n_train=8, n_eval=2, prompts=2, group_size=2,
                max_new_tokens=3)
    for m in ("naive", "sat"):
        run_study(m, 2, 0, tmp_path, False, 1, **tiny)
    d = tmp_path / "n2" / "naive_s0"
    assert json.loads((d / "study.json").read_text())["finished"]
    assert sorted(f.name for f in d.glob("eval_*.jsonl")) == ["eval_0.jsonl", "eval_2.jsonl"]
    steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    assert all("stale_frac" in r for r in steps if r["kind"] == "step")
    rows = report(tmp_path)["rows"]
    assert {r["method"] for r in rows} == {"naive", "sat"}
    assert "sat_minus_lenient" in next(r for r in rows if r["method"] == "naive")
