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


#: one row per section for the summary table at the top of the report (filled by the sections)
SUMMARY: list[dict] = []


def _sum(figure: str, paper: str, ours: str, verdict: str) -> None:
    SUMMARY.append({"figure / table": figure, "paper": paper, "ours": ours, "verdict": verdict})


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
            + (f"Here the methods separate: naive's exponent exceeds SAT's by {a_n - a_s:.2f}, the "
               "direction the theory predicts (stale occupancy adds the chained shift Σ_{k<i} to "
               "every step's error)." if a_n - a_s >= 0.25 else
               "The methods do not separate by ≥ 0.25 in this measure either.")
            + f" Penalty exponents: naive {ex.get((lay, 'naive', 'penalty'), math.nan):.2f}, "
            f"SAT {ex.get((lay, 'sat', 'penalty'), math.nan):.2f} (c also varies with A_max across n).")
    s += ["**Agreement.**", *verdicts, ""]
    tn = {m: ex.get(("turn", m, "D_occ"), math.nan) for m in ("naive", "sat")}
    td = {m: ex.get(("turn", m, "Delta_stale"), math.nan) for m in ("naive", "sat")}
    _sum("fig_n_scaling (TeamTR Table 5)",
         f"α_Δ {P['delta_naive']} / {P['delta_teamtr']}, α_D {P['docc_naive']} / {P['docc_teamtr']} (naive / TeamTR)",
         f"turn-taking: α_Δ {td['naive']:.2f} / {td['sat']:.2f}, α_D {tn['naive']:.2f} / {tn['sat']:.2f}",
         ("naive's D_occ growth matches; " if abs(tn["naive"] - P["docc_naive"]) < 0.25 else "naive's growth differs; ")
         + ("TeamTR's near-linear growth reproduced" if abs(tn["sat"] - P["docc_teamtr"]) < 0.25 else
            "TeamTR's near-linear growth not reproduced: both methods grow alike (a property of the policy sequence)"))
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
        "rate is nearly flat in δ" + (" (slightly decreasing)" if a < 0 else "") + ". The reason is scale invariance: to first order the step has "
        "KL_s ≈ ½η²·Var_{π(·|s)}A_j(s,·) and fixing E_d KL_s = δ fixes η² ∝ δ, so KL_s/δ does not "
        "depend on δ and the fraction of states above δ tends to a constant as δ → 0; it grows "
        "only where steps leave the quadratic regime. A √δ law needs something else to change "
        "with δ (in SAT's LLM runs δ also changes the training trajectory)."))
    _sum("fig_violation_rate (SAT Fig. 1c)", "rate ∝ √δ (α = 0.5)", f"α = {a:.2f}",
         "agrees" if agree else "disagrees: nearly flat in δ (first-order scale invariance)")
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
           "at γ ≥ ½ the expected-KL bound can never be positive (docs/theory.md §4.4, checked "
           "by `sat verify`'s expected_kl_vacuity): gain and penalty are both of order √δ, and "
           "the penalty's constant √2γA_max/(1−γ)² exceeds the largest the gain can have, "
           "√2A_max/(1−γ), by the factor γ/(1−γ). "
           if pos < 0.5 else "The TeamTR bound was positive on most stages at some δ. ")
        + ("The tightest rung (exact TV, ‖f_i‖∞) is positive on most stages for "
           f"δ ≤ {first_pos.delta.max():g}." if not first_pos.empty else
           "Even the tightest rung is mostly negative."))
    at = df[np.isclose(df.delta, 0.01)].set_index("quantity")["mean"] if (np.isclose(df.delta, 0.01)).any() else None
    _sum("fig_certificate_ladder (THEORY §4)", "conservative certificates",
         f"all bounds hold ({hold:.0%}); at δ=0.01: true {at['true_improvement']:.3g}, TeamTR bound "
         f"{at['lower_bound']:.3g}, tightest rung {at['lower_bound_tv']:.3g}" if at is not None else f"hold rate {hold:.0%}",
         ("agrees (sound)" if hold == 1.0 else "a bound FAILED")
         + ("; the papers' forms are vacuous here" if pos < 0.5 else ""))
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
    for _, g in ft.groupby("instance"):
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
    _sum("fig_order_sensitivity", "order barely matters (87.2 / 86.9 / 87.5%); bound holds for any σ",
         f"bound holds for every order: {bool(df.holds.all())}; SAT-outcome spread {100 * rel_true_seq.median():.1f}%",
         "agrees" if bool(df.holds.all()) else "a bound failed")
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
    g3 = d0[d0.n == 3].sort_values("step").ess_over_B.to_numpy()
    _sum("fig_is_degeneracy / table_is_degeneracy (TeamTR Table 10)",
         f"ESS/B {' → '.join(map(str, P['n3']))} (n=3), … → {P['n5'][-1]} (n=5, step 5)",
         f"{' → '.join(f'{x:.2f}' for x in g3)} (n=3), … → {d0[d0.n == 5].sort_values('step').ess_over_B.iloc[-1]:.2f} (n=5)"
         if len(g3) else "n/a",
         ("qualitatively agrees (ESS falls with i)" if len(g3) > 1 and np.all(np.diff(g3) < 0) else "ESS does not fall with i")
         + ("; milder at the paper's δ" if len(g3) and g3[-1] > P["n3"][-1] else "")
         + ("; E[w²] = ∞ at larger δ" if (df.ess_over_B == 0).any() else ""))
    return "\n".join(s) + "\n"


