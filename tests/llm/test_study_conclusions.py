"""The generated conclusions of the common-schedule study (experiments/study_conclusions.py):
each verdict follows its declared rule, flips when the data flip, and a claim whose runs are
missing reads "not yet measured"."""

import pytest

from experiments import study_conclusions as c
from experiments.llm_team_learning import run_name

SEEDS = (0, 1, 2)
METRICS = ("auc", "final", "best", "drawdown", "worst_drop", "below_untrained")


def _metrics(**over) -> dict:
    """Every curve metric as (value, lo, hi): a CI that includes 0 unless overridden."""
    m = {k: (0.0, -0.01, 0.01) for k in METRICS}
    m["drawdown"] = (0.0, 0.0, 0.02)
    m.update(over)
    return m


def _run(method, lr, seed, tune=False, wall=20.0, train=15.0, lenient=None, strict=None) -> dict:
    name = run_name(method, lr, seed, tune)
    return name, dict(run=name, method=method, lr=lr, seed=seed, tune=tune, wall_minutes=wall,
                      train_minutes=train, eval_share=1 - train / wall,
                      lenient=lenient or _metrics(), strict=strict or _metrics())


def _pair(lenient=None, strict=None) -> dict:
    return dict(lenient=dict(diff=lenient or _metrics()), strict=dict(diff=strict or _metrics()))


def _par(seed, lenient=(0.01, -0.02, 0.04), strict=(0.01, -0.02, 0.04)) -> dict:
    return dict(seed=seed, lenient_auc=lenient, strict_auc=strict, noise_floor_auc=None,
                noise_floor_plain_auc=None)


CHOSEN = dict(plain=1e-3, trl=3e-4, sat=1e-3, comlrl=5e-6)


def _t(parity=(), runs=(), chosen=None) -> dict:
    return dict(parity=list(parity), runs=dict(runs), chosen=chosen or dict.fromkeys(CHOSEN))


def _g(pairs=None, strict_chosen=None) -> dict:
    return dict(pairs=pairs or {}, strict_chosen=strict_chosen or dict.fromkeys(CHOSEN))


# ------------------------------------------------------------------ R3's rule
@pytest.mark.parametrize("ivs, sense, want", [
    ({0: (0.05, 0.01, 0.09), 1: (0.03, 0.005, 0.06)}, 1, "better"),
    ({0: (-0.05, -0.09, -0.01), 1: (-0.03, -0.06, -0.005)}, 1, "worse"),
    ({0: (-0.05, -0.09, -0.01), 1: (-0.03, -0.06, -0.005)}, -1, "better"),  # lower is better
    ({0: (0.05, 0.01, 0.09), 1: (0.01, -0.02, 0.04)}, 1, "not separated"),
    ({0: (0.05, 0.01, 0.09), 1: (-0.05, -0.09, -0.01)}, 1, "not separated"),
    ({0: (0.05, 0.01, 0.09)}, 1, c.NOT_YET),
])
def test_across_seeds_needs_every_planned_seed_on_one_side(ivs, sense, want):
    assert c.across_seeds(ivs, (0, 1), sense) == want


def test_speed_verdict_flips_when_the_data_flip_and_waits_for_every_seed():
    up = _metrics(auc=(0.05, 0.02, 0.08))
    down = _metrics(auc=(-0.05, -0.08, -0.02))
    pairs = {(1.0, "trl", s): _pair(up, up) for s in SEEDS}
    text, v = c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc")
    assert v == dict(lenient="better", strict="better") and "SAT faster (higher AUC)" in text
    assert "+5.0 [+2.0, +8.0]" in text and "agree" in text
    pairs = {(1.0, "trl", s): _pair(down, down) for s in SEEDS}
    text, v = c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc")
    assert v == dict(lenient="worse", strict="worse") and "SAT slower (lower AUC)" in text
    pairs = {(1.0, "trl", s): _pair(up, down) for s in SEEDS}
    text, v = c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc")
    assert v == dict(lenient="better", strict="worse") and "scorings disagree" in text
    del pairs[(1.0, "trl", 2)]
    text, v = c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc")
    assert v == dict(lenient=c.NOT_YET, strict=c.NOT_YET)
    assert "faster" not in text and "slower" not in text and "2 of 3 seeds finished" in text


def test_the_run_noise_qualifies_a_lenient_auc_verdict():
    pairs = {(1.0, "trl", s): _pair(_metrics(auc=(0.02, 0.01, 0.03))) for s in SEEDS}
    small = dict(per_seed_bound=0.01)
    big = dict(per_seed_bound=0.10)
    assert "beyond the run noise" in c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc", small)[0]
    text = c.comparison_bullet("x", pairs, (1.0, "trl"), SEEDS, "auc", big)[0]
    assert "within the run noise of a 3-seed mean (±5.8" in text  # 10/√3


