"""Recompute the issue-21 study's per-run numbers from its raw files and check ``runs.json``.

Independent of the project: the standard library only, nothing imported from ``sat_llm``,
``sat_theory`` or ``experiments``. Point estimates only (``runs.json`` stores each curve metric
as ``[value, ci_lo, ci_hi]``; the bootstrap intervals are random resamples and are not checked).

A run is a folder under DIR (``<method>_lr<rate>_s<seed>/`` or ``tune/...``) whose
``study.json`` says ``"finished": true``. Its checkpoints are the ``k`` of its
``eval_<k>.jsonl`` files (digits only; units trained: stages, generations or prompts), sorted:
``k_0 = 0 < k_1 < ... < k_{K-1}``. Each file has one JSON record per problem.

Scores of a record: lenient = ``score`` (the task's score; a ``lenient`` field, when present,
must equal it), strict = ``strict``. Accuracy at checkpoint ``j``: ``a_j = (1/n) Σ_i s_ji``
over that file's ``n`` problems. Then, per scoring:

- ``auc = (1/K) Σ_j a_j`` (every checkpoint, the untrained one included);
- ``final = a_{K-1}``; ``best = max_j a_j``; ``drawdown = best - final``;
- ``worst_drop = max(0, max_j (a_j - a_{j+1}))`` (0 when K = 1);
- ``below_untrained = #{j >= 1 : a_j < a_0} / (K - 1)`` (0 when K = 1).

From ``metrics.jsonl`` (one JSON record a line, with ``kind``):

- ``kl_per_update`` = mean of ``kl`` over the ``kind == "step"`` records whose ``kl`` is not
  null; null when there is none (the peers, TRL and CoMLRL, do not measure it);
- training seconds ``T`` = the ``train_seconds`` of the last ``kind == "stage"`` record that
  has one (peer runs), else the sum of the step records' ``seconds`` (ours);
  ``train_minutes = T/60``, ``wall_minutes = study.json wall_seconds / 60``,
  ``eval_share = 1 - train_minutes / wall_minutes``.

Consistency checks (each a failure when it does not hold): every eval file of a run scores
the same problem ids, each once; ``lenient == score``; the checkpoints are ``[0] +
study.json schedule``; and checkpoint ``j`` lies on the common grid: ``|k_j·m - 128·j| <=
0.25·128`` with ``m`` the sampled messages per unit (``sat``: 2 rollouts × B prompts × G
episodes × 2 messages; ``comlrl``: 2(G + G²); the others: B·G; B, G from study.json).

Comparison: every recomputed number against ``runs.json[run]`` (``checkpoints`` exactly, the
rest within an absolute tolerance of 1e-9; ``runs.json`` stores full floats, unrounded). A
finished run missing from ``runs.json`` is listed but is not a failure (``runs.json`` may
predate it); a run in ``runs.json`` without a finished folder is a failure.

Exit status: 0 all match, 1 some differ, 2 bad input (message on one line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "figures" / "llm_team_learning" / "v2"
TOL = 1e-9
GRID, GRID_TOL = 128, 0.25
METRICS = ("auc", "final", "best", "drawdown", "worst_drop", "below_untrained")
SCORINGS = ("lenient", "strict")
FLOATS = ("kl_per_update", "train_minutes", "wall_minutes", "eval_share")


class BadInput(Exception):
    """A missing or unreadable input file (exit status 2)."""


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}") from None


def read_jsonl(path: Path) -> list[dict]:
    try:
        lines = path.read_text().splitlines()
        recs = [json.loads(x) for x in lines if x.strip()]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadInput(f"cannot read {path}: {e}") from None
    if not all(isinstance(r, dict) for r in recs):
        raise BadInput(f"{path}: a line is not a JSON object")
    return recs


def curve_metrics(acc: list[float]) -> dict[str, float]:
    """The six metrics of one accuracy curve (module docstring)."""
    K, best, final = len(acc), max(acc), acc[-1]
    drops = [acc[j] - acc[j + 1] for j in range(K - 1)]
    return dict(auc=sum(acc) / K, final=final, best=best, drawdown=best - final,
                worst_drop=max(0.0, max(drops)) if drops else 0.0,
                below_untrained=sum(a < acc[0] for a in acc[1:]) / (K - 1) if K > 1 else 0.0)


def accuracy(recs: list[dict], scoring: str) -> float:
    key = "score" if scoring == "lenient" else "strict"
    return sum(float(r[key]) for r in recs) / len(recs)


def eval_checks(files: dict[int, list[dict]]) -> list[str]:
    """Same problem ids in every file, each once; ``lenient == score`` on every record."""
    out, ids0 = [], None
    for k, recs in files.items():
        ids = [r["id"] for r in recs]
        if len(set(ids)) != len(ids):
            out.append(f"eval_{k}: duplicate problem ids")
        if ids0 is None:
            ids0 = set(ids)
        elif set(ids) != ids0:
            out.append(f"eval_{k}: other problem ids than eval_{min(files)}")
        bad = [r["id"] for r in recs
               if "lenient" in r and float(r["lenient"]) != float(r["score"])]
        if bad:
            out.append(f"eval_{k}: lenient != score for ids {bad[:5]}")
    return out


def messages_per_unit(method: str, study: dict) -> int | None:
    B, G = study["prompts"], study["group_size"]
    if method == "sat":
        return 2 * B * G * 2
    if method == "comlrl":
        return 2 * (G + G * G)
    return B * G if method.startswith(("plain", "trl")) else None


def grid_checks(ks: list[int], meta: dict) -> list[str]:
    out = []
    if ks != [0, *meta.get("schedule", [])]:
        out.append(f"checkpoints {ks} != [0] + study.json schedule {meta.get('schedule')}")
    m = messages_per_unit(meta["method"], meta["study"])
    if m is None:
        return [*out, f"grid: unknown method {meta['method']!r}"]
    off = [k for j, k in enumerate(ks) if abs(k * m - GRID * j) > GRID_TOL * GRID]
    return [*out, f"grid: checkpoints {off} are off the {GRID}-message grid"] if off else out


def kl_per_update(records: list[dict]) -> float | None:
    kls = [r["kl"] for r in records if r.get("kind") == "step" and r.get("kl") is not None]
    return sum(kls) / len(kls) if kls else None


def train_seconds(records: list[dict]) -> float:
    peer = [r["train_seconds"] for r in records
            if r.get("kind") == "stage" and "train_seconds" in r]
    if peer:
        return float(peer[-1])
    return float(sum(r.get("seconds") or 0.0 for r in records if r.get("kind") == "step"))


def recompute(d: Path, meta: dict) -> tuple[dict, list[str]]:
    """``(numbers, failed checks)`` of one finished run folder."""
    ks = sorted(int(p.stem[5:]) for p in d.glob("eval_*.jsonl") if p.stem[5:].isdigit())
    if not ks:
        raise BadInput(f"{d}: no eval_<k>.jsonl files")
    files = {k: read_jsonl(d / f"eval_{k}.jsonl") for k in ks}
    if not all(files.values()):
        raise BadInput(f"{d}: an eval file is empty")
    try:
        got = {"checkpoints": ks}
        for sc in SCORINGS:
            for name, v in curve_metrics([accuracy(files[k], sc) for k in ks]).items():
                got[f"{sc}.{name}"] = v
        checks = eval_checks(files) + grid_checks(ks, meta)
        recs = read_jsonl(d / "metrics.jsonl")
        got["kl_per_update"] = kl_per_update(recs)
        got["train_minutes"] = train_seconds(recs) / 60
        got["wall_minutes"] = float(meta["wall_seconds"]) / 60
        got["eval_share"] = 1 - got["train_minutes"] / got["wall_minutes"]
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"{d}: a record lacks or has a bad field: {e!r}") from None
    return got, checks


def stored(entry: dict) -> dict:
    """The point estimates of one ``runs.json`` entry, keyed as :func:`recompute`'s."""
    try:
        out = {"checkpoints": entry["checkpoints"], **{f: entry[f] for f in FLOATS}}
        for sc in SCORINGS:
            for name in METRICS:
                out[f"{sc}.{name}"] = entry[sc][name][0]
    except (KeyError, TypeError, IndexError) as e:
        raise BadInput(f"runs.json entry {entry.get('run')!r} lacks a field: {e!r}") from None
    return out


