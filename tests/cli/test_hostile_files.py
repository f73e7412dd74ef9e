"""Hostile files run nothing and hang nothing: a model folder with custom code (``auto_map``)
or pickled weights, a run's ``config.json`` naming a task class, FIFOs and devices where a
file is expected — each is one ``sat CMD: error:`` line and exit 2, and the payload that
would prove code ran (a marker file) is never written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from sat_theory.cli import main

TINY = ["train", "--backend", "llm", "--task", "copy", "--agents", "2", "--stages", "1",
        "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4", "--n-train", "8",
        "--n-eval", "2", "--quiet", "--threads", "1", "--report-to", "none"]


def _refused(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err


@pytest.fixture
def tiny_folder(tmp_path):
    """A copy of the tiny-random model as a Hugging Face folder (safetensors)."""
    pytest.importorskip("transformers")
    from sat_llm.models import hf_dir

    dst = tmp_path / "model"
    shutil.copytree(hf_dir("tiny-random"), dst)
    return dst


def _with_custom_code(folder, marker, config="config.json"):
    """``auto_map`` pointing at a module of the folder whose import writes ``marker``."""
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import LlamaConfig as EvilConfig, LlamaForCausalLM as EvilModel\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    conf = json.loads((folder / config).read_text())
    conf["auto_map"] = ({"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}
                        if config == "config.json" else
                        {"AutoTokenizer": [None, "evil.EvilTokenizer"]})
    (folder / config).write_text(json.dumps(conf))


@pytest.mark.parametrize("config", ["config.json", "tokenizer_config.json"])
def test_model_folder_with_custom_code_runs_nothing(tiny_folder, tmp_path, config):
    """transformers' own prompt ("Do you wish to run the custom code?") answered by a piped
    ``y`` used to run the folder's module; now nothing asks and nothing runs."""
    marker = tmp_path / "pwned"
    _with_custom_code(tiny_folder, marker, config)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "sat_theory.cli", *TINY, "--model",
                        str(tiny_folder), "--out", str(tmp_path / "run")], input="y\ny\n",
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 2, r.stderr
    assert "auto_map" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not marker.exists()