# ------------------------------------------------------------------ R1, R2
def test_parity_met_missed_and_not_yet():
    text = "\n".join(c.parity_bullets([_par(s) for s in SEEDS], SEEDS))
    assert "lenient: met" in text and "strict: met" in text and "agree" in text
    par = [_par(0), _par(1, lenient=(0.08, 0.03, 0.13)), _par(2)]
    text = "\n".join(c.parity_bullets(par, SEEDS))
    assert "lenient: missed (the CI excludes 0 on seed(s) 1)" in text and "strict: met" in text
    assert "scorings disagree" in text
    text = "\n".join(c.parity_bullets([_par(0), _par(1)], SEEDS))
    assert "lenient: not yet measured (2 of 3 seeds finished)" in text and "met" not in text
    assert "Parity against the run noise (R2, lenient)** — not yet measured" in text


def test_parity_run_noise_is_the_reports_paragraph_computation():
    from experiments.report import _run_noise_paragraph

    par = [dict(_par(0, lenient=(-0.081, -0.1, -0.06)), noise_floor_auc=(0.02, 0, 0),
                noise_floor_plain_auc=(0.09, 0, 0)),
           dict(_par(1, lenient=(0.029, 0.01, 0.05)), noise_floor_auc=(-0.01, 0, 0))]
    r = c.parity_run_noise(par)
    assert f"{100 * r['per_seed_bound']:.1f} points with probability 5%" in _run_noise_paragraph(par)
    text = c.parity_bullets(par, (0, 1))[1]
    assert f"±{100 * r['per_seed_bound']:.1f}" in text and "not told apart" in text
    assert c.parity_run_noise(par[:1]) is None


# ------------------------------------------------------------------ R5, R4, R6
def test_never_collapses_only_without_a_checkpoint_below_untrained_and_a_drawdown():
    runs = dict(_run("sat", 3e-3, s) for s in (0, 1))
    names = [run_name("sat", 3e-3, s) for s in (0, 1)]
    assert c.collapse_verdict(runs, names, "lenient")[0] == "never collapses"
    runs[names[1]]["lenient"] = _metrics(below_untrained=(0.25, 0.0, 0.5))
    v, nums = c.collapse_verdict(runs, names, "lenient")
    assert v == "does not stay collapse-free" and "seed 1: 25% below untrained" in nums
    assert c.collapse_verdict(runs, names, "strict")[0] == "never collapses"
    runs[names[1]]["lenient"] = _metrics(drawdown=(0.2, 0.1, 0.3))
    assert c.collapse_verdict(runs, names, "lenient")[0] == "does not stay collapse-free"
    del runs[names[1]]
    assert c.collapse_verdict(runs, names, "lenient")[0] == f"{c.NOT_YET} (1 of 2 seeds finished)"


def test_best_tuning_run_ties_go_to_the_smaller_rate():
    runs = dict(_run("sat", lr, 0, tune=True, lenient=_metrics(auc=(0.5, 0.4, 0.6)))
                for lr in (1e-3, 3e-4))
    assert c.best_tuning_run(runs, "sat") == run_name("sat", 3e-4, 0, True)
    runs[run_name("sat", 1e-3, 0, True)]["lenient"] = _metrics(auc=(0.6, 0.5, 0.7))
    assert c.best_tuning_run(runs, "sat") == run_name("sat", 1e-3, 0, True)
    assert c.best_tuning_run(runs, "trl") is None


def test_cost_met_missed_and_unmeasured():
    runs = dict([_run("sat", 1e-3, 0, wall=25.0, train=15.0), _run("trl", 1e-3, 0, wall=10.0, train=9.0)])
    text = "\n".join(c.cost_bullets(runs))
    assert "≤ 30 min)** — met" in text and "from 10.0 min (trl_lr0.001_s0) to 25.0 min" in text
    assert "sat 25.0 (1 run(s))" in text and "missed by 1 of 2 run(s): shares from 10% to 40%" in text
    runs[run_name("sat", 1e-3, 0)]["wall_minutes"] = 31.0
    text = "\n".join(c.cost_bullets(runs))
    assert "missed by 1 run(s) over the 2 measured" in text
    assert f"to 31.0 min ({run_name('sat', 1e-3, 0)})" in text
    runs[run_name("sat", 1e-3, 0)]["wall_minutes"] = 5.0  # a lost wall clock: wall < training
    assert "1 run(s) not measured" in "\n".join(c.cost_bullets(runs))
    assert c.NOT_YET in c.cost_bullets({})[0]


