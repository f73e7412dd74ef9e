"""The LLM backend on CPU (issue 7 item 4, and the LLM part of item 5).

For each model (``tiny-random``; the full run adds ``smollm2-135m``), all through
:mod:`sat_llm` (models loaded by ``sat_llm.models``; nothing downloads):

1. **Batched rollout vs per-sample generate.** The same contexts (``prompts × G`` rendered
   chat contexts of agent 1, as in a group rollout) through ``sat_llm.rollout.generate`` in
   one batch vs one call per context, through the team's LoRA-wrapped model as the real
   rollout does. Throughput = message tokens produced (each row cut at its stop token, as
   the rollout keeps them) per second. Contenders interleaved, order rotated per round, the
   torch RNG seeded identically for both; the best round of each is compared.
   Target: batched ≥ 4× per-sample tokens/s.
2. **Exact-KL monitor overhead.** One agent step as ``run_stage`` takes it without
   backtracking: ``team.update`` (its reference log-probabilities included: the first
   update of a (batch, reference) pair computes them) then ``team.kl`` (the exact
   full-vocabulary token KL of :mod:`sat_llm.kl`, float64, plus the sampled eq. 18 one).
   Overhead = t(kl) / t(update); target ≤ 15 %. Measured for agent 1 (first speaker: its
   G turns of a prompt have identical contexts) and agent 2 (contexts hold agent 1's
   message: only the prompt part is shared). Also reported: the same with the reference
   cached (as in a backtracking retry), the cost of the sampled-only monitor (one float32
   scoring pass of the current adapter: what eq. 18 needs once the reference
   log-probabilities of the sampled tokens are known), and t(kl) over the whole step
   including its rollout (TeamTR's accounting: 6.2 s of 192.8 s).
3. **Intermediate-occupancy resampling overhead** in sampled tokens, SAT vs naive, same
   model, prompts pool, seed, stages and group size, through ``sat_theory.algorithm
   .run_stage`` (the shared algorithm, unchanged); tokens and episodes counted at
   ``team.rollout``. Two budgets: (a) the same per-update batch (B prompts × G): SAT draws a
   batch per agent update, naive one per stage, so SAT samples ≈ n× the tokens;
   (b) the same per-stage budget (TeamTR App. G's scaling study): SAT's per-update batch is
   B/n prompts. TeamTR Table 6 reports +11.1 % tokens and rollouts with 3 agents.
   Held-out evaluation (greedy) is the same for both and not counted.
4. **Model load**, first vs second: ``tiny-random`` in one process (the first includes
   transformers' lazy imports); ``smollm2-135m`` in fresh subprocesses with an empty
   ``$SAT_LLM_CACHE`` (first: GGUF de-quantisation + cache write) and then the filled cache.
5. **Scaling** (item 5): ``team.rollout(B, G)`` wall time vs G and vs n (agents = turns per
   episode), log-log fits ``log t = a + b log x``.

6. **One n = 1 step, ours vs TRL's ``GRPOTrainer``, like for like** (issue 12 item 3, issue
   27 item 2): the configuration the study compares (``experiments/llm_team_learning.py``):
   one step = a batch of B prompts × G samples and the ``B·G/minibatch`` AdamW steps on it
   (the smollm2 settings: B 8, G 4, minibatch 8, 16 new tokens, temperature 0.7, lr 1e-3,
   LoRA r 8 on q/v, one torch thread). Ours as the study runs it: one ``run_stage`` of a
   one-agent ``LLMTeam`` (rollout with the behaviour log-prob check, reference pass, update,
   the exact-KL monitor and the records; no held-out evaluation), twice: **plain**
   (``--method no-tr``, β = 1e-300 = 0 in float32, the token ratio, no std normalisation:
   the update of TRL's ``dr_grpo``, ``tests/llm/test_trl_oracle.py``) and **SAT** (``--method
   sat``, δ = 0.05, its backtracking included). TRL 1.16's trainer built by
   ``experiments/peer_trl.py`` with ``loss_type="dr_grpo"`` (token level),
   ``scale_rewards="none"``, ``per_device_train_batch_size = minibatch`` and
   ``steps_per_generation = B·G/minibatch`` (so it generates once per B·G completions, scores
   their old log-probs once, and steps ``B·G/minibatch`` times), its clip scaled to ours.
   One process: TRL's ``train()`` runs its steps and a callback runs ours (plain and SAT,
   order alternating) right before or after each of TRL's generation batches (alternating);
   each timed alone; pair 0 is a warm-up. Headline: the median over the back-to-back pairs
   of ``t(TRL) / t(ours)``; targets 1.5 (plain) and 1.2 (SAT with its monitor). Also the
   ratio of medians and per generated token (they sample different completions). Skipped
   (with a note) when trl is missing.

7. **Behaviour log-prob check** (issue 13 item 4): ``team.rollout(B, G)`` with the default
   ``logp_check=8`` (the first 8 messages of every generation call rescored by the training
   model and compared with the engine's log-probs) vs ``logp_check=0`` (off); the same
   sampled tokens (torch RNG seeded alike), interleaved rounds, medians and their ratio.

8. **Profile of one SAT stage** (issue 27 item 1, ``--profile``): exclusive wall time per
   phase — rollout (episode loop), shared-prefix prefill, decoding, behaviour log-prob check,
   reference scoring, the update's forward, backward and optimizer step, the monitor — of
   ``run_stage`` at the study's settings (:data:`PROFILE`), n = 1 and n = 2, by timed
   wrappers around the team's methods (:class:`PhaseTimer`).

Run: ``python experiments/benchmarks/bench_llm.py [--quick] [--out PATH]``;
``--vs-trl`` runs only section 6 (results ``bench_llm_trl*.json``), ``--profile`` only
section 8 (``bench_llm_profile*.json``).
``--quick``: tiny-random only, small settings (~1 min); full adds smollm2-135m (~5-10 min).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from _common import fmt_table, machine_info, print_targets, save_json, target_line

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@dataclass
class ModelBench:
    """Settings of one model's benchmarks."""

    model: str = field(default="tiny-random", metadata={"help": "sat_llm model name"})
    max_new_tokens: int = field(default=32, metadata={"help": "tokens per message at most"})
    prompts: int = field(default=2, metadata={"help": "prompts B of the throughput batch"})
    group_size: int = field(default=8, metadata={"help": "episodes per prompt G"})
    rounds: int = field(default=3, metadata={"help": "interleaved rounds (best kept)"})
    kl_prompts: int = field(default=4, metadata={"help": "prompts of the KL-overhead batch"})
    kl_group_size: int = field(default=4, metadata={"help": "G of the KL-overhead batch"})
    kl_more_epochs: tuple[int, ...] = field(default=(2, 4), metadata={
        "help": "also time updates with these many epochs (default of sat train: 1)"})
    occ_agents: int = field(default=2, metadata={"help": "agents n of the resampling comparison"})
    occ_prompts: int = field(default=4, metadata={"help": "B of the resampling comparison"})
    occ_group_size: int = field(default=4, metadata={"help": "G of the resampling comparison"})
    occ_stages: int = field(default=2, metadata={"help": "stages of the resampling comparison"})
    scale_G: tuple[int, ...] = field(default=(1, 2, 4, 8, 16, 32),
                                     metadata={"help": "G of the rollout-time series"})
    scale_n: tuple[int, ...] = field(default=(1, 2, 4, 8),
                                     metadata={"help": "n of the rollout-time series (G=4)"})
    load_subprocess: bool = field(default=False, metadata={
        "help": "first/second load in fresh processes with an empty cache (GGUF models)"})
    trl_reps: int = field(default=4, metadata={
        "help": "timed steps of ours vs TRL's GRPOTrainer (after one warm-up each; 0: skip)"})
    trl_prompts: int = field(default=2, metadata={"help": "prompts B per step, ours vs TRL"})
    trl_group_size: int = field(default=4, metadata={"help": "samples G per prompt, ours vs TRL"})
    trl_temperature: float = field(default=0.7, metadata={"help": "sampling temperature, ours vs TRL"})
    trl_lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate, ours vs TRL"})
    trl_minibatch: int = field(default=0, metadata={
        "help": "completions per optimizer step, ours vs TRL (0: all B·G, one step per batch)"})
    trl_delta: float = field(default=0.05, metadata={"help": "SAT's trust-region radius δ, vs TRL"})


