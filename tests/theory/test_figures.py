"""Smoke and unit tests of the figure pipeline (experiments/, sat_theory.plotting, `sat figures`,
`sat plot`) on tiny settings; a torn ``timings.json`` does not block ``sat figures``, and
``sat plot`` refuses to mix backends."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from experiments import common, report  # noqa: E402
from experiments.runs import RunSet, ensure_runs, load  # noqa: E402
from sat_theory import cli  # noqa: E402
from sat_theory.certificates import intermediate_policies  # noqa: E402
from sat_theory.envs import random_mdp  # noqa: E402
from sat_theory.evaluate import evaluate  # noqa: E402
from sat_theory.plotting import read_metrics, spearman  # noqa: E402
from sat_theory.policy import TeamPolicy, factor_kl  # noqa: E402


def _outputs_ok(out: Path, name: str):
    for ext in ("csv", "png", "pdf"):
        p = out / f"{name}.{ext}"
        assert p.exists() and p.stat().st_size > 0, p


# ------------------------------------------------------------------ pure pieces
def test_power_law_fit_recovers_exponent():
    n = np.array([2, 3, 4, 5, 6, 8], dtype=float)
    a, c = common.fit_power_law(n, 3.0 * n ** 1.5)
    assert a == pytest.approx(1.5, abs=1e-12) and c == pytest.approx(3.0, rel=1e-12)


def test_power_law_fit_rejects_nonpositive():
    assert all(math.isnan(v) for v in common.fit_power_law([1, 2], [1.0, 0.0]))


def test_spearman_is_rank_based():
    x = np.arange(10.0)
    assert spearman(x, np.exp(x)) == pytest.approx(1.0)
    assert spearman(x, -x ** 3) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 2], [2, 1]))


@pytest.mark.parametrize("layout", ["turn", "masked"])
def test_tr_step_hits_the_radius(layout):
    mdp = random_mdp(9, 3, 3, layout=layout, seed=3)
    pol = TeamPolicy.random(mdp, 1)
    ev = evaluate(mdp, pol)
    new = common.tr_factor_step(mdp, pol, ev.A, ev.d, 1, 0.02)
    assert float(ev.d @ factor_kl(mdp, pol.factors[1], new, 1)) == pytest.approx(0.02, rel=1e-6)


@pytest.mark.parametrize("delta", [1e-6, 0.3, 50.0])
def test_tr_step_kl_is_finite_and_within_radius(delta):
    # tiny advantages force huge η; the step must never return an infinite or too-large KL
    mdp = random_mdp(8, 2, 3, layout="turn", seed=4)
    pol = TeamPolicy.random(mdp, 0, temperature=4.0)
    ev = evaluate(mdp, pol)
    new = common.tr_factor_step(mdp, pol, ev.A * 1e-6, ev.d, 0, delta)
    kl = float(ev.d @ factor_kl(mdp, pol.factors[0], new, 0))
    assert np.isfinite(kl) and kl <= delta * (1 + 1e-9)


def test_stale_stage_final_team_does_not_depend_on_order():
    # every stale target is computed at π̂^0, so the final team is the same for any order
    mdp = random_mdp(9, 3, 3, layout="turn", seed=5)
    cur = TeamPolicy.random(mdp, 2)
    a, _, _ = common.exact_stage(mdp, cur, [0, 1, 2], 0.01, "stale")
    b, _, _ = common.exact_stage(mdp, cur, [2, 0, 1], 0.01, "stale")
    for fa, fb in zip(a.factors, b.factors, strict=True):
        np.testing.assert_allclose(fa, fb, rtol=0, atol=1e-12)


def test_exact_stage_evaluations_match_intermediate_policies():
    mdp = random_mdp(8, 2, 2, layout="simultaneous", seed=1)
    cur = TeamPolicy.random(mdp, 0)
    tar, cert, evs = common.exact_stage(mdp, cur, [1, 0], 0.01)
    pols = intermediate_policies(cur, tar, [1, 0])
    assert [e.J for e in evs] == pytest.approx([evaluate(mdp, p).J for p in pols], abs=1e-12)
    assert cert.holds


def test_read_metrics_skips_torn_last_line(tmp_path):
    recs = [{"kind": "step", "stage": 0, "step": 1, "kl": "Infinity"},
            {"kind": "stage", "stage": 0, "order": [1, 0], "J_before": 0.0, "J_after": 1.0},
            {"kind": "swap", "stage": 0}]
    text = "\n".join(json.dumps(r) for r in recs) + '\n{"kind": "st'
    (tmp_path / "metrics.jsonl").write_text(text)
    steps, stages = read_metrics(tmp_path)
    assert len(steps) == 1 and len(stages) == 1
    assert steps.kl.iloc[0] == math.inf and stages.order.iloc[0] == [1, 0]


def test_report_numbers_come_from_the_csv(tmp_path):
    rows = []
    for lay in ("turn",):
        for m, a in (("naive", 1.234), ("sat", 0.987)):
            for met in ("Delta_stale", "D_occ", "surrogate_error", "penalty"):
                for n in (2, 4):
                    rows.append(dict(delta=0.01, layout=lay, method=m, metric=met, n=n, mean=n ** a,
                                     std=0.0, n_seeds=1, exponent=a, prefactor=1.0))
    rows.append(dict(layout="any", method="analytic", metric="analytic_n", exponent=1.0))
    rows.append(dict(layout="any", method="analytic", metric="analytic_n(n+1)/2", exponent=1.77))
    pd.DataFrame(rows).to_csv(tmp_path / "table_n_scaling.csv", index=False)
    text = report.section_n_scaling(tmp_path)
    assert "1.23" in text and "0.99" in text and "1.77" in text
    assert "Not generated" in report.section_is(tmp_path)


# ------------------------------------------------------------------ studies, tiny
def test_exact_studies_write_csv_png_pdf(tmp_path):
    from experiments import fig_certificate_ladder, fig_is_degeneracy, fig_order_sensitivity

    opts = common.Options(out=tmp_path, quick=True, seeds=1)
    for mod in (fig_certificate_ladder, fig_order_sensitivity, fig_is_degeneracy):
        mod.run(opts)
        _outputs_ok(tmp_path, mod.NAME)
    lad = pd.read_csv(tmp_path / "fig_certificate_ladder.csv")
    assert (lad.holds_rate == 1.0).all()  # every bound is a theorem
    isd = pd.read_csv(tmp_path / "table_is_degeneracy.csv")
    assert ((isd.ess_over_B >= 0) & (isd.ess_over_B <= 1)).all()


def test_n_scaling_table_has_exponents(tmp_path):
    from experiments import fig_n_scaling

    cfg = fig_n_scaling.Config(ns=(2, 3, 4), layouts=("turn",), stages=1, seeds=1)
    agg, fits = fig_n_scaling.summarize(fig_n_scaling.simulate(cfg))
    assert {"method", "metric", "exponent"} <= set(fits.columns)
    got = fits[(fits.method == "sat") & (fits.metric == "D_occ")].exponent.iloc[0]
    sub = agg[(agg.method == "sat") & (agg.metric == "D_occ")].sort_values("n")
    assert got == pytest.approx(common.fit_power_law(sub.n, sub["mean"])[0])


def test_run_set_and_run_log_figures(tmp_path):
    from experiments import fig_plug_and_play

    rs = RunSet(name="tiny", stages=3, seeds=1, budget_groups=6, group_size=4,
                variants={"sat": {"method": "sat"}, "naive": {"method": "naive"},
                          "stronger/direct": {"method": "sat", "swap_stage": 1, "swap_strategy": "direct"}})
    dirs = ensure_runs(tmp_path, rs, quiet=True)
    mtimes = [(d / "metrics.jsonl").stat().st_mtime_ns for d in dirs]
    assert ensure_runs(tmp_path, rs, quiet=True) == dirs  # cached: not retrained
    assert [(d / "metrics.jsonl").stat().st_mtime_ns for d in dirs] == mtimes
    steps, stages, swaps = load(tmp_path, rs)
    assert set(stages.method) == {"sat", "naive", "stronger/direct"} and len(swaps) == 1
    # matched budget: every method sees the same episodes per stage
    eps = stages.groupby("method").episodes.max()
    assert eps.nunique() == 1
    summ = fig_plug_and_play.summary(stages[stages.method == "stronger/direct"], swaps)
    assert summ.swap_shock_mean.iloc[0] == pytest.approx(swaps.swap_shock.iloc[0])
    # `sat plot` on one of the runs draws the run-log figures
    out = tmp_path / "plots"
    assert cli.main(["plot", str(dirs[0]), "--out", str(out)]) == 0
    for name in ("training_curve", "kl_distribution", "certificate_tracking",
                 "certificate_vs_improvement", "stale_gap"):
        assert (out / f"{name}.png").stat().st_size > 0 and (out / f"{name}.pdf").exists()


def test_sat_figures_only_one_study_is_deterministic(tmp_path):
    stale = tmp_path / "b" / "runs" / "old"
    stale.mkdir(parents=True)
    for sub in ("a", "b"):
        rc = cli.main(["figures", "--quick", "--only", "fig_certificate_ladder", "--seeds", "1",
                       "--out", str(tmp_path / sub), "--retrain"])
        assert rc == 0
        _outputs_ok(tmp_path / sub, "fig_certificate_ladder")
    assert not stale.exists()  # --retrain clears the cached training runs
    assert ((tmp_path / "a" / "fig_certificate_ladder.csv").read_bytes()
            == (tmp_path / "b" / "fig_certificate_ladder.csv").read_bytes())
    rep = (tmp_path / "a" / "REPORT.md").read_text()
    assert "Certificate ladder" in rep and "Run time" in rep
    assert json.loads((tmp_path / "a" / "timings.json").read_text())["studies"]["fig_certificate_ladder"]


def test_bad_input_is_one_line(tmp_path, capsys):
    assert cli.main(["figures", "--only", "fig_nope", "--out", str(tmp_path)]) == 2
    assert cli.main(["figures", "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert cli.main(["plot", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("sat ") for line in err)


# ------------------------------------------------------------------ readable figures (issue 14 item 7)
def _axes():
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    return fig, ax


def test_symlog_band_is_a_power_of_ten_and_no_tick_sits_inside_it():
    from sat_theory.plotting import symlog_y

    fig, ax = _axes()
    y = np.array([0.03, 0.25, 0.8, -40.0, -700.0])
    ax.plot(np.arange(y.size), y)
    t = symlog_y(ax, [0.03, 0.25, 0.8])
    assert t == 0.1  # 10^floor(log10(median 0.25))
    ticks = [v for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
    assert 0.0 in ticks
    # every other tick is a decade at or beyond the band: none next to 0 inside the linear part
    assert all(v == 0 or (abs(v) >= t and math.log10(abs(v)).is_integer()) for v in ticks), ticks
    assert "linear for |y| < 0.1" in ax.get_ylabel()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_note_overlaps_names_identical_and_overlapping_curves_only():
    import matplotlib.pyplot as plt

    from sat_theory.plotting import note_overlaps

    fig, ax = _axes()
    x = np.arange(10.0)
    ax.plot(x, x, label="a (3 seeds)")
    ax.plot(x, x.copy(), label="b (3 seeds)")            # equal data
    ax.plot(x, x + 0.05, label="c")                      # 0.05 of a 10-high axis: on top of a
    ax.plot(x, x + 3.0, label="d")                       # clearly apart
    ax.plot(x[:5], x[:5] + 0.01, label="_unlabelled")   # ignored
    note_overlaps(ax)
    labels = [ln.get_label() for ln in ax.lines]
    assert labels[1] == "b (3 seeds), identical to a" and ax.lines[1].get_linestyle() != "-"
    assert labels[2] == "c, overlaps a"
    assert labels[3] == "d"
    # only x > after is compared: curves equal before it and apart after it are not noted
    fig2, ax2 = _axes()
    ax2.plot(x, np.where(x > 4, 0.0, x), label="p")
    ax2.plot(x, np.where(x > 4, 9.0, x), label="q")
    note_overlaps(ax2, after=4)
    assert [ln.get_label() for ln in ax2.lines] == ["p", "q"]
    plt.close(fig)
    plt.close(fig2)


def test_study_figures_redraw_from_their_csv(tmp_path):
    from experiments import fig_certificate_ladder

    fig_certificate_ladder.run(common.Options(out=tmp_path, quick=True, seeds=1))
    csv = (tmp_path / "fig_certificate_ladder.csv").read_bytes()
    (tmp_path / "fig_certificate_ladder.png").unlink()
    paths = fig_certificate_ladder.plot(tmp_path)
    assert [p.name for p in paths] == ["fig_certificate_ladder.png", "fig_certificate_ladder.pdf"]
    assert (tmp_path / "fig_certificate_ladder.png").stat().st_size > 0
    assert (tmp_path / "fig_certificate_ladder.csv").read_bytes() == csv  # plotting writes no data


def test_kl_monitor_note_and_report_are_computed_from_the_csv(tmp_path):
    from experiments.llm_kl_monitor import gap_note, plot

    rng = np.random.default_rng(0)
    exact = 0.002 + 0.0001 * rng.standard_normal(12)
    df = pd.DataFrame(dict(seed=range(12), exact_in=exact, exact_fresh=exact[::-1],
                           sampled_in=exact + 0.01 * rng.standard_normal(12),
                           sampled_fresh=exact + 0.01 * rng.standard_normal(12)))
    folder = tmp_path / "llm_kl_monitor"
    folder.mkdir()
    df.to_csv(folder / "kl_monitor.csv", index=False)
    note = gap_note(df)
    lo = min(df.sampled_in.std() / df.exact_in.std(), df.sampled_fresh.std() / df.exact_fresh.std())
    assert f"its spread is {lo:.0f}–" in note
    assert f"{100 * float((df.sampled_in < 0).mean()):.0f}% of the in-sample trials" in note
    assert plot(folder)[0].stat().st_size > 0
    text = report.section_llm_kl_monitor(tmp_path)
    assert note in text and "12 trials" in text
    assert "Not generated" in report.section_llm_kl_monitor(tmp_path / "nowhere")


def test_sat_figures_plot_only_redraws_from_the_csvs(tmp_path, capsys):
    out = tmp_path / "f"
    args = ["figures", "--quick", "--only", "fig_certificate_ladder,table_ablations", "--seeds", "1",
            "--out", str(out), "--no-report", "--plot-only"]
    assert cli.main(args) == 2  # nothing computed yet: one line naming the missing CSV
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fig_certificate_ladder.csv is missing" in err[0]
    assert cli.main(["figures", "--quick", "--only", "fig_certificate_ladder", "--seeds", "1",
                     "--out", str(out), "--no-report"]) == 0
    timings = (out / "timings.json").read_bytes()
    (out / "fig_certificate_ladder.png").unlink()
    assert cli.main(args[:3] + ["fig_certificate_ladder"] + args[4:]) == 0
    assert (out / "fig_certificate_ladder.png").stat().st_size > 0
    assert (out / "timings.json").read_bytes() == timings  # plotting is not a study's run time


@pytest.mark.parametrize("foreign", ["notes.txt", "thesis/chapter1.tex"])
def test_retrain_refuses_a_runs_folder_holding_what_sat_figures_did_not_write(tmp_path, foreign):
    """``sat figures --retrain`` called ``rmtree(OUT/runs)`` on any ``--out``: a user's files
    under ``runs/`` were deleted. Now it is one error line, exit 2, and nothing is removed."""
    doc = tmp_path / "out" / "runs" / foreign
    doc.parent.mkdir(parents=True)
    doc.write_text("mine")
    ours = tmp_path / "out" / "runs" / "main"
    ours.mkdir()
    (ours / "spec.json").write_text("{}")
    rc = cli.main(["figures", "--quick", "--only", "fig_certificate_ladder", "--seeds", "1",
                   "--out", str(tmp_path / "out"), "--retrain"])
    assert rc == 2
    assert doc.read_text() == "mine" and (ours / "spec.json").exists()


def test_relay_section_recomputes_accuracy_from_the_records_and_names_a_view_above_chance(tmp_path):
    """REPORT's relay checks are computed from the per-problem records (not checks.json's
    numbers), and a one-view agent that beats its chance level is named, not hidden."""
    folder = tmp_path / "llm_team_task"
    (folder / "checks").mkdir(parents=True)
    checks = {"team2": dict(agents=2, task_options={}, lenient=0.99),
              "full": dict(agents=1, task_options={"parts": 2}, lenient=0.99),
              "view2_1": dict(agents=1, task_options={"parts": 2, "only": 1}, chance=0.25,
                              chance_exact="1/4", lenient=0.0)}
    (folder / "checks.json").write_text(json.dumps(dict(settings={}, checks=checks)))
    scores = {"team2": [1, 0, 0, 0], "full": [1, 1, 0, 0], "view2_1": [1, 1, 0, 0]}
    for name, xs in scores.items():
        (folder / "checks" / f"{name}.jsonl").write_text(
            "".join(json.dumps(dict(id=i, lenient=x, strict=0)) + "\n" for i, x in enumerate(xs)))
    text = report.section_relay_checks(tmp_path)
    assert "untrained teams score 0.250" in text and "sees everything (the upper bound) scores 0.500" in text
    assert "above its chance level: view2_1" in text


# ------------------------------------------------------------------ sat figures, timings.json
TORN_TIMINGS = ['{"studies": {"fig_n_scaling": {"seconds": 1.5, "qu',  # a kill mid-write
                '[1, 2]', '{"studies": {"fig_n_scaling": 3}}', b'{"studies": {"\xff": {}}}']


@pytest.mark.parametrize("bad", TORN_TIMINGS, ids=["torn", "list", "entry", "not-utf8"])
def test_an_invalid_timings_json_is_ignored_with_one_warning(tmp_path, capsys, bad):
    from sat_theory.commands.figures import read_timings

    path = tmp_path / "timings.json"
    path.write_bytes(bad if isinstance(bad, bytes) else bad.encode())
    assert read_timings(path) == {}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sat figures: warning: ignoring")


def test_a_torn_timings_json_does_not_block_sat_figures(tmp_path, capsys):
    from sat_theory import cli

    out = tmp_path / "figs"
    out.mkdir()
    (out / "timings.json").write_text(TORN_TIMINGS[0])
    rc = cli.main(["figures", "--quick", "--only", "fig_certificate_ladder", "--seeds", "1",
                   "--out", str(out)])
    assert rc == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "warning: ignoring" in err[0] and "timings.json" in err[0]
    timings = json.loads((out / "timings.json").read_text())  # rewritten whole
    assert set(timings["studies"]) == {"fig_certificate_ladder"}
    assert timings["last_invocation"]["studies"] == ["fig_certificate_ladder"]
    assert "Run time" in (out / "REPORT.md").read_text()
    assert not list(out.glob(".timings.json.tmp*"))


# ------------------------------------------------------------------ sat plot: one backend
def _tabular_run(out: Path) -> Path:
    from sat_theory import cli

    assert cli.main(["train", "--env", "bandit", "--stages", "2", "--quiet",
                     "--out", str(out)]) == 0
    return out


def test_sat_plot_refuses_to_mix_tabular_and_llm_runs(tmp_path, capsys):
    from sat_theory import cli

    tab = _tabular_run(tmp_path / "tab")
    # the check reads the backend from config.json: an LLM run's "backend" section (as
    # sat_llm.train writes it) on a copy of the run stands in for a trained LLM run
    llm = tmp_path / "llm"
    llm.mkdir()
    (llm / "metrics.jsonl").write_bytes((tab / "metrics.jsonl").read_bytes())
    conf = json.loads((tab / "config.json").read_text())
    conf["backend"] = {"backend": "llm", "llm": {"model": "tiny-random"}}
    (llm / "config.json").write_text(json.dumps(conf))
    capsys.readouterr()
    assert cli.main(["plot", str(tab), str(llm), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "different backends" in err[0]
    assert f"llm: {llm}" in err[0] and f"tabular: {tab}" in err[0]
    assert not (tmp_path / "p").exists()  # refused before drawing anything
    # each backend alone still draws
    assert cli.main(["plot", str(tab), str(tab), "--out", str(tmp_path / "p2")]) == 0
    assert cli.main(["plot", str(llm), "--out", str(tmp_path / "p3")]) == 0
