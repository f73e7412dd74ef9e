"""The relay study (issue 22 item 3, experiments/llm_team_task.py): run names, the common
schedule, the queue (tuning first, chosen rates from validation only), the report computed
from planted per-problem records, and a smoke run of every method through the queue."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pytest

from experiments import llm_team_task as relay
from experiments.llm_team_learning import COMLRL_DEFAULT_LR, LR_GRID


def test_run_names_round_trip_and_bad_names_are_refused(capsys):
    for n in (2, 3):
        for tune in (False, True):
            for m in relay.STUDY_METHODS:
                name = relay.run_name(n, m, 3e-4, 2, tune)
                assert relay.parse_run(name) == (n, tune, m, 3e-4, 2)
    assert relay.parse_run("n3/tune/comlrl_lr5e-06_s0") == (3, True, "comlrl", 5e-6, 0)
    for bad in ("n2/sat_s0", "n4/sat_lr0.001_s0", "n2/ppo_lr0.001_s0", "sat_lr0.001_s0",
                "n2/sat_lr0.001_s0/../x", "n2/sat_lr1e-3e-3_s0"):
        with pytest.raises(SystemExit, match="not a"):
            relay.parse_run(bad)
    with pytest.raises(SystemExit) as e:
        relay.main(["--run", "n2/ppo_lr0.001_s0"])
    assert e.value.code == 2 and "not a run of the relay study" in capsys.readouterr().err


def test_a_run_name_can_set_the_trust_region_radius_of_trust_region_methods_only(tmp_path,
                                                                                 monkeypatch):
    assert set(relay.TRUST_REGION_METHODS) == {"sat", "naive", "joint", "single"}
    for m in relay.TRUST_REGION_METHODS:
        name = relay.run_name(2, m, 3e-3, 0, True, delta=0.2)
        assert name == f"n2/tune/{m}_lr0.003_d0.2_s0"
        assert relay.parse_run(name) == (2, True, m, 3e-3, 0) and relay.run_delta(name) == 0.2
    assert relay.run_delta(relay.run_name(3, "sat", 1e-3, 1)) is None
    for bad in ("n2/no-tr_lr0.003_d0.2_s0", "n2/comlrl_lr0.003_d0.2_s0", "n2/sat_lr0.003_d0_s0",
                "n2/sat_lr0.003_d1e-2e_s0"):
        with pytest.raises(SystemExit, match="not a"):
            relay.parse_run(bad)
    # the run gets that radius: run_one hands it to training in place of the study's delta
    seen = {}
    monkeypatch.setattr(relay, "_train", lambda cfg, *a, **k: seen.setdefault("delta", cfg.delta))
    with pytest.raises(FileNotFoundError):  # no study.json: the stand-in trained nothing
        relay.run_one(relay.study_config(), "n2/sat_lr0.003_d0.2_s0", tmp_path, resume=False)
    assert seen["delta"] == 0.2 != relay.study_config().delta


@pytest.mark.parametrize("n", [2, 3])
def test_every_method_is_evaluated_on_the_same_message_grid(n):
    cfg = relay.study_config(budget=12)
    unit = n * n * cfg.prompts * cfg.group_size
    for m in relay.STUDY_METHODS:
        units, at = relay.schedule(m, n, cfg)
        per = relay.messages_per_unit(m, n, cfg)
        assert len(at) == cfg.budget and at[-1] == units
        for j, k in enumerate(at, 1):  # ours exactly on the grid, CoMLRL within half a prompt
            assert abs(k * per - j * unit) <= (per / 2 if m == "comlrl" else 0)
    assert relay.schedule("sat", 2, cfg) == (12, list(range(1, 13)))
    assert relay.schedule("single", 3, cfg) == (108, list(range(9, 109, 9)))
    assert relay.messages_per_unit("comlrl", 3, cfg) == 3 * (4 + 16 + 64)


def test_queue_tunes_first_and_chooses_rates_on_validation_runs_only(tmp_path):
    q = relay.queue_relay()
    tune = [e for e in q if "/tune/" in e]
    assert len(tune) == 2 * (len(relay.STUDY_METHODS) * len(LR_GRID) + 1)
    assert len(q) == len(tune) + 2 * 3 * len(relay.STUDY_METHODS)
    assert q[:len(tune)] == tune  # every tuning run before any chosen-rate run
    assert relay.run_name(3, "comlrl", COMLRL_DEFAULT_LR, 0, True) in tune
    # a chosen-rate entry waits for all of its method's tuning runs
    entry = "n2/naive_lr@_s1"
    assert relay.resolve(tmp_path, entry) is None
    for i, lr in enumerate(LR_GRID):
        assert relay.resolve(tmp_path, entry) is None
        _fake(tmp_path, relay.run_name(2, "naive", lr, 0, True), [[0, 0, 0, 0], [0] * i + [1] * (4 - i)])
    # a held-out (non-tuning) run with a better curve does not change the choice
    _fake(tmp_path, relay.run_name(2, "naive", 1e-2, 0), [[1, 1, 1, 1], [1, 1, 1, 1]])
    assert relay.resolve(tmp_path, entry) == relay.run_name(2, "naive", LR_GRID[0], 1)


# ------------------------------------------------------------------ planted runs
def _fake(root, name, lenient, strict=None, *, steps=(), budget=None):
    """A finished run folder with hand-made per-problem eval files at the method's schedule
    (``lenient[c]``: the 0/1 row of the c-th checkpoint, the first the untrained team) and
    step records ``steps``."""
    n, tune, method, lr, seed = relay.parse_run(name)
    strict = strict if strict is not None else lenient
    d = root / name
    d.mkdir(parents=True)
    cfg = relay.study_config(budget=budget or len(lenient) - 1)
    units, at = relay.schedule(method, n, cfg)
    for k, row, srow in zip([0, *at], lenient, strict, strict=True):
        (d / f"eval_{k}.jsonl").write_text("".join(
            json.dumps(dict(id=i, prompt=f"p{i} s{seed}", answer=1, final="", score=float(x),
                            lenient=float(x), strict=float(y))) + "\n"
            for i, (x, y) in enumerate(zip(row, srow, strict=True))))
    (d / "metrics.jsonl").write_text("".join(json.dumps(dict(kind="step", **r)) + "\n"
                                             for r in steps))
    (d / "study.json").write_text(json.dumps(dict(
        run=name, method=method, lr=lr, seed=seed, tune=tune, n=n, finished=True,
        wall_seconds=1.0, study=asdict(cfg))))
    return d


def _acc(rows):
    return np.array(rows, dtype=float).mean(1)


def test_report_recomputes_the_tables_from_planted_records(tmp_path):
    root = tmp_path
    # tuning at n = 2: lr 3e-3 has the best validation AUC for sat and naive
    for m in ("sat", "naive"):
        for lr in LR_GRID:
            good = lr == 3e-3
            _fake(root, relay.run_name(2, m, lr, 0, True), [[0, 0, 0, 0], [1, 1, 1, int(good)]])
    sat = {0: [[0, 0, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0]],
           1: [[0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0]],
           2: [[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]}
    naive = {0: [[0, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0]],
             1: [[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]],
             2: [[1, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]]}
    strict_sat = {s: [[0] * 4, [0] * 4, [1, 0, 0, 0]] for s in range(3)}
    stale = {0: [0.2, 0.4], 1: [0.1, 0.1], 2: [0.5, 0.7]}
    for s in range(3):
        _fake(root, relay.run_name(2, "sat", 3e-3, s), sat[s], strict_sat[s],
              steps=[dict(agent=1, stale_frac=0.0, drift_kl=[0.05, None])])
        _fake(root, relay.run_name(2, "naive", 3e-3, s), naive[s],
              steps=[dict(agent=0, stale_frac=0.0, drift_kl=[None, None]),
                     *(dict(agent=1, stale_frac=v, drift_kl=[0.01 * (j + 1), None])
                       for j, v in enumerate(stale[s]))])
        # a decoy at a rate that was not chosen: never in the tables
        _fake(root, relay.run_name(2, "sat", 1e-3, s), [[1] * 4] * 3)
    data = relay.report(root, reps=500)
    assert data["chosen"]["n2/sat"] == 3e-3 and data["chosen"]["n2/naive"] == 3e-3
    assert data["chosen"]["n2/joint"] is None and data["chosen"]["n3/sat"] is None
    gaps = []
    for s in range(3):
        d = data["diff"][f"n2/naive/s{s}"]
        want_auc = _acc(sat[s]).mean() - _acc(naive[s]).mean()
        want_final = _acc(sat[s])[-1] - _acc(naive[s])[-1]
        assert d["lenient"]["diff"]["auc"][0] == pytest.approx(want_auc)
        assert d["lenient"]["diff"]["final"][0] == pytest.approx(want_final)
        # strict: SAT's planted strict rows, naive's strict = its lenient
        assert d["strict"]["diff"]["final"][0] == pytest.approx(0.25 - _acc(naive[s])[-1])
        gaps.append(want_auc)
        assert data["main"][f"n2/sat/s{s}"]["lenient"]["best"][0] == pytest.approx(_acc(sat[s]).max())
        drift = data["drift"][f"n2/s{s}"]
        assert drift["naive"]["stale_frac"][1] == pytest.approx(np.mean(stale[s]))
        assert drift["naive"]["drift_kl"][0] == pytest.approx(0.015)
        assert drift["sat"]["stale_frac"][1] == 0.0 and drift["sat"]["drift_kl"][0] == 0.05
    mean = data["diff"]["n2/naive/mean"]["lenient"]["auc"]
    assert mean[0] == pytest.approx(np.mean(gaps)) and mean[1] <= mean[0] <= mean[2]
    x = [np.mean(stale[s]) for s in range(3)]
    assert data["relation"]["pearson_auc"] == pytest.approx(np.corrcoef(x, gaps)[0, 1])
    text = (root / "study.md").read_text()
    assert "| sat | 0.003 | 0 |" in text and "| sat | 0.001 |" not in text
    # n = 3 has no run: each of its tables' cells reads "not yet run"
    n3 = text.split("**n = 3**")
    assert all("not yet run" in part or "not yet (tuning" in part for part in n3[1:])
    rows = {r["run"]: r for r in data["rows"]}
    assert rows["n2/naive_lr0.003_s0"]["sat_minus_lenient"][0] == pytest.approx(
        _acc(sat[0])[-1] - _acc(naive[0])[-1])


def test_comlrl_is_paired_with_ours_on_the_nearest_common_checkpoints(tmp_path):
    """CoMLRL's checkpoints are prompt counts (40 messages each at n = 2, G = 4); SAT's are
    stages (128 messages): the pairing maps each grid point to the nearest checkpoint."""
    a = relay.run_name(2, "sat", 1e-3, 0)
    b = relay.run_name(2, "comlrl", 1e-3, 0)
    da = _fake(tmp_path, a, [[0, 0], [1, 0], [1, 1]])
    db = _fake(tmp_path, b, [[0, 0], [0, 1], [0, 0]])
    assert sorted(relay.budgets(db)) == [0, 3, 6]  # round(128/40), round(256/40)
    ps = relay.paired(da, db, reps=200)
    assert ps["checkpoints"] == [[0, 0], [1, 3], [2, 6]]
    assert ps["lenient"]["diff"]["auc"][0] == pytest.approx((0 + 1 / 2 + 1) / 3 - (0 + 1 / 2 + 0) / 3)
    # not the same held-out problems: refused
    other = _fake(tmp_path, relay.run_name(2, "naive", 1e-3, 1), [[0, 0], [0, 0], [0, 0]])
    with pytest.raises(ValueError, match="same problems"):
        relay.paired(da, other)


# ------------------------------------------------------------------ smoke run of the queue
TINY = dict(model="tiny-random", n_train=8, n_eval=3, prompts=2, group_size=2,
            max_new_tokens=3, minibatch=4, budget=1)


@pytest.mark.slow
def test_queue_runs_every_method_tuning_first_and_reports(tmp_path, monkeypatch):
    """The study's entry point at a tiny size (tiny-random, one budget unit, n = 2, one
    seed, one tuning rate): every method's tuning run, then every method at its chosen rate,
    each its own niced process with its log in .logs/, then the report; a second queue call
    finds everything finished and runs nothing."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    pytest.importorskip("comlrl")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "study"
    flags = [x for k, v in TINY.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    argv = ["--study-dir", str(root), "--queue", "--ns", "2", "--seeds", "0", "--lr-grid",
            "0.01", "--n-validation", "4", "--nice", "3", "--poll", "0.5", *flags]
    assert relay.main(argv) == 0
    names = [relay.resolve(root, e, (0.01,)) for e in relay.queue_relay((2,), (0,), (0.01,))]
    assert len(names) == 2 * len(relay.STUDY_METHODS) + 1
    for name in names:
        d = root / name
        meta = json.loads((d / "study.json").read_text())
        assert meta["finished"] and meta["wall_seconds"] > 0 and meta["load_end"], name
        assert (root / ".logs" / (name.replace("/", "_") + ".log")).is_file()
        recs = [json.loads(x) for x in (d / "eval_0.jsonl").read_text().splitlines()]
        assert len(recs) == (4 if meta["tune"] else 3) and {"strict", "lenient"} <= set(recs[0])
        n_evals = len(list(d.glob("eval_*.jsonl")))
        assert n_evals == 2, name  # untrained and after the one budget unit
    steps = [json.loads(x) for x in (root / "n2/naive_lr0.01_s0/metrics.jsonl").read_text()
             .splitlines() if '"step"' in x]
    assert steps and all("stale_frac" in r and "drift_kl" in r for r in steps)
    assert not list(root.rglob("checkpoint*"))
    comlrl = next(n for n in names if n.startswith("n2/comlrl") and "tune" not in n)
    assert json.loads((root / comlrl / "config.json").read_text())["magrpo"]["num_turns"] == 2
    assert relay.main(argv) == 0  # resumable: nothing left to run
    assert relay.main(["--study-dir", str(root), "--report", "--lr-grid", "0.01"]) == 0
    text = (root / "study.md").read_text()
    assert "| naive | 0 | " in text and text.count("not yet run") > 0


def test_a_finished_run_is_not_rerun_and_keeps_its_wall_clock(tmp_path):
    name = relay.run_name(2, "sat", 1e-3, 0)
    d = _fake(tmp_path, name, [[0, 1], [1, 1]])
    before = (d / "study.json").read_text()
    assert relay.run_one(relay.study_config(), name, tmp_path, True) == d
    assert (d / "study.json").read_text() == before


def test_the_default_budget_is_the_studys_budget_of_each_team_size():
    """``budget`` 0 (the default) resolves to STUDY_BUDGETS[n] (2 → 6 units, 3 → 3): SAT
    runs that many stages, naive n times as many, single n² times; a given budget wins."""
    cfg = relay.study_config()
    assert cfg.budget == 0 and relay.STUDY_BUDGETS == {2: 6, 3: 3}
    assert relay.with_budget(cfg, 2).budget == 6 and relay.with_budget(cfg, 3).budget == 3
    assert relay.schedule("sat", 2, cfg) == (6, list(range(1, 7)))
    assert relay.schedule("naive", 3, cfg) == (9, [3, 6, 9])
    assert relay.schedule("single", 3, cfg) == (27, [9, 18, 27])
    assert relay.schedule("sat", 3, relay.study_config(budget=5))[0] == 5


def test_queue_commands_carry_the_settings_and_each_team_sizes_budget(tmp_path):
    cfg = relay.study_config(model="tiny-random", budget=12)
    cmd = relay.queue_command(cfg, tmp_path, "n3/tune/sat_lr0.001_s0", 4, 3, {3: 4})
    assert cmd[:3] == ["nice", "-n", "3"] and cmd[cmd.index("--run") + 1] == "n3/tune/sat_lr0.001_s0"
    assert cmd[cmd.index("--budget") + 1] == "4" and cmd[cmd.index("--model") + 1] == "tiny-random"
    assert cmd[cmd.index("--n-validation") + 1] == "4"
    cmd2 = relay.queue_command(cfg, tmp_path, "n2/sat_lr0.001_s0", budgets={3: 4})
    assert cmd2[cmd2.index("--budget") + 1] == "12" and "nice" not in cmd2
    # the flags parse back to the same settings
    from dataclasses import fields

    args = cmd2[cmd2.index("--resume") + 1:]
    ns = {fields(cfg)[i].name: v for i, v in enumerate(args[1::2])}
    assert ns == {f.name: str(getattr(cfg, f.name)) for f in fields(cfg)}
    with pytest.raises(SystemExit) as e:
        relay.main(["--queue", "--budgets", "4=2"])
    assert e.value.code == 2
