"""Issue 27 item 3: one whole study run before and after the step changes, side by side.

The two runs of ``results/run_level/`` are the issue-21 study's ``plain_lr0.001_s1`` (ours
plain GRPO, n = 1, 48 stages, 13 held-out evaluations of 200 problems), trained at the same
time on the 2-core machine, one torch thread each: ``before`` by the code of commit 78957eb
(before issue 27), ``after`` by 02844b3. They were made with

    git worktree add --detach ../before 78957eb      # and ../after at 02844b3
    cd ../before && PYTHONPATH=. python3 experiments/llm_team_learning.py \\
        --out OUT/before --run plain_lr0.001_s1      # the same in ../after, at the same time

and their config.json, metrics.jsonl, study.json and eval files copied here. This script
prints whether the records agree (every field but the timing fields ``seconds`` and
``peak_memory_bytes``) and the eval files are identical, and the times: wall (study.json),
training (the step records' seconds) and the evaluation share 1 − training / wall."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMING = ("seconds", "peak_memory_bytes")


def records(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]


def differing_fields(a: list[dict], b: list[dict]) -> list[tuple]:
    """``(record, field, a's value, b's value)`` wherever the runs differ, timing excluded."""
    if len(a) != len(b):
        return [("count", None, len(a), len(b))]
    return [(i, k, x.get(k), y.get(k)) for i, (x, y) in enumerate(zip(a, b, strict=True))
            for k in sorted(set(x) | set(y)) if k not in TIMING and x.get(k) != y.get(k)]


def times(d: Path) -> dict:
    meta = json.loads((d / "study.json").read_text())
    train = sum(r.get("seconds") or 0.0 for r in records(d) if r["kind"] == "step")
    return dict(wall_min=meta["wall_seconds"] / 60, train_min=train / 60,
                eval_share=1 - train / meta["wall_seconds"], load_start=meta["load_start"],
                load_end=meta["load_end"])


def main(root: Path) -> int:
    a, b = root / "before", root / "after"
    diff = differing_fields(records(a), records(b))
    evals = sorted(p.name for p in a.glob("eval_*.jsonl"))
    same_evals = evals == sorted(p.name for p in b.glob("eval_*.jsonl")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in evals)
    print(f"records: {len(records(a))} each, {len(diff)} differing fields (timing excluded)"
          f"{'' if not diff else ': ' + repr(diff[:5])}")
    print(f"eval files: {len(evals)}, identical: {same_evals}")
    ta, tb = times(a), times(b)
    for name, t in (("before", ta), ("after", tb)):
        print(f"{name}: wall {t['wall_min']:.1f} min, training {t['train_min']:.1f} min, "
              f"evaluation share {100 * t['eval_share']:.0f}%, load {t['load_start'][0]:.2f} -> "
              f"{t['load_end'][0]:.2f}")
    print(f"after / before: wall {tb['wall_min'] / ta['wall_min']:.3f}, training "
          f"{tb['train_min'] / ta['train_min']:.3f}")
    return 0 if not diff and same_evals else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1
                  else Path(__file__).resolve().parent / "results" / "run_level"))
