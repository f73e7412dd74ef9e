"""``sat bench --only llm``: the LLM benchmark runs end to end (smoke sizes, tiny-random) and
is skipped with a one-line note when its dependencies are missing. Timings are never
asserted; the accounting of the resampling comparison is (it is exact by construction)."""

import json
import sys

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
    # batched rollout, KL monitor of agent 1 and of agent 2
    assert [t["benchmark"] for t in obj["targets"]] == ["llm", "llm", "llm"]
    assert all(isinstance(t["met"], bool) for t in obj["targets"])


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
