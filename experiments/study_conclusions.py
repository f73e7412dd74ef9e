"""Plain-language conclusions of the common-schedule study (issue 21), generated from the
output of :func:`experiments.llm_team_learning.report_common`.

Every conclusion is a markdown bullet that carries its numbers and intervals (points of
held-out accuracy, ``value [95% CI]``), and its verdict follows one of the rules below,
declared before the data. Each rule is applied to the lenient and the strict scoring
separately; a bullet says when the two disagree. A claim whose runs have not all finished
reads "not yet measured" (with the numbers of the runs that have), never a verdict.

- **R1, parity per seed.** Ours-plain matches TRL dr_grpo on seed ``s`` when the paired
  bootstrap CI over problems of the AUC difference plain − TRL includes 0; the target is met
  when it does on every planned seed (issue 21 item 3), missed when every planned seed has
  run and one CI excludes 0.
- **R2, parity against the run noise** (lenient AUC: the reruns are scored leniently):
  :func:`experiments.study_metrics.run_noise_interval` on the inputs of
  ``experiments.report._run_noise_paragraph`` (:func:`parity_run_noise`). Plain and TRL are
  "not told apart beyond their run noise" when its interval of δ includes 0, "differ" when it
  excludes 0; needs two seeds and one rerun.
- **R3, SAT against a peer** (speed: AUC and final at the chosen rates; stability: drawdown,
  worst drop, fraction of checkpoints below the untrained model at 3× and 10× them). Per seed,
  the paired CI over problems of SAT − peer on that seed's common checkpoints
  (:func:`experiments.llm_team_learning.paired_on_schedule`). SAT is "better" (higher AUC or
  final; smaller drawdown, worst drop, fraction below) when the CI excludes 0 on SAT's side on
  every planned seed, "worse" when on the peer's side on every planned seed, and "not
  separated" otherwise. Those CIs cover the evaluation's noise, not the training run's: a
  lenient-AUC verdict is marked "within the run noise" when the mean difference over the
  seeds is no larger than R2's bound on a mean of that many seeds, ``t_k·σ_run/√P`` (σ_run
  measured on plain and TRL; SAT's and CoMLRL's own run noise is not measured).
- **R4, provisional speed** (only while the chosen-rate runs of a pair are missing): R3 on the
  one validation seed, between each method's best finished tuning run (the highest lenient
  validation AUC, ties to the smaller rate). Validation problems only, one seed: labelled
  provisional, never a conclusion.
- **R5, never collapses.** A method "never collapses" at a rate when, on every planned seed,
  no checkpoint falls below the untrained accuracy (``below_untrained = 0``) and the CI of
  its drawdown (best − final) includes 0; otherwise it "does not stay collapse-free".
- **R6, cost.** The run-time target is met when every finished run whose wall clock was
  measured took at most :data:`TARGET_WALL_MINUTES` (a run resumed after a kill without its
  heartbeat has wall < training time: not measured, counted separately); the evaluation
  share target when every measured run's share is at most :data:`TARGET_EVAL_SHARE`.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from experiments.llm_team_learning import (
    SCORINGS,
    chosen_lr,
    paired_on_schedule,
    parse_run,
    queue_issue21,
    run_name,
)
from experiments.study_metrics import run_noise_interval

#: issue 21, "Done when": every run's total time at most 30 minutes (2 runs in parallel)
TARGET_WALL_MINUTES = 30.0
#: issue 21 item 6: the held-out evaluation at most 25% of a run's wall time
TARGET_EVAL_SHARE = 0.25
SAT = "sat"
#: metric -> (+1 when higher is better for SAT, what "better" / "worse" reads as)
SENSE = {"auc": (1, "faster (higher AUC)", "slower (lower AUC)"),
         "final": (1, "higher final", "lower final"),
         "drawdown": (-1, "smaller drawdown", "larger drawdown"),
         "worst_drop": (-1, "smaller worst drop", "larger worst drop"),
         "below_untrained": (-1, "fewer checkpoints below untrained",
                             "more checkpoints below untrained")}
NOT_YET = "not yet measured"


def pts(iv) -> str:
    """``(v, lo, hi)`` as signed points of accuracy: ``+1.2 [−0.3, +2.5]``."""
    return f"{100 * iv[0]:+.1f} [{100 * iv[1]:+.1f}, {100 * iv[2]:+.1f}]"


def side(iv) -> int:
    """+1 when the CI ``(v, lo, hi)`` lies above 0, −1 below, 0 when it includes 0."""
    return 1 if iv[1] > 0 else -1 if iv[2] < 0 else 0


# ------------------------------------------------------------------ the plan, from the queue
def plan() -> dict:
    """The study's planned runs, from :func:`experiments.llm_team_learning.queue_issue21`:
    ``parity`` (the seeds of plain vs TRL dr_grpo) and ``factors``: ``{F: (methods, seeds)}``
    of the runs at F × each method's chosen rate (queue entries ``m_lr@F_sS``)."""
    parity, methods, seeds = set(), {}, {}
    for e in queue_issue21():
        m = re.fullmatch(r"([a-z-]+)_lr@([0-9.]+)_s(\d+)", e)
        if m:
            f = float(m.group(2))
            methods.setdefault(f, {})[m.group(1)] = None  # a dict keeps the queue's order
            seeds.setdefault(f, set()).add(int(m.group(3)))
        elif parse_run(e)[:2] == (False, "plain"):
            parity.add(parse_run(e)[3])
    return dict(parity=sorted(parity),
                factors={f: (tuple(methods[f]), tuple(sorted(seeds[f]))) for f in methods})