def differs(a, b, tol: float = TOL) -> bool:
    if isinstance(a, list) or isinstance(b, list) or a is None or b is None:
        return a != b
    return not (math.isfinite(a) and math.isfinite(b) and abs(a - b) <= tol)


def compare(got: dict, want: dict, tol: float = TOL) -> list[str]:
    return [f"{k} recomputed={got[k]!r} runs.json={want[k]!r}" for k in got
            if differs(got[k], want[k], tol)]


def finished_runs(root: Path) -> dict[str, tuple[Path, dict]]:
    """``{run name (folder path under root): (folder, study.json)}`` of the finished runs."""
    out = {}
    for p in sorted(root.rglob("study.json")):
        meta = read_json(p)
        if isinstance(meta, dict) and meta.get("finished"):
            out[p.parent.relative_to(root).as_posix()] = (p.parent, meta)
    return out


def check(root: Path, tol: float = TOL) -> tuple[list[str], int, int]:
    """``(report lines, runs checked, runs failed)``."""
    if not root.is_dir():
        raise BadInput(f"no such folder: {root}")
    runs_json = read_json(root / "runs.json")
    if not isinstance(runs_json, dict):
        raise BadInput(f"{root / 'runs.json'}: not a JSON object of runs")
    runs = finished_runs(root)
    lines, failed = [], 0
    for name in sorted(set(runs_json) | set(runs)):
        if name not in runs:
            lines.append(f"FAIL {name}: in runs.json but no finished run folder")
            failed += 1
            continue
        if name not in runs_json:
            lines.append(f"note {name}: finished but not in runs.json (not checked)")
            continue
        d, meta = runs[name]
        got, problems = recompute(d, meta)
        if meta.get("run") != name:
            problems.append(f"study.json run {meta.get('run')!r} != folder {name!r}")
        problems += compare(got, stored(runs_json[name]), tol)
        failed += bool(problems)
        lines.append(f"FAIL {name}: " + "; ".join(problems) if problems else f"ok   {name}")
    return lines, len(runs_json), failed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", nargs="?", type=Path, default=DEFAULT_DIR,
                   help="the study folder: runs.json and the run folders (default: %(default)s)")
    a = p.parse_args(argv)
    try:
        lines, n, failed = check(a.dir)
    except BadInput as e:
        print(f"error: {e}".replace("\n", " "), file=sys.stderr)
        return 2
    print("\n".join(lines))
    print(f"{n} runs in runs.json: {n - failed} match, {failed} differ "
          f"(absolute tolerance {TOL:g}; checkpoints exactly)")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
