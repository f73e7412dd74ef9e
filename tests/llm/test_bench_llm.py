"""``sat bench --only llm``: the LLM benchmark runs end to end (smoke sizes, tiny-random) and
is skipped with a one-line note when its dependencies are missing. Timings are never
asserted; the accounting of the resampling comparison is (it is exact by construction)."""

import importlib.util
import json
import sys

import numpy as np
import pytest

from sat_theory.cli import main
from sat_theory.commands.bench import bench_dir


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_bench_llm_smoke_json(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    code, out, err = _run(capsys, "bench", "--smoke", "--only", "llm", "--json")
    assert code == 0, err
    obj = json.loads(out)
    res = obj["benchmarks"]["llm"]
    r = res["models"]["tiny-random"]
    assert r["throughput"]["batched_tok_s"] > 0 and r["throughput"]["per_sample_tok_s"] > 0
    assert all(x["kl_value"] >= 0 for x in r["kl"]["rounds"])  # the exact KL is never negative
    rs = r["resampling"]
    n, stages = rs["agents"], rs["stages"]
    # SAT draws a batch before every agent update, naive one per stage
    assert rs["same_batch"]["sat"]["rollouts"] == n * stages
    assert rs["same_batch"]["naive"]["rollouts"] == stages
    assert rs["same_batch"]["sat"]["episodes"] == n * rs["same_batch"]["naive"]["episodes"]
    assert rs["matched_budget"]["sat"]["episodes"] == rs["same_batch"]["naive"]["episodes"]
    # batched rollout, KL monitor of agent 1 and of agent 2, and (with trl) ours vs TRL
    has_trl = importlib.util.find_spec("trl") is not None
    assert [t["benchmark"] for t in obj["targets"]] == ["llm"] * (5 if has_trl else 3)
    assert all(isinstance(t["met"], bool) for t in obj["targets"])
    assert ("vs_trl" in r) == has_trl
    if has_trl:
        _check_vs_trl(r["vs_trl"])


def _check_vs_trl(v):
    """One warm-up and ``reps`` timed steps of each; every one of ours an update on B·G turns."""
    assert len(v["ours"]) == len(v["trl"]) == v["reps"] + 1
    B, G = v["prompts"], v["group_size"]
    assert all(o["opt_steps"] == 1 for o in v["ours"])  # minibatch = B·G: one AdamW step
    for row in v["ours"] + v["trl"]:
        assert row["step"] > 0 and 0 < row["tokens"] <= B * G * v["max_new_tokens"]
    steps = [o["step"] for o in v["ours"][1:]]
    assert v["ours_step_median"] == float(np.median(steps))
    assert v["ratio"] == v["trl_step_median"] / v["ours_step_median"]


def test_bench_vs_trl_smoke(tmp_path):
    pytest.importorskip("trl", reason="trl (the peer) is not installed: pip install -e '.[dev]'")
    folder = str(bench_dir())
    sys.path.insert(0, folder)
    try:
        import bench_llm

        res = bench_llm.main_vs_trl(bench_llm.SMOKE, out=str(tmp_path / "trl.json"), verbose=False)
    finally:
        sys.path.remove(folder)
    v = res["models"]["tiny-random"]
    _check_vs_trl(v)
    assert [t["target"] for t in res["targets"]] == [
        "tiny-random: TRL GRPOTrainer step / our step (n = 1), paired median",
        "tiny-random: TRL GRPOTrainer step / our SAT step with its monitor (n = 1), paired median"]
    assert [t["value"] for t in res["targets"]] == [v["ratio_paired"], v["ratio_sat_paired"]]
    assert json.loads((tmp_path / "trl.json").read_text())["rows"][0]["model"] == "tiny-random"


def test_bench_llm_skipped_without_dependencies(capsys, monkeypatch):
    folder = str(bench_dir())
    monkeypatch.syspath_prepend(folder)
    import bench_llm

    monkeypatch.setattr(bench_llm, "available", lambda: "needs torch (pip install -e '.[llm]')")
    code, out, err = _run(capsys, "bench", "--smoke", "--only", "llm")
    assert code == 0, err
    assert "llm: skipped (needs torch" in out
    code, out, err = _run(capsys, "bench", "--smoke", "--only", "llm", "--json")
    assert code == 0
    assert json.loads(out)["benchmarks"]["llm"]["skipped"].startswith("needs torch")
    assert "llm: skipped" in err
    sys.modules.pop("bench_llm", None)