def planned_run(chosen: dict, method: str, factor: float, seed: int) -> str | None:
    """The run name of ``method`` at ``factor`` × its chosen rate (``None`` before it is
    chosen): the name ``report_common``'s tables and the queue's ``resolve`` use."""
    return None if chosen.get(method) is None else run_name(method, factor * chosen[method], seed)


def best_tuning_run(runs: dict, method: str) -> str | None:
    """R4: the finished tuning run of ``method`` with the highest lenient validation AUC (ties:
    the smaller rate); ``None`` when none has finished."""
    tuned = [r for r in runs.values() if r["tune"] and r["method"] == method]
    # max keeps the first of equals: in ascending rate order, the smaller rate
    return max(sorted(tuned, key=lambda r: r["lr"]), key=lambda r: r["lenient"]["auc"][0],
               default={}).get("run")


# ------------------------------------------------------------------ the one reading step
def gather(folder: Path, t: dict, reps: int = 10000) -> dict:
    """The paired comparisons the conclusions need, from the run folders under ``folder``
    (read only): ``pairs[(F, peer, seed)] = paired_on_schedule(SAT run, peer run)`` for every
    planned pair whose two runs finished, ``pairs[("tune", peer, 0)]`` between the best
    finished tuning runs (R4), and ``strict_chosen``: the rates the strict validation AUC
    would choose."""
    runs, chosen, pl = t["runs"], t["chosen"], plan()
    pairs = {}
    for f, (methods, seeds) in pl["factors"].items():
        for m in methods:
            for s in seeds:
                a, b = planned_run(chosen, SAT, f, s), planned_run(chosen, m, f, s)
                if m != SAT and a in runs and b in runs:
                    pairs[(f, m, s)] = paired_on_schedule(folder / a, folder / b, reps=reps)
    peers = {m for ms, _ in pl["factors"].values() for m in ms} - {SAT}
    a = best_tuning_run(runs, SAT)
    for m in sorted(peers):
        b = best_tuning_run(runs, m)
        if a and b:
            pairs[("tune", m, 0)] = paired_on_schedule(folder / a, folder / b, reps=reps)
    return dict(pairs=pairs, strict_chosen={m: chosen_lr(folder, m, "strict")
                                            for m in sorted(peers | {SAT})})


