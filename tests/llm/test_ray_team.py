"""``RayTeam`` (agents as Ray actors) against the in-process ``LLMTeam``, on a local Ray
cluster that this module starts and stops itself (tiny random model, CPU).

- the same seed gives the same metrics, record by record, bit for bit (one torch thread in
  both worlds; the sampling RNG state travels with each generation call), the behaviour
  log-prob check's statistics included (they travel with the calls too); only the peak
  memory, a measurement of each process, differs;
- the team records the dtype its actors resolved, as ``LLMTeam`` does;
- an agent actor killed in the middle of a stage is restarted by Ray, reloads its last
  checkpoint, and the run's metrics are again exactly the in-process ones (nothing lost).
"""

import json
import math
import os

import numpy as np
import pytest

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_llm.checkpoint import load_checkpoint  # noqa: E402
from sat_llm.ray_team import (  # noqa: E402
    AgentWorker,
    RayOptions,
    RayTeam,
    build_ray_team,
    ray_options,
)
from sat_llm.team import LLMTeam  # noqa: E402
from sat_theory.algorithm import TrainConfig  # noqa: E402
from sat_theory.cli import build_parser, main  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402
from sat_theory.metrics import RunWriter  # noqa: E402
from sat_theory.runner import RunFolder, Runner  # noqa: E402
from sat_theory.team import Batch, Episode  # noqa: E402
from tests.llm.helpers import LOWERCASE_TASK, llm_cfg  # noqa: E402

torch.set_num_threads(1)  # the actors get one CPU each, hence one torch thread: same kernels


# δ small enough that some steps backtrack (restore + β growth run through the actors too)
ALG = dict(method="sat", stages=2, n_groups=2, group_size=2, delta=0.002, seed=0)


def _records(path):
    """The run's records without the machine measurements (wall time, peak memory); every
    step record did measure its peak memory and ran the behaviour log-prob check (so the
    comparison of ``logp_diff_*`` is not one of two Nones)."""
    out = []
    for line in open(path):
        r = json.loads(line)
        r.pop("seconds", None)
        peak = r.pop("peak_memory_bytes", None)
        if r["kind"] == "step":
            assert isinstance(peak, int) and peak > 0, r
            assert r["logp_diff_max"] >= r["logp_diff_mean"] >= 0, r
        out.append(r)
    return out


def _run(team, out, runner_cls=Runner, **alg):
    cfg = TrainConfig(**{**ALG, **alg})
    with RunFolder(out) as folder, RunWriter(str(out)) as writer:
        runner_cls(team, cfg, writer=writer, folder=folder).start()
    return _records(out / "metrics.jsonl")


def _assert_same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            x, y = ra[k], rb[k]
            if isinstance(x, float) and isinstance(y, float) and math.isnan(x):
                assert math.isnan(y), k
            else:
                assert x == y, (ra["kind"], ra.get("stage"), ra.get("step"), k, x, y)


@pytest.fixture(scope="module")
def cluster():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the actors import the task by name ("tests.llm.helpers:LowercaseTask"): the repository
    # root on their path
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run's metrics records (one stage of a two-agent team)."""
    out = tmp_path_factory.mktemp("inproc")
    recs = _run(LLMTeam(llm_cfg()), out, stages=1)
    steps = [r for r in recs if r["kind"] == "step"]
    assert len(steps) == 2 and any(r["opt_steps"] for r in steps)
    assert any(r["backtracks"] for r in steps), "the test should exercise restore"
    return recs


# a heterogeneous team (each actor loads only its own base), a random router (several
# speakers per turn: sequential sampling, parallel greedy evaluation) and a plug-and-play
# swap with Stage-0 distillation (new_agent, replace, align's own rollout/update/kl calls)
HETERO = dict(agents=3, router="random", agent_models=("tiny-random",) * 3)
SWAP = dict(swap_stage=1, swap_agent=1, swap_kind="random", swap_strategy="stage0",
            delta_align=5e-4)


