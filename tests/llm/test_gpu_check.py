"""``experiments/gpu_check.py --cpu-only --quick`` runs in CI (well under a minute): one JSON
object whose CPU parts hold — the explicit ``--device cpu`` SAT stage equals the default one
bit for bit, and the bfloat16 throughput measurement produces finite numbers."""

import json
import math

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from experiments import gpu_check  # noqa: E402


def test_cpu_only_check_prints_one_json_object(capsys):
    assert gpu_check.main(["--cpu-only", "--quick"]) == 0
    res = json.loads(capsys.readouterr().out)
    a = res["a_cpu_vs_cuda"]
    assert a["runs"] == ["default", "cpu"] and a["records"] > 0 and a["fields"] > 0
    assert a["equal"] and a["bit_for_bit"] and not a["mismatches"]
    b = res["b_throughput"]["tiny"]
    assert b["dtype"] == "bfloat16" and b["device"] == "cpu" and b["opt_steps"] >= 1
    for k in ("rollout_tokens_per_s", "update_s", "kl_s", "kl_share", "kl"):
        assert math.isfinite(b[k]) and b[k] >= 0, k
    assert b["peak_memory_bytes"] > 0
    chk = b["logp_check"]
    assert chk["n_tokens"] > 0 and chk["mean_abs"] <= chk["tol"]
    assert "skipped" in res["c_vllm"] or "error" in res["c_vllm"] or res["c_vllm"]["kl"] >= 0


def test_record_comparison_finds_a_difference():
    rec = [{"kind": "step", "kl": 0.5, "accepted": True, "seconds": 1.0}]
    assert gpu_check.compare_records(rec, [dict(rec[0], seconds=9.0)])["equal"]
    assert gpu_check.compare_records(rec, [dict(rec[0], kl=0.5 + 1e-5)])["equal"]
    off = gpu_check.compare_records(rec, [dict(rec[0], kl=0.5 + 1e-3)])
    assert not off["equal"] and "kl" in off["mismatches"][0]
    assert not gpu_check.compare_records(rec, [dict(rec[0], accepted=False)])["equal"]
    assert not gpu_check.compare_records(rec, rec + rec)["equal"]