# ------------------------------------------------------------------ the rules
def across_seeds(ivs: dict, seeds, sense: int) -> str:
    """R3 on one metric: ``ivs = {seed: (v, lo, hi)}`` of SAT − peer; ``"better"``,
    ``"worse"``, ``"not separated"`` or :data:`NOT_YET` (a planned seed missing)."""
    if any(s not in ivs for s in seeds):
        return NOT_YET
    sides = {sense * side(ivs[s]) for s in seeds}
    return "better" if sides == {1} else "worse" if sides == {-1} else "not separated"


def parity_run_noise(par: list[dict]) -> dict | None:
    """R2: :func:`experiments.study_metrics.run_noise_interval` of the per-seed lenient AUC
    differences plain − TRL, the TRL reruns' and (once there are any) the plain reruns'
    differences, as ``experiments.report._run_noise_paragraph`` computes it; ``None`` before
    two seeds and one TRL rerun."""
    diffs, reruns, plain = run_noise_inputs(par)
    if len(diffs) < 2 or not reruns:
        return None
    return run_noise_interval(diffs, reruns, reruns_a=plain or None)


def run_noise_inputs(par: list[dict]) -> tuple[list, list, list]:
    """``(plain − TRL, TRL − TRL rerun, plain − plain rerun)``: the per-seed lenient AUC
    differences of the parity runs ``par`` (the reruns' where they have run)."""
    return ([p["lenient_auc"][0] for p in par],
            [p["noise_floor_auc"][0] for p in par if p["noise_floor_auc"]],
            [p["noise_floor_plain_auc"][0] for p in par if p.get("noise_floor_plain_auc")])


def _agree(verdicts: dict) -> str:
    """The clause that says whether the scorings' verdicts agree."""
    v = set(verdicts.values())
    if NOT_YET in v:
        return ""
    return " The two scorings agree." if len(v) == 1 else " **The scorings disagree.**"


def parity_bullets(par: list[dict], seeds) -> list[str]:
    """R1 per scoring and R2 (lenient) on the parity runs ``par`` (``report_common``'s
    ``t["parity"]``: the seeds where both runs finished)."""
    by = {p["seed"]: p for p in par}
    verdicts, parts = {}, []
    for sc in SCORINGS:
        ivs = {s: by[s][f"{sc}_auc"] for s in seeds if s in by}
        inc = [s for s in ivs if side(ivs[s]) == 0]
        if len(ivs) < len(seeds):
            verdicts[sc] = NOT_YET
        else:
            verdicts[sc] = ("met" if len(inc) == len(seeds) else
                            f"missed (the CI excludes 0 on seed(s) "
                            f"{', '.join(str(s) for s in ivs if s not in inc)})")
        nums = ", ".join(f"seed {s} {pts(iv)}" for s, iv in ivs.items()) or "no seed finished"
        parts.append(f"{sc}: {verdicts[sc]}"
                     + (f" ({len(ivs)} of {len(seeds)} seeds finished)" if verdicts[sc] == NOT_YET else "")
                     + f"; plain − TRL AUC {nums}; the CI includes 0 on {len(inc)} of them")
    out = [f"- **Parity, ours-plain vs TRL dr_grpo (R1: the paired CI of the AUC difference "
           f"includes 0 on each of {len(seeds)} seeds)** — " + "; ".join(parts) + "."
           + _agree(verdicts)]
    r = parity_run_noise(par)
    if r is None:
        out.append("- **Parity against the run noise (R2, lenient)** — " + NOT_YET
                   + f": it needs two seeds and one TRL rerun ({len(par)} seed(s) so far).")
    else:
        tell = ("plain and TRL are not told apart beyond their run noise" if side(r["delta"]) == 0
                else "plain and TRL differ beyond their run noise")
        beyond = [p["seed"] for p, w in zip(par, r["within_noise"], strict=True) if not w]
        out.append(f"- **Parity against the run noise (R2, lenient)** — {tell}: plain − TRL over "
                   f"{len(par)} seeds {pts(r['delta'])} (t-interval with the reruns' noise, "
                   f"σ_run {100 * r['run_noise_sd']:.1f} points per seed); one seed's bound "
                   f"±{100 * r['per_seed_bound']:.1f}, exceeded on "
                   + (f"seed(s) {', '.join(map(str, beyond))}" if beyond else "no seed")
                   + ". The strict scoring's run noise is not measured (the reruns are compared "
                   "leniently).")
    return out


