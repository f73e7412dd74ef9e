"""A killed peer run resumes *exactly* (experiments/llm_team_learning.py ``run_study_trl``,
experiments/peer_comlrl.py ``run_study_comlrl``).

**TRL.** On tiny-random (8 held-out problems, a pool of 6, 2 prompts × 2 completions per
generation, 2 minibatches per generation: TRL's buffer of ``steps_per_generation`` = 2), 8
generations with an evaluation and a checkpoint every 2. The pool of 6 problems is 3
generations per epoch, so the checkpoint after generation 4 is in the middle of epoch 1 (TRL's
sampler must be advanced past epoch 0's permutation) and the one after generation 6 is at
the end of an epoch (transformers' other resume path). A run is interrupted right after
writing evaluation 6 (resumed from checkpoint 4: ``metrics.jsonl`` and ``eval_6.jsonl`` are
cut back and written again) or evaluation 8 (resumed from checkpoint 6), then resumed; it
must give the same ``eval_*.jsonl`` bytes, the same metrics records except timing, and the
same adapter weights at every evaluation (bit for bit) as a run never stopped. Two broken
resumes (no optimizer state; the sampler not advanced) give other weights: the comparison
detects a wrong resume.

**CoMLRL.** 2 agents, 7 prompts, evaluations after prompts 3 and 5 (and 0, 7); interrupted
right after evaluation 5 and resumed from checkpoint 3, whose rollout buffers are not empty
(each agent has 1 + G = 3 samples per prompt, trained 2 at a time).

The task's reward is 0 on every completion of a random model (no gradient), so the tests
give the peers a synthetic reward (distinct characters of the completion) that they can
learn; the evaluations and the weights then change from one evaluation to the next
(asserted, so the comparison has something to compare). Interrupting = an exception raised
right after an evaluation file is written (as a kill there would leave the folder). The
machine is shared: the folders are made once per module and copied.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("trl")

from experiments import llm_team_learning as study  # noqa: E402
from experiments import peer_runs, peer_trl  # noqa: E402

CFG = study.StudyConfig(model="tiny-random", n_train=6, n_eval=8, prompts=2, group_size=2,
                        max_new_tokens=4, minibatch=2, lr=3e-2)
STEPS, EVERY = 8, 2
TIMING = {"train_seconds"}


class Interrupted(Exception):
    """Stands for a kill of the run's process."""


def _synthetic_reward(prompts, completions, **kw):
    return [len(set(c[0]["content"])) / 4.0 for c in completions]


def _instrument(mp):
    """TRL with the synthetic reward; records the SHA-256 of the adapter weights at every
    evaluation (``weights``); ``stop_after[0] = k`` interrupts the run right after it wrote
    evaluation ``k``."""
    import torch

    make, copy, log = peer_trl.grpo_trainer, peer_trl.adapter_into, peer_runs.log_peer_eval
    weights: list[str] = []
    stop_after = [None]

    def grpo_trainer(*a, **kw):
        tr = make(*a, **kw)
        tr.reward_funcs[0] = _synthetic_reward
        return tr

    def adapter_into(team, trainer, agent=0):
        copy(team, trainer, agent)
        model = trainer.model if hasattr(trainer, "train_dataset") else trainer
        h = hashlib.sha256()
        for k, p in sorted(model.named_parameters()):
            if ".default." in k:
                h.update(k.encode() + p.detach().to(torch.float32).numpy().tobytes())
        weights.append(h.hexdigest())

    def log_peer_eval(d, team, writer, k, **fields):
        log(d, team, writer, k, **fields)
        if k == stop_after[0]:
            raise Interrupted(k)

    mp.setattr(peer_trl, "grpo_trainer", grpo_trainer)
    mp.setattr(peer_trl, "adapter_into", adapter_into)
    mp.setattr(peer_runs, "log_peer_eval", log_peer_eval)
    return weights, stop_after


@pytest.fixture
def instrumented(monkeypatch):
    return _instrument(monkeypatch)


def _run(d, **kw):
    return study.run_study_trl(CFG, 0, d, steps=STEPS, eval_every=EVERY, loss_type="dr_grpo",
                               scale_rewards="none", **kw)


def _evals(d) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.glob("eval_*.jsonl"))}


