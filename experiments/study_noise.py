"""Run noise of the parity study (issue 21, item 3): where two runs of one algorithm on the
same problems differ, for ours-plain and TRL dr_grpo, from the committed run folders only.

The parity table reports, per seed, the lenient-AUC difference of a run and its rerun (same
problems, another trainer seed: ``plain`` / ``plain-rerun``, ``trl-drgrpo`` / ``trl-rerun``).
Those few numbers are means over ``K`` checkpoints; this module looks inside them. With the
two runs' 0/1 score matrices ``A``, ``B`` (``K`` checkpoints × ``n`` problems, ``k = 0`` the
untrained model, identical for both) and ``d_k = 100 · (mean_i A[k, i] − mean_i B[k, i])``
(points; ``d_0 = 0``), :func:`pair_noise` gives

- ``auc = (1/K) Σ_k d_k``: the AUC difference of the parity table;
- ``ck_rms = sqrt(Σ_{k≥1} d_k² / (K−1))``: how far apart the runs are at one checkpoint;
- ``persistence = (Σ_k d_k)² / Σ_{k≥1} d_k²``: how much the checkpoint deviations add up
  rather than cancel. Two runs of one algorithm have ``E d_k = 0``; with independent
  deviations its expectation is 1, with a constant offset it is ``K − 1`` (its maximum). So
  ``auc² = persistence · ck_rms² · (K−1) / K²``: a large AUC difference needs either runs far
  apart at every checkpoint or deviations of one sign;
- ``lag1 = Σ_{k≥1} d_k d_{k+1} / Σ_{k≥1} d_k²``: the lag-1 autocorrelation around 0;
- ``disagree``: the fraction of (checkpoint ≥ 1, problem) cells where exactly one run is
  right.

:func:`variance_ratio` compares two methods' rerun differences (each zero-mean by
construction): ``F = mean(a²) / mean(b²)``, its one-sided p-value under normal run noise
(``F`` with ``(len a, len b)`` degrees of freedom) and the exact permutation p-value (every
way of labelling ``len(a)`` of the pooled values as ``a``; no distributional assumption).

Per run (:func:`run_profile`): AUC under both scorings, the format rate's course (checkpoints
``k ≥ 1`` with a mixed format rate, between :data:`MIXED`), the greedy outputs' churn (the
fraction of held-out problems whose final message changes between consecutive checkpoints
``k ≥ 1``), the correctness flips and the spread of checkpoint-to-checkpoint changes; how
often each training problem was drawn, replayed from the seeds (:func:`ours_prompt_counts`:
ours draws ``B`` distinct problems per rollout from its numpy stream, independently every
rollout; :func:`epoch_prompt_counts`: ours with ``--prompt-draw epoch``;
:func:`trl_prompt_counts`: TRL's ``RepeatSampler`` one permutation per epoch in
chunks of ``B``, dropping the incomplete chunk); and ours' step records
(:func:`step_profile`; TRL logs no step records in the study).

Usage: ``python experiments/study_noise.py [--runs figures/llm_team_learning/v2] [--out FILE]``
(the markdown goes to stdout by default; the run folders are only read).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.llm_team_learning import (  # noqa: E402
    RERUN_SEED,
    _finished,
    format_rate,
    parse_run,
    run_name,
    score_matrix,
)
from experiments.study_metrics import curve_metrics  # noqa: E402

__all__ = ["pair_noise", "variance_ratio", "format_course", "churn", "ours_prompt_counts",
           "epoch_prompt_counts", "trl_prompt_counts", "step_profile", "run_profile", "pairs", "report", "main"]

#: a checkpoint's format rate strictly between these is "mixed": the run is between the
#: answer-line style and the bare ``a op b = c`` style
MIXED = (0.1, 0.9)
#: run -> its rerun (same problems, the trainer seed RERUN_SEED + s)
RERUNS = {"plain": "plain-rerun", "trl-drgrpo": "trl-rerun", "plain-epoch": "plain-epoch-rerun"}
#: the parity pairs themselves, for comparison with the rerun pairs
CROSS = (("plain", "trl-drgrpo"), ("plain-rerun", "trl-rerun"), ("plain-epoch", "trl-drgrpo"))
#: the run-noise comparisons: each of ours' prompt draws (independent; epoch, TRL's) against
#: TRL, on their rerun pairs
VERSUS = (("plain", "trl-drgrpo"), ("plain-epoch", "trl-drgrpo"))
DEFAULT_RUNS = Path(__file__).resolve().parents[1] / "figures" / "llm_team_learning" / "v2"


def pair_noise(A, B) -> dict[str, float]:
    """The module docstring's statistics of two runs' score matrices ``A``, ``B`` (K, n) on
    the same checkpoints and problems."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    if A.shape != B.shape or A.ndim != 2 or A.shape[0] < 3:
        raise ValueError(f"need two (K >= 3, n) matrices of one shape, got {A.shape}, {B.shape}")
    K = A.shape[0]
    d = 100 * (A.mean(1) - B.mean(1))
    tail = d[1:]
    ss = float((tail ** 2).sum())
    return dict(auc=float(d.mean()), ck_rms=math.sqrt(ss / (K - 1)),
                persistence=float(d.sum() ** 2 / ss) if ss else 0.0,
                lag1=float((tail[:-1] * tail[1:]).sum() / ss) if ss else 0.0,
                disagree=float((A[1:] != B[1:]).mean()))