def _noise_note(ivs: dict, noise: dict | None) -> str:
    """R3's run-noise qualifier of a lenient-AUC verdict: the mean difference against
    ``t_k·σ_run/√P``."""
    if noise is None or not ivs:
        return ""
    mean = sum(iv[0] for iv in ivs.values()) / len(ivs)
    bound = noise["per_seed_bound"] / math.sqrt(len(ivs))
    return (f", mean {100 * mean:+.1f} {'within' if abs(mean) <= bound else 'beyond'} the run "
            f"noise of a {len(ivs)}-seed mean (±{100 * bound:.1f}, R2's σ_run of plain and TRL)")


def comparison_bullet(title: str, pairs: dict, key, seeds, metric: str,
                      noise: dict | None = None) -> tuple[str, dict]:
    """R3 for SAT − one peer on ``metric`` under both scorings: ``pairs[(*key, seed)]`` are
    ``paired_on_schedule`` results. Returns the bullet and ``{scoring: verdict}``."""
    sense, good, bad = SENSE[metric]
    verdicts, parts = {}, []
    for sc in SCORINGS:
        ivs = {s: pairs[(*key, s)][sc]["diff"][metric] for s in seeds if (*key, s) in pairs}
        v = across_seeds(ivs, seeds, sense)
        verdicts[sc] = v
        word = {"better": f"SAT {good}", "worse": f"SAT {bad}"}.get(v, v)
        if v == NOT_YET:
            word += f" ({len(ivs)} of {len(seeds)} seeds finished)"
        nums = ", ".join(f"seed {s} {pts(iv)}" for s, iv in ivs.items())
        note = _noise_note(ivs, noise) if sc == "lenient" and metric == "auc" and v != NOT_YET else ""
        parts.append(f"{sc}: {word}" + (f"; SAT − peer {nums}{note}" if nums else ""))
    return f"- **{title}** — " + "; ".join(parts) + "." + _agree(verdicts), verdicts


def speed_bullets(t: dict, g: dict, pl: dict) -> tuple[list[str], dict]:
    """R3 on AUC and final at the chosen rates (factor 1), and R4 while a pair is missing;
    also ``{peer: {scoring: AUC verdict}}``."""
    methods, seeds = pl["factors"][1.0]
    noise = parity_run_noise(t["parity"])
    out, auc = [], {}
    if any(t["chosen"].get(m) != g["strict_chosen"].get(m) for m in methods):
        out.append("- **Chosen rates** — lenient validation AUC (used): "
                   + ", ".join(f"{m} {_rate(t['chosen'].get(m))}" for m in methods)
                   + "; the strict validation AUC would choose "
                   + ", ".join(f"{m} {_rate(g['strict_chosen'].get(m))}" for m in methods) + ".")
    for m in methods:
        if m == SAT:
            continue
        if not any((1.0, m, x) in g["pairs"] for x in seeds):  # one line while nothing ran
            out.append(f"- **Speed, SAT vs {m} at the chosen rates (R3, AUC and final)** — "
                       f"{NOT_YET} (0 of {len(seeds)} seeds finished; rates chosen: SAT "
                       f"{_rate(t['chosen'].get(SAT))}, {m} {_rate(t['chosen'].get(m))}).")
            vs = dict(auc=dict.fromkeys(SCORINGS, NOT_YET))
        else:
            vs = {}
            for metric in ("auc", "final"):
                b, vs[metric] = comparison_bullet(f"Speed, SAT vs {m} at the chosen rates, "
                                                  f"{metric} (R3)", g["pairs"], (1.0, m), seeds,
                                                  metric, noise)
                out.append(b)
        auc[m] = vs["auc"]
        if NOT_YET in vs["auc"].values() and ("tune", m, 0) in g["pairs"]:
            b, _ = comparison_bullet(f"Provisional, validation only (R4): SAT's best finished "
                                     f"tuning run vs {m}'s, AUC on the validation seed",
                                     g["pairs"], ("tune", m), (0,), "auc")
            out.append(b + " (" + _tuning_runs(t["runs"], m) + ")")
    return out, auc