def section_training(out: Path) -> str:
    title = "Training curves at a matched rollout budget (TeamTR Fig. 3)"
    df_all = _read(out, "fig_training_curves")
    if df_all is None:
        return _missing(title, "fig_training_curves")
    settings = list(dict.fromkeys(df_all.setting)) if "setting" in df_all else [None]
    df = df_all[df_all.setting == settings[0]] if settings[0] is not None else df_all
    last = df[df.stage == df.stage.max()]
    fin = last.groupby("method").J_after.agg(["mean", "std", "count"]).reset_index()
    # regressions: stages whose true improvement was negative
    reg = df.groupby("method").true_improvement.agg(lambda v: float(np.mean(v < 0))).to_dict()
    fin["regression_rate"] = fin.method.map(reg)
    eps = df.groupby("method").episodes.max().to_dict() if "episodes" in df else {}
    fin["episodes"] = fin.method.map(eps)
    order = ["sat", "naive", "joint", "no-tr", "happo"]
    fin = fin.set_index("method").reindex([m for m in order if m in set(fin.method)]).reset_index()
    best = fin.loc[fin["mean"].idxmax(), "method"]
    sat = fin.set_index("method").loc["sat"] if "sat" in set(fin.method) else None
    nai = fin.set_index("method").loc["naive"] if "naive" in set(fin.method) else None
    same_jn = ("joint" in set(df.method) and "naive" in set(df.method) and np.allclose(
        df[df.method == "joint"].sort_values(["seed", "stage"]).J_after.to_numpy(),
        df[df.method == "naive"].sort_values(["seed", "stage"]).J_after.to_numpy()))
    s = [f"## {title}\n", _img("fig_training_curves"),
         "**What it tests.** Whether SAT/TeamTR improves the team steadily and ends higher than "
         "naive sequential, joint, no-trust-region and HAPPO updates at the same number of "
         "episodes per stage.\n",
         f"**Paper.** {PAPER['training']['src']}.\n",
         f"**Ours** (final exact J after stage {int(df.stage.max())}, mean ± std over seeds; "
         "regression rate = fraction of stages with a negative true improvement; episodes = "
         "total per run):\n",
         md_table(fin.rename(columns={"mean": "final_J", "std": "std", "count": "seeds"})), ""]
    verdict = (f"Best final J: {best}. " + (
        f"SAT ends {'above' if sat['mean'] > nai['mean'] else 'below'} naive sequential "
        f"({sat['mean']:.3f} vs {nai['mean']:.3f}; difference {sat['mean'] - nai['mean']:+.3f}, "
        f"seed std {sat['std']:.3f} / {nai['std']:.3f}). " if sat is not None and nai is not None else ""))
    if sat is not None and nai is not None and abs(sat["mean"] - nai["mean"]) < max(sat["std"], nai["std"]):
        # rule: a difference smaller than the larger seed std is not a difference
        verdict += ("The two are indistinguishable within seed noise, so the paper's clear "
                    "separation is not reproduced: at a matched budget SAT draws a third of the "
                    "episodes per update (it resamples before each of the 3 updates), so its "
                    "updates are noisier, while the stale batch's bias is small at δ = 0.01 (see the "
                    "stale-gap section). The stale-occupancy failure the paper describes needs larger "
                    "drift (more agents, larger steps, or structured MDPs such as the verify suite's "
                    "naive_reuse counterexample). ")
    elif sat is not None and nai is not None and sat["mean"] <= nai["mean"]:
        verdict += ("Disagrees with the paper here: at a matched budget SAT draws a third of the "
                    "episodes per update (it resamples before each of the 3 updates), so its "
                    "updates are noisier, while the stale batch's bias is small at δ = 0.01 — "
                    "the chained occupancy shift of 2 earlier steps of expected KL 0.01 is tiny "
                    "(see the stale-gap section). The stale-occupancy failure the paper describes "
                    "needs larger drift (more agents, larger steps, or structured MDPs such as the "
                    "verify suite's naive_reuse counterexample). ")
    else:
        verdict += "Agrees with the paper's ordering of SAT over naive sequential. "
    if same_jn:
        verdict += ("joint and naive produce identical curves: with one batch per stage an "
                    "agent's update does not depend on the others' new parameters, so the two "
                    "coincide in this implementation. ")
    if len(settings) > 1:
        ex = df_all[df_all.setting == settings[1]]
        fe = ex[ex.stage == ex.stage.max()].groupby("method").J_after.mean()
        if {"sat", "naive"} <= set(fe.index):
            d = fe["sat"] - fe["naive"]
            curve = ex.groupby(["method", "stage"]).J_after.mean().unstack("method")
            gap = (curve["sat"] - curve["naive"])
            k = int(gap.abs().idxmax())
            verdict += (f"In the second panel ({settings[1]}), SAT ends at "
                        f"J = {fe['sat']:.4f} and naive at {fe['naive']:.4f} (difference {d:+.2e}, "
                        f"{100 * d / abs(fe['naive']):+.3f}%); the largest gap along the way is "
                        f"{gap.loc[k]:+.3f} after stage {k} (J ≈ {curve['naive'].loc[k]:.2f}). "
                        "The stale-occupancy bias alone "
                        + ("barely changes where training ends, unlike the paper's 87.9% vs 58.7% at n = 8."
                           if abs(d) < 0.01 * abs(fe["naive"]) else "changes where training ends."))
    s.append("**Agreement.** " + verdict)
    if sat is not None and nai is not None:
        _sum("fig_training_curves (TeamTR Fig. 3)", "TeamTR ends clearly above the sequential baselines",
             f"final J: SAT {sat['mean']:.2f} ± {sat['std']:.2f}, naive {nai['mean']:.2f} ± {nai['std']:.2f}",
             "not reproduced (within seed noise)" if abs(sat["mean"] - nai["mean"]) < max(sat["std"], nai["std"])
             else ("agrees" if sat["mean"] > nai["mean"] else "disagrees: naive ends higher"))
    return "\n".join(s) + "\n"


def section_kl(out: Path) -> str:
    title = "Per-update KL and the out-of-region rate (TeamTR Fig. 4a)"
    df = _read(out, "fig_kl_distribution")
    if df is None:
        return _missing(title, "fig_kl_distribution")
    delta = float(df.delta_i.dropna().min()) if "delta_i" in df and df.delta_i.notna().any() else 0.01
    rows = []
    for m, g in df.groupby("method"):
        rows.append(dict(method=m, updates=len(g), median_kl_hat=float(g.kl.median()),
                         out_hat=float(np.mean(g.kl > delta)), median_kl_exact=float(g.delta.median()),
                         out_exact=float(np.mean(g.delta > delta)),
                         rejected=float(np.mean(g.rejected.astype(bool))) if "rejected" in g else np.nan))
    t = pd.DataFrame(rows)
    sat_out = t.set_index("method").out_exact.get("sat", np.nan)
    other = t[t.method.isin(["no-tr", "happo"])].out_exact
    s = [f"## {title}\n", _img("fig_kl_distribution"),
         "**What it tests.** Whether the trust region keeps updates inside δ, measured by the "
         "monitored estimate δ̂ and (tabular only) by the exact expected KL.\n",
         f"**Paper.** {PAPER['kl']['src']}.\n",
         f"**Ours** (δ = {delta:g}; out_* = fraction of updates above δ):\n", md_table(t), ""]
    s.append("**Agreement.** " + (
        f"SAT's updates stay in region ({100 * sat_out:.0f}% out by the exact KL). "
        + (f"The methods without a trust region are out of region on "
           f"{100 * other.max():.0f}% of updates at most: "
           + ("like the paper, they leave the region." if other.max() > 0.1 else
              "unlike the paper's PPO/GRPO/DAPO baselines, they rarely leave it here — the "
              "tabular backend's optimizer (a few Adam epochs with ratio clipping) takes steps "
              "smaller than δ = 0.01 even without a KL constraint, so clipping alone keeps them "
              "in region.") if len(other) else "")))
    _sum("fig_kl_distribution (TeamTR Fig. 4a)", "TeamTR in region; PPO/GRPO/DAPO often out",
         f"out of region (exact KL): SAT {100 * sat_out:.0f}%, no-tr / happo up to {100 * other.max():.0f}%"
         if len(other) else f"SAT {100 * sat_out:.0f}% out",
         "agrees" if len(other) and other.max() > 0.1 and sat_out < 0.1 else "partly")
    return "\n".join(s) + "\n"


def section_llm_kl_monitor(out: Path) -> str:
    """TeamTR's sampled KL monitor (eq. 18) against the exact token KL on LLM updates, read
    from ``llm_kl_monitor/kl_monitor.csv`` (``python experiments/llm_kl_monitor.py``)."""
    from experiments.llm_kl_monitor import ESTIMATES, gap_note

    title = "Sampled vs exact KL monitor on LLM updates (TeamTR eq. 18)"
    path = out / "llm_kl_monitor" / "kl_monitor.csv"
    if not path.exists():
        return (f"## {title}\n\nNot generated: `{path}` is missing; run "
                f"`python experiments/llm_kl_monitor.py --out {out}/llm_kl_monitor`.\n")
    df = pd.read_csv(path)
    t = pd.DataFrame([dict(estimate=f"{kind}, {batch}", mean=float(df[c].mean()),
                           se=float(df[c].std(ddof=1) / np.sqrt(len(df))), std=float(df[c].std(ddof=1)),
                           negative=float(np.mean(df[c] < 0)))
                      for c, (kind, batch) in ESTIMATES.items()])
    s = [f"## {title}\n",
         "![sampled vs exact KL](llm_kl_monitor/kl_monitor.png)  \n"
         "Data: [`llm_kl_monitor/kl_monitor.csv`](llm_kl_monitor/kl_monitor.csv); regenerate with "
         "`python experiments/llm_kl_monitor.py` (tiny-random team, CPU).\n",
         "**What it tests.** TeamTR monitors its trust region with the sampled token KL on the "
         "update's own rollout batch (App. G). Each trial takes one real agent update and measures "
         "the sampled and the exact (full-vocabulary) token KL on that batch and on a fresh batch "
         "from the pre-update policy.\n",
         f"**Ours** ({len(df)} trials; per-message KL in nats; negative = fraction of trials below 0):\n",
         md_table(t, "{:.4g}"), "",
         "**Why the two differ.** " + gap_note(df)]
    return "\n".join(s) + "\n"


