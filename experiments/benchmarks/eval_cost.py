"""Issue 21 item 6: the cost of one held-out evaluation, before vs after ``greedy_pooled``.

One evaluation of the issue-21 study's configuration (``StudyConfig().llm_config(1, seed)``:
SmolLM2-135M, 200 held-out problems, ``eval_batch`` 32, 16 new tokens, one torch thread) on
the untrained model, so its records must equal the committed ``eval_0.jsonl`` of
``plain_lr0.001_s<seed>``. Two code paths, alternated in one process (new, old, then old,
new, ...), each a whole ``team.evaluate()`` plus ``team.eval_records()`` and their JSON lines:

- ``old``: what ``LLMTeam._messages`` ran before: ``greedy_shared_prefix`` on each chunk
  of ``eval_batch`` rows (the system prefix prefilled per chunk, and ``generate`` running
  every row of a chunk until the chunk's longest message ends);
- ``new``: ``greedy_pooled`` (the prefix once per evaluation, the same per-chunk prefills,
  then all rows decoded together, each leaving the batch when it stops).

Per run: wall and CPU seconds (``time.process_time``: on this shared 2-core machine a
process at ``nice 15`` beside two trainings gets a varying share of a core, so its CPU time
is the steadier measure of the work), and a split: rendering (chat template + tokenisation),
the prefix prefills, the chunk prefills (forward passes of more than one token per row),
the decoding steps (one token per row) with the row-steps they computed, scoring
(``task.score`` in the episodes) and the records (``eval_records`` and their JSON); "other"
is the rest (``generate``'s bookkeeping, the log-probabilities,
detokenisation). Prints the table, the records' equality (old = new = committed file,
byte for byte) and the projected evaluation share of a plain study run, and writes
``results/eval_cost/eval_cost_s<seed>.json`` (atomically)::

    OMP_NUM_THREADS=1 nice -n 15 python3 experiments/benchmarks/eval_cost.py --pairs 3

Exit status: 0, or 1 when the records of a path differ from the other's or from the file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = Path(__file__).resolve().parent / "results" / "eval_cost"
COMMITTED = ROOT / "figures" / "llm_team_learning" / "v2"
#: the plain study run this projects onto (experiments/benchmarks/run_level.py, "after":
#: plain_lr0.001_s1, 48 stages, 13 evaluations, two runs in parallel): wall and training
#: minutes; the rest of its wall time is the evaluations (~6.5 min) and ~0.3 min of setup
RUN_WALL_MIN, RUN_TRAIN_MIN, RUN_EVALS = 21.1, 14.3, 13


class Split:
    """Accumulated seconds (and counts) of the phases of one evaluation, from forward hooks
    on the causal LM (a call with one token per row is a decoding step, more is a prefill)
    and wrappers of the prefix prefill, the renderer and the scorer."""

    def __init__(self):
        self.t = dict(render=0.0, prefix=0.0, prefill=0.0, decode=0.0, score=0.0, records=0.0)
        self.n = dict(decode_steps=0, decode_row_steps=0, prefill_tokens=0, pad_tokens=0)
        self._t0 = None

    def pre(self, _mod, args, kwargs):
        self._t0 = time.perf_counter()
        ids = kwargs.get("input_ids", args[0] if args else None)
        self._shape = tuple(ids.shape)
        am = kwargs.get("attention_mask")
        if ids.shape[1] > 1:
            self.n["prefill_tokens"] += int(ids.numel())
            if am is not None:  # padded positions of this prefill
                self.n["pad_tokens"] += int((am[:, -ids.shape[1]:] == 0).sum())

    def post(self, _mod, _args, _kwargs, _out):
        dt = time.perf_counter() - self._t0
        B, L = self._shape
        if L == 1:
            self.t["decode"] += dt
            self.n["decode_steps"] += 1
            self.n["decode_row_steps"] += B
        else:
            self.t["prefill"] += dt

    def timed(self, key, fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.t[key] += time.perf_counter() - t0
        return wrapper


def old_greedy(model, contexts, *, chunk, **kw):
    """The evaluation's generation before ``greedy_pooled``: ``greedy_shared_prefix`` per
    chunk of ``chunk`` rows (``_messages`` ran exactly this through ``in_chunks``)."""
    import sat_llm.scoring as scoring

    parts = [scoring.greedy_shared_prefix(model, contexts[a:a + chunk], greedy=True,
                                          streamer=None, **kw)
             for a in range(0, len(contexts), chunk)]
    return [m for p in parts for m in p[0]], [lp for p in parts for lp in p[1]]


def one_evaluation(team, path: str) -> tuple[dict, str]:
    """Time one whole evaluation of ``team`` by ``path`` (``old`` | ``new``); returns
    ``(timings, the eval_0.jsonl text it produces)``."""
    import sat_llm.scoring as scoring

    split = Split()
    base = team._model(0).get_base_model()
    hooks = [base.register_forward_pre_hook(split.pre, with_kwargs=True),
             base.register_forward_hook(split.post, with_kwargs=True)]
    saved = (scoring.greedy_pooled, scoring._prefill)
    if path == "old":
        scoring.greedy_pooled = old_greedy
    scoring._prefill = split.timed("prefix", saved[1])
    # instance attributes shadow the methods for this evaluation only
    team.protocol.render = split.timed("render", team.protocol.render)
    team.task.score = split.timed("score", team.task.score)
    team._eval_cache.clear()
    try:
        w0, c0 = time.perf_counter(), time.process_time()
        team.evaluate()
        t0 = time.perf_counter()
        text = "".join(json.dumps(r) + "\n" for r in team.eval_records())
        split.t["records"] += time.perf_counter() - t0
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    finally:
        for h in hooks:
            h.remove()
        scoring.greedy_pooled, scoring._prefill = saved
        del team.protocol.render, team.task.score
    t = dict(split.t)
    t["other"] = wall - sum(t.values())
    return dict(wall_s=wall, cpu_s=cpu, load=os.getloadavg()[0], split_s=t, counts=split.n), text


def project(old_s: float, new_s: float) -> dict:
    """Evaluation share of the plain study run (1 − training / wall, as timing.md) if each of
    its evaluations took ``new_s / old_s`` of the time it took: the run's non-training time
    minus that fraction of its evaluations (the non-training time less ~0.3 min setup)."""
    evals = RUN_WALL_MIN - RUN_TRAIN_MIN - 0.3
    wall = RUN_TRAIN_MIN + 0.3 + evals * new_s / old_s
    return dict(ratio=new_s / old_s, run_wall_min=wall, eval_share=1 - RUN_TRAIN_MIN / wall,
                eval_share_before=1 - RUN_TRAIN_MIN / RUN_WALL_MIN)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0, help="study seed (its problems and eval_0)")
    ap.add_argument("--pairs", type=int, default=3, help="old/new pairs, alternating order")
    ap.add_argument("--out", type=Path, default=OUT, help="results folder")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        print("eval_cost: --pairs must be >= 1", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.path[:0] = [str(ROOT), str(ROOT / "experiments")]
    from llm_team_learning import StudyConfig

    from sat_llm.team import LLMTeam

    team = LLMTeam(StudyConfig().llm_config(1, a.seed))
    ref = COMMITTED / f"plain_lr0.001_s{a.seed}" / "eval_0.jsonl"
    committed = ref.read_text() if ref.is_file() else None
    runs: dict[str, list] = {"old": [], "new": []}
    texts: dict[str, set] = {"old": set(), "new": set()}
    for i in range(a.pairs):
        for path in (("new", "old") if i % 2 == 0 else ("old", "new")):
            t, text = one_evaluation(team, path)
            runs[path].append(t)
            texts[path].add(text)
            print(f"pair {i} {path}: wall {t['wall_s']:.1f} s, cpu {t['cpu_s']:.1f} s, "
                  f"load {t['load']:.2f}", flush=True)
            # what has run so far, in case the run is cut short (the final file replaces it)
            write_atomic(a.out / f"eval_cost_s{a.seed}.partial.json",
                         json.dumps(dict(seed=a.seed, runs=runs), indent=1) + "\n")
    med = {p: {k: statistics.median(r[k] for r in runs[p]) for k in ("wall_s", "cpu_s")}
           for p in runs}
    same = len(texts["old"] | texts["new"]) == 1
    lines = next(iter(texts["new"])).splitlines()
    differ = (None if committed is None else
              sum(x != y for x, y in zip(lines, committed.splitlines(), strict=False))
              + abs(len(lines) - len(committed.splitlines())))
    print(f"\nseed {a.seed}, {len(lines)} problems, {a.pairs} pairs, load "
          f"{min(r['load'] for p in runs for r in runs[p]):.2f}-"
          f"{max(r['load'] for p in runs for r in runs[p]):.2f}")
    print("| path | wall s (median) | cpu s (median) | " + " | ".join(runs["old"][0]["split_s"])
          + " | decode steps | decode row-steps |")
    for p in runs:
        sp = {k: statistics.median(r["split_s"][k] for r in runs[p]) for k in runs[p][0]["split_s"]}
        c = runs[p][0]["counts"]
        print(f"| {p} | {med[p]['wall_s']:.1f} | {med[p]['cpu_s']:.1f} | "
              + " | ".join(f"{v:.2f}" for v in sp.values())
              + f" | {c['decode_steps']} | {c['decode_row_steps']} |")
    print(f"prefill tokens {runs['old'][0]['counts']['prefill_tokens']}, of them padding "
          f"{runs['old'][0]['counts']['pad_tokens']}")
    proj = {k: project(med["old"][k], med["new"][k]) for k in ("cpu_s", "wall_s")}
    print(f"new / old: cpu {proj['cpu_s']['ratio']:.3f}, wall {proj['wall_s']['ratio']:.3f}")
    new_text = next(iter(texts["new"]))
    verdict = ("no file" if committed is None else
               f"{len(lines) - differ} of {len(lines)} lines equal, byte-identical "
               f"{new_text == committed}")
    print(f"records: old = new {same}; new = committed {ref.relative_to(ROOT)}: {verdict}")
    print(f"projected plain run (wall {RUN_WALL_MIN} min, training {RUN_TRAIN_MIN} min): "
          f"evaluation share {100 * proj['cpu_s']['eval_share_before']:.0f}% -> "
          f"{100 * proj['cpu_s']['eval_share']:.0f}% (by the cpu ratio), "
          f"{100 * proj['wall_s']['eval_share']:.0f}% (by the wall ratio); target <= 25%")
    result = dict(seed=a.seed, pairs=a.pairs, problems=len(lines), median=med, runs=runs,
                  records_equal_old_new=same, lines_differing_from_committed=differ,
                  byte_identical_to_committed=None if committed is None else new_text == committed,
                  projection=proj, machine=dict(platform=platform.platform(),
                                                cpus=os.cpu_count(), nice=os.nice(0)),
                  command=" ".join(sys.argv))
    write_atomic(a.out / f"eval_cost_s{a.seed}.json", json.dumps(result, indent=1) + "\n")
    (a.out / f"eval_cost_s{a.seed}.partial.json").unlink(missing_ok=True)
    return 0 if same and differ in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