def _rate(lr) -> str:
    return "not yet chosen" if lr is None else f"{lr:g}"


def _tuning_runs(runs: dict, m: str) -> str:
    """Which tuning runs R4 compared: each side's best finished rate and how many finished."""
    return "; ".join(
        f"{x}: lr {runs[best]['lr']:g}, {sum(r['tune'] and r['method'] == x for r in runs.values())} "
        f"tuning run(s) finished" for x in (SAT, m) if (best := best_tuning_run(runs, x)))


def collapse_verdict(runs: dict, names: list, scoring: str) -> tuple[str, str]:
    """R5 for one method at one rate: ``(verdict, numbers)`` over its planned runs ``names``
    (``None``: not yet chosen)."""
    done = [n for n in names if n in runs]
    nums = ", ".join(f"seed {runs[n]['seed']}: {100 * runs[n][scoring]['below_untrained'][0]:.0f}% "
                     f"below untrained, drawdown {pts(runs[n][scoring]['drawdown'])}" for n in done)
    if len(done) < len(names):
        return f"{NOT_YET} ({len(done)} of {len(names)} seeds finished)", nums
    ok = all(runs[n][scoring]["below_untrained"][0] == 0 and side(runs[n][scoring]["drawdown"]) == 0
             for n in done)
    return ("never collapses" if ok else "does not stay collapse-free"), nums


def stability_bullets(t: dict, g: dict, pl: dict) -> tuple[list[str], dict]:
    """R5 for every method and R3 (drawdown, worst drop, fraction below untrained) at every
    planned factor above 1; also ``{factor: {method: {scoring: R5 verdict}}}``."""
    out, coll = [], {}
    for f, (methods, seeds) in sorted(pl["factors"].items()):
        if f == 1.0:
            continue
        names = [planned_run(t["chosen"], m, f, x) for m in methods for x in seeds]
        if not any(n in t["runs"] for n in names):  # one line while nothing ran
            out.append(f"- **Stability at {f:g}× the chosen rate (R5, R3)** — {NOT_YET} (0 of "
                       f"{len(names)} runs finished; {sum(t['chosen'].get(m) is not None for m in methods)} "
                       f"of {len(methods)} methods' rates chosen).")
            coll[f] = {m: dict.fromkeys(SCORINGS, NOT_YET) for m in methods}
            continue
        for m in methods:
            names = [planned_run(t["chosen"], m, f, s) for s in seeds]
            v = {sc: collapse_verdict(t["runs"], names, sc) for sc in SCORINGS}
            coll.setdefault(f, {})[m] = {sc: x[0] for sc, x in v.items()}
            out.append(f"- **Stability at {f:g}× the chosen rate, {m} (R5)** — "
                       + "; ".join(f"{sc}: {verdict}" + (f" ({nums})" if nums else "")
                                   for sc, (verdict, nums) in v.items()) + "."
                       + _agree({sc: x[0] for sc, x in v.items()}))
        for m in methods:
            if m != SAT:
                out += [comparison_bullet(f"Stability at {f:g}×, SAT vs {m}, {metric} (R3)",
                                          g["pairs"], (f, m), seeds, metric)[0]
                        for metric in ("drawdown", "worst_drop", "below_untrained")]
    return out, coll