def section_tracking(out: Path) -> str:
    title = "Cumulative certificate vs measured improvement (TeamTR Fig. 4b)"
    df = _read(out, "fig_certificate_tracking")
    if df is None:
        return _missing(title, "fig_certificate_tracking")
    cum = df.sort_values("stage").groupby("seed")[
        [c for c in ("true_improvement", "lower_bound_estimated", "lower_bound", "lower_bound_tv") if c in df]].sum()
    m = cum.mean()
    s = [f"## {title}\n", _img("fig_certificate_tracking"),
         "**What it tests.** Whether the stage certificates, summed over training, stay below the "
         "measured improvement while tracking it.\n",
         f"**Paper.** {PAPER['tracking']['src']}: the certificate \"remains conservative while "
         "tracking progress with a consistent gap\".\n",
         f"**Ours** (SAT, sums over {int(df.stage.max()) + 1} stages, mean over seeds): measured "
         f"{m.true_improvement:.3f}; paper-form certificate with estimated terms "
         f"{m.get('lower_bound_estimated', np.nan):.1f}; with exact terms {m.get('lower_bound', np.nan):.1f}; "
         f"tightest exact rung {m.get('lower_bound_tv', np.nan):.2f}. Every stage's exact bound held: "
         f"{bool(df.holds.all()) if 'holds' in df else 'n/a'}.\n"]
    s.append("**Agreement.** Conservative, as the paper says — but far from tracking: the "
             f"paper-form certificate is {abs(m.get('lower_bound_estimated', np.nan) / m.true_improvement):.0f}× "
             "the measured gain in magnitude and of the opposite sign, because its penalty "
             "c·Σ√δ_i with c = √2γA_max/(1−γ)² outweighs any possible gain at γ ≥ ½: both are of "
             "order √δ, and the gain is at most √2A_max√δ_i/(1−γ) per step, so with exact terms the bound is ≤ 0 "
             "for every stage (docs/theory.md §4.4, the vacuity result, checked by `sat verify`'s "
             "expected_kl_vacuity). The paper's visibly tracking certificate is not what Thm 3.6 gives with "
             f"these constants; this project's tightest rung ({m.get('lower_bound_tv', np.nan):.2f}) is the "
             "nearest to the measured curve.")
    _sum("fig_certificate_tracking (TeamTR Fig. 4b)", "conservative and tracking progress",
         f"Σ measured {m.true_improvement:.2f} vs Σ certificate {m.get('lower_bound_estimated', np.nan):.0f}",
         ("conservative" if m.get("lower_bound_estimated", np.nan) <= m.true_improvement else "not conservative")
         + (", but does not track (vacuous with these constants)" if m.get("lower_bound_estimated", 0) < 0 else ""))
    return "\n".join(s) + "\n"


def section_cert_vs(out: Path) -> str:
    from sat_theory.plotting import spearman

    title = "Per-stage certificate vs improvement (TeamTR Fig. 4c)"
    df = _read(out, "fig_certificate_vs_improvement")
    if df is None:
        return _missing(title, "fig_certificate_vs_improvement")
    rows = []
    for col in ("lower_bound_estimated", "lower_bound", "lower_bound_tv"):
        if col in df:
            rows.append(dict(certificate=col, spearman=spearman(df[col], df.true_improvement),
                             violation_rate=float(np.mean(df[col] > df.true_improvement)),
                             median_certificate=float(df[col].median())))
    t = pd.DataFrame(rows)
    s = [f"## {title}\n", _img("fig_certificate_vs_improvement"),
         "**What it tests.** Whether per-stage certificates rank stages like their true "
         "improvements (rank correlation) and never exceed them (violation rate).\n",
         "**Paper.** TeamTR Fig. 4c: conservative (low violation rate) with positive rank "
         "correlation (the number is in the figure only).\n",
         f"**Ours** (SAT stages, n = {len(df)}; median true improvement "
         f"{df.true_improvement.median():.3f}):\n", md_table(t), ""]
    rho = t.set_index("certificate").spearman
    s.append("**Agreement.** " + (
        "Violation rate 0 for every form: conservative, as the paper says. " if (t.violation_rate == 0).all()
        else "Some certificate exceeded the true improvement on some stages. ")
        + f"Rank correlation of the paper's form: {rho.get('lower_bound_estimated', np.nan):.2f} — "
        + ("positive like the paper's." if rho.get("lower_bound_estimated", 0) > 0.3 else
           "not a useful positive correlation: the certificate's variation across stages is "
           "driven by the penalty (A_max, √δ̂), not by the gain, so it does not rank stages by "
           "their improvement."))
    r = rho.get("lower_bound_estimated", np.nan)
    vmax = float(t.violation_rate.max()) if len(t) else np.nan
    _sum("fig_certificate_vs_improvement (TeamTR Fig. 4c)", "low violation rate, positive rank correlation",
         f"violation rate {vmax:.0%}, Spearman ρ {r:.2f}",
         ("conservative" if vmax == 0 else "violations") + ("; ρ positive" if r > 0.3 else "; no positive ρ"))
    return "\n".join(s) + "\n"


def section_stale_gap(out: Path) -> str:
    title = "Stale-occupancy gap within a stage (TeamTR Fig. 2)"
    df = _read(out, "fig_stale_gap")
    if df is None:
        return _missing(title, "fig_stale_gap")
    t = df[df.step.isin([2, 3])].groupby(["method", "step"])[["gap_exact", "gap_used"]].mean().reset_index()
    piv = t.pivot_table(index="method", columns="step", values="gap_exact")
    grows = {m: bool(piv.loc[m, 3] > piv.loc[m, 2]) for m in piv.index if 3 in piv.columns}
    pu = t.pivot_table(index="method", columns="step", values="gap_used")
    s = [f"## {title}\n", _img("fig_stale_gap"),
         "**What it tests.** Whether the surrogate on stage-start rollouts drifts away from the "
         "one on the intermediate team's rollouts, more for the later step i = 3 than for i = 2.\n",
         f"**Paper.** {PAPER['stale_gap']['src']}; Fig. 2: the gap is larger at i = 3 than at "
         "i = 2 for methods reusing stage-start rollouts, and much smaller for TeamTR.\n",
         "**Ours** (mean over stages and seeds; gap_exact = |L_i^stale − L_i^seq|, "
         "gap_used = |L̂_i − L_i^seq| for the surrogate the method optimized):\n", md_table(t), ""]
    s.append("**Agreement.** " + "; ".join(
        f"{m}: exact gap {'larger' if g else 'not larger'} at i = 3 than at i = 2" for m, g in grows.items())
        + (". The compounding with i agrees with the paper (the chained shift Σ_{k<i}√δ_k grows with i). "
           if grows and all(grows.values()) else
           ". The paper's compounding with i is not seen for every method here. ")
        + (f"The exact gap is of the same size for SAT and naive ({piv.loc['sat'].mean():.1e} vs "
           f"{piv.loc['naive'].mean():.1e}): it is a function of the policy sequence, and the "
           "sequences are close. What SAT avoids is optimizing the stale surrogate; its own "
           f"surrogate error (gap_used, {pu.loc['sat'].mean():.1e}) is sampling noise, naive's "
           f"({pu.loc['naive'].mean():.1e}) is noise plus the stale gap"
           + (" — at this δ the noise dominates both." if pu.loc["naive"].mean() > 3 * piv.loc["naive"].mean()
              else ".") if {"sat", "naive"} <= set(piv.index) else ""))
    if {"sat", "naive"} <= set(piv.index) and 3 in piv.columns:
        _sum("fig_stale_gap (TeamTR Fig. 2)", "gap larger at i=3 than i=2; TeamTR's much smaller",
             f"exact gap i=2→3: naive {piv.loc['naive', 2]:.1e}→{piv.loc['naive', 3]:.1e}, "
             f"SAT {piv.loc['sat', 2]:.1e}→{piv.loc['sat', 3]:.1e}",
             ("compounding with i agrees" if all(grows.values()) else "compounding not seen")
             + ("; SAT's gap is not smaller (same policy-sequence quantity)"
                if piv.loc["sat"].mean() > 0.5 * piv.loc["naive"].mean() else "; SAT's gap is smaller"))
    return "\n".join(s) + "\n"