def _metrics(d) -> list[dict]:
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING}
            for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def trl_runs(tmp_path_factory):
    """The run never stopped (and its adapter weights at every evaluation), and
    ``stopped(k)``: the run interrupted right after evaluation ``k`` (made when first asked
    for): ``(straight, weights, stopped)``."""
    root = tmp_path_factory.mktemp("trl")
    made: dict = {}

    def instrumented_run(d, stop=None):
        mp = pytest.MonkeyPatch()
        try:
            weights, stop_after = _instrument(mp)
            stop_after[0] = stop
            if stop is None:
                _run(d)
            else:
                with pytest.raises(Interrupted):
                    _run(d)
        finally:
            mp.undo()
        return weights

    def stopped(stop: int):
        if stop not in made:
            made[stop] = root / f"stop{stop}"
            instrumented_run(made[stop], stop)
        return made[stop]

    w0 = instrumented_run(root / "straight")
    return root / "straight", w0, stopped


def _copy(src, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(src, dst, symlinks=True)
    return dst


def test_straight_run_learns_and_leaves_no_checkpoint(trl_runs):
    d, weights, _ = trl_runs
    assert sorted(_evals(d)) == sorted(f"eval_{k}.jsonl" for k in range(0, STEPS + 1, EVERY))
    assert len(set(weights)) == len(weights) == STEPS // EVERY  # the weights move
    assert len(set(_evals(d).values())) > 1  # and so do the greedy evaluations
    assert not (d / "ckpt").exists() and json.loads((d / "study.json").read_text())["finished"]
    assert (d / ".sat-run").is_file()


@pytest.mark.parametrize("stop", [6, 8], ids=["mid-epoch", "epoch-end"])
def test_interrupted_trl_run_resumes_exactly(tmp_path, trl_runs, instrumented, stop):
    d0, w0, stopped = trl_runs
    weights, _ = instrumented
    d = _copy(stopped(stop), tmp_path)
    weights.clear()  # the interrupted run may have been made just now, instrumented
    rec = json.loads((d / "ckpt" / "latest.json").read_text())
    assert rec["eval"] == stop - EVERY and rec["dir"] == f"checkpoint-{2 * (stop - EVERY)}"
    assert len(_metrics(d)) == stop // EVERY + 1  # eval `stop` was logged before the kill
    assert not (d / "study.json").exists()
    assert not any(n.endswith((".bin", ".pkl")) for n in rec["files"])
    _run(d)  # resume (the default)
    assert _evals(d) == _evals(d0)
    assert _metrics(d) == _metrics(d0)  # no duplicate records, the same values
    assert weights == w0[(stop - EVERY) // EVERY:]  # the evaluations after the checkpoint
    assert not (d / "ckpt").exists() and json.loads((d / "study.json").read_text())["finished"]


@pytest.mark.parametrize("broken", ["no-optimizer-state", "sampler-not-advanced"])
def test_a_wrong_resume_is_detected(tmp_path, trl_runs, instrumented, monkeypatch, broken):
    """The comparison has power: resuming without the optimizer state, or without advancing
    TRL's sampler past the epochs trained, gives other weights from the first update on."""
    from transformers import Trainer

    d0, w0, stopped = trl_runs
    weights, _ = instrumented
    d = _copy(stopped(6), tmp_path)  # resumes from checkpoint 4, mid-epoch 1
    weights.clear()
    if broken == "no-optimizer-state":
        monkeypatch.setattr(Trainer, "_load_optimizer_and_scheduler", lambda self, ck: None)
    else:
        monkeypatch.setattr(peer_trl, "resumable", lambda tr: None)
    _run(d)
    assert len(weights) == 2 and weights[0] != w0[2]  # already after the first generation


def _refused(capsys, d, what: str):
    capsys.readouterr()  # what ran before printed
    with pytest.raises(SystemExit) as e:
        peer_runs.peer_checkpoint(d)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and what in err, err


def test_foreign_or_corrupted_checkpoints_are_refused(tmp_path, trl_runs, capsys):
    src = trl_runs[2](6)
    rec = peer_runs.peer_checkpoint(src)
    assert rec is not None and rec["eval"] == 4
    n = [0]

    def fresh():
        n[0] += 1
        c = tmp_path / f"copy{n[0]}"
        shutil.copytree(src, c, symlinks=True)
        return c, c / "ckpt" / rec["dir"]

    c, cc = fresh()
    data = bytearray((cc / "adapter_model.safetensors").read_bytes())
    data[-1] ^= 1
    (cc / "adapter_model.safetensors").write_bytes(bytes(data))
    _refused(capsys, c, "not those the run wrote")
    c, cc = fresh()
    (cc / "scaler.pt").write_bytes(b"planted")  # a file transformers would load
    _refused(capsys, c, "not those the run wrote")
    c, cc = fresh()
    (cc / "optimizer.pt").unlink()
    _refused(capsys, c, "not those the run wrote")
    c, cc = fresh()
    (cc / "rng_state.pth").unlink()
    (cc / "rng_state.pth").symlink_to(src / "ckpt" / rec["dir"] / "rng_state.pth")
    _refused(capsys, c, "not a regular file")
    c, _ = fresh()
    (c / ".sat-run").unlink()
    _refused(capsys, c, ".sat-run")
    c, _ = fresh()
    conf = json.loads((c / "config.json").read_text())
    conf["seed"] = 1
    (c / "config.json").write_text(json.dumps(conf))
    _refused(capsys, c, "belongs to another run")
    c, _ = fresh()
    (c / "metrics.jsonl").write_text("")
    _refused(capsys, c, "metrics.jsonl")
    c, _ = fresh()
    (c / "ckpt" / "latest.json").write_text("[]")
    _refused(capsys, c, "not a checkpoint record")


def test_a_checkpoint_of_other_settings_is_refused(tmp_path, trl_runs, instrumented, capsys):
    """The folder resumed with another learning rate: this run's config.json would differ
    from the checkpoint's run; refused before anything is loaded or changed."""
    from dataclasses import replace

    d = _copy(trl_runs[2](6), tmp_path)
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        study.run_study_trl(replace(CFG, lr=1e-3), 0, d, steps=STEPS, eval_every=EVERY,
                            loss_type="dr_grpo", scale_rewards="none")
    err = capsys.readouterr().err.splitlines()[-1]  # after the model loader's progress bars
    assert e.value.code == 2 and err.startswith("llm_team_learning: error: ")
    assert "other settings" in err
    assert {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()} == before


# ------------------------------------------------------------------ CoMLRL
N_PROMPTS, EVAL_AT = 7, {3, 5}


def _comlrl(d):
    from experiments.peer_comlrl import run_study_comlrl

    cfg = study.StudyConfig(model="tiny-random", n_train=6, n_eval=4, prompts=2, group_size=2,
                            max_new_tokens=4, minibatch=4, lr=3e-2)
    return run_study_comlrl(cfg, 0, d, n_prompts=N_PROMPTS, eval_at=EVAL_AT)


def test_interrupted_comlrl_run_resumes_exactly(tmp_path, monkeypatch):
    pytest.importorskip("comlrl")
    from sat_llm.task_base import ArithmeticTask

    monkeypatch.setattr(ArithmeticTask, "score", lambda self, problem, text: len(set(text)) / 4)
    weights, stop_after = _instrument(monkeypatch)
    _comlrl(tmp_path / "straight")
    w0 = list(weights)  # both agents at evaluations 0, 3, 5, 7
    assert len(w0) == 8 and len(set(w0[2:])) == 6  # they learn
    d = tmp_path / "run"
    stop_after[0] = 5
    with pytest.raises(Interrupted):
        _comlrl(d)
    stop_after[0] = None
    rec = json.loads((d / "ckpt" / "latest.json").read_text())
    assert rec["eval"] == 3 and set(rec["files"]) == {"state.safetensors"}
    from sat_theory.checkpoint import load_state

    assert any(load_state(d / "ckpt" / "checkpoint-3" / "state.safetensors")["buffers"])
    weights.clear()
    _comlrl(d)
    assert _evals(d) == _evals(tmp_path / "straight")
    assert _metrics(d) == _metrics(tmp_path / "straight")
    assert weights == w0[4:]  # evaluations 5 and 7, both agents
    assert not (d / "ckpt").exists() and json.loads((d / "study.json").read_text())["finished"]
