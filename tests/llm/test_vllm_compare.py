"""The vLLM-against-transformers comparison of one SAT stage over seeds
(experiments/benchmarks/bench_vllm.py ``--compare``, issue 23 item 4): per-seed paired
differences and the seed-level interval that decides whether an engine effect is seen.
Needs neither vLLM nor torch: it reads eval files."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "experiments" / "benchmarks"


@pytest.fixture(scope="module")
def bench_vllm():
    sys.path.insert(0, str(ROOT))
    try:
        import bench_vllm
    finally:
        sys.path.remove(str(ROOT))
    return bench_vllm


def _write_eval(path: Path, scores: list[float], finals: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(dict(id=i, score=s, lenient=s, final=f)) + "\n"
                            for i, (s, f) in enumerate(zip(scores, finals, strict=True))))


def _run(path: Path, before: list[float], after: list[float]) -> None:
    finals = [f"m{i}" for i in range(len(before))]
    _write_eval(path / "eval_0.jsonl", before, finals)
    _write_eval(path / "eval_1.jsonl", after, finals)


def test_seed_level_interval_is_the_student_t_interval_of_the_seed_means(bench_vllm):
    """``mean ± t_{0.975, 2} · sd / √3`` for three seeds, by hand: 0.03 ± 4.302653 · 0.02 / √3."""
    mean, lo, hi = bench_vllm.seed_level_interval([0.01, 0.03, 0.05])
    half = 4.3026527297 * 0.02 / math.sqrt(3)
    assert mean == pytest.approx(0.03, abs=1e-15)
    assert (lo, hi) == pytest.approx((0.03 - half, 0.03 + half), abs=1e-10)
    # a consistent effect excludes 0; the same mean with a seed of the other sign does not
    assert bench_vllm.seed_level_interval([0.04, 0.05, 0.045])[1] > 0
    assert bench_vllm.seed_level_interval([0.10, -0.05, 0.04])[1] < 0
    assert bench_vllm.seed_level_interval([0.02]) == (0.02, 0.02, 0.02)


def test_compare_pairs_each_vllm_seed_with_its_own_transformers_run(bench_vllm, tmp_path):
    """Seed 0's transformers run comes from the study folder, seed 1's from ``hf_s1`` beside
    the vLLM runs; the differences and gains are each seed's own, and the interval over seeds
    is computed from them (a swapped pairing would change it); a vLLM seed without a
    transformers run is listed and left out."""
    d, study = tmp_path / "vllm", tmp_path / "study"
    before = [1.0, 0.0, 0.0, 0.0]
    _run(d / "sat_s0", before, [1.0, 1.0, 0.0, 0.0])      # vLLM seed 0: 0.50
    _run(study / "sat_s0", before, [1.0, 0.0, 0.0, 0.0])  # HF seed 0: 0.25
    _run(d / "sat_s1", before, [0.0, 0.0, 0.0, 0.0])      # vLLM seed 1: 0.00
    _run(d / "hf_s1", before, [1.0, 1.0, 1.0, 1.0])       # HF seed 1: 1.00
    _run(study / "sat_s1", before, [0.0, 0.0, 0.0, 0.0])  # not used: hf_s1 comes first
    _run(d / "sat_s2", before, before)                    # no transformers run yet: left out
    out = bench_vllm.compare(d, study)
    assert out["seeds_without_a_transformers_run"] == [2] and sorted(out["seeds"]) == ["0", "1"]
    s0, s1 = out["seeds"]["0"], out["seeds"]["1"]
    assert s0["after_1_stages"]["vllm_minus_hf"] == pytest.approx(0.25)
    assert s1["after_1_stages"]["vllm_minus_hf"] == pytest.approx(-1.0)
    assert s0["untrained_same_final_messages"] == s1["untrained_same_final_messages"] == 4
    agg = out["over_seeds_after_1_stages"]
    assert agg["seeds"] == [0, 1]
    assert agg["vllm_minus_hf"] == pytest.approx(bench_vllm.seed_level_interval([0.25, -1.0]))
    assert agg["gain_vllm"][0] == pytest.approx(0.0)  # +0.25 and -0.25
    assert agg["gain_hf"][0] == pytest.approx(0.375)  # 0.0 and +0.75


def test_transformers_draw_runs_are_compared_with_seed_0s_transformers_run(bench_vllm, tmp_path):
    """``hf_p0_s{k}`` (the transformers engine on seed 0's problems, other draws) are each
    compared with seed 0's transformers run, not with the vLLM run: the draw noise of one
    stage; a run whose untrained scores differ from seed 0's is flagged (other problems)."""
    d, study = tmp_path / "vllm", tmp_path / "study"
    before = [1.0, 0.0, 0.0, 0.0]
    _run(d / "sat_s0", before, [1.0, 1.0, 1.0, 0.0])      # vLLM: 0.75
    _run(d / "hf_s0", before, [1.0, 0.0, 0.0, 0.0])       # HF seed 0: 0.25
    _run(d / "hf_p0_s1", before, [1.0, 1.0, 0.0, 0.0])    # HF, other draws: 0.50
    _run(d / "hf_p0_s2", [0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0])
    out = bench_vllm.compare(d, study)["transformers_draws"]
    assert sorted(out) == ["hf_p0_s1", "hf_p0_s2"]
    one = out["hf_p0_s1"]
    assert one["after_1_stages"]["other_minus_hf"] == pytest.approx(0.25)
    assert one["after_1_stages"]["hf"] == pytest.approx(0.25) and one["untrained_same_scores"]
    assert out["hf_p0_s2"]["after_1_stages"]["other_minus_hf"] == pytest.approx(-0.25)
    assert not out["hf_p0_s2"]["untrained_same_scores"]