def section_pnp(out: Path) -> str:
    title = "Plug-and-play replacement (TeamTR Fig. 6, Table 11)"
    t = _read(out, "table_plug_and_play")
    if t is None:
        return _missing(title, "table_plug_and_play")
    P = PAPER["pnp"]
    show = t[["kind", "strategy", "seeds", "final_J_mean", "final_J_std", "swap_shock_mean",
              "swap_shock_pct_mean", "align_kl_exact"]]
    s = [f"## {title}\n", _img("fig_plug_and_play"),
         "**What it tests.** Whether aligning a replacement agent to the old one (Stage-0) before "
         "the swap avoids the swap shock and ends higher than a direct swap or retraining.\n",
         f"**Paper.** {P['src']}: swap shock {P['shock_direct']} points (direct) vs "
         f"{P['shock_stage0']} (Stage-0); final {P['final_direct']}% vs {P['final_stage0']}%; "
         "retraining ends below the aligned swap.\n",
         "**Ours** (shock = J after swap − J before; % of the pre-swap J):\n", md_table(show), ""]
    g = t.set_index("variant")
    lines = []
    if {"random/direct", "random/stage0"} <= set(g.index):
        rd, rs_ = g.loc["random/direct"], g.loc["random/stage0"]
        lines.append(f"Random (mismatched) replacement: direct shock {rd.swap_shock_mean:+.3f} vs Stage-0 "
                     f"{rs_.swap_shock_mean:+.3f}; final J {rd.final_J_mean:.3f} vs {rs_.final_J_mean:.3f}"
                     + (" — agrees with the paper: alignment removes most of the shock and ends higher."
                        if abs(rs_.swap_shock_mean) < abs(rd.swap_shock_mean) and rs_.final_J_mean > rd.final_J_mean
                        else " — does not reproduce the paper's ordering."))
    if {"stronger/direct", "stronger/stage0"} <= set(g.index):
        sd, ss = g.loc["stronger/direct"], g.loc["stronger/stage0"]
        lines.append(f"Stronger replacement: direct {sd.swap_shock_mean:+.3f} vs Stage-0 "
                     f"{ss.swap_shock_mean:+.3f}; final J {sd.final_J_mean:.3f} vs {ss.final_J_mean:.3f}"
                     + (" — here a direct swap is better: the new agent is better at the task and "
                        "compatible with the team (the tabular world has no chat-protocol mismatch), "
                        "so there is no shock to remove, and Stage-0 alignment, by pulling the agent "
                        "back within δ of the old one, throws its strength away. Stage-0 pays off "
                        "when the replacement is mismatched, not merely different."
                        if sd.final_J_mean > ss.final_J_mean else "."))
    s.append("**Agreement.** " + " ".join(lines))
    if {"random/direct", "random/stage0"} <= set(g.index):
        _sum("fig_plug_and_play (TeamTR Fig. 6, Table 11)",
             f"shock {P['shock_direct']} (direct) vs {P['shock_stage0']} (Stage-0) points",
             f"random replacement: shock {rd.swap_shock_mean:+.2f} vs {rs_.swap_shock_mean:+.2f} J"
             + (f"; stronger replacement: final J direct {g.loc['stronger/direct'].final_J_mean:.2f} vs "
                f"Stage-0 {g.loc['stronger/stage0'].final_J_mean:.2f}" if "stronger/direct" in g.index else ""),
             ("agrees for a mismatched replacement" if abs(rs_.swap_shock_mean) < abs(rd.swap_shock_mean)
              and rs_.final_J_mean > rd.final_J_mean else "mismatched replacement: not reproduced")
             + ("; not for a compatible stronger one" if "stronger/direct" in g.index and
                g.loc["stronger/direct"].final_J_mean > g.loc["stronger/stage0"].final_J_mean else ""))
    return "\n".join(s) + "\n"


def section_ablations(out: Path) -> str:
    title = "Ablations with a tabular meaning (TeamTR Table 9)"
    t = _read(out, "table_ablations")
    if t is None:
        return _missing(title, "table_ablations")
    show = t[["paper_row", "paper_acc", "paper_delta_stale", "final_J", "final_J_std",
              "delta_stale_final", "surrogate_gap_final", "stability", "out_of_region_rate",
              "adv_clip_frac", "bound_violations"]]
    g = t.set_index("variant")
    full = g.loc["full"]
    spread = float(t.final_J.max() - t.final_J.min())
    noise = float(t.final_J_std.mean())
    same_clip = np.isclose(g.loc["no-clip", "final_J"], full.final_J) if "no-clip" in g.index else False
    # Spearman of our final J against the paper's accuracy over the rows
    from sat_theory.plotting import spearman

    rho = spearman(t.paper_acc, t.final_J)
    s = [f"## {title}\n", "Data: [`table_ablations.csv`](table_ablations.csv)\n",
         "**What it tests.** Which components matter: resampling (none / every 2 updates / "
         "importance weights), trust region (none, δ = 0.001, δ = 0.1, adaptive), update order, "
         "advantage normalization and clipping.\n",
         f"**Paper.** {PAPER['ablations']['src']} (columns paper_acc, paper_delta_stale).\n",
         f"**Ours** ({int(t.seeds.min())} seeds; final exact J; Δ_stale and surrogate gap at the final stage):\n",
         md_table(show), ""]
    best, worst = t.loc[t.final_J.idxmax()], t.loc[t.final_J.idxmin()]
    within = t[(t.final_J - full.final_J).abs() <= t.final_J_std.clip(lower=full.final_J_std)]
    s.append("**Agreement.** " + (
        f"The spread of final J across rows ({spread:.3f}) is comparable to the seed std "
        f"({noise:.3f}), so most rows are not distinguishable here; " if spread < 3 * noise else
        f"Rows differ by up to {spread:.3f} in final J (mean seed std {noise:.3f}): best "
        f"'{best.paper_row}' ({best.final_J:.2f}), worst '{worst.paper_row}' ({worst.final_J:.2f}); "
        f"{len(within) - 1} of the other {len(t) - 1} rows are within one seed std of the full "
        "method; ")
        + f"the rank correlation between our final J and the paper's accuracy over the rows is "
        f"{rho:.2f}"
        + (" — the paper's ordering of the components is not reproduced: in this small MDP at "
           "δ = 0.01 the stale batch costs little (see the stale-gap section) and the budget "
           "split of resampling costs more, while a too-small δ slows learning most. "
           if rho < 0.3 else ". ")
        + ("'No hard clipping' equals the full method exactly: with G episodes per group the "
           "normalized advantage is bounded by √(G−1) < A_clip, so the clip never binds "
           f"(clip fraction {full.adv_clip_frac:.3f}). " if same_clip else "")
        + "'Fixed order' is the full method's own order, hence identical. Every row's exact "
        f"certificate held on every stage: {bool((t.bound_violations == 0).all())}.")
    _sum("table_ablations (TeamTR Table 9)", "full TeamTR best; no-resample / no-TR worst",
         f"best '{best.paper_row}', worst '{worst.paper_row}'; ρ with paper {rho:.2f}",
         "ordering not reproduced" if rho < 0.3 else "ordering broadly agrees")
    return "\n".join(s) + "\n"