@dataclass
class LLMBenchConfig:
    models: tuple[ModelBench, ...] = field(default=(), metadata={"help": "per-model settings"})
    threads: int = field(default=1, metadata={
        "help": "torch CPU threads (1: the stable setting on a loaded 2-core machine)"})
    seed: int = field(default=0, metadata={"help": "seed of sampling and problems"})
    speedup_goal: float = field(default=4.0, metadata={"help": "target batched/per-sample"})
    kl_goal: float = field(default=0.15, metadata={"help": "target t(kl)/t(update) at most"})


TINY_FULL = ModelBench()
SMOL_FULL = ModelBench(model="smollm2-135m", max_new_tokens=16, prompts=2, group_size=4,
                       rounds=2, kl_prompts=2, kl_group_size=4, occ_prompts=2, occ_group_size=2,
                       occ_stages=1, scale_G=(1, 2, 4, 8), scale_n=(1, 2), load_subprocess=True,
                       kl_more_epochs=(2,), trl_reps=7, trl_prompts=8, trl_minibatch=8)
FULL = LLMBenchConfig(models=(TINY_FULL, SMOL_FULL))
QUICK = LLMBenchConfig(models=(ModelBench(rounds=2, occ_stages=1, scale_G=(1, 2, 4, 8, 16),
                                          scale_n=(1, 2, 4)),))
#: seconds, to check that the script runs (numbers meaningless)
SMOKE = LLMBenchConfig(models=(ModelBench(max_new_tokens=4, prompts=1, group_size=2, rounds=1,
                                          kl_prompts=1, kl_group_size=2, kl_more_epochs=(), occ_prompts=2,
                                          occ_group_size=2, occ_stages=1, scale_G=(1, 2),
                                          scale_n=(1, 2), trl_reps=1, trl_prompts=1,
                                          trl_group_size=2),))


def available() -> str | None:
    """``None`` if torch, transformers and peft import; else the reason (one line)."""
    import importlib.util

    missing = [m for m in ("torch", "transformers", "peft") if importlib.util.find_spec(m) is None]
    return f"needs {', '.join(missing)} (pip install -e '.[llm]')" if missing else None


def fit(xs, ts) -> dict:
    """Least-squares ``log t = a + b log x``: exponent ``b`` and prefactor ``e^a``."""
    b, a = np.polyfit(np.log(xs), np.log(ts), 1)
    return {"exponent": float(b), "prefactor": float(np.exp(a))}