def test_ray_team_equals_in_process(cluster, tmp_path):
    inproc = LLMTeam(llm_cfg(**HETERO))
    ref = _run(inproc, tmp_path / "inproc", **SWAP)
    swap = [r for r in ref if r["kind"] == "swap"]
    assert len(swap) == 1 and swap[0]["align_steps"] > 0
    cfg = llm_cfg(**HETERO, dtype="auto")
    team = RayTeam(cfg, RayOptions(agent_cpus=0.5, checkpoint_dir=str(tmp_path / "agents")))
    try:
        # 'auto' resolved by the actors and recorded, as in process
        assert (cfg.device, cfg.dtype) == (inproc.cfg.device, inproc.cfg.dtype) == ("cpu", "float32")
        got = _run(team, tmp_path / "ray", **SWAP)
        info = team.info()
    finally:
        team.close()
    assert [i["k"] for i in info] == [0, 0, 0]  # one base per actor
    pids = {i["pid"] for i in info}
    assert len(pids) == 3 and os.getpid() not in pids  # three separate agent processes
    _assert_same(got, ref)


class KillingRunner(Runner):
    """Kills the actor of the agent just updated after stage 0's first step (after the
    run's own checkpoint), so its next generation call meets a restarting actor."""

    killed: list = []

    def on_step(self, rec, position):
        super().on_step(rec, position)
        if rec["stage"] == 0 and rec["step"] == 1:
            self.killed.append((rec["agent"], self.team.info()[rec["agent"]]["pid"]))
            ray.kill(self.team.actors[rec["agent"]], no_restart=False)


def test_killed_actor_restarts_from_checkpoint(cluster, reference, tmp_path):
    team = build_ray_team(llm_cfg(), out=tmp_path)
    try:
        got = _run(team, tmp_path, KillingRunner, stages=1)
        info = team.info()
    finally:
        team.close()
    (j, old_pid), = KillingRunner.killed
    assert info[j]["reconstructed"] and info[j]["loaded_checkpoint"]
    assert info[j]["pid"] != old_pid
    assert not info[1 - j]["reconstructed"]
    assert (tmp_path / "agents" / f"agent{j}" / "checkpoint.safetensors").is_file()
    _assert_same(got, reference)  # the stage completed with nothing lost or repeated


def test_worker_snapshot_round_trip_without_ray(tmp_path):
    """The actor class is plain Python: a restore puts weights and optimizer state back, and
    a fresh worker on the same folder does not pick up the old checkpoint (no reconstruction)."""
    cfg = llm_cfg()
    w = AgentWorker(cfg.to_dict(), 1, str(tmp_path))
    snap = w.snapshot()
    assert snap.agent == 1 and snap.base == "tiny-random"
    new = w.new_agent("random", 5)
    w.replace(new, 7)
    assert w.info()["version"] == 7
    changed = w.state()["weights"]
    assert any(not torch.equal(changed[k], snap.weights[k]) for k in changed)
    w.restore(snap)
    back = w.state()["weights"]
    assert all(torch.equal(back[k], snap.weights[k]) for k in back)
    saved = load_checkpoint(tmp_path / "agent1")
    assert all(torch.equal(saved["weights"][k], snap.weights[k]) for k in back)
    w2 = AgentWorker(cfg.to_dict(), 1, str(tmp_path))
    assert not w2.info()["loaded_checkpoint"]
    bad = w.snapshot()
    bad.base = "other"
    with pytest.raises(InputError, match="cannot restore"):
        w.restore(bad)


def test_team_larger_than_cluster_is_refused(cluster):
    with pytest.raises(InputError, match="exceed the Ray cluster's 2 CPU"):
        RayTeam(llm_cfg(agents=3))  # 3 agents x 1 CPU on a 2-CPU cluster
    with pytest.raises(InputError, match="--agent-gpus"):
        RayTeam(llm_cfg(), RayOptions(agent_gpus=1))


def test_bad_options_are_input_errors():
    with pytest.raises(InputError, match="agent_gpus"):
        RayOptions(agent_gpus=-1)
    with pytest.raises(InputError, match="max_restarts"):
        RayOptions(max_restarts=-1)
    assert np.isclose(RayOptions().agent_cpus, 1.0)