def _llm_rows(folder: Path) -> list[dict]:
    """The study's per-run summary, recomputed from its eval files (never a stale copy)."""
    from experiments import llm_team_learning as study

    if not folder.is_dir():
        return []
    study.report(folder)  # rewrites summary.json / summary.md / figures from the raw files
    p = folder / "summary.json"
    return json.loads(p.read_text()) if p.is_file() else []


def _sampled_accuracy(folder: Path, runs: list[str]) -> float:
    """Mean batch reward of the first agent step of each run (the untrained team, sampled)."""
    from sat_theory.metrics import read_metrics

    first = [next(r for r in read_metrics(folder / run) if r["kind"] == "step")["reward_mean"]
             for run in runs]
    return float(np.mean(first)) if first else math.nan


def _error_kinds(folder: Path, runs: list[str]) -> str:
    """What the trained teams' wrong final answers are: a wrong number, or no number."""
    import re

    wrong_number = no_number = 0
    for run in runs:
        evals = sorted((p for p in (folder / run).glob("eval_*.jsonl") if p.stem[5:].isdigit()),
                       key=lambda p: int(p.stem[5:]))
        for line in evals[-1].read_text().splitlines():
            r = json.loads(line)
            if not r["correct"]:
                has = re.search(r"-?\d+", r["final"]) is not None
                wrong_number += has
                no_number += not has
    total = max(wrong_number + no_number, 1)
    return (f"Of the trained teams' wrong final answers (lenient scoring), "
            f"{100 * wrong_number / total:.0f}% contain some number and "
            f"{100 * no_number / total:.0f}% none at all.")


def _after_best(run: Path) -> str:
    """``", then down to x at prompt k"`` when a run's accuracy fell after its best evaluation."""
    from sat_theory.metrics import read_metrics

    acc = [(r.get("prompts", r.get("stage")), r["eval_accuracy"]) for r in read_metrics(str(run))
           if r.get("kind") == "stage" and r.get("eval_accuracy") is not None]
    if not acc:
        return ""
    b = max(range(len(acc)), key=lambda i: acc[i][1])
    low = min(acc[b:], key=lambda t: t[1])
    return (f" after {acc[b][0]} prompts, then down to {low[1]:.3f} after {low[0]}"
            if low[1] < acc[b][1] else "")


def _scoring_paragraph(rows: list[dict]) -> str:
    """What the two scorings say about the first study's runs (from summary.json's rows)."""
    by = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    parts = [f"{m} {min(x['acc_final_strict'] for x in rs):.3f}–"
             f"{max(x['acc_final_strict'] for x in rs):.3f} strict vs "
             f"{min(x['acc_final'] for x in rs):.3f}–{max(x['acc_final'] for x in rs):.3f} lenient "
             f"(format followed by {100 * min(x['format_final'] for x in rs):.0f}–"
             f"{100 * max(x['format_final'] for x in rs):.0f}% of the finals)"
             for m, rs in sorted(by.items()) if m in ("sat", "single", "trl", "comlrl", "naive")]
    never = sorted(m for m, rs in by.items() if all(x["format_final"] == 0 for x in rs))
    return ("\n**Two scorings** (every eval file re-scored from its saved final messages, "
            "`llm_team_learning.py --rescore`): *lenient* is the task's score (the last integer "
            "on the last `Answer:`'s line, else on the last line; the parser took the text after "
            "the *first* `Answer:` of a line before the fix, which changed 94 of the 77 000 "
            "records: `git show 1aa234d --stat`), *strict* needs an `Answer: <integer>` line whose value is right. Final "
            "accuracy per method over its seeds: " + "; ".join(parts) + ". "
            + (f"The finals of {', '.join(never)} never follow the `Answer:` format the prompt "
               "asks for: their accuracy is the lenient parser's reading of free text (e.g. "
               "`6 + 6 = 12, which is the sum of 6` is scored wrong, its last integer being 6), "
               "so a fall of their lenient curve can be a change of phrasing rather than of "
               "arithmetic. " if never else "")
            + "Which method is ahead depends on the scoring in several of the comparisons "
            "above (compare the lenient and strict columns).\n")


def _run_noise_paragraph(par: list[dict]) -> str:
    """Parity judged against the training runs' own noise (:func:`experiments.study_metrics.
    run_noise_interval`): the per-seed lenient AUC differences plain − TRL against the
    reruns' differences TRL − TRL rerun and, once there are any, plain − plain rerun (then
    the two methods' noise is not assumed equal), once there are two seeds and a TRL rerun."""
    from experiments.study_conclusions import parity_run_noise, run_noise_inputs

    diffs, reruns, plain = run_noise_inputs(par)
    head = "**Against the run noise** (lenient AUC, `study_metrics.run_noise_interval`): "
    r = parity_run_noise(par)
    if r is None:
        return head + ("not yet measured: it needs plain − TRL on two seeds and at least one "
                       f"TRL rerun ({len(diffs)} and {len(reruns)} so far).\n")
    pts = lambda iv: f"{100 * iv[0]:+.1f} [{100 * iv[1]:+.1f}, {100 * iv[2]:+.1f}]"  # noqa: E731
    rms = lambda x: 100 * (sum(v * v for v in x) / len(x)) ** 0.5  # noqa: E731
    seeds = ", ".join(f"seed {p['seed']} {100 * d:+.1f} ({'within' if w else 'beyond'})"
                      for p, d, w in zip(par, diffs, r["within_noise"], strict=True))
    noise = (f"two TRL runs that differ only in TRL's seed differ by {rms(reruns):.1f} points "
             f"RMS over {len(reruns)} seed(s)")
    if plain:
        noise += (f", two plain runs that differ only in our seed by {rms(plain):.1f} over "
                  f"{len(plain)}; the noise of one seed's plain − TRL is then "
                  f"{100 * r['run_noise_sd']:.1f} points (√ of the mean of the two mean squares, "
                  f"{r['dof']:.1f} degrees of freedom by Welch–Satterthwaite)")
    vs = [f"seed {p['seed']} {pts(p['plain_rerun_minus_trl_auc'])}" for p in par
          if p.get("plain_rerun_minus_trl_auc")]
    if vs:
        noise += ("; the plain rerun against TRL dr_grpo, lenient AUC with its paired CI: "
                  + ", ".join(vs))
    model = ("its method's plus independent run noise, of each method's own size" if plain else
             "its method's plus independent run noise, equally large for both methods (plain's "
             "reruns, which would measure its own, are not yet run)")
    return (head + f"{noise}. If plain and TRL were the same algorithm, one seed's "
            f"|plain − TRL| would exceed t · that = {100 * r['per_seed_bound']:.1f} points "
            f"with probability 5%: {seeds}. Over the {len(diffs)} seeds, plain − TRL = "
            f"{pts(r['delta'])} points (95% t-interval with the reruns' noise; from the seeds' "
            f"own spread alone: {pts(r['seeds_only'])}). The model behind it: every run's AUC is "
            f"its problems' effect plus {model}.\n")


