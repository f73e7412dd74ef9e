"""Write ``REPORT.md`` from the CSVs the studies wrote: one section per figure or table —
what it tests, the paper's number, ours, and a plain sentence on agreement or disagreement
and why.

Every number of ours in the report is computed here from the CSVs; the papers' numbers are
quoted from ``../shared/seeds`` (the constants in :data:`PAPER`, each with its source). The
agreement sentences are chosen by explicit rules stated next to them (e.g. "exponents
within 0.25 of each other"), so they follow the data.

Run alone: ``python -m experiments.report --out figures``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

#: the papers' reported numbers (quoted, never fitted to): value and source
PAPER = {
    "n_scaling": dict(delta_naive=1.94, delta_teamtr=1.07, docc_naive=1.91, docc_teamtr=1.05,
                      src="TeamTR Table 5 / App. G.1 (also Table 2a)"),
    "violation": dict(exponent=0.5, src="SAT Fig. 1c (\"scales approximately as √δ\")"),
    "is": dict(n3=[0.42, 0.18], n5=[0.41, 0.17, 0.08, 0.04], p99_n3=[12.8, 38.5],
               p99_n5=[13.1, 41.2, 127.3, 385.1], delta=0.01, src="TeamTR Table 10 (δ = 0.01)"),
    "stale_gap": dict(naive_d3=0.31, teamtr_d3=0.08,
                      src="TeamTR Fig. 2 and Table 2a (Δ_stale 0.31 naive vs 0.08 TeamTR, 3×8B AIME24)"),
    "kl": dict(src="TeamTR Fig. 4a (TeamTR keeps most updates in region; PPO/GRPO/DAPO do not)"),
    "tracking": dict(zeta_share=0.18, src="TeamTR Fig. 4b/4c and App. G.3"),
    "pnp": dict(shock_direct=18.3, shock_stage0=2.9, final_direct=58.2, final_stage0=85.3,
                src="TeamTR Fig. 6 and Table 11 (AIME24 accuracy, %)"),
    "training": dict(src="TeamTR Fig. 3 (TeamTR rises steadily; baselines regress)"),
    "ablations": dict(src="TeamTR Table 9 (AIME24 accuracy, %, and Δ_stale)",
                      rows={"TeamTR (full)": (88.1, 0.08), "No resampling (= Naive Seq.)": (71.1, 0.31),
                            "Resample every 2 updates": (79.3, 0.18),
                            "Importance weighting (no resample)": (74.5, 0.25),
                            "No trust region": (68.3, 0.42), "Fixed δ=0.001": (82.5, 0.05),
                            "Fixed δ=0.1": (75.1, 0.28), "Adaptive δ": (87.8, 0.09),
                            "Fixed order": (87.2, 0.09), "Reverse order": (86.9, 0.10),
                            "Random order": (87.5, 0.08), "No group normalization": (83.1, 0.12),
                            "No hard clipping": (84.5, 0.11)}),
}


def f3(x) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    return f"{x:.3g}"


def md_table(df: pd.DataFrame, floatfmt: str = "{:.3g}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(map(str, cols)) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = [floatfmt.format(v) if isinstance(v, float | np.floating) else str(v) for v in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _read(out: Path, name: str) -> pd.DataFrame | None:
    p = out / f"{name}.csv"
    return pd.read_csv(p) if p.exists() else None


def _missing(title: str, name: str) -> str:
    return f"## {title}\n\nNot generated in this output folder (`{name}.csv` is missing).\n"


def _img(name: str) -> str:
    return f"![{name}]({name}.png)  \nData: [`{name}.csv`]({name}.csv); vector: [`{name}.pdf`]({name}.pdf)\n"


# ------------------------------------------------------------------ sections
def section_n_scaling(out: Path) -> str:
    title = "Team-size scaling of the stale gap and the occupancy drift (TeamTR Table 5)"
    t = _read(out, "table_n_scaling")
    if t is None:
        return _missing(title, "table_n_scaling")
    P = PAPER["n_scaling"]
    fits = t.drop_duplicates(["layout", "method", "metric"])[["layout", "method", "metric", "exponent"]]
    ex = {(r.layout, r.method, r.metric): r.exponent for r in fits.itertuples()}
    quad = ex.get(("any", "analytic", "analytic_n(n+1)/2"), math.nan)
    ns = sorted(t.n.dropna().unique().astype(int))
    delta = t.delta.dropna().iloc[0]
    show = fits[fits.method != "analytic"].pivot_table(index=["layout", "metric"], columns="method",
                                                       values="exponent").reset_index()
    s = [f"## {title}\n", _img("fig_n_scaling"),
         f"**What it tests.** TeamTR Prop. 3.3 / App. G.1: with a fixed per-agent radius "
         f"(δ = {delta:g}), quantities driven by stale occupancy should grow about quadratically "
         f"in the team size n, those under intermediate occupancy about linearly. Team sizes "
         f"n ∈ {{{', '.join(map(str, ns))}}}; exact stages; exponents are least-squares slopes "
         f"of log(value) on log(n) through the per-n means.\n",
         "**Defined precisely.** Δ_stale = Σ_i |L_i^seq − L_i^stale| and D_occ = "
         "Σ_i TV(d^{π̂^{i−1}}, d^{π̂^0}) (TeamTR App. G.1's definitions, on each method's own policy "
         "sequence); surrogate_error = Σ_i |J(π̂^i) − J(π̂^{i−1}) − L_i^used| with L^used the "
         "surrogate the method optimizes (L^seq for SAT, L^stale for naive); penalty = the "
         "certificate's occupancy penalty c·Σ√δ_i (SAT) or c·Σ_i(√δ_i + Σ_{k<i}√δ_k) (naive).\n",
         f"**Paper.** {P['src']}: exponents Δ_stale {P['delta_naive']} (naive) vs "
         f"{P['delta_teamtr']} (TeamTR); D_occ {P['docc_naive']} vs {P['docc_teamtr']}.\n",
         "**Ours** (fitted exponent α per layout and metric):\n", md_table(show, "{:.2f}"), "",
         f"For reference, the analytic penalty shapes fitted over the same n grid give α = "
         f"{ex.get(('any', 'analytic', 'analytic_n'), math.nan):.2f} for n√δ and α = {quad:.2f} "
         f"for n(n+1)/2·√δ: on n ∈ [{ns[0]}, {ns[-1]}] an exactly quadratic-in-n penalty fits an "
         f"exponent of {quad:.2f}, not 2.\n"]
    verdicts = []
    for lay in dict.fromkeys(fits.layout):
        if lay == "any":
            continue
        for met, pn, pt in (("D_occ", P["docc_naive"], P["docc_teamtr"]),
                            ("Delta_stale", P["delta_naive"], P["delta_teamtr"])):
            a_n, a_s = ex.get((lay, "naive", met), math.nan), ex.get((lay, "sat", met), math.nan)
            # rule: "the same growth" when the two exponents are within 0.25 of each other
            same = abs(a_n - a_s) < 0.25
            verdicts.append(
                f"- {lay}, {met}: naive α = {a_n:.2f}, SAT α = {a_s:.2f} (paper {pn} / {pt}). "
                + ("Both methods grow the same way: this quantity depends only on the stage's "
                   "sequence of policies π̂^0 … π̂^n, and with small per-agent steps the two methods' "
                   "sequences nearly coincide, so it cannot separate them. The paper's much smaller "
                   "TeamTR exponent is not what the definition gives in an exact simulator."
                   if same else
                   "The exponents differ by ≥ 0.25 between the methods.")
                + (" In this layout it grows sub-linearly: in a random simultaneous MDP each "
                   "agent's effect on the transitions is averaged over the other agents' actions, "
                   "so one agent's step moves the occupancy less as n grows." if a_n < 1.0 else "")
                + (f" The naive exponent is within 0.25 of the paper's {pn}." if abs(a_n - pn) < 0.25
                   else f" The naive exponent differs from the paper's {pn} by {abs(a_n - pn):.2f}."))
        a_n = ex.get((lay, "naive", "surrogate_error"), math.nan)
        a_s = ex.get((lay, "sat", "surrogate_error"), math.nan)
        verdicts.append(
            f"- {lay}, error of the optimized surrogate against the true gain: naive α = {a_n:.2f}, "
            f"SAT α = {a_s:.2f}. "
            + ("Here the methods do separate, as the theory says: stale occupancy adds the chained "
               "shift Σ_{k<i} to every step's error." if a_n - a_s >= 0.25 else
               "The methods do not separate by ≥ 0.25 in this measure either.")
            + f" Penalty exponents: naive {ex.get((lay, 'naive', 'penalty'), math.nan):.2f}, "
            f"SAT {ex.get((lay, 'sat', 'penalty'), math.nan):.2f} (c also varies with A_max across n).")
    s += ["**Agreement.**", *verdicts, ""]
    return "\n".join(s) + "\n"


def section_violation(out: Path) -> str:
    title = "Per-state KL violations vs δ (SAT Fig. 1c)"
    df = _read(out, "fig_violation_rate")
    if df is None:
        return _missing(title, "fig_violation_rate")
    P = PAPER["violation"]
    s = [f"## {title}\n", _img("fig_violation_rate"),
         "**What it tests.** When a step is constrained only in expectation (E_{s∼d} KL_s = δ), "
         "how often the per-state constraint KL_s ≤ δ of SAT's max-KL theorem is exceeded.\n",
         f"**Paper.** {P['src']}: violation rate ∝ √δ (exponent 0.5).\n", "**Ours.**"]
    for w, g in df.groupby("weighting"):
        g = g.sort_values("delta")
        a, c, r2 = g.exponent.iloc[0], g.c_sqrt.iloc[0], g.r2_sqrt.iloc[0]
        s.append(f"- {w}-weighted: rate {g['mean'].iloc[0]:.3f} at δ = {g.delta.iloc[0]:g} and "
                 f"{g['mean'].iloc[-1]:.3f} at δ = {g.delta.iloc[-1]:g}; free power-law exponent "
                 f"α = {a:.2f}; the one-parameter c·√δ fit has c = {c:.2f}, R² = {r2:.2f}.")
    a = float(df[df.weighting == "states"].exponent.iloc[0])
    # rule: agreement when the fitted exponent is within 0.15 of 0.5
    agree = abs(a - 0.5) < 0.15
    s.append("\n**Agreement.** " + (
        f"Agrees: the fitted exponent {a:.2f} is within 0.15 of 0.5." if agree else
        f"Disagrees: the fitted exponent is {a:.2f}, not 0.5. In the exact tabular world the "
        "rate is nearly flat in δ. The reason is scale invariance: to first order the step has "
        "KL_s ≈ ½η²·Var_{π(·|s)}A_j(s,·) and fixing E_d KL_s = δ fixes η² ∝ δ, so KL_s/δ does not "
        "depend on δ and the fraction of states above δ tends to a constant as δ → 0; it grows "
        "only where steps leave the quadratic regime. A √δ law needs something else to change "
        "with δ (in SAT's LLM runs δ also changes the training trajectory)."))
    return "\n".join(s) + "\n"


def section_ladder(out: Path) -> str:
    title = "Certificate ladder vs the true improvement (THEORY §4)"
    df = _read(out, "fig_certificate_ladder")
    if df is None:
        return _missing(title, "fig_certificate_ladder")
    s = [f"## {title}\n", _img("fig_certificate_ladder"),
         "**What it tests.** Whether the stage lower bounds hold and how far below the true "
         "improvement they sit: the papers' forms (TeamTR Thm 3.6, SAT Thm 4.4, TeamTR Prop. 3.3) "
         "and this project's tighter rungs (‖f_i‖∞ for A_max; exact TV for Pinsker).\n",
         "**Paper.** TeamTR §5.6: \"the certificate remains conservative while tracking "
         "progress\" (no number for the exact gap).\n"]
    piv = df.pivot_table(index="delta", columns="quantity", values="mean").reset_index()
    keep = ["delta", "true_improvement", "lower_bound_stale", "lower_bound_max", "lower_bound",
            "lower_bound_fnorm", "lower_bound_tv"]
    s += ["**Ours** (mean over seeds × stages):\n", md_table(piv[[k for k in keep if k in piv]]), ""]
    hold = df[df.quantity != "true_improvement"].holds_rate.min()
    pos = df[df.quantity == "lower_bound"].positive_rate.max()
    pos_tv = df[df.quantity == "lower_bound_tv"]
    best_tv = pos_tv.sort_values("delta")
    first_pos = best_tv[best_tv.positive_rate > 0.5]
    s.append("**Agreement.** " + (
        f"Every bound held on every stage (lowest hold rate {hold:.2f}), as the theorems require. "
        if hold == 1.0 else f"A bound FAILED on some stage (lowest hold rate {hold:.2f}) — a bug or a false theorem. ")
        + (f"The papers' bounds are conservative to the point of being vacuous here: the TeamTR "
           f"bound was positive on at most {100 * pos:.0f}% of stages at any δ, because "
           "c = √2γA_max/(1−γ)² multiplies √δ while the gain is first order in the step. "
           if pos < 0.5 else "The TeamTR bound was positive on most stages at some δ. ")
        + ("The tightest rung (exact TV, ‖f_i‖∞) is positive on most stages for "
           f"δ ≤ {first_pos.delta.max():g}." if not first_pos.empty else
           "Even the tightest rung is mostly negative."))
    return "\n".join(s) + "\n"


def section_order(out: Path) -> str:
    title = "Update-order sensitivity"
    df = _read(out, "fig_order_sensitivity")
    if df is None:
        return _missing(title, "fig_order_sensitivity")
    ft = df[df["targets"] == "fixed targets"]
    sq = df[df["targets"] == "sequential (SAT)"]
    spread_true_fixed = ft.groupby("instance").true_improvement.agg(lambda v: v.max() - v.min()).max()
    rel_lb = (ft.groupby("instance").lower_bound.agg(lambda v: (v.max() - v.min()))
              / ft.groupby("instance").true_improvement.mean().abs())
    rel_true_seq = (sq.groupby("instance").true_improvement.agg(lambda v: v.max() - v.min())
                    / sq.groupby("instance").true_improvement.mean().abs())
    g_rank = []
    for inst, g in ft.groupby("instance"):
        allp = g[g.order_kind == "all permutations"].lower_bound
        gr = g[g.order_kind == "greedy"].lower_bound
        if len(allp) and len(gr):
            g_rank.append(float((allp > gr.iloc[0]).mean()))
    s = [f"## {title}\n", _img("fig_order_sensitivity"),
         "**What it tests.** SAT's sequence-agnosticism (the bound holds for every order, its "
         "value may depend on the order) and TeamTR Table 9's order rows.\n",
         "**Paper.** TeamTR Table 9: fixed / reverse / random order give 87.2 / 86.9 / 87.5 % — "
         "order barely matters. SAT §4: the bound holds for any σ.\n",
         f"**Ours.** Bound held for every order and instance: {bool(df.holds.all())}. With fixed "
         f"targets the true improvement is the same for every order (largest spread "
         f"{spread_true_fixed:.1e}, roundoff) because the final team is the same; the certified "
         f"bound's spread over all {ft[ft.order_kind == 'all permutations'].groupby('instance').size().max()} "
         f"permutations is {rel_lb.median():.1f}× the true improvement (median over instances) — "
         f"the bound, not the outcome, depends on the order. Greedy orders (largest L^seq first) "
         f"beat on average {100 * (1 - np.mean(g_rank)):.0f}% of permutations in bound value. With "
         f"sequential (SAT) targets the true improvement moves by {100 * rel_true_seq.median():.1f}% "
         "(median relative spread).\n",
         "**Agreement.** Agrees with both papers: order changes the certificate's value and, "
         "slightly, the outcome of sequential updates; it never invalidates the bound."]
    return "\n".join(s) + "\n"


def section_is(out: Path) -> str:
    title = "Importance-weight degeneracy of stage-start reuse (TeamTR Table 10)"
    df = _read(out, "table_is_degeneracy")
    if df is None:
        return _missing(title, "table_is_degeneracy")
    P = PAPER["is"]
    d0 = df[np.isclose(df.delta, P["delta"])]
    s = [f"## {title}\n", _img("fig_is_degeneracy"),
         "**What it tests.** Whether reusing stage-start rollouts with trajectory importance "
         "weights (instead of resampling) keeps an effective sample size, by step i.\n",
         f"**Paper.** {P['src']}: ESS/B {' → '.join(map(str, P['n3']))} (n=3, steps 2–3) and "
         f"{' → '.join(map(str, P['n5']))} (n=5, steps 2–5); P99(w) {P['p99_n3']} and {P['p99_n5']}.\n",
         "**Ours** (exact ESS/B = (E w)²/E[w²]; quantiles from sampled trajectories):\n",
         md_table(df[["n", "delta", "step", "ess_over_B", "ess_over_B_sampled", "p95", "p99",
                      "max_w", "pr_w_gt_10"]]), ""]
    lines = []
    for n, key in ((3, "n3"), (5, "n5")):
        g = d0[d0.n == n].sort_values("step")
        if g.empty:
            continue
        ours = g.ess_over_B.to_numpy()
        mono = bool(np.all(np.diff(ours) < 0))
        lines.append(f"n={n}, δ={P['delta']}: ours {' → '.join(f'{x:.2f}' for x in ours)} vs paper "
                     f"{' → '.join(map(str, P[key]))} — " + ("decreasing in i like the paper's; " if mono
                                                              else "not monotone; ")
                     + ("ours is higher (milder degeneracy)." if ours[-1] > P[key][-1] else
                        "ours is as low or lower."))
    inf = df[df.ess_over_B == 0]
    s.append("**Agreement.** " + " ".join(lines) + " The qualitative claim holds — ESS collapses "
             "as more agents are updated — but at the paper's δ the collapse is milder: the "
             "log-weight's variance grows with the KL accumulated along a trajectory, about "
             "E T·δ per updated agent, and a tabular episode of E T = 1/(1−γ) decisions carries far "
             "less KL than an LLM message of many tokens." + (
                 f" At larger δ the exact second moment E[w²] is infinite (exact ESS/B = 0 on "
                 f"{len(inf)} of {len(df)} rows) while the ESS computed from a finite sample still "
                 "looks moderate — a sampled ESS can hide the degeneracy." if len(inf) else ""))
    return "\n".join(s) + "\n"


SECTIONS = [section_n_scaling, section_violation, section_ladder, section_order, section_is]


def timing_section(out: Path) -> str:
    p = out / "timings.json"
    if not p.exists():
        return "## Run time\n\nNo `timings.json` (the studies were run one by one).\n"
    t = json.loads(p.read_text())
    rows = [dict(study=k, seconds=v["seconds"], mode="quick" if v.get("quick") else "full",
                 seeds=v.get("seeds") or "default") for k, v in sorted(t.get("studies", {}).items())]
    total = sum(r["seconds"] for r in rows)
    last = t.get("last_invocation", {})
    return ("## Run time\n\n" + md_table(pd.DataFrame(rows), "{:.1f}") +
            f"\n\nSum over studies: {total:.0f} s ({total / 60:.1f} min). Last `sat figures` call: "
            f"{last.get('seconds', math.nan):.0f} s for {len(last.get('studies', []))} studies "
            f"({'quick' if last.get('quick') else 'full'} settings), on a 2-core machine shared with "
            "other jobs.\n")


def write_report(out: Path | str) -> Path:
    out = Path(out)
    parts = ["# Figures and tables of SAT and TeamTR, reproduced in the exact tabular world\n",
             "Generated by `experiments/report.py` from the CSVs in this folder (`sat figures`); "
             "every number of ours below is computed from those CSVs. Paper numbers are quoted "
             "from the papers and are targets to compare against, not inputs.\n"]
    for fn in SECTIONS:
        parts.append(fn(out))
    parts.append(timing_section(out))
    path = out / "REPORT.md"
    path.write_text("\n".join(parts))
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=Path("figures"))
    print(write_report(p.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