def test_train_flags_give_ray_options(tmp_path):
    args = build_parser(only="train").parse_args(
        ["train", "--backend", "llm", "--executor", "ray", "--agent-gpus", "0.5",
         "--agent-cpus", "2", "--ray-address", "auto"])
    assert args.executor == "ray"
    opts = ray_options(args, out=tmp_path)
    assert (opts.agent_gpus, opts.agent_cpus, opts.ray_address) == (0.5, 2.0, "auto")
    assert opts.checkpoint_dir == str(tmp_path / "agents")
    assert ray_options().to_dict() == RayOptions().to_dict()
    assert build_parser(only="train").parse_args(["train"]).executor == "serial"


def test_tabular_backend_refuses_ray(capsys, tmp_path):
    rc = main(["train", "--env", "bandit", "--executor", "ray", "--out", str(tmp_path)])
    assert rc == 2 and "needs --backend llm" in capsys.readouterr().err


def test_retried_update_is_applied_once(tmp_path, monkeypatch):
    """An actor that died after checkpointing an update but before replying: Ray retries
    the call on the restarted actor, which returns the recorded result (no second step); a
    new call id does step again."""
    team = LLMTeam(llm_cfg())
    batch = team.rollout(2, 2)
    sub = Batch(episodes=[Episode(0, [t for _, t in batch.turns_of(0)], 0.0)],
                rollout_id=batch.rollout_id)
    adv = np.linspace(-1, 1, len(sub.turns_of(0)))
    w = AgentWorker(llm_cfg().to_dict(), 0, str(tmp_path))
    ref = w.snapshot()
    args = ("b1", sub, adv, 0.1, ref, 1.0, "none", 1)
    first = w.update(*args, call_id="c1")
    assert first[1] and first[0]["opt_steps"] >= 1
    after = w.state()["weights"]
    monkeypatch.setattr(AgentWorker, "_reconstructed", staticmethod(lambda: True))
    w2 = AgentWorker(llm_cfg().to_dict(), 0, str(tmp_path))  # the restarted actor
    assert w2.info()["loaded_checkpoint"] and w2.info()["version"] == 1
    assert w2.update(*args, call_id="c1") == first
    assert all(torch.equal(w2.state()["weights"][k], after[k]) for k in after)
    again = w2.update(*args[:-1], 2, call_id="c2")
    assert again[1] and any(not torch.equal(w2.state()["weights"][k], after[k]) for k in after)


@pytest.mark.slow
def test_sat_train_executor_ray_and_resume(cluster, tmp_path, capsys):
    """``sat train --backend llm --executor ray`` equals the serial run, and ``--resume``
    rebuilds the Ray team from config.json: a one-stage run extended to two stages and
    resumed gives the two-stage serial run's records."""
    args = ["train", "--backend", "llm", "--device", "cpu", "--model", "tiny-random", "--task",
            LOWERCASE_TASK, "--agents", "2", "--prompts", "2", "--group-size", "2",
            "--max-new-tokens", "4", "--n-train", "16", "--n-eval", "2", "--delta", "0.002",
            "--llm-lr", "0.01", "--threads", "1", "--quiet"]
    assert main([*args, "--stages", "2", "--out", str(tmp_path / "serial")]) == 0
    assert main([*args, "--stages", "1", "--executor", "ray", "--out", str(tmp_path / "ray")]) == 0
    conf = json.loads((tmp_path / "ray" / "config.json").read_text())
    assert conf["ray"]["checkpoint_dir"] == str(tmp_path / "ray" / "agents")
    # the task class is read back from config.json: importing it needs the explicit opt-in
    assert main(["--allow-task-import", "train", "--resume", str(tmp_path / "ray"), "--stages", "2",
                 "--quiet"]) == 0
    capsys.readouterr()
    serial = _records(tmp_path / "serial" / "metrics.jsonl")
    assert len(serial) == 6
    _assert_same(_records(tmp_path / "ray" / "metrics.jsonl"), serial)