def _noise_source(folder: Path) -> str:
    """Where two runs of one algorithm differ (``experiments/study_noise.py``, also written to
    ``v2/noise.md``): per pair of runs on the same problems, the AUC difference split into
    the checkpoint deviations and how much they add up; per method the rerun pairs' noise;
    per run the format course, churn, prompt draws and step records."""
    from experiments.study_noise import report as noise_report

    text = noise_report(folder)
    (folder / "noise.md").write_text(text)
    return ("**Where the run noise comes from** (`experiments/study_noise.py`; `v2/noise.md`). "
            "`plain-epoch` is ours-plain with TRL's prompt draws (`--prompt-draw epoch`), "
            "`plain-epoch-rerun` its rerun; they test whether ours' lasting deviations come "
            "from drawing each rollout's problems independently, which lets two reruns train on "
            "different problem multisets (the draws column below).\n\n" + text)


def section_llm_common(folder: Path) -> str:
    """The common-schedule study (issue 21): tables generated by
    ``llm_team_learning.py --report-common`` from the run folders under ``folder``."""
    from experiments import llm_team_learning as study
    from experiments.study_conclusions import study_conclusions

    head = "### The comparison on one schedule: parity with TRL, tuned peers, stability (issue 21)\n"
    if not folder.is_dir():
        return head + "\nNot yet run (`python experiments/llm_team_learning.py --out " \
                      "figures/llm_team_learning/v2 --queue issue21`).\n"
    t = study.report_common(folder)
    done = sorted(t["runs"])
    total = len(study.queue_issue21())
    par = t["parity"]
    verdict = ("not yet run on any seed" if not par else
               f"the AUC difference's CI includes 0 on {sum(p['includes_0'] for p in par)} of "
               f"{len(par)} seed(s) run (target: each of 3)")
    s = [head,
         "Every method is evaluated on the same grid of the sampled-message budget: after every "
         f"{study.GRID_MESSAGES} sampled training messages (12 points plus the untrained model; "
         "ours via `sat train --eval-every`, TRL every 4 generations, CoMLRL after the nearest "
         "prompt count). Headline metrics (`experiments/study_metrics.py`): AUC = mean held-out "
         "accuracy over the checkpoints, final, best, drawdown (best − final) and the worst drop "
         "between consecutive checkpoints, each with a paired bootstrap 95% CI over the 200 "
         "problems (2 000 resamples per run, 10 000 per comparison), McNemar's exact p for "
         "finals; lenient / strict. Runs: `llm_team_learning/v2/<method>_lr<rate>_s<seed>/` "
         "(held-out) and `v2/tune/` (validation); every number is in `v2/runs.json` and "
         "recomputes from the eval files: `python experiments/recompute_llm_study.py` does it "
         "with the standard library only, none of the project's code, and checks every point "
         f"estimate of `runs.json`. Finished: {len(done)} of the queue's {total} runs "
         f"({', '.join(done) if done else 'none yet'}).\n",
         "**Conclusions** (generated, `experiments/study_conclusions.py`: each verdict follows "
         "the rule R1–R6 its docstring declares, under each scoring; points of accuracy, "
         "[95% CI]):\n", study_conclusions(folder, t),
         "**Implementation parity** (`plain` = `sat train --method no-tr --agents 1 --beta 1e-300 "
         "--ratio token --no-std-norm`: β = 0 exactly in the float32 loss, no backtracking, "
         "TRL's per-token ratio, advantages r − mean; `trl-drgrpo` = TRL 1.16 GRPOTrainer with "
         "`loss_type=\"dr_grpo\"`, `scale_rewards=\"none\"`, β = 0, `max_grad_norm` = ours ÷ "
         f"{1 / study.trl_drgrpo_clip(study.StudyConfig()):g} "
         "(its minibatch loss is ours ÷ L_max·mb/M); `tests/llm/test_trl_oracle.py` checks 6 "
         "off-policy AdamW steps of this pair step by step. What still differs: TRL shuffles "
         "the generation batch into minibatches (ours keeps rollout order, two whole groups "
         "per minibatch), draws its prompts as one permutation of the pool per epoch (ours "
         "draws each rollout's 8 distinct problems independently of the other rollouts, "
         "unless `--prompt-draw epoch`), takes 4 momentum-only Adam steps on a rollout whose "
         "advantages are all 0 (ours skips the update) and applies Adam's ε = 1e-8 to a "
         "gradient 4× smaller; learning rate 1e-3 for both, 3 seeds. Parity: "
         f"{verdict}. The paired CI over problems covers the evaluation's noise only, not the "
         "training run's random streams (samples, LoRA init, prompt order), which differ "
         "between any two runs even of one algorithm; the last two columns measure that noise "
         "floor: `trl-rerun` is TRL dr_grpo again on the same seed's problems with TRL's own "
         f"seed {study.RERUN_SEED} + s, `plain-rerun` ours-plain again on them with our seed "
         f"{study.RERUN_SEED} + s (`sat train --problem-seed s --seed {study.RERUN_SEED}+s`).\n", (folder / "parity.md").read_text(),
         _run_noise_paragraph(par),
         _noise_source(folder),
         "**Tuning grid** (validation AUC, lenient / strict, seed 0; 50 validation problems "
         "disjoint from the 200 held-out ones and from the tuning runs' 50 training problems; "
         "chosen: the best lenient validation AUC):\n", (folder / "tuning.md").read_text(),
         "**At the chosen rates** (3 seeds, held-out):\n", (folder / "main.md").read_text(),
         "**Stability at aggressive rates** (2 seeds; the theory predicts that SAT's trust "
         "region bounds the damage; KL per update: the exact token-sum KL of each update to the "
         "policy before it, which the peers' trainers do not measure):\n",
         (folder / "stability.md").read_text(),
         "**Run time** (1 torch thread per run, two runs at a time, on a 2-core machine shared "
         "with other engineers' jobs — the load average is recorded at start and end; "
         "evaluation share = 1 − training / wall, i.e. the held-out evaluations plus model "
         "loading):\n", (folder / "timing.md").read_text() if done else "No run finished yet.\n"]
    return "\n".join(s) + "\n"