def test_nothing_finished_claims_nothing():
    text = c.conclusions(_t(), _g())
    for claim in ("faster", "slower", "never collapses", "collapse-free", ": met", "better", "worse"):
        assert claim not in text
    assert text.count(c.NOT_YET) >= 10


def test_provisional_speed_is_labelled_and_goes_once_the_chosen_rate_runs_exist():
    up = _metrics(auc=(0.05, 0.02, 0.08))
    runs = dict([_run("sat", 1e-3, 0, tune=True), _run("trl", 3e-4, 0, tune=True)])
    g = _g({("tune", "trl", 0): _pair(up, up)})
    text = c.conclusions(_t(runs=runs), g)
    assert "Provisional, validation only (R4)" in text and "sat: lr 0.001, 1 tuning run(s)" in text
    assert "SAT is not yet compared with plain, trl, comlrl" in text  # not the provisional pair
    pairs = {(1.0, "trl", s): _pair(up, up) for s in SEEDS} | g["pairs"]
    text = c.conclusions(_t(runs=runs, chosen=CHOSEN), _g(pairs, CHOSEN))
    assert "Provisional" not in text.split("trl at the chosen rates, auc")[1].split("comlrl")[0]
    assert "Lenient: at the chosen rates SAT is not yet compared with plain, comlrl; faster than trl" in text
    assert "Speed, SAT vs plain at the chosen rates (R3, AUC and final)** — not yet measured" in text


def test_stability_headline_follows_r5():
    runs = dict(_run(m, 10 * CHOSEN[m], s) for m in CHOSEN for s in (0, 1))
    runs[run_name("plain", 10 * CHOSEN["plain"], 1)]["lenient"] = _metrics(below_untrained=(0.5, 0.2, 0.8))
    text = c.conclusions(_t(runs=runs, chosen=CHOSEN), _g(strict_chosen=CHOSEN))
    assert ("at 10× SAT never collapses (others: plain: does not stay collapse-free; trl, comlrl: "
            "never collapses)" in text)
    assert "Strict: at the chosen rates" in text and "at 10× SAT never collapses (others: plain, trl" in text
    assert "at 3× SAT is not yet measured" in text
    assert "Chosen rates" not in text  # the strict choice agrees
    text = c.conclusions(_t(runs=runs, chosen=CHOSEN), _g(strict_chosen=dict(CHOSEN, sat=3e-4)))
    assert "the strict validation AUC would choose plain 0.001, trl 0.0003, sat 0.0003" in text


# ------------------------------------------------------------------ from run folders
def _folder_run(out, name, acc, n=40):
    """A finished run folder with what :func:`c.gather` reads: ``study.json`` and, per
    checkpoint of the method's schedule, an eval file whose first ``acc[k]·n`` problems are
    right (both scorings)."""
    import json
    from dataclasses import asdict

    from experiments import llm_team_learning as study

    tune, method, lr, seed = study.parse_run(name)
    cfg = study.StudyConfig(budget=len(acc) - 1)
    d = out / name
    d.mkdir(parents=True)
    for k, a in zip([0, *study.schedule(cfg, method)[1]], acc, strict=True):
        (d / f"eval_{k}.jsonl").write_text("".join(
            json.dumps(dict(id=i, prompt=f"p{i}", score=float(i < a * n), strict=float(i < a * n)))
            + "\n" for i in range(n)))
    (d / "study.json").write_text(json.dumps(dict(run=name, method=method, lr=lr, seed=seed,
                                                  tune=tune, finished=True, study=asdict(cfg))))


@pytest.mark.parametrize("sat_ahead", [True, False])
def test_gather_pairs_the_planned_runs_and_the_verdict_follows_the_files(tmp_path, sat_ahead):
    hi, lo = [0.2, 0.8, 0.9], [0.2, 0.3, 0.3]
    runs = {}
    for m, curve in (("sat", hi if sat_ahead else lo), ("trl", lo if sat_ahead else hi)):
        for s in SEEDS:
            _folder_run(tmp_path, run_name(m, CHOSEN[m], s), curve)
            runs.update([_run(m, CHOSEN[m], s)])
    t = _t(runs=runs, chosen=CHOSEN)
    g = c.gather(tmp_path, t, reps=500)
    assert sorted(g["pairs"]) == [(1.0, "trl", s) for s in SEEDS]
    assert g["strict_chosen"] == dict.fromkeys(("comlrl", "plain", "sat", "trl"))  # no tuning runs
    text = c.conclusions(t, g)
    word = "faster" if sat_ahead else "slower"
    assert f"Lenient: at the chosen rates SAT is not yet compared with plain, comlrl; {word} than trl" in text
    assert f"seed 0 {'+' if sat_ahead else '-'}36.7" in text  # AUC (0.8 + 0.9 − 0.3 − 0.3)/3