def _lowercase(team, seed: int):
    """Give ``team`` the lowercase-fraction task of ``experiments/llm_kl_monitor.py``: its
    score varies even for a random model, so advantages are non-zero and updates real."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from experiments.llm_kl_monitor import _lowercase_task

    team.task = _lowercase_task()
    team.train_pool = team.task.problems("train", 64, seed)
    team.eval_set = team.task.problems("eval", max(2, len(team.eval_set)), seed + 1)
    return team


def make_team(mb: ModelBench, cfg: LLMBenchConfig, agents: int = 2, **kw):
    from sat_llm.team import LLMConfig, LLMTeam

    llm = LLMConfig(model=mb.model, agents=agents, task="arithmetic",
                    max_new_tokens=mb.max_new_tokens, n_train=64, n_eval=2,
                    seed=cfg.seed, threads=cfg.threads, **kw)
    return _lowercase(LLMTeam(llm), cfg.seed)


# ------------------------------------------------------------------ 1. throughput
def bench_throughput(team, mb: ModelBench, cfg: LLMBenchConfig) -> dict:
    import torch

    from sat_llm.rollout import generate

    tok = team.tokenizer(0)
    model = team._activate(0)
    last = team.protocol.n_turns == 1
    # prompts whose contexts have one common length (the most frequent one in the pool), as in
    # the first turn of a rollout batch
    by_len: dict[int, list] = {}
    for p in team.train_pool:
        by_len.setdefault(len(team.protocol.render(tok, p.prompt, [], 0, last)), []).append(p)
    probs = max(by_len.values(), key=len)[:mb.prompts]
    ctxs = [team.protocol.render(tok, p.prompt, [], 0, last)
            for p in probs for _ in range(mb.group_size)]
    stop = [tok.eos_token_id]
    kw = dict(max_new_tokens=mb.max_new_tokens, temperature=1.0, stop_ids=stop,
              pad_id=tok.pad_token_id)

    def batched():
        msgs, _ = generate(model, ctxs, **kw)
        return sum(len(m) for m in msgs)

    def per_sample():
        return sum(len(generate(model, [c], **kw)[0][0]) for c in ctxs)

    kw1 = {**kw, "max_new_tokens": 1}

    def batched_prefill():  # one new token: the prefill (context forward pass) and one step
        generate(model, ctxs, **kw1)
        return len(ctxs)

    def per_sample_prefill():
        for c in ctxs:
            generate(model, [c], **kw1)
        return len(ctxs)

    def batched_unshared():  # the same batch without sat_llm's shared-prefix prefill
        msgs, _ = generate(model, ctxs, **kw, share_prefix=False)
        return sum(len(m) for m in msgs)

    cases = {"batched": batched, "per_sample": per_sample, "batched_prefill": batched_prefill,
             "per_sample_prefill": per_sample_prefill, "batched_unshared": batched_unshared}
    torch.manual_seed(cfg.seed)
    generate(model, ctxs[:2], **{**kw, "max_new_tokens": 2})  # warm-up: lazy inits, allocator
    rounds: dict[str, list] = {k: [] for k in cases}
    names = list(cases)
    for r in range(mb.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            torch.manual_seed(cfg.seed + r)
            t0 = time.perf_counter()
            n_tok = cases[name]()
            dt = time.perf_counter() - t0
            rounds[name].append({"seconds": dt, "tokens": n_tok, "tokens_per_s": n_tok / dt})
    best = {k: max(v, key=lambda x: x["tokens_per_s"]) for k, v in rounds.items()}
    pre_b = min(x["seconds"] for x in rounds["batched_prefill"])
    pre_s = min(x["seconds"] for x in rounds["per_sample_prefill"])
    # decode phase alone: tokens after the first per second, prefill time subtracted
    dec_b = (best["batched"]["tokens"] - len(ctxs)) / max(best["batched"]["seconds"] - pre_b, 1e-9)
    dec_s = (best["per_sample"]["tokens"] - len(ctxs)) / max(best["per_sample"]["seconds"] - pre_s, 1e-9)
    return {"contexts": len(ctxs), "context_tokens": len(ctxs[0]),
            "max_new_tokens": mb.max_new_tokens, "rounds": rounds,
            "batched_tok_s": best["batched"]["tokens_per_s"],
            "per_sample_tok_s": best["per_sample"]["tokens_per_s"],
            "speedup": best["batched"]["tokens_per_s"] / best["per_sample"]["tokens_per_s"],
            "unshared_tok_s": best["batched_unshared"]["tokens_per_s"],
            "unshared_speedup": best["batched_unshared"]["tokens_per_s"]
            / best["per_sample"]["tokens_per_s"],
            "prefill_seconds_batched": pre_b, "prefill_seconds_per_sample": pre_s,
            "prefill_share_batched": pre_b / best["batched"]["seconds"],
            "prefill_speedup": pre_s / pre_b, "decode_speedup": dec_b / dec_s,
            "speedup_median": float(np.median([b["tokens_per_s"] / p["tokens_per_s"] for b, p in
                                               zip(rounds["batched"], rounds["per_sample"],
                                                   strict=True)]))}


# ------------------------------------------------------------------ 7. log-prob check
def bench_logp_check(mb: ModelBench, cfg: LLMBenchConfig, check: int = 8) -> dict:
    """Median ``team.rollout(B, G)`` seconds with the behaviour log-prob check on
    (``check`` messages per generation call) and off, and ``overhead = t(on)/t(off) − 1``."""
    import torch

    teams = {"on": make_team(mb, cfg, logp_check=check), "off": make_team(mb, cfg, logp_check=0)}
    for t in teams.values():
        t.rollout(1, 2)  # warm-up
    rounds: dict[str, list] = {k: [] for k in teams}
    names = list(teams)
    for r in range(max(mb.rounds, 3)):
        for name in names[r % 2:] + names[:r % 2]:
            torch.manual_seed(cfg.seed + r)  # both sample the same tokens
            t0 = time.perf_counter()
            b = teams[name].rollout(mb.prompts, mb.group_size)
            rounds[name].append({"seconds": time.perf_counter() - t0,
                                 "tokens": b.extra["tokens"],
                                 "logp_check": b.extra.get("logp_check")})
    med = {k: float(np.median([x["seconds"] for x in v])) for k, v in rounds.items()}
    return {"rounds": rounds, "check_messages": check, "on_s": med["on"], "off_s": med["off"],
            "overhead": med["on"] / med["off"] - 1,
            "same_tokens": [x["tokens"] for x in rounds["on"]] == [x["tokens"] for x in rounds["off"]]}


# ------------------------------------------------------------------ 2. KL monitor
def _advantages(team, batch, agent: int) -> np.ndarray:
    from sat_theory.estimators import group_advantages

    adv_ep = group_advantages(batch.returns, batch.groups)
    adv = np.array([adv_ep[i] for i, _ in batch.turns_of(agent)])
    if not np.any(adv):  # all groups tied: update() would skip; the timing needs a real step
        adv = np.random.default_rng(0).standard_normal(adv.shape)
    return adv


def bench_kl(team, mb: ModelBench, cfg: LLMBenchConfig, epochs: int, batch=None,
             agent: int = 0) -> dict:
    import torch

    t0 = time.perf_counter()
    if batch is None:
        batch = team.rollout(mb.kl_prompts, mb.kl_group_size)
    t_rollout = time.perf_counter() - t0 if "rollout_seconds" not in batch.extra else \
        batch.extra["rollout_seconds"]
    batch.extra["rollout_seconds"] = t_rollout
    team.cfg.epochs = epochs  # read by update() at every call
    j = agent
    adv = _advantages(team, batch, j)
    ref = team.snapshot(j)
    ctxs, msgs, _ = team._turns(j, batch)
    rows = []
    for r in range(mb.rounds + 1):  # round 0: warm-up (allocator, autograd graph caches)
        team.restore(j, ref)
        team._ref_cache = None  # the first update of a (batch, reference) pair scores it
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        team.update(j, batch, adv, 0.1, ref)
        t_up = time.perf_counter() - t0
        t0 = time.perf_counter()
        klr = team.kl(j, batch, ref)
        t_kl = time.perf_counter() - t0
        # a backtracking retry: restore, update again with the reference cached
        team.restore(j, ref)
        t0 = time.perf_counter()
        team.update(j, batch, adv, 0.2, ref, step_scale=0.5)
        t_up_cached = time.perf_counter() - t0
        # the sampled-only monitor (eq. 18): one float32 scoring pass of the current adapter
        t0 = time.perf_counter()
        team._score(j, ctxs, msgs)
        t_sampled = time.perf_counter() - t0
        if r > 0:
            rows.append(dict(update=t_up, kl=t_kl, update_cached_ref=t_up_cached,
                             sampled_only=t_sampled, kl_value=klr["kl"],
                             kl_sampled_value=klr["kl_sampled"]))
    team.restore(j, ref)
    team.cfg.epochs = 1
    best = {k: min(x[k] for x in rows) for k in ("update", "kl", "update_cached_ref", "sampled_only")}
    n_tok = int(sum(len(m) for m in msgs))
    return {"turns": len(msgs), "message_tokens": n_tok, "rollout_seconds": t_rollout,
            "rounds": rows, **{f"t_{k}": v for k, v in best.items()},
            "kl_over_update": best["kl"] / best["update"],
            "kl_over_update_cached_ref": best["kl"] / best["update_cached_ref"],
            "sampled_over_update": best["sampled_only"] / best["update"],
            "kl_over_step_with_rollout": best["kl"] / (best["update"] + best["kl"] + t_rollout),
            "minibatch": team.cfg.minibatch, "epochs": epochs, "batch": batch}


# ------------------------------------------------------------------ 3. resampling overhead
def _counting(team):
    """Wrap ``team.rollout`` to count sampled message tokens, episodes and rollouts."""
    counts = {"tokens": 0, "episodes": 0, "rollouts": 0, "rollout_seconds": 0.0}
    inner = team.rollout

    def rollout(n_groups, group_size):
        t0 = time.perf_counter()
        b = inner(n_groups, group_size)
        counts["rollout_seconds"] += time.perf_counter() - t0
        counts["tokens"] += int(b.extra["tokens"])
        counts["episodes"] += b.n_episodes
        counts["rollouts"] += 1
        return b

    team.rollout = rollout
    return counts


def run_method(mb: ModelBench, cfg: LLMBenchConfig, method: str, n_groups: int) -> dict:
    from sat_theory.algorithm import RunState, TrainConfig, run_stage

    team = make_team(mb, cfg, agents=mb.occ_agents)
    counts = _counting(team)
    tc = TrainConfig(method=method, stages=mb.occ_stages, n_groups=n_groups,
                     group_size=mb.occ_group_size, seed=cfg.seed)
    state = RunState.initial(tc, team.n_agents)
    t0 = time.perf_counter()
    for _ in range(tc.stages):
        run_stage(team, tc, state)
    return {"method": method, "n_groups": n_groups, **counts,
            "seconds": time.perf_counter() - t0}


def bench_resampling(mb: ModelBench, cfg: LLMBenchConfig) -> dict:
    n, B = mb.occ_agents, mb.occ_prompts
    same = {m: run_method(mb, cfg, m, B) for m in ("naive", "sat")}
    Bs = max(1, B // n)
    matched = {"naive": same["naive"], "sat": run_method(mb, cfg, "sat", Bs)}

    def over(d, k):
        return d["sat"][k] / d["naive"][k] - 1.0

    return {"agents": n, "prompts": B, "group_size": mb.occ_group_size, "stages": mb.occ_stages,
            "same_batch": same, "matched_budget": matched, "sat_prompts_matched": Bs,
            "token_overhead_same_batch": over(same, "tokens"),
            "episode_overhead_same_batch": over(same, "episodes"),
            "token_overhead_matched": over(matched, "tokens"),
            "episode_overhead_matched": over(matched, "episodes"),
            "time_overhead_same_batch": over(same, "seconds"),
            "time_overhead_matched": over(matched, "seconds")}


# ------------------------------------------------------------------ 4. model load
_LOAD_SNIPPET = """
import json, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
t1 = time.perf_counter()
from sat_llm.models import load_model
m, tok = load_model({name!r})
t2 = time.perf_counter()
m2, tok2 = load_model({name!r})
t3 = time.perf_counter()
print(json.dumps(dict(imports=t1 - t0, load=t2 - t1, load_again_same_process=t3 - t2)))
"""


def bench_load(mb: ModelBench) -> dict:
    if not mb.load_subprocess:
        from sat_llm.models import load_model

        t0 = time.perf_counter()
        load_model(mb.model)
        t1 = time.perf_counter()
        load_model(mb.model)
        t2 = time.perf_counter()
        return {"mode": "in-process", "first": t1 - t0, "second": t2 - t1,
                "first_over_second": (t1 - t0) / (t2 - t1)}
    runs = []
    with tempfile.TemporaryDirectory(prefix="sat_llm_cache_bench_") as cache:
        env = {**os.environ, "SAT_LLM_CACHE": cache, "HF_HUB_OFFLINE": "1",
               "TRANSFORMERS_VERBOSITY": "error"}
        for _ in range(2):
            t0 = time.perf_counter()
            p = subprocess.run([sys.executable, "-c", _LOAD_SNIPPET.format(name=mb.model)],
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
            wall = time.perf_counter() - t0
            if p.returncode != 0:
                return {"mode": "subprocess", "error": p.stderr.strip().splitlines()[-1:]}
            runs.append({**json.loads(p.stdout.strip().splitlines()[-1]), "process_wall": wall})
    return {"mode": "subprocess, empty cache then filled", "runs": runs,
            "first": runs[0]["load"], "second": runs[1]["load"],
            "first_over_second": runs[0]["load"] / runs[1]["load"],
            "same_process_again": runs[1]["load_again_same_process"]}


# ------------------------------------------------------------------ 5. scaling
def bench_scaling(team, mb: ModelBench, cfg: LLMBenchConfig) -> dict:
    import torch

    def timed_rollout(t, B, G):
        torch.manual_seed(cfg.seed)
        t0 = time.perf_counter()
        b = t.rollout(B, G)
        return time.perf_counter() - t0, int(b.extra["tokens"])

    timed_rollout(team, 1, 1)  # warm-up
    series_G = []
    for G in mb.scale_G:
        dt, tok = timed_rollout(team, 1, G)
        series_G.append({"x": G, "t": dt, "tokens": tok})
    series_n = []
    for n in mb.scale_n:
        t = team if n == team.n_agents else make_team(mb, cfg, agents=n)
        timed_rollout(t, 1, 1)
        dt, tok = timed_rollout(t, 1, 4)
        series_n.append({"x": n, "t": dt, "tokens": tok})
    fits = {"rollout_vs_G": fit([p["x"] for p in series_G], [p["t"] for p in series_G]),
            "rollout_vs_n": fit([p["x"] for p in series_n], [p["t"] for p in series_n])}
    return {"series": {"rollout_vs_G": series_G, "rollout_vs_n": series_n}, "fits": fits}


# ------------------------------------------------------------------ 8. profile of one step
class PhaseTimer:
    """Exclusive wall time per phase of nested calls: ``wrap(owner, name, label)`` replaces
    ``owner.name`` by a timed wrapper; a phase's time excludes the phases called inside it
    (so the phases add up to the timed region)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[float] = []  # children's inclusive time of each open phase
        self._undo: list = []

    def wrap(self, owner, name: str, label: str) -> None:
        inner = getattr(owner, name)

        def timed(*a, **kw):
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                dt = time.perf_counter() - t0
                children = self._stack.pop()
                self.seconds[label] = self.seconds.get(label, 0.0) + dt - children
                self.calls[label] = self.calls.get(label, 0) + 1
                if self._stack:
                    self._stack[-1] += dt

        had = name in vars(owner) if not isinstance(owner, type) else name in owner.__dict__
        self._undo.append((owner, name, inner if had else None))
        setattr(owner, name, timed)

    def restore(self) -> None:
        for owner, name, inner in reversed(self._undo):
            if inner is None:
                delattr(owner, name)
            else:
                setattr(owner, name, inner)
        self._undo.clear()