def section_llm_learning(out: Path) -> str:
    """LLM teams that learn (experiments/llm_team_learning.py): computed from the run
    folders' ``eval_{k}.jsonl`` (per-problem correctness) and ``metrics.jsonl``."""
    from experiments import llm_team_learning as study

    title = "LLM teams that learn: SmolLM2-135M agents, side by side with peers"
    folder = out / "llm_team_learning"
    rows = _llm_rows(folder)
    if not rows:
        return f"## {title}\n\nNo finished run in `{folder}` (run experiments/llm_team_learning.py).\n"
    cfg = study.StudyConfig()
    sat = [r for r in rows if r["method"] == "sat"]
    met = [r for r in sat if r["gain"] >= 0.25 and r["gain_ci_lo"] > 0
           and r["wall_minutes"] <= 45]
    done = {r["method"] for r in rows}
    todo = [m for m in [*study.METHODS, *study.PEERS, *study.SWAPS] if m not in done]
    untrained = [r["acc_untrained"] for r in sat]
    sampled = _sampled_accuracy(folder, [r["run"] for r in sat])
    s = [f"## {title}\n", "![accuracy vs tokens and wall time](llm_team_learning/learning.png)  \n"
         "Per run: `llm_team_learning/<method>_s<seed>/` (config.json, metrics.jsonl, "
         "eval_{k}.jsonl); table: `llm_team_learning/summary.csv`.\n",
         "**What it tests.** Whether the LLM backend *trains* a team: two SmolLM2-135M-Instruct "
         "agents (LoRA rank 8 on `q_proj`/`v_proj` of one frozen base) take turns on arithmetic "
         f"(operands {cfg.lo}–{cfg.hi}, `{cfg.ops}`, 300 problems: {cfg.n_train} for training, "
         f"{cfg.n_eval} held out, disjoint); agent 2's final answer is scored. Every method gets "
         f"the same prompts, group size {cfg.group_size}, {cfg.prompts} prompts per rollout, "
         f"learning rate {cfg.lr:g}, ≤ {cfg.max_new_tokens} new tokens, τ = {cfg.temperature} and "
         "the same budget of sampled messages; held-out accuracy is greedy and every evaluation "
         "is saved per problem (`eval_{k}.jsonl`), from which every number below is recomputed "
         "(gain CIs: paired bootstrap over problems, 10 000 resamples). Why this task: the "
         f"untrained team scores {100 * min(untrained):.1f}–{100 * max(untrained):.1f}% (inside "
         f"the asked 15–60% band) and {100 * sampled:.1f}% of its sampled episodes in the first "
         "rollouts are correct, so groups carry signal; one-digit operands (243 problems) cannot "
         "give 200 held-out problems and two-digit ones leave almost no sampled episode correct "
         "(0 of 32 with `+` only, measured before the study).\n",
         "**Target** (issue 12): SAT ≥ +25 points with the CI excluding 0 on each of ≥ 2 seeds "
         f"in ≤ 45 min per run. **Ours:** met on {len(met)} of {len(sat)} SAT seeds.\n",
         (folder / "summary.md").read_text() if (folder / "summary.md").is_file() else "", ""]
    for r in sat:
        s.append(f"- `{r['run']}`: {r['acc_untrained']:.3f} → {r['acc_final']:.3f} "
                 f"({100 * r['gain']:+.1f} points, CI [{100 * r['gain_ci_lo']:+.1f}, "
                 f"{100 * r['gain_ci_hi']:+.1f}]), {r['wall_minutes']:.1f} min in all, of which "
                 f"{r['train_minutes']:.1f} min training and the rest the "
                 f"{r['stages'] + 1} held-out evaluations.")
    by = {}
    for r in rows:
        by.setdefault(r["method"], []).append(r)
    if len(by) > 1:
        mean = {m: float(np.mean([r["gain"] for r in rs_])) for m, rs_ in by.items()}
        tok = {m: float(np.mean([r["tokens"] for r in rs_])) for m, rs_ in by.items()}
        order = sorted(mean, key=mean.get, reverse=True)
        s.append("\n**Side by side at one token budget** (mean lenient gain over seeds): " + "; ".join(
            f"{m}{' (one agent, n = 1)' if m in ('trl', 'single') else ''} {100 * mean[m]:+.1f} "
            f"points ({len(by[m])} seed(s), {tok[m] / 1000:.1f}k tokens)" for m in order) + ".")
        if "trl" in mean and "single" not in mean:
            s.append("TRL's GRPOTrainer trains one agent; its like-for-like comparison is our "
                     "`single` (n = 1) run, not yet done — the 2-agent rows are not its peers.")
        comp = folder / "comparisons.csv"
        if comp.is_file():
            c = pd.read_csv(comp)
            s.append("\n**Paired comparisons of the final held-out accuracy** (the same 200 "
                     "problems: same seed; a − b with its paired-bootstrap 95% CI; "
                     "`llm_team_learning/comparisons.csv`):\n")
            s.append((folder / "comparisons.md").read_text())
            for r in c.to_dict("records"):
                if {r['a'].split("_s")[0], r['b'].split("_s")[0]} == {"single", "trl"}:
                    s.append(f"`{r['a']}` (SAT at n = 1: β-penalised and backtracking — *not* "
                             f"TRL's update) against TRL's GRPOTrainer (`dapo`, β = 0) on seed "
                             f"{r['seed']}: final {100 * r['diff']:+.1f} points "
                             f"[{100 * r['diff_ci_lo']:+.1f}, {100 * r['diff_ci_hi']:+.1f}] "
                             f"lenient, {100 * r['final_strict']:+.1f} strict; on the "
                             f"{r['common_checkpoints']} shared checkpoints AUC "
                             f"{100 * r['auc_lenient']:+.1f} [{100 * r['auc_lenient_ci_lo']:+.1f}, "
                             f"{100 * r['auc_lenient_ci_hi']:+.1f}] lenient, "
                             f"{100 * r['auc_strict']:+.1f} [{100 * r['auc_strict_ci_lo']:+.1f}, "
                             f"{100 * r['auc_strict_ci_hi']:+.1f}] strict; "
                             f"{r['tokens_a'] / 1000:.1f}k vs {r['tokens_b'] / 1000:.1f}k tokens.")
                if r['a'].startswith("single") and r['b'].startswith("sat"):
                    both = r['diff_ci_lo'] > 0 and r['final_strict_ci_lo'] > 0
                    s.append(f"One agent trained alone (4× the updates at the same tokens) ends "
                             f"{100 * r['diff']:+.1f} points [{100 * r['diff_ci_lo']:+.1f}, "
                             f"{100 * r['diff_ci_hi']:+.1f}] lenient, "
                             f"{100 * r['final_strict']:+.1f} [{100 * r['final_strict_ci_lo']:+.1f}, "
                             f"{100 * r['final_strict_ci_hi']:+.1f}] strict, against the SAT team "
                             f"of seed {r['seed']}"
                             + (": under both scorings the second agent does not pay for itself "
                                "at this budget and task." if both else
                                ": the scorings disagree or a CI includes 0."))
        if "naive" in mean and "sat" in mean and mean["naive"] > mean["sat"]:
            s.append("Here the stale-batch baseline learns *more* per generated token than SAT, "
                     "against TeamTR Fig. 3 / Table 9. At an equal token budget naive makes two "
                     "agent updates per rollout and SAT one (SAT re-samples after every update, so "
                     "half of each of its rollouts is the other agent's messages, which it does "
                     "not train on); with two agents the drift of agent 2's contexts after agent "
                     "1's update is small, so naive's reuse costs it little.")
            at = []
            for r in by["sat"]:
                nv = folder / f"naive_s{r['seed']}"
                if nv.is_dir():
                    tk, sc, ac = study.curve(nv)
                    got = [a_ for t_, a_ in zip(sc, ac, strict=True) if t_ <= 60 * r["train_minutes"]]
                    at.append(f"seed {r['seed']}: naive {got[-1]:.3f} vs SAT {r['acc_final']:.3f}")
            if at:
                s.append("At SAT's training time (evaluation excluded), naive reaches: "
                         + "; ".join(at) + ".")
    for r in rows:  # joint ≡ naive, as in the tabular world: compare their per-problem files
        nv = folder / f"naive_s{r['seed']}"
        if r["method"] == "joint" and nv.is_dir():
            same = all((folder / r["run"] / f"eval_{k}.jsonl").read_bytes()
                       == (nv / f"eval_{k}.jsonl").read_bytes() for k in range(r["stages"] + 1))
            s.append(f"\n`{r['run']}` and `naive_s{r['seed']}` have "
                     + ("byte-identical held-out files at every stage (and equal training "
                        "records): with separate adapters and no importance correction, each "
                        "agent's update from the shared stage-start batch does not depend on the "
                        "other's, so joint and naive sequential are the same algorithm here."
                        if same else "different held-out files."))
    peers = [r for r in rows if r["method"] == "comlrl"]
    if peers:
        s.append("\n**CoMLRL's MAGRPOTrainer** (2 agents): " + "; ".join(
                 f"`{peer['run']}` ({peer['tokens'] / 1000:.1f}k tokens) "
                 f"{peer['acc_untrained']:.3f} → {peer['acc_final']:.3f}, best "
                 f"{peer['best_acc']:.3f}{_after_best(folder / peer['run'])}" for peer in peers)
                 + " (`experiments/peer_comlrl.py`: MAGRPO's simultaneous turns mapped onto our "
                 "turn-taking protocol, its own REINFORCE loss with a group baseline and no "
                 "trust region). A first run as configured out of the box stayed at the untrained "
                 "accuracy for 21 prompts: CoMLRL 1.4.3 takes a prompt's length to be the position "
                 "of its first pad token, and SmolLM2 pads with `<|im_end|>`, which every chat "
                 "prompt contains, so its \"completions\" held most of the prompt; the study pads "
                 "with `<|endoftext|>` instead (a user-side setting; `<|im_end|>` stays the stop "
                 "token).")
    swaps = [r for r in rows if r["method"] in study.SWAPS]
    if swaps:
        s.append("\n**Plug-and-play with LLM agents** (TeamTR Fig. 6; "
                 "![swaps](llm_team_learning/plug_and_play.png)): the trained SAT team of seed 0 "
                 "(after its 12 stages) has agent 2, the final answerer, replaced before stage 0 "
                 "by the longer-trained single agent (`single_s0`'s final adapter), then trains "
                 f"{swaps[0]['stages']} more SAT stages. Shock = accuracy right after the swap "
                 "minus before it; recovery = after the stages minus right after the swap "
                 "(paired CIs over the 200 problems): " + "; ".join(
                     f"`{r['method'].removeprefix('swap-')}` shock {100 * r['shock']:+.1f} "
                     f"[{100 * r['shock_ci_lo']:+.1f}, {100 * r['shock_ci_hi']:+.1f}], recovery "
                     f"{100 * r['recovery']:+.1f} [{100 * r['recovery_ci_lo']:+.1f}, "
                     f"{100 * r['recovery_ci_hi']:+.1f}], final {r['acc_final']:.3f}"
                     for r in swaps) + ". In the summary table a swap row's gain is final minus "
                 "the team before the swap.")
    first = _llm_rows(folder / "ops0-12")
    if first:
        s.append("\n**First attempt, a harder task** (operands 0–12, 507 problems, "
                 "`figures/llm_team_learning/ops0-12/`): " + "; ".join(
                     f"`{r['run']}` {r['acc_untrained']:.3f} → {r['acc_final']:.3f} "
                     f"({100 * r['gain']:+.1f}, CI [{100 * r['gain_ci_lo']:+.1f}, "
                     f"{100 * r['gain_ci_hi']:+.1f}], best {r['best_acc']:.3f})" for r in first)
                 + ". " + _error_kinds(folder / "ops0-12", [r["run"] for r in first])
                 + " The study moved to operands 0–9.")
    if todo:
        s.append(f"\n**Not yet run** (the study continues over sessions with `--resume`): "
                 f"{', '.join(todo)}.")
    s.append(_scoring_paragraph(rows))
    s.append(section_llm_common(folder / "v2"))
    _sum("LLM team learning (issue 12)", "—",
         "; ".join(f"{r['run']} {100 * r['gain']:+.1f} pts" for r in rows),
         f"SAT target met on {len(met)}/{len(sat)} seeds")
    return "\n".join(s) + "\n"