def variance_ratio(a, b) -> dict[str, float]:
    """``F = mean(a²)/mean(b²)`` of two sets of zero-mean differences, ``p_normal = P(F_{na,
    nb} ≥ F)`` and ``p_perm``: the fraction of the ``C(na+nb, na)`` labellings of the pooled
    values whose ratio is ≥ the observed one."""
    from scipy.stats import f as f_dist

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1 or len(a) < 1 or len(b) < 1 or not np.any(b):
        raise ValueError("need two non-empty sets of differences, the second not all 0")
    ratio = float(np.mean(a ** 2) / np.mean(b ** 2))
    pool = np.concatenate([a, b]) ** 2
    hits = total = 0
    for idx in itertools.combinations(range(len(pool)), len(a)):
        mask = np.zeros(len(pool), dtype=bool)
        mask[list(idx)] = True
        if pool[~mask].sum():
            total += 1
            hits += pool[mask].mean() / pool[~mask].mean() >= ratio * (1 - 1e-12)
    return dict(ratio=ratio, p_normal=float(f_dist.sf(ratio, len(a), len(b))),
                p_perm=hits / total)


def format_course(rates) -> dict[str, float]:
    """``mixed``: checkpoints ``k ≥ 1`` whose format rate lies strictly inside :data:`MIXED`;
    ``final``: the last checkpoint's rate."""
    r = np.asarray(rates, dtype=np.float64)
    return dict(mixed=int(((r[1:] > MIXED[0]) & (r[1:] < MIXED[1])).sum()), final=float(r[-1]))


def churn(texts, S) -> dict[str, float]:
    """``texts[k][i]``: checkpoint ``k``'s final message on problem ``i``; ``S`` the 0/1
    scores. Over consecutive checkpoints ``k, k+1`` with ``k ≥ 1``: ``text`` the mean fraction
    of problems whose message changes, ``flips`` the mean fraction whose score changes,
    ``step_sd`` the standard deviation (points) of the accuracy changes."""
    S = np.asarray(S, dtype=np.float64)
    K = len(texts)
    if K < 3 or S.shape[0] != K:
        raise ValueError("need >= 3 checkpoints of texts and scores")
    text = [np.mean([x != y for x, y in zip(texts[k], texts[k + 1], strict=True)])
            for k in range(1, K - 1)]
    acc = S.mean(1)
    return dict(text=float(np.mean(text)), flips=float((S[2:] != S[1:-1]).mean()),
                step_sd=float(100 * np.diff(acc[1:]).std()))