#: the study's settings of a profiled step (figures/llm_team_learning/v2/*/config.json)
PROFILE = dict(prompts=8, group_size=4, max_new_tokens=16, minibatch=8, lora_r=8, ratio="token",
               temperature=0.7, lr=1e-3, delta=0.05, logp_check=2)


def bench_profile(mb: ModelBench, cfg: LLMBenchConfig, agents: int, rounds: int = 2,
                  method: str = "sat") -> dict:
    """Exclusive seconds of each phase of one SAT stage (``agents`` agent steps, each on a
    fresh batch, as ``run_stage`` takes them; no held-out evaluation) at the study's settings
    (:data:`PROFILE`): rollout (episode loop), generation split into the shared-prefix
    prefill and the decoding, the behaviour log-prob check, reference scoring, the update's
    forward, backward and optimizer step, the monitor (``team.kl``). One warm-up stage, then
    ``rounds`` timed stages; per phase the sum over the timed stages and its fraction."""
    import torch

    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import sat_llm.rollout as sr
    import sat_llm.scoring as st
    from sat_theory.algorithm import RunState, TrainConfig, run_stage

    P = PROFILE
    team = make_team(ModelBench(**{**asdict(mb), "max_new_tokens": P["max_new_tokens"]}), cfg,
                     agents=agents, minibatch=P["minibatch"], lora_r=P["lora_r"],
                     ratio=P["ratio"], temperature=P["temperature"], lr=P["lr"],
                     logp_check=P["logp_check"])
    tc = TrainConfig(method=method, stages=rounds + 1, n_groups=P["prompts"],
                     group_size=P["group_size"], delta=P["delta"], seed=cfg.seed,
                     **({"beta_init": 0.0} if method == "no-tr" else {}))
    state = RunState.initial(tc, agents)
    torch.manual_seed(cfg.seed)
    run_stage(team, tc, state, J_before=None, evaluate_after=False)  # warm-up
    pt = PhaseTimer()
    pt.wrap(team, "rollout", "rollout (episode loop, tokenizing)")
    pt.wrap(st, "generate", "decode")
    pt.wrap(sr, "_shared_prefix_cache", "prefill (shared prefixes)")
    pt.wrap(team, "_check_logps", "behaviour log-prob check")
    pt.wrap(team, "_ref_logps", "reference scoring")
    pt.wrap(team, "update", "update: optimizer step, clip, rest")
    pt.wrap(team, "_accumulate", "update: backward")
    pt.wrap(team, "_minibatch_loss", "update: forward")
    pt.wrap(team, "kl", "monitor (exact + sampled KL)")
    steps: list[dict] = []
    load = [round(x, 2) for x in os.getloadavg()]
    t0 = time.perf_counter()
    try:
        for _ in range(rounds):
            run_stage(team, tc, state, J_before=None, evaluate_after=False,
                      log=lambda r: steps.append(r) if r["kind"] == "step" else None)
    finally:
        pt.restore()
    total = time.perf_counter() - t0
    rest = total - sum(pt.seconds.values())
    phases = {**pt.seconds, "other (records, snapshots, advantages)": rest}
    return {"agents": agents, "method": method, "settings": P, "stages": rounds,
            "agent_steps": len(steps), "backtracks": sum(r["backtracks"] for r in steps),
            "opt_steps": sum(r["opt_steps"] or 0 for r in steps),
            "tokens": sum(r["tokens"] or 0 for r in steps), "seconds": total,
            "seconds_per_agent_step": total / max(len(steps), 1),
            "phases": phases, "fractions": {k: v / total for k, v in phases.items()},
            "calls": pt.calls, "loadavg_before": load,
            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}