def test_every_model_load_says_trust_remote_code_false(tiny_folder, monkeypatch):
    """The loaders pass ``trust_remote_code=False`` explicitly (no prompt, whatever the
    transformers default) and read weights from safetensors only."""
    import transformers

    from sat_llm import models

    calls = []
    for cls in (transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        real = cls.from_pretrained

        def spy(*a, _real=real, _name=cls.__name__, **kw):
            calls.append((_name, kw))
            return _real(*a, **kw)

        monkeypatch.setattr(cls, "from_pretrained", spy)
    models.load_model(str(tiny_folder))
    assert [n for n, _ in calls] == ["AutoTokenizer", "AutoModelForCausalLM"]
    assert all(kw.get("trust_remote_code") is False and kw.get("local_files_only") for _, kw in calls)
    assert calls[1][1].get("use_safetensors") is True


def test_pickled_model_folder_is_refused(tiny_folder, tmp_path, capsys):
    import pickle

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tiny_folder / "model.safetensors").unlink()
    (tiny_folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    _refused(capsys, main(TINY + ["--model", str(tiny_folder), "--out", str(tmp_path / "run")]),
             "only pickled weights (pytorch_model.bin)")
    assert not marker.exists()


def test_a_run_config_naming_a_task_class_is_refused_on_resume(tmp_path, capsys, monkeypatch):
    """A task class typed as ``--task`` runs (the user asked); the same name read back from
    a run's config.json (a run folder someone handed over) needs ``--allow-task-import``."""
    pytest.importorskip("peft")
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    marker = tmp_path / "imported"
    (pkg / "shipped_task.py").write_text(
        f"open({str(marker)!r}, 'a').write('x')\nfrom sat_llm.tasks import CopyTask as Task\n")
    monkeypatch.syspath_prepend(str(pkg))
    run = tmp_path / "run"
    args = [a if a != "copy" else "shipped_task:Task" for a in TINY]
    assert main(args + ["--model", "tiny-random", "--out", str(run)]) == 0
    sys.modules.pop("shipped_task", None)
    marker.unlink()
    for argv in (["train", "--resume", str(run), "--stages", "2", "--quiet"],
                 ["export", str(run), "--out", str(tmp_path / "ex")],
                 ["team", str(run), "--prompt", "hi"]):
        _refused(capsys, main(argv), "--allow-task-import")
        assert not marker.exists() and "shipped_task" not in sys.modules
    assert main(["--allow-task-import", "train", "--resume", str(run), "--stages", "2",
                 "--quiet"]) == 0
    assert marker.exists()


def _sat(args, timeout=300):
    """``sat ARGS`` in a child process (a hang is a timeout, not a stuck test run)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "sat_theory.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _refused_child(r, pattern):
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and pattern in r.stderr, r.stderr


def test_fifo_and_device_inputs_are_refused_at_once(tmp_path):
    """``sat eval FIFO.npz`` and ``--dataset`` on a FIFO or a symlink to /dev/zero used to
    block forever."""
    fifo = tmp_path / "m.npz"
    os.mkfifo(fifo)
    _refused_child(_sat(["eval", str(fifo), "--policy", str(fifo)], timeout=120), "is a FIFO")
    pytest.importorskip("datasets")
    zero = tmp_path / "zero.jsonl"
    zero.symlink_to("/dev/zero")
    folder = tmp_path / "saved"
    folder.mkdir()
    os.mkfifo(folder / "data-00000-of-00001.arrow")
    for data, pattern in ((zero, "is a device"), (folder, "is a FIFO")):
        _refused_child(_sat(TINY[:3] + ["--model", "tiny-random", "--task", "dataset",
                                        "--dataset", str(data), "--out", str(tmp_path / "r")]),
                       pattern)


# ------------------------------------------------------------------ crafted checkpoints, budgets
TAB = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "1",
       "--quiet", "--report-to", "none"]


@pytest.mark.parametrize("change, pattern", [
    (lambda ck: ck.__setitem__("n_records", -3), "n_records -3"),
    (lambda ck: ck.__setitem__("n_records", "2"), "n_records '2'"),
    (lambda ck: ck.pop("team"), "missing team"),
    (lambda ck: ck.__setitem__("run_state", {"x": 1}), "run_state lacks"),
    (lambda ck: ck["run_state"].__setitem__("stage", -1), "stage -1"),
    (lambda ck: ck.__setitem__("position", {"step": "x"}), "position"),
])
def test_crafted_checkpoint_counts_are_refused(tmp_path, capsys, change, pattern):
    """A negative ``n_records`` used to drop records silently (``lines[:-3]``); missing or
    malformed runner fields were a KeyError (exit 1)."""
    from sat_theory.checkpoint import load_state, save_state

    run = tmp_path / "run"
    assert main(TAB + ["--out", str(run)]) == 0
    metrics = (run / "metrics.jsonl").read_text()
    ck = load_state(run / "checkpoint.safetensors")
    change(ck)
    save_state(run / "checkpoint.safetensors", ck)
    capsys.readouterr()
    _refused(capsys, main(["train", "--resume", str(run), "--stages", "2", "--quiet"]), pattern)
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing dropped


def test_the_memory_budget_covers_generated_mdps(tmp_path, capsys, monkeypatch):
    """``--env random-turn --states 30000`` (13.4 GiB of transitions) hit MemoryError past
    ``--max-memory``; now it is refused before anything is drawn, on resume too."""
    from sat_theory import mdp

    monkeypatch.setattr(mdp, "MAX_MEMORY", mdp.MAX_MEMORY)  # --max-memory sets it process-wide
    _refused(capsys, main(["train", "--env", "random-turn", "--agents", "2", "--states",
                           "30000", "--out", str(tmp_path / "big")]), "13.4 GiB")
    assert not (tmp_path / "big").exists()
    run = tmp_path / "run"
    assert main(TAB + ["--out", str(run)]) == 0
    capsys.readouterr()
    _refused(capsys, main(["--max-memory", "200", "train", "--resume", str(run), "--stages",
                           "2", "--quiet"]), "over the memory budget of 200 B")
