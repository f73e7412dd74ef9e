"""Markdown tables for BENCHMARKS.md from the JSON files in ``results/``.

Run: ``python experiments/benchmarks/render.py [--suffix _quick] [--dir results/calm]`` and
paste the output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from _common import RESULTS, blas_summary


def md(rows: list[dict], cols: list[str], fmt: str = "{:.3g}") -> str:
    def cell(v):
        if isinstance(v, bool):
            return "yes" if v else "**no**"
        if isinstance(v, float):
            return fmt.format(v)
        return "" if v is None else str(v)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(out)


def targets(res: dict) -> str:
    rows = [{"target": t["target"], "value": t["value"], "goal": t["goal"],
             "met": t["met"]} for t in res.get("targets", [])]
    return md(rows, ["target", "value", "goal", "met"])


def main(suffix: str = "", folder=None) -> str:
    parts = []
    for name in ("eval", "sparse", "certificate", "scaling"):
        path = Path(folder or RESULTS) / f"bench_{name}{suffix}.json"
        if not path.exists():
            continue
        res = json.loads(path.read_text())
        m = res["machine"]
        parts.append(f"### {name}\n\nrun {m['time_utc']}, load average before {m['loadavg']}, "
                     f"after {res.get('loadavg_after')}; BLAS {blas_summary(m)}\n")
        if name == "eval":
            rows = [r for r in res["grid"] if "skipped" not in r]
            parts.append(md(rows, ["S", "K", "ours", "ours_collapsed", "quantecon", "mdptoolbox",
                                   "lapack", "read_P", "quantecon/ours", "mdptoolbox/ours",
                                   "lapack/ours", "quantecon/ours_collapsed",
                                   "lapack/ours_collapsed"]))
            skipped = [r for r in res["grid"] if "skipped" in r]
            if skipped:
                parts.append("\nskipped: " + "; ".join(f"S={r['S']} K={r['K']} ({r['skipped']})"
                                                       for r in skipped))
            if "file_target" in res:
                parts.append("\nfrom files (turn-taking S=2000, n=4, A=4):\n")
                parts.append(md([res["file_target"]], ["file_MB", "ours_files", "ours_memory",
                                                       "load_only", "quantecon", "lapack",
                                                       "quantecon/ours", "lapack/ours"]))
        elif name == "sparse":
            parts.append(md(res["rows"], ["S", "gamma", "nnz_P", "ours_V", "ours_d", "residual",
                                          "d_sum_minus_1", "VI", "VI_sweeps", "VI/ours",
                                          "VI_warm", "VI_warm_sweeps", "VI_warm/ours", "rho2",
                                          "k_star", "ceiling"]))
        elif name == "certificate":
            parts.append(md(res["rows"], ["layout", "S", "n", "K", "ours", "naive", "naive/ours",
                                          "max_abs_diff"]))
        elif name == "scaling":
            for k, v in res["series"].items():
                parts.append(f"- `{k}`: " + ", ".join(f"{p['x']}: {p['t']:.3g} s" for p in v))
            parts.append("")
            parts.append(md([{"series": k, **v} for k, v in res["fits"].items()],
                            ["series", "exponent", "prefactor", "per_agent_factor"]))
        if res.get("targets"):
            parts.append("\ntargets:\n")
            parts.append(targets(res))
        parts.append("")
    text = "\n".join(parts)
    print(text)
    return text


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suffix", default="", help="'_quick' for the quick results")
    ap.add_argument("--dir", default=None, help="folder of the JSON files (default: results/)")
    a = ap.parse_args()
    main(a.suffix, a.dir)
