"""The prepared GPU check of the LLM backend (issue 13 item 7): one command, one JSON object.

Needs only this repository and torch, transformers and peft (vLLM optional); nothing is
downloaded: every model is ``tiny-random`` or a randomly initialised Llama built from a
config (:func:`sat_llm.models.random_llama`). Budget: ≤ 8 minutes on one GPU.

(a) **Same numbers on CPU and CUDA.** One SAT stage (``sat train --backend llm``, the
    shared algorithm, 2 agents) on ``tiny-random`` in float32 with the same seed on the CPU
    and on ``cuda``; every numeric field of ``metrics.jsonl`` (wall-clock fields excepted)
    must agree to 1e-4 (absolute or relative), and the discrete ones (accepted steps,
    tokens, rollouts) exactly. Sampling draws on the host (``sat_llm.rollout.HostSampler``),
    so both devices sample the same messages. With ``--cpu-only`` the second run is the
    explicit ``--device cpu`` against the default (the two must be identical bit for bit).
(b) **Throughput and memory** of a random Llama with SmolLM2-135M's shape and one of ~1.2B
    parameters (Llama-3.2-1B's layout), frozen base in bfloat16 (LoRA, optimizer, log-probs
    and KLs float32/float64): rollout tokens/s (``team.rollout``), one update's seconds
    (its reference pass included), the exact-KL monitor's seconds and its share
    t(kl)/t(update) (BENCHMARKS.md's measure), peak memory (CUDA ``max_memory_allocated``;
    CPU peak RSS), and the behaviour log-prob check (engine vs training model, per token).
    ``--cpu-only`` measures a tiny shape on the CPU instead (the code path, not the speed).
(c) **vLLM** (``--engine vllm``) if ``vllm`` imports and CUDA is there: one rollout and one
    update through :class:`sat_llm.vllm_engine.VLLMEngine` on the SmolLM2-shaped model, with
    the version and log-prob checks; any error is reported, not raised.

Run: ``python experiments/gpu_check.py [--cpu-only] [--quick] [--out FILE]``; prints the
JSON object on stdout (and writes it to ``--out``). ``--quick``: smallest sizes (CI).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: fields of metrics.jsonl that measure wall time or memory (they may differ across devices)
UNTIMED = {"seconds", "peak_memory_bytes"}
TOL = 1e-4

#: (b) the shapes measured; "tiny" is the CPU-only stand-in (same code path, small sizes)
SHAPES_GPU = ("smollm2-135m", "llama-1b")
TINY_SHAPE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn):
    _sync()
    t = time.perf_counter()
    out = fn()
    _sync()
    return out, time.perf_counter() - t


# ------------------------------------------------------------------ (a)
def sat_stage(device: str | None, out_dir: Path, quick: bool) -> list[dict]:
    """``metrics.jsonl`` records of one SAT stage on tiny-random in float32 (``device=None``:
    the default flags, no --device)."""
    from sat_theory.cli import main

    size = ["--prompts", "2", "--group-size", "2", "--max-new-tokens", "4", "--n-eval", "2"] if quick \
        else ["--prompts", "4", "--group-size", "4", "--max-new-tokens", "16", "--n-eval", "8"]
    argv = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
            "--agents", "2", "--stages", "1", "--seed", "0", "--threads", "1", "--minibatch", "8",
            "--llm-lr", "1e-2", "--n-train", "16", *size, "--out", str(out_dir), "--quiet"]
    if device is not None:
        argv += ["--device", device, "--dtype", "float32"]
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the one JSON object
        code = main(argv)
    if code != 0:
        raise RuntimeError(f"sat train exited with {code}")
    with open(out_dir / "metrics.jsonl") as f:
        return [json.loads(line) for line in f]


def _numbers(rec: dict, prefix: str = "") -> dict:
    """Flatten the comparable fields of a record: numbers (and bools/strings/None exactly)."""
    out = {}
    for k, v in rec.items():
        if k in UNTIMED:
            continue
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}."))
        elif isinstance(v, list):
            out.update(_numbers(dict(enumerate(v)), f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_records(a: list[dict], b: list[dict], tol: float = TOL) -> dict:
    """``{"equal", "max_abs_diff", "max_rel_diff", "fields", "mismatches"}``: numbers agree
    when ``|x − y| ≤ tol·max(1, |x|)``; other values (ints of counts, strings, None) must be
    equal; record kinds and counts must match."""
    bad, max_abs, max_rel, n = [], 0.0, 0.0, 0
    if len(a) != len(b):
        return dict(equal=False, max_abs_diff=None, max_rel_diff=None, fields=0,
                    mismatches=[f"{len(a)} vs {len(b)} records"])
    for i, (ra, rb) in enumerate(zip(a, b, strict=True)):
        fa, fb = _numbers(ra), _numbers(rb)
        for k in sorted(set(fa) | set(fb)):
            x, y = fa.get(k), fb.get(k)
            n += 1
            if isinstance(x, float) or isinstance(y, float):
                if x is None or y is None or isinstance(x, str) or isinstance(y, str):
                    ok = x == y
                elif math.isnan(x) and math.isnan(y):
                    ok = True
                else:
                    d = abs(x - y)
                    max_abs = max(max_abs, d) if math.isfinite(d) else max_abs
                    max_rel = max(max_rel, d / max(abs(x), 1e-300)) if math.isfinite(d) else max_rel
                    ok = d <= tol * max(1.0, abs(x)) or x == y
            else:
                ok = x == y
            if not ok:
                bad.append(f"record {i} {k}: {x!r} vs {y!r}")
    return dict(equal=not bad, max_abs_diff=max_abs, max_rel_diff=max_rel, fields=n,
                mismatches=bad[:10])


def check_a(cpu_only: bool, quick: bool) -> dict:
    import torch

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        first = sat_stage(None if cpu_only else "cpu", Path(tmp) / "first", quick)
        other = "cpu" if cpu_only else "cuda"
        if not cpu_only and not torch.cuda.is_available():
            return dict(skipped="no CUDA device")
        second = sat_stage(other, Path(tmp) / "second", quick)
    cmp = compare_records(first, second)
    exact = cpu_only and cmp["equal"] and cmp["max_abs_diff"] == 0.0
    return dict(runs=["default" if cpu_only else "cpu", other], records=len(first),
                bit_for_bit=exact if cpu_only else None, **cmp)


# ------------------------------------------------------------------ (b)
def measure_model(shape, *, device: str, dtype: str, quick: bool, engine: str = "hf") -> dict:
    """Rollout tokens/s, update and KL seconds, KL share, peak memory of a random Llama."""
    import torch

    from sat_llm.models import random_llama
    from sat_llm.team import LLMConfig, LLMTeam

    model, tok = random_llama(shape, seed=0)
    n_params = sum(p.numel() for p in model.parameters())
    prompts, G, T = (2, 2, 8) if quick else (8, 8, 32)
    cfg = LLMConfig(model="tiny-random", task="copy", agents=2, max_new_tokens=T, n_train=64,
                    n_eval=2, minibatch=16, seed=0, device=device, dtype=dtype, engine=engine,
                    temperature=1.0, lr=1e-4)
    team, t_load = _timed(lambda: LLMTeam(cfg, model=model, tokenizer=tok))
    team.rollout(1, 2)  # warm-up (kernels, allocator)
    batch, t_roll = _timed(lambda: team.rollout(prompts, G))
    ref = team.snapshot(0)
    adv = np.linspace(-1, 1, len(batch.turns_of(0)))
    info, t_up = _timed(lambda: team.update(0, batch, adv, 0.1, ref))
    kl, t_kl = _timed(lambda: team.kl(0, batch, ref))
    return dict(params=int(n_params), device=team.cfg.device, dtype=team.cfg.dtype, engine=engine,
                episodes=batch.n_episodes, rollout_tokens=batch.extra["tokens"],
                rollout_s=t_roll, rollout_tokens_per_s=batch.extra["tokens"] / t_roll,
                update_s=t_up, kl_s=t_kl, kl_share=t_kl / t_up, load_s=t_load,
                kl=kl["kl"], opt_steps=info["opt_steps"],
                peak_memory_bytes=max(batch.extra["peak_memory_bytes"], info["peak_memory_bytes"]),
                logp_check=batch.extra["logp_check"], versions=list(batch.versions),
                cuda_device=torch.cuda.get_device_name() if team.cfg.device.startswith("cuda")
                else None)


def check_b(cpu_only: bool, quick: bool) -> dict:
    import torch

    if cpu_only:
        return {"tiny": measure_model(TINY_SHAPE, device="cpu", dtype="bfloat16", quick=True)}
    if not torch.cuda.is_available():
        return dict(skipped="no CUDA device")
    out = {}
    for name in SHAPES_GPU[:1] if quick else SHAPES_GPU:
        try:
            out[name] = measure_model(name, device="cuda", dtype="bfloat16", quick=quick)
        except Exception as e:  # report and go on: one JSON object whatever happens
            out[name] = dict(error=f"{type(e).__name__}: {e}")
        torch.cuda.empty_cache()
    return out


# ------------------------------------------------------------------ (c)
def check_c(cpu_only: bool, quick: bool) -> dict:
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None:
        return dict(skipped="vllm does not import here")
    if cpu_only or not torch.cuda.is_available():
        return dict(skipped="needs a CUDA device")
    try:
        return measure_model("smollm2-135m", device="cuda", dtype="bfloat16", quick=quick,
                             engine="vllm")
    except Exception as e:
        return dict(error=f"{type(e).__name__}: {e}")


def run_check(cpu_only: bool = False, quick: bool = False) -> dict:
    """The whole check as one JSON-ready dict (module docstring)."""
    import importlib.metadata as md

    import torch

    t0 = time.perf_counter()
    res = dict(versions={p: md.version(p) for p in ("torch", "transformers", "peft")},
               cuda=torch.cuda.is_available(), cpu_only=cpu_only, quick=quick)
    res["a_cpu_vs_cuda"] = check_a(cpu_only, quick)
    res["b_throughput"] = check_b(cpu_only, quick)
    res["c_vllm"] = check_c(cpu_only, quick)
    res["seconds"] = time.perf_counter() - t0
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-only", action="store_true", help="no GPU: the CPU parts (CI)")
    p.add_argument("--quick", action="store_true", help="smallest sizes")
    p.add_argument("--out", default=None, help="also write the JSON object here")
    a = p.parse_args(argv)
    res = run_check(cpu_only=a.cpu_only, quick=a.quick)
    text = json.dumps(res, indent=1, default=str)
    if a.out:
        from sat_theory.checkpoint import write_atomic

        write_atomic(a.out, lambda tmp: Path(tmp).write_text(text + "\n"))
    print(text)
    return 0 if res["a_cpu_vs_cuda"].get("equal", True) else 1


if __name__ == "__main__":
    sys.exit(main())
