"""``sat train --report-to``: the trackers hold the same scalars as metrics.jsonl (read back
with each tracker's own reader), once each even across a killed and resumed run; a failing
tracker never stops a run; bad names are one line and exit status 2."""

import json
import math
import struct
from collections import Counter

import numpy as np
import pytest

from sat_theory import tracking
from sat_theory.cli import main
from sat_theory.errors import InputError
from sat_theory.metrics import read_metrics

TRAIN = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "3",
         "--seed", "3", "--quiet"]


def sat(*argv):
    return main([str(a) for a in argv])


def expected(run_dir) -> dict[tuple[str, int], float]:
    """``{(tag, x): value}`` that every tracker must hold, computed from metrics.jsonl alone:
    numeric fields as ``kind/field`` at the record's ordinal within its kind."""
    out, seen = {}, Counter()
    for rec in read_metrics(run_dir):
        kind = rec["kind"]
        for k, v in rec.items():
            # non-finite floats are the strings "Infinity", "-Infinity", "NaN" in the file
            numeric = isinstance(v, bool | int | float) or v in ("Infinity", "-Infinity", "NaN")
            if k != "kind" and numeric:
                out[(f"{kind}/{k}", seen[kind])] = float(v)
        seen[kind] += 1
    return out


def same(a: float, b: float, rel: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b or math.isclose(a, b, rel_tol=rel)


# ------------------------------------------------------------------ parsing
def test_report_to_names():
    assert tracking.parse_report_to("none") == ()
    assert tracking.parse_report_to("TensorBoard, wandb,tensorboard") == ("tensorboard", "wandb")
    assert tracking.parse_report_to(None) == tracking.default_report_to()
    for bad in ("tensorbord", "none,wandb", "wandb,", ""):
        with pytest.raises(InputError):
            tracking.parse_report_to(bad)


@pytest.mark.parametrize("value, needle", [("comet", "unknown tracker 'comet'"),
                                           ("none,tensorboard", "cannot be combined")])
def test_bad_report_to_is_one_line_exit_2(tmp_path, capsys, value, needle):
    rc = sat(*TRAIN, "--out", tmp_path / "r", "--report-to", value)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and needle in err, err
    assert not (tmp_path / "r").exists()  # refused before any work


def test_a_tracker_that_is_not_installed_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(tracking.TRACKERS, "mlflow", "no_such_module_for_sat_tests")
    rc = sat(*TRAIN, "--out", tmp_path / "r", "--report-to", "mlflow")
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "not installed" in err and len(err.splitlines()) == 1


def test_scalars_and_flat_config():
    rec = {"kind": "step", "kl": 0.5, "agent": 1, "rejected": np.bool_(True), "holds": False,
           "order": [1, 0], "source": "exact", "tv": None, "w": np.float64(2.0)}
    assert tracking.scalars(rec) == {"kl": 0.5, "agent": 1.0, "rejected": 1.0, "holds": 0.0,
                                     "w": 2.0}
    assert tracking.flat_config({"a": {"b": 1, "c": [1, 2], "d": None}, "e": "x"}) == {
        "a.b": 1, "a.c": "[1, 2]", "a.d": "null", "e": "x"}


# ------------------------------------------------------------------ TensorBoard
def tensorboard_scalars(run_dir) -> tuple[dict, Counter, dict]:
    """``({(tag, step): value}, events per (tag, step), hparams)`` of every event file in
    ``run_dir/tb``, read with TensorBoard's own EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    values, count = {}, Counter()
    for tag in acc.Tags()["scalars"]:
        for ev in acc.Scalars(tag):
            values[(tag, ev.step)] = ev.value
            count[(tag, ev.step)] += 1
    data = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"])
    hparams = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind"))
               for k, v in data.session_start_info.hparams.items()}
    return values, count, hparams


def _check_tensorboard(run_dir):
    want = expected(run_dir)
    got, count, hparams = tensorboard_scalars(run_dir)
    assert set(got) == set(want)
    assert max(count.values()) == 1  # no record twice
    bad = [(k, got[k], want[k]) for k in want if not same(got[k], float(np.float32(want[k])), 0)]
    assert not bad, bad[:5]  # TensorBoard keeps float32: the same number rounded to it
    return hparams


def test_tensorboard_default_holds_metrics_jsonl(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    out = tmp_path / "r"
    assert sat(*TRAIN, "--out", out) == 0  # default: tensorboard (installed)
    assert capsys.readouterr().err == ""
    hparams = _check_tensorboard(out)
    config = json.loads((out / "config.json").read_text())
    assert config["run"]["report_to"] == ["tensorboard"]
    assert hparams["algorithm.method"] == "sat" and hparams["algorithm.stages"] == 3
    assert hparams["backend.env"] == "random-turn"
    kinds = {tag.split("/")[0] for tag, _ in expected(out)}
    assert kinds == {"step", "stage"}
    # --overwrite removes the old event files with the rest of the run
    assert sat(*TRAIN, "--out", out, "--overwrite", "--report-to", "none") == 0
    assert not (out / "tb").exists()


def test_tensorboard_sampled_swap_run(tmp_path):
    """Sampled mode with a plug-and-play swap: step, stage and swap records, estimated terms."""
    pytest.importorskip("tensorboard")
    out = tmp_path / "r"
    assert sat("train", "--env", "random-turn", "--agents", "2", "--states", "3", "--stages", "2",
               "--group-size", "3", "--groups", "2", "--horizon-tol", "0.1", "--swap-stage", "1",
               "--out", out, "--quiet", "--report-to", "tensorboard") == 0
    _check_tensorboard(out)
    assert {tag.split("/")[0] for tag, _ in expected(out)} == {"step", "stage", "swap"}


def test_killed_and_resumed_run_sends_every_record_once(tmp_path, capsys, monkeypatch):
    """A run killed after writing a step record but before its checkpoint redoes that step on
    resume; the tracker has each record once, equal to the final metrics.jsonl."""
    pytest.importorskip("tensorboard")
    from sat_theory import runner

    out = tmp_path / "r"
    calls = {"n": 0}
    real = runner.save_state

    def dies_at_the_fifth_checkpoint(path, state):
        calls["n"] += 1
        if calls["n"] == 5:  # mid-stage: the step record is in metrics.jsonl already
            raise KeyboardInterrupt
        return real(path, state)

    monkeypatch.setattr(runner, "save_state", dies_at_the_fifth_checkpoint)
    assert sat(*TRAIN, "--out", out) == 130
    redone = len(read_metrics(out))
    monkeypatch.setattr(runner, "save_state", real)
    assert sat("train", "--resume", out, "--quiet") == 0
    capsys.readouterr()
    assert len(list((out / "tb").iterdir())) == 2  # one event file per process
    _check_tensorboard(out)
    recs = read_metrics(out)
    assert len(recs) == 3 * 2 + 3 and redone < len(recs)


# ------------------------------------------------------------------ failures
class _Broken:
    def __init__(self, run_dir, config, fail_at="log"):
        if fail_at == "init":
            raise RuntimeError("no server\nsecond line")
        self.fail_at = fail_at

    def log(self, kind, x, values):
        raise OSError("disk full")

    def flush(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize("fail_at", ["init", "log"])
def test_a_failing_tracker_warns_once_and_the_run_goes_on(tmp_path, capsys, monkeypatch, fail_at):
    monkeypatch.setitem(tracking._BACKENDS, "tensorboard",
                        lambda run_dir, config: _Broken(run_dir, config, fail_at))
    out = tmp_path / "r"
    assert sat(*TRAIN, "--out", out, "--report-to", "tensorboard") == 0
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sat: warning: --report-to tensorboard:"), lines
    assert ("no server" if fail_at == "init" else "disk full") in lines[0]
    assert len(read_metrics(out)) == 9 and cap.out.startswith("sat: 3 stages")


# ------------------------------------------------------------------ W&B (offline)
def wandb_history(run_dir) -> tuple[list[dict], dict]:
    """``(history rows, config)`` of the offline W&B run under ``run_dir/wandb``, read from its
    ``.wandb`` file: a LevelDB-style log (7-byte ``:W&B`` header, 32 KiB blocks of records with
    a 7-byte header crc32/length/type) of ``wandb_internal_pb2.Record`` messages."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B", "unknown .wandb file format"
    block, pos, buf, rows, config = 32768, 7, b"", [], {}
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # block trailer
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end of a block
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            rec = wandb_internal_pb2.Record.FromString(buf)
            buf = b""
            which = rec.WhichOneof("record_type")
            if which == "history":
                rows.append({it.key or "/".join(it.nested_key): json.loads(it.value_json)
                             for it in rec.history.item})
            elif which in ("run", "config"):  # the config comes with the run record
                items = rec.run.config.update if which == "run" else rec.config.update
                config.update({it.key: json.loads(it.value_json) for it in items})
    return rows, config


def test_wandb_offline_holds_metrics_jsonl(tmp_path, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb", reason="wandb is not installed (an optional tracker)")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline is ours to choose then
    out = tmp_path / "r"
    assert sat(*TRAIN, "--out", out, "--report-to", "wandb") == 0
    assert "warning" not in capsys.readouterr().err
    wandb.teardown()  # W&B's service writes the run file out when it stops (at exit in sat)
    rows, config = wandb_history(out)
    got = {}
    for row in rows:
        kinds = {k.split("/")[0] for k in row if not k.startswith("_")}
        assert len(kinds) == 1, row  # one record per history row
        (kind,) = kinds
        for k, v in row.items():
            if not k.startswith("_") and k != f"{kind}/index":
                got[(k, row[f"{kind}/index"])] = float(v)
    want = expected(out)
    assert set(got) == set(want)
    assert all(same(got[k], want[k], 1e-12) for k in want)
    assert config["algorithm"]["method"] == "sat" and config["run"]["report_to"] == ["wandb"]


# ------------------------------------------------------------------ MLflow (local file store)
def test_mlflow_file_store_holds_metrics_jsonl(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is not installed (an optional tracker)")
    from mlflow.tracking import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = tmp_path / "r"
    assert sat(*TRAIN, "--out", out, "--report-to", "mlflow") == 0
    assert "warning" not in capsys.readouterr().err
    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("sat").experiment_id])
    want = expected(out)
    got = {}
    for tag in {t for t, _ in want}:
        for m in client.get_metric_history(run.info.run_id, tag):
            assert (tag, m.step) not in got
            got[(tag, m.step)] = m.value
    assert set(got) == set(want)
    assert all(same(got[k], want[k], 1e-12) for k in want)
    assert run.data.params["algorithm.method"] == "sat"