def ours_prompt_counts(seed: int, pool: int, per_rollout: int, rollouts: int) -> np.ndarray:
    """How often each of ``pool`` training problems is drawn by ``rollouts`` rollouts of our
    team with ``seed``: its numpy stream ``default_rng(seed)`` picks ``per_rollout`` distinct
    problems per rollout (:meth:`sat_llm.episodes.EpisodeLoop.rollout`; nothing else draws
    from it with one agent and the round-robin router)."""
    rng = np.random.default_rng(seed)
    counts = np.zeros(pool, dtype=np.int64)
    for _ in range(rollouts):
        counts[rng.choice(pool, size=per_rollout, replace=per_rollout > pool)] += 1
    return counts


def epoch_prompt_counts(seed: int, pool: int, per_rollout: int, rollouts: int) -> np.ndarray:
    """The same for ours with ``--prompt-draw epoch`` (:func:`sat_llm.episodes.epoch_chunk`:
    rollout ``r`` takes its chunk of epoch ``r // ⌊pool/B⌋``'s permutation)."""
    from sat_llm.episodes import epoch_chunk

    counts = np.zeros(pool, dtype=np.int64)
    for r in range(rollouts):
        counts[epoch_chunk(pool, per_rollout, r, seed)] += 1
    return counts


def trl_prompt_counts(seed: int, pool: int, per_generation: int, generations: int) -> np.ndarray:
    """The same for TRL's ``RepeatSampler`` with ``seed``: a ``torch.Generator`` seeded once
    draws one permutation of the pool per epoch; generation ``g`` takes its chunk of
    ``per_generation`` prompts, the incomplete last chunk of an epoch is dropped."""
    import torch

    gen = torch.Generator()
    gen.manual_seed(int(seed))
    counts = np.zeros(pool, dtype=np.int64)
    chunks = pool // per_generation
    done = 0
    while done < generations:
        perm = torch.randperm(pool, generator=gen).tolist()
        for c in range(min(chunks, generations - done)):
            counts[perm[c * per_generation:(c + 1) * per_generation]] += 1
            done += 1
    return counts