def cost_bullets(runs: dict) -> list[str]:
    """R6 over every finished run, and the mean wall minutes of each method's held-out runs."""
    if not runs:
        return [f"- **Cost (R6)** — {NOT_YET}: no run has finished."]
    measured = {n: r for n, r in runs.items() if r["wall_minutes"] >= r["train_minutes"]}
    lost = len(runs) - len(measured)
    if not measured:
        return [f"- **Cost (R6)** — {NOT_YET}: no finished run's wall clock was measured "
                f"({lost} lost a killed segment's)."]
    over = [n for n, r in measured.items() if r["wall_minutes"] > TARGET_WALL_MINUTES]
    shortest, longest = (f(measured, key=lambda n: measured[n]["wall_minutes"]) for f in (min, max))
    heavy = [n for n, r in measured.items() if r["eval_share"] > TARGET_EVAL_SHARE]
    shares = sorted(r["eval_share"] for r in measured.values())
    by = {}  # by the study's method name (study.json's "method" says trl for trl-rerun too)
    for n, r in measured.items():
        if not r["tune"]:
            by.setdefault(parse_run(n)[1], []).append(r["wall_minutes"])
    return [f"- **Cost, wall time (R6: every run ≤ {TARGET_WALL_MINUTES:g} min)** — "
            + ("met" if not over else f"missed by {len(over)} run(s)")
            + f" over the {len(measured)} measured finished runs: from "
            f"{measured[shortest]['wall_minutes']:.1f} min ({shortest}) to "
            f"{measured[longest]['wall_minutes']:.1f} min ({longest})"
            + (f"; {lost} run(s) not measured (a killed segment's wall clock was lost)" if lost else "")
            + ". Mean wall minutes of a held-out run: "
            + (", ".join(f"{m} {sum(w) / len(w):.1f} ({len(w)} run(s))" for m, w in sorted(by.items()))
               or "no held-out run measured") + ".",
            f"- **Cost, evaluation share (R6: ≤ {100 * TARGET_EVAL_SHARE:.0f}% of a run)** — "
            + ("met" if not heavy else f"missed by {len(heavy)} of {len(measured)} run(s)")
            + f": shares from {100 * shares[0]:.0f}% to {100 * shares[-1]:.0f}%."]


def headline(auc: dict, coll: dict) -> str:
    """One sentence per scoring from the verdicts of R3 (AUC at the chosen rates, ``{peer:
    {scoring: verdict}}``) and R5 (``{factor: {method: {scoring: verdict}}}``): the study's
    answer in the form "SAT is slower than …, and at 3× never collapses"."""
    vs = {"better": "faster than", "worse": "slower than", "not separated": "not separated from"}

    def grouped(verdicts: dict, methods_first: bool = False) -> str:
        """``{method: verdict}`` as "verdict m1, m2; verdict m3" (or "m1, m2: verdict"), the
        verdicts in first-seen order."""
        by = {}
        for m, v in verdicts.items():
            by.setdefault(v, []).append(m)
        return "; ".join(f"{', '.join(ms)}: {v}" if methods_first else f"{v} {', '.join(ms)}"
                         for v, ms in by.items())

    def sentence(sc: str) -> str:
        speed = grouped({m: vs.get(v[sc], "not yet compared with") for m, v in auc.items()})
        stab = "; ".join(
            f"at {f:g}× SAT {_short(ms[SAT][sc], 'is not yet measured')} (others: "
            + grouped({m: _short(v[sc], 'not yet measured') for m, v in ms.items() if m != SAT},
                      methods_first=True)
            + ")" for f, ms in sorted(coll.items()))
        return f"{sc.capitalize()}: at the chosen rates SAT is {speed}; {stab}."

    return "- **In short** (from the verdicts below) — " + " ".join(
        sentence(sc) for sc in SCORINGS)


def _short(verdict: str, not_yet: str) -> str:
    """An R5 verdict without its counts; ``not_yet`` for :data:`NOT_YET`."""
    return not_yet if verdict.startswith(NOT_YET) else verdict


def conclusions(t: dict, g: dict) -> str:
    """The conclusions block: R1–R6 on ``report_common``'s tables ``t`` and :func:`gather`'s
    pairs ``g``, as markdown bullets, the headline first."""
    pl = plan()
    speed, auc = speed_bullets(t, g, pl)
    stab, coll = stability_bullets(t, g, pl)
    return "\n".join([headline(auc, coll), *parity_bullets(t["parity"], pl["parity"]), *speed,
                      *stab, *cost_bullets(t["runs"])]) + "\n"


def study_conclusions(folder: Path, t: dict) -> str:
    """The conclusions of the study under ``folder`` (read only) from its tables ``t``."""
    return conclusions(t, gather(folder, t))