def main_profile(cfg: LLMBenchConfig, out: str | None = None, verbose: bool = True,
                 tag: str = "", rounds: int = 2) -> dict:
    """Section 8 for every model of ``cfg``, n = 1 and n = 2 (``--profile``)."""
    import torch

    torch.set_num_threads(cfg.threads)
    info = machine_info()
    info["torch_threads"] = torch.get_num_threads()
    models = {}
    for mb in cfg.models:
        models[mb.model] = {f"n{n}": bench_profile(mb, cfg, n, rounds) for n in (1, 2)}
    rows = [{"model": m, "n": r["agents"], "steps": r["agent_steps"], "backtracks": r["backtracks"],
             "s/step": r["seconds_per_agent_step"],
             **{k.split(" (")[0]: v for k, v in r["fractions"].items()}}
            for m, d in models.items() for r in d.values()]
    result = {"benchmark": "llm_profile", "config": asdict(cfg), "machine": info,
              "models": models, "rows": rows}
    path = save_json(result, "bench_llm_profile" + tag, out)
    if verbose:
        print(fmt_table(rows, list(rows[0])))
        print(f"wrote {path}")
    return result


# ------------------------------------------------------------------ 6. one step vs TRL
def trl_available() -> str | None:
    """``None`` if TRL's trainer can be built here; else the reason (one line)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from experiments.peer_trl import trl_available as peer

    return peer()


def bench_vs_trl(mb: ModelBench, cfg: LLMBenchConfig) -> dict:
    """Section 6 of the module docstring: ``{"ours": [...], "sat": [...], "trl": [...],
    medians, ratios}``. One step = one batch of ``B·G`` sampled completions and the
    ``B·G/minibatch`` optimizer steps on it: for ours one ``run_stage`` of a one-agent team
    (rollout, behaviour log-prob check, reference pass, update, exact-KL monitor, records;
    no held-out evaluation); for TRL its ``steps_per_generation`` trainer steps of one
    generation batch (generation, old log-probs, loss and backward, optimizer)."""
    import torch
    from transformers import TrainerCallback

    from experiments.peer_trl import grpo_trainer
    from sat_theory.algorithm import RunState, TrainConfig, run_stage

    B, G = mb.trl_prompts, mb.trl_group_size
    per_gen = B * G
    minibatch = mb.trl_minibatch or per_gen
    if per_gen % minibatch:
        raise ValueError("trl_prompts x trl_group_size must be a multiple of trl_minibatch")
    spg = per_gen // minibatch  # optimizer steps per generation batch (TRL steps_per_generation)
    kw = dict(agents=1, temperature=mb.trl_temperature, lr=mb.trl_lr, minibatch=minibatch,
              ratio="token")  # the token ratio: TRL dr_grpo's update (tests/llm/test_trl_oracle.py)
    contenders = {  # ours plain (the study's `plain`: β 1e-300 = 0 in float32), and SAT
        "ours": (make_team(mb, cfg, **kw), TrainConfig(
            method="no-tr", beta_init=1e-300, normalize_std=False, n_groups=B, group_size=G,
            seed=cfg.seed, stages=1 << 20)),
        "sat": (make_team(mb, cfg, **kw), TrainConfig(
            method="sat", delta=mb.trl_delta, normalize_std=False, n_groups=B, group_size=G,
            seed=cfg.seed, stages=1 << 20))}
    states = {k: RunState.initial(tc, 1) for k, (_, tc) in contenders.items()}
    rows: dict[str, list[dict]] = {k: [] for k in contenders}

    def our_step(name):
        team, tc = contenders[name]
        recs: list[dict] = []
        t0 = time.perf_counter()
        run_stage(team, tc, states[name], J_before=None, evaluate_after=False, log=recs.append)
        dt = time.perf_counter() - t0
        st = [r for r in recs if r["kind"] == "step"]
        rows[name].append(dict(step=dt, tokens=int(sum(r["tokens"] for r in st)),
                               opt_steps=int(sum(r["opt_steps"] or 0 for r in st)),
                               backtracks=int(sum(r["backtracks"] for r in st)),
                               kl=float(st[0]["kl"]), load=round(os.getloadavg()[0], 2)))

    def ours_both(k):  # the two of ours, order alternating with the pair index
        for name in (("ours", "sat") if k % 2 == 0 else ("sat", "ours")):
            our_step(name)

    class Interleave(TrainerCallback):
        """Ours before TRL's odd generation batches and after its even ones; TRL's batch
        (its ``spg`` trainer steps) timed alone."""

        def on_step_begin(self, args, state, control, **kw):
            k, first = divmod(state.global_step, spg)
            if first == 0:
                if k % 2 == 1:
                    ours_both(k)
                self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            k, last = divmod(state.global_step - 1, spg)  # global_step counts this step now
            if last == spg - 1:
                trl_times.append(time.perf_counter() - self.t0)
                if k % 2 == 0:
                    ours_both(k)

    trl_times: list[float] = []
    team0, _ = contenders["ours"]
    c = team0.cfg
    # TRL dr_grpo divides by mb·L_max where ours divides by M: its gradient is ours / (L_max mb/M)
    clip = c.grad_clip / (c.max_new_tokens * minibatch / per_gen)
    with tempfile.TemporaryDirectory(prefix="bench_trl_") as tmp:
        tr = grpo_trainer(mb.model, team0.task, team0.train_pool, lora_r=c.lora_r,
                          lora_alpha=c.lora_alpha, lora_targets=c.lora_targets, group_size=G,
                          prompts_per_step=B, lr=c.lr, max_new_tokens=c.max_new_tokens,
                          temperature=c.temperature, seed=cfg.seed, out_dir=tmp,
                          steps=(mb.trl_reps + 1) * spg, grad_clip=clip, loss_type="dr_grpo",
                          importance_sampling_level="token", scale_rewards="none",
                          per_device_train_batch_size=minibatch, steps_per_generation=spg)
        tr.add_callback(Interleave())
        torch.manual_seed(cfg.seed)
        tr.train()
    logs = [r for r in tr.state.log_history if "completions/mean_length" in r]
    # TRL logs its completion metrics once per generation batch or once per trainer step
    gen_logs = logs if len(logs) == len(trl_times) else logs[::spg]
    trl = [dict(step=t, tokens=int(round(r["completions/mean_length"] * per_gen)))
           for t, r in zip(trl_times, gen_logs, strict=True)]
    o, sa, t = rows["ours"][1:], rows["sat"][1:], trl[1:]  # pair 0: warm-up

    def med(rs, key):
        return float(np.median([r[key] for r in rs]))

    def per_tok(rs):
        return float(np.median([r["step"] / max(r["tokens"], 1) for r in rs]))

    def paired(a, b):  # pair k ran back to back: robust to load that drifts
        return [y["step"] / x["step"] for x, y in zip(a, b, strict=True)]

    return {"prompts": B, "group_size": G, "minibatch": minibatch, "steps_per_generation": spg,
            "max_new_tokens": c.max_new_tokens, "temperature": c.temperature, "lr": c.lr,
            "lora": [c.lora_r, c.lora_alpha, list(c.lora_targets)], "sat_delta": mb.trl_delta,
            "trl_loss_type": "dr_grpo (token level, scale_rewards none)", "trl_max_grad_norm": clip,
            "reps": len(o), "ours": rows["ours"], "sat": rows["sat"], "trl": trl,
            "ours_step_median": med(o, "step"), "sat_step_median": med(sa, "step"),
            "trl_step_median": med(t, "step"),
            "ours_tokens_median": med(o, "tokens"), "sat_tokens_median": med(sa, "tokens"),
            "trl_tokens_median": med(t, "tokens"),
            "ratio": med(t, "step") / med(o, "step"),
            "ratio_paired": float(np.median(paired(o, t))), "pairs": paired(o, t),
            "ratio_sat": med(t, "step") / med(sa, "step"),
            "ratio_sat_paired": float(np.median(paired(sa, t))), "pairs_sat": paired(sa, t),
            "ratio_per_token": per_tok(t) / per_tok(o),
            "ratio_sat_per_token": per_tok(t) / per_tok(sa),
            "sat_backtracks": sum(r["backtracks"] for r in sa),
            "ours_updates_skipped": sum(r["opt_steps"] == 0 for r in o)}


def trl_row(name: str, r: dict) -> dict:
    return {"model": name, "B x G / mb": f"{r['prompts']} x {r['group_size']} / {r['minibatch']}",
            "new_tokens": r["max_new_tokens"], "reps": r["reps"],
            "ours_s": r["ours_step_median"], "sat_s": r["sat_step_median"],
            "trl_s": r["trl_step_median"], "ours_tok": r["ours_tokens_median"],
            "sat_tok": r["sat_tokens_median"], "trl_tok": r["trl_tokens_median"],
            "trl/ours": r["ratio"], "paired": r["ratio_paired"], "per_token": r["ratio_per_token"],
            "trl/sat": r["ratio_sat"], "sat_paired": r["ratio_sat_paired"],
            "sat_per_token": r["ratio_sat_per_token"], "sat_backtracks": r["sat_backtracks"]}


def trl_targets(name: str, r: dict) -> list[dict]:
    """Issue 27's two targets: TRL's step / ours-plain ≥ 1.5 and TRL's step / our SAT step with
    its exact-KL monitor ≥ 1.2 (per-pair medians)."""
    return [target_line(f"{name}: TRL GRPOTrainer step / our step (n = 1), paired median",
                        r["ratio_paired"], 1.5),
            target_line(f"{name}: TRL GRPOTrainer step / our SAT step with its monitor (n = 1), "
                        "paired median", r["ratio_sat_paired"], 1.2)]


def main_vs_trl(cfg: LLMBenchConfig, out: str | None = None, verbose: bool = True,
                tag: str = "") -> dict:
    """Only section 6, for every model of ``cfg`` (``--vs-trl``)."""
    import torch

    torch.set_num_threads(cfg.threads)
    info = machine_info()
    info["torch_threads"] = torch.get_num_threads()
    reason = available() or trl_available()
    if reason is not None:
        if verbose:
            print(f"ours vs TRL skipped: {reason}")
        return {"benchmark": "llm_trl", "skipped": reason, "targets": []}
    import trl

    info["versions"].update({m: getattr(__import__(m), "__version__", None)
                             for m in ("torch", "transformers", "peft")}, trl=trl.__version__)
    models = {}
    for mb in cfg.models:
        before = [round(x, 2) for x in os.getloadavg()]
        models[mb.model] = {**bench_vs_trl(mb, cfg), "loadavg_before": before,
                            "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    rows = [trl_row(k, r) for k, r in models.items()]
    targets = [t for k, r in models.items() for t in trl_targets(k, r)]
    result = {"benchmark": "llm_trl", "config": asdict(cfg), "machine": info, "models": models,
              "rows": rows, "targets": targets}
    path = save_json(result, "bench_llm_trl" + tag, out)
    if verbose:
        print(fmt_table(rows, list(rows[0])))
        print_targets(targets, path)
    return result


# ------------------------------------------------------------------ driver
def bench_model(mb: ModelBench, cfg: LLMBenchConfig, verbose: bool) -> dict:
    def say(msg):
        if verbose:
            print(f"[{mb.model}] {msg}", flush=True)

    out = {"settings": asdict(mb), "loadavg_before": [round(x, 2) for x in os.getloadavg()]}
    t0 = time.perf_counter()
    out["load"] = bench_load(mb)
    say(f"load: first {out['load'].get('first', float('nan')):.2f}s, "
        f"second {out['load'].get('second', float('nan')):.2f}s")
    team = make_team(mb, cfg)
    out["throughput"] = tp = bench_throughput(team, mb, cfg)
    say(f"throughput: batched {tp['batched_tok_s']:.0f} tok/s, per-sample "
        f"{tp['per_sample_tok_s']:.0f} tok/s, x{tp['speedup']:.2f}")
    out["kl"] = kl = bench_kl(team, mb, cfg, 1)
    batch = kl.pop("batch")
    say(f"kl monitor: {kl['t_kl']:.3f}s vs update {kl['t_update']:.3f}s "
        f"({kl['kl_over_update']:.1%}), 1 epoch")
    # the second speaker's turns: contexts differ per episode (they hold agent 1's message)
    # and share only the prompt part, so prefix sharing saves less than for agent 1's copies
    out["kl_agent2"] = k2 = bench_kl(team, mb, cfg, 1, batch, agent=1)
    k2.pop("batch")
    say(f"kl monitor, agent 2: {k2['t_kl']:.3f}s vs update {k2['t_update']:.3f}s "
        f"({k2['kl_over_update']:.1%}), 1 epoch")
    out["kl_epochs"] = {}
    for e in mb.kl_more_epochs:  # more passes per update: the monitor's share shrinks
        k2 = bench_kl(team, mb, cfg, e, batch)
        k2.pop("batch")
        out["kl_epochs"][e] = k2
        say(f"kl monitor: {k2['t_kl']:.3f}s vs update {k2['t_update']:.3f}s "
            f"({k2['kl_over_update']:.1%}), {e} epochs")
    out["scaling"] = sc = bench_scaling(team, mb, cfg)
    say("rollout time exponents: " + ", ".join(f"{k} {v['exponent']:.2f}" for k, v in sc["fits"].items()))
    del team
    out["logp_check"] = lc = bench_logp_check(mb, cfg)
    say(f"behaviour log-prob check: rollout {lc['on_s']:.2f}s on vs {lc['off_s']:.2f}s off "
        f"({lc['overhead']:+.1%})")
    out["resampling"] = rs = bench_resampling(mb, cfg)
    say(f"resampling: tokens +{rs['token_overhead_same_batch']:.1%} (same batch), "
        f"{rs['token_overhead_matched']:+.1%} (matched budget)")
    if mb.trl_reps and trl_available() is None:
        out["vs_trl"] = vt = bench_vs_trl(mb, cfg)
        say(f"one n=1 step: ours {vt['ours_step_median']:.2f}s, TRL {vt['trl_step_median']:.2f}s "
            f"(TRL/ours {vt['ratio']:.2f}x)")
    out["seconds"] = time.perf_counter() - t0
    out["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return out


def main(quick: bool = False, out: str | None = None, cfg: LLMBenchConfig | None = None,
         verbose: bool = True) -> dict:
    reason = available()
    if reason is not None:
        res = {"benchmark": "llm", "skipped": reason, "targets": []}
        if verbose:
            print(f"llm benchmark skipped: {reason}")
        return res
    import torch

    cfg = cfg or (QUICK if quick else FULL)
    torch.set_num_threads(cfg.threads)
    info = machine_info()
    info["torch_threads"] = torch.get_num_threads()
    info["versions"].update({m: getattr(__import__(m), "__version__", None)
                             for m in ("torch", "transformers", "peft")})
    models = {mb.model: bench_model(mb, cfg, verbose) for mb in cfg.models}
    targets = []
    for name, r in models.items():
        targets.append(target_line(f"{name}: batched / per-sample tokens/s",
                                   r["throughput"]["speedup"], cfg.speedup_goal))
        targets.append(target_line(f"{name}: exact-KL monitor / update time",
                                   r["kl"]["kl_over_update"], cfg.kl_goal, higher_is_better=False))
        targets.append(target_line(f"{name}: exact-KL monitor / update time, agent 2",
                                   r["kl_agent2"]["kl_over_update"], cfg.kl_goal,
                                   higher_is_better=False))
        if "vs_trl" in r:
            targets += trl_targets(name, r["vs_trl"])
    rows = [{"model": k, "batched_tok_s": r["throughput"]["batched_tok_s"],
             "per_sample_tok_s": r["throughput"]["per_sample_tok_s"],
             "speedup": r["throughput"]["speedup"],
             "prefill_share": r["throughput"]["prefill_share_batched"],
             "prefill_x": r["throughput"]["prefill_speedup"],
             "decode_x": r["throughput"]["decode_speedup"],
             "unshared_x": r["throughput"]["unshared_speedup"], "t_update": r["kl"]["t_update"],
             "t_kl": r["kl"]["t_kl"], "kl/update": r["kl"]["kl_over_update"],
             "kl/update_cached": r["kl"]["kl_over_update_cached_ref"],
             "sampled/update": r["kl"]["sampled_over_update"],
             "kl/update_a2": r["kl_agent2"]["kl_over_update"],
             **{f"kl/update_{e}ep": v["kl_over_update"] for e, v in r["kl_epochs"].items()},
             "logp_check+": r["logp_check"]["overhead"],
             "tok+_same": r["resampling"]["token_overhead_same_batch"],
             "tok+_matched": r["resampling"]["token_overhead_matched"],
             "load_1st": r["load"].get("first"), "load_2nd": r["load"].get("second"),
             "G_exp": r["scaling"]["fits"]["rollout_vs_G"]["exponent"],
             "n_exp": r["scaling"]["fits"]["rollout_vs_n"]["exponent"]}
            for k, r in models.items()]
    result = {"benchmark": "llm", "quick": quick, "config": asdict(cfg), "machine": info,
              "models": models, "rows": rows, "targets": targets,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    path = save_json(result, "bench_llm" + ("_quick" if quick else ""), out)
    if verbose:
        print(fmt_table(rows, list(rows[0])))
        trl_rows = [trl_row(k, r["vs_trl"]) for k, r in models.items() if "vs_trl" in r]
        if trl_rows:
            print(fmt_table(trl_rows, list(trl_rows[0])))
        print_targets(targets, path)
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny-random only, small settings")
    ap.add_argument("--smoke", action="store_true", help="seconds; checks that it runs")
    ap.add_argument("--out", help="JSON output path (default results/bench_llm.json)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1)")
    ap.add_argument("--vs-trl", action="store_true",
                    help="only the n = 1 step of ours vs TRL's GRPOTrainer (section 6)")
    ap.add_argument("--profile", action="store_true",
                    help="only the phase profile of one SAT stage, n = 1 and 2 (section 8)")
    ap.add_argument("--profile-rounds", type=int, default=2, help="timed stages per profile")
    ap.add_argument("--model", default=None, help="only this model's settings (e.g. smollm2-135m)")
    a = ap.parse_args()
    c = SMOKE if a.smoke else (QUICK if a.quick else FULL)
    models = tuple(m for m in c.models if a.model in (None, m.model))
    if not models:
        ap.error(f"no settings for model {a.model!r} in this configuration")
    c = LLMBenchConfig(**{**asdict(c), "models": models,
                          "threads": c.threads if a.threads is None else a.threads})
    if a.profile:
        main_profile(c, out=a.out, tag="_smoke" if a.smoke else ("_quick" if a.quick else ""),
                     rounds=a.profile_rounds)
    elif a.vs_trl:
        main_vs_trl(c, out=a.out, tag="_smoke" if a.smoke else ("_quick" if a.quick else ""))
    else:
        main(quick=a.quick, out=a.out, cfg=c)