def section_relay_checks(out: Path) -> str:
    """The relay task's pre-study checks (issue 22): accuracies recomputed here from the
    per-problem records ``llm_team_task/checks/<name>.jsonl``; the view each row gets and the
    exact chance level come from ``checks.json`` (``experiments/llm_team_task.py --checks``)."""
    title = "A task that needs the team: relay, pre-study checks (issue 22)"
    folder = out / "llm_team_task"
    if not (folder / "checks.json").is_file():
        return f"## {title}\n\nNo checks in `{folder}` (run experiments/llm_team_task.py --checks).\n"
    meta = json.loads((folder / "checks.json").read_text())
    rows = []
    for name, m in meta["checks"].items():
        recs = [json.loads(line) for line in (folder / "checks" / f"{name}.jsonl").read_text().splitlines()
                if line.strip()]
        opts = m.get("task_options") or {}
        who = (f"{m['agents']}-agent team" if m["agents"] > 1 else
               "one agent, full view" if "only" not in opts else f"one agent, view {opts['only']} of {opts['parts']}")
        rows.append({"row": name, "who": who, "problems": len(recs),
                     "lenient": float(np.mean([r["lenient"] for r in recs])),
                     "strict": float(np.mean([r["strict"] for r in recs])),
                     "chance (best guess from the view)": m.get("chance_exact", ""),
                     "_chance": m.get("chance", math.nan)})
    df = pd.DataFrame(rows)
    above = df[df.lenient > df._chance].row.tolist()  # NaN chance (teams): never above
    df = df.drop(columns="_chance")
    team = df[df.who.str.contains("team")]
    one = df[df.who.str.startswith("one agent, view")]
    full = df[df.who == "one agent, full view"]
    return (f"## {title}\n\n"
            "Untrained SmolLM2-135M-Instruct, greedy, the same held-out problems for every row: "
            "the operands and the operator are split across the agents' private views and the "
            "last agent answers. Checks before any study: the untrained teams score "
            f"{', '.join(f'{x:.3f}' for x in team.lenient)} (lenient; clearly above 0, below 0.6); "
            f"every single agent that sees one view scores at most {one.lenient.max():.3f}, "
            + (f"above its chance level: {', '.join(above)}" if above else "none above its chance level")
            + "; the single agent that sees everything (the upper bound) "
            f"scores {float(full.lenient.iloc[0]):.3f} — above both untrained teams. Strict scores "
            "(an `Answer:` line) are about 0 before training.\n\n" + md_table(df) + "\n")


SECTIONS = [section_stale_gap, section_n_scaling, section_training, section_kl, section_llm_kl_monitor,
            section_tracking,
            section_cert_vs, section_violation, section_pnp,
            section_order, section_ladder, section_is, section_ablations, section_llm_learning,
            section_relay_checks]


def timing_section(out: Path) -> str:
    from sat_theory.commands.figures import read_timings

    t = read_timings(out / "timings.json", warn="report")  # a torn file: a warning, not a crash
    if not t:
        return "## Run time\n\nNo `timings.json` (the studies were run one by one).\n"
    rows = [dict(study=k, seconds=v["seconds"], mode="quick" if v.get("quick") else "full",
                 seeds=v.get("seeds") or "default") for k, v in sorted(t.get("studies", {}).items())]
    last = t.get("last_invocation", {})
    full = t.get("complete_run")
    head = (f"Complete `sat figures` run ({len(full['studies'])} studies, "
            f"{'quick' if full.get('quick') else 'full'} settings): **{full['seconds']:.0f} s "
            f"({full['seconds'] / 60:.1f} min)** wall time, on a 2-core machine shared with other jobs.\n\n"
            if full else "No complete run of every study was recorded in this folder.\n\n")
    return ("## Run time\n\n" + head + "Per study, from its latest run (a training-based study "
            "that found its runs already trained shows only its plotting time; the first study of "
            "a run set pays for the training):\n\n" + md_table(pd.DataFrame(rows), "{:.1f}") +
            f"\n\nLast `sat figures` call: {last.get('seconds', math.nan):.0f} s for "
            f"{len(last.get('studies', []))} studies.\n")


def write_report(out: Path | str) -> Path:
    out = Path(out)
    parts = ["# Figures and tables of SAT and TeamTR, reproduced in the exact tabular world\n",
             "Generated by `experiments/report.py` from the CSVs in this folder (`sat figures`); "
             "every number of ours below is computed from those CSVs. Paper numbers are quoted "
             "from the papers and are targets to compare against, not inputs.\n"]
    SUMMARY.clear()
    bodies = []
    for fn in SECTIONS:
        try:
            bodies.append(fn(out))
        except Exception as e:  # an old or partial CSV must not lose the other sections
            bodies.append(f"## {fn.__name__}\n\nThis section could not be written from the CSVs in "
                          f"this folder ({type(e).__name__}: {e}); rerun its study.\n")
    if SUMMARY:
        parts.append("## Summary\n\nOne line per study (details and the reasons in its section).\n\n"
                     + md_table(pd.DataFrame(SUMMARY)) + "\n")
    parts += bodies
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