def step_profile(records: list[dict], clip: float) -> dict[str, float] | None:
    """Ours' step records: ``kl`` the mean exact KL of an update to the policy before it,
    ``zero_adv`` the fraction of steps skipped for all-zero advantages (``opt_steps == 0``),
    ``clipped`` the fraction whose last minibatch's gradient norm reached ``clip`` and
    ``idle_last``, of the steps that updated, the fraction whose last minibatch had no
    gradient (its groups' advantages all 0: Adam then moves on momentum alone). ``None``
    without step records (a peer run). Only the last minibatch's norm is logged."""
    steps = [r for r in records if r.get("kind") == "step"]
    if not steps:
        return None
    kl = [r["kl"] for r in steps if r.get("kl") is not None]
    moved = [r for r in steps if r.get("opt_steps")]
    return dict(kl=float(np.mean(kl)) if kl else float("nan"),
                zero_adv=float(np.mean([not r.get("opt_steps") for r in steps])),
                clipped=float(np.mean([(r.get("grad_norm") or 0.0) >= clip * (1 - 1e-6)
                                       for r in steps])),
                idle_last=float(np.mean([not r.get("grad_norm") for r in moved])) if moved
                else float("nan"))


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _trainer(d: Path) -> dict:
    """``seed``, ``pool``, ``per_unit`` (prompts per rollout / generation), ``units``
    (rollouts / generations: ours, the last step's ``rollout_id``, which counts them) and
    ``clip`` of a run folder, from its config and records."""
    cfg = json.loads((d / "config.json").read_text())
    ks, _ = score_matrix(d)
    if "grpo" in cfg:  # a TRL run: one generation per evaluated unit
        g = cfg["grpo"]
        return dict(kind="trl", seed=int(g["seed"]), pool=int(cfg["study"]["n_train"]),
                    per_unit=int(g["generation_batch_size"] // g["num_generations"]),
                    units=max(ks), clip=float(g["max_grad_norm"]))
    llm = cfg["backend"]["llm"]
    recs = _records(d / "metrics.jsonl")
    kind = "ours-epoch" if llm.get("prompt_draw") == "epoch" else "ours"
    return dict(kind=kind, seed=int(cfg["algorithm"]["seed"]), pool=int(llm["n_train"]),
                per_unit=int(cfg["algorithm"]["n_groups"]), clip=float(llm["grad_clip"]),
                units=max((int(r["rollout_id"]) for r in recs if r["kind"] == "step"), default=0))


def run_profile(d: Path) -> dict:
    """One run folder's profile (module docstring)."""
    ks, S = score_matrix(d, "lenient")
    _, St = score_matrix(d, "strict")
    texts = [[r["final"] for r in sorted(_records(d / f"eval_{k}.jsonl"), key=lambda r: r["id"])]
             for k in ks]
    t = _trainer(d)
    counts = {"trl": trl_prompt_counts, "ours": ours_prompt_counts,
              "ours-epoch": epoch_prompt_counts}[t["kind"]](t["seed"], t["pool"], t["per_unit"],
                                                            t["units"])
    steps = step_profile(_records(d / "metrics.jsonl"), t["clip"])
    return dict(checkpoints=ks, auc=100 * curve_metrics(S)["auc"],
                auc_strict=100 * curve_metrics(St)["auc"],
                **{f"format_{k}": v for k, v in
                   format_course([format_rate(d / f"eval_{k}.jsonl") for k in ks]).items()},
                **{f"churn_{k}": v for k, v in churn(texts, S).items()},
                never=int((counts == 0).sum()), most=int(counts.max()),
                count_sd=float(counts.std()), trainer_seed=t["seed"], steps=steps)


def pairs(runs: Path, lr: float = 1e-3) -> list[tuple[str, str, int, str, str]]:
    """``(kind, method, seed, a, b)`` of every finished pair at ``lr``: each run and its rerun
    (kind ``rerun``) and the parity pairs (kind ``cross``)."""
    seeds = sorted({parse_run(p.name)[3] for p in runs.iterdir()
                    if p.is_dir() and _finished(p) and not json.loads(
                        (p / "study.json").read_text()).get("tune")})
    out = []
    for s in seeds:
        for kind, table in (("rerun", RERUNS.items()), ("cross", CROSS)):
            for m, m2 in table:
                a, b = run_name(m, lr, s), run_name(m2, lr, s)
                if _finished(runs / a) and _finished(runs / b):
                    out.append((kind, m, s, a, b))
    return out


def _pair(runs: Path, a: str, b: str) -> dict:
    (ka, A), (kb, B) = score_matrix(runs / a), score_matrix(runs / b)
    if ka != kb:
        raise ValueError(f"{a} and {b} are not on the same checkpoints: {ka} vs {kb}")
    pa = [r["prompt"] for r in _records(runs / a / "eval_0.jsonl")]
    if pa != [r["prompt"] for r in _records(runs / b / "eval_0.jsonl")]:
        raise ValueError(f"{a} and {b} are not scored on the same problems")
    return pair_noise(A, B)


def report(runs: Path, lr: float = 1e-3) -> str:
    """The markdown of the run-noise evidence of the run folders under ``runs``."""
    rows = [(kind, m, s, a, b, _pair(runs, a, b)) for kind, m, s, a, b in pairs(runs, lr)]
    out = ["**Pairs of runs on the same problems** (lenient; d_k = a − b at checkpoint k, "
           "points; rerun pairs differ only in the trainer seed, RERUN_SEED + s = "
           f"{RERUN_SEED} + s):", "",
           "| pair | AUC a − b | checkpoint RMS of d_k | persistence (Σd)²/Σd² | lag-1 "
           "autocorrelation | problems disagreeing |", "|---|---|---|---|---|---|"]
    for _, _, _, a, b, p in rows:
        out.append(f"| {a} − {b} | {p['auc']:+.1f} | {p['ck_rms']:.1f} | {p['persistence']:.1f}"
                   f" | {p['lag1']:+.2f} | {p['disagree']:.3f} |")
    by = {m: [p for kind, mm, _, _, _, p in rows if kind == "rerun" and mm == m] for m in RERUNS}
    out += ["", "**Run noise per method** (rerun pairs; F = ratio of the mean squares, "
            "ours over TRL; p: one-sided, under normal noise and by exact permutation):", "",
            "| statistic | ours reruns | TRL reruns | F | p (normal) | p (permutation) |",
            "|---|---|---|---|---|---|"]
    for ours, trl in VERSUS:
        for key, label in (("auc", "AUC difference, RMS"),
                           ("ck_rms", "checkpoint difference, RMS"),
                           ("persistence", "persistence, mean")):
            va, vb = [p[key] for p in by[ours]], [p[key] for p in by[trl]]
            if not va or not np.any(vb):  # no rerun of either, or TRL's without noise: no ratio
                continue
            agg = ((lambda v: math.sqrt(np.mean(np.square(v)))) if key != "persistence"
                   else np.mean)
            test = variance_ratio(va, vb) if key != "persistence" else None
            tail = (f"{test['ratio']:.1f} | {test['p_normal']:.3f} | {test['p_perm']:.2f}"
                    if test else "— | — | —")
            out.append(f"| {label} ({ours}) | {agg(va):.1f} (n = {len(va)}) | {agg(vb):.1f} "
                       f"(n = {len(vb)}) | {tail} |")
    names = sorted({x for *_, a, b, _ in rows for x in (a, b)})
    out += ["", "**Per run** (lenient / strict AUC; format: checkpoints k ≥ 1 with a format "
            f"rate in ({MIXED[0]}, {MIXED[1]}) and the final rate; churn between consecutive "
            "checkpoints k ≥ 1: messages changed, scores flipped, SD of the accuracy change; "
            "training problems by draws, replayed from the trainer seed; ours' steps: mean "
            "exact KL per update, share skipped for all-zero advantages, share whose last "
            "minibatch's gradient norm reached the clip, share of the updating steps whose "
            "last minibatch had no gradient):", "",
            "| run | trainer seed | AUC | format mixed / final | churn text / flips / step SD | "
            "problems never drawn, most draws, SD of draws | KL per update, zero-adv, clipped, "
            "idle last minibatch |",
            "|---|---|---|---|---|---|---|"]
    for name in names:
        r = run_profile(runs / name)
        st = r["steps"]
        steps = (f"{st['kl']:.2f}, {st['zero_adv']:.2f}, {st['clipped']:.2f}, "
                 f"{st['idle_last']:.2f}" if st else "not logged")
        out.append(f"| {name} | {r['trainer_seed']} | {r['auc']:.1f} / {r['auc_strict']:.1f} | "
                   f"{r['format_mixed']} / {r['format_final']:.2f} | {r['churn_text']:.2f} / "
                   f"{r['churn_flips']:.3f} / {r['churn_step_sd']:.1f} | {r['never']}, "
                   f"{r['most']}, {r['count_sd']:.2f} | {steps} |")
    return "\n".join(out) + "\n"


def main(out_dir=None, argv=None) -> str:
    """Print (or write to ``--out``) :func:`report` of the run folders ``out_dir`` (default:
    the committed common-schedule study, ``--runs``)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=None, help="the study's run folders (v2)")
    ap.add_argument("--out", type=Path, default=None, help="markdown file (default: stdout)")
    a = ap.parse_args(argv)
    text = report(Path(a.runs or out_dir or DEFAULT_RUNS))
    if a.out is None:
        print(text, end="")
    else:
        a.out.write_text(text)
    return text


if __name__ == "__main__":
    main()
