"""``sat eval`` and ``sat certify``: JSON and table output, and every bad input of issue 2
item 8 ending in exit status 2 with exactly one line on stderr and no traceback."""

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest

from sat_theory import BOUND_KEYS, TeamPolicy, evaluate, random_mdp, stage_certificate
from sat_theory.cli import main
from tests.bad_files import (
    BAD_MDP_CASES,
    BAD_PATH_IDS,
    BAD_POLICY_CASES,
    bad_paths,
    good_policy_arrays,
    policy_for,
    policy_mdp,
    write_bad_mdp,
)


def run_cli(capsys, *argv):
    """cli.main's return code; argparse usage errors exit through SystemExit instead."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, out, err, pattern=None):
    assert code == 2, (code, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and out == ""
    if pattern is not None:

        assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture
def files(tmp_path):
    mdp = random_mdp(6, 3, 2, layout="masked", seed=3)
    cur, tar = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    paths = {k: tmp_path / f"{k}.npz" for k in ("mdp", "cur", "tar")}
    mdp.save(paths["mdp"])
    cur.save(paths["cur"])
    tar.save(paths["tar"])
    return mdp, cur, tar, paths


# ------------------------------------------------------------------ outputs
def test_eval_json(capsys, files):
    mdp, cur, _, p = files
    code, out, err = run_cli(capsys, "eval", p["mdp"], "--policy", p["cur"], "--json")
    assert code == 0 and err == ""
    obj = json.loads(out)
    assert set(obj) == {"J", "V", "d"}
    ev = evaluate(mdp, cur)
    assert obj["J"] == pytest.approx(ev.J, rel=1e-15)
    np.testing.assert_allclose(obj["V"], ev.V, rtol=1e-15)
    np.testing.assert_allclose(obj["d"], ev.d, rtol=1e-15)
    assert math.isclose(sum(obj["d"]), 1.0, abs_tol=1e-12)


def test_eval_table(capsys, files):
    _, _, _, p = files
    code, out, _ = run_cli(capsys, "eval", p["mdp"], "--policy", p["cur"])
    assert code == 0 and "J = " in out and "sum(d) = " in out and "masked" in out


def test_certify_json(capsys, files):
    mdp, cur, tar, p = files
    code, out, err = run_cli(capsys, "certify", p["mdp"], "--current", p["cur"],
                             "--target", p["tar"], "--order", "2,0,1", "--json")
    assert code == 0 and err == ""
    obj = json.loads(out)
    for k in ("order", "steps", "A_max", "c", "true_improvement", "holds", *BOUND_KEYS):
        assert k in obj, k
    assert obj["order"] == [2, 0, 1]
    assert [s["agent"] for s in obj["steps"]] == [2, 0, 1]  # steps in update order
    for s in obj["steps"]:
        for k in ("agent", "L_seq", "L_stale", "delta", "delta_max", "A_max", "true_gain"):
            assert k in s, k
    cert = stage_certificate(mdp, cur, tar, [2, 0, 1])
    assert obj["lower_bound"] == pytest.approx(cert.lower_bound, rel=1e-15)
    assert obj["holds"] is True


def test_certify_default_order_and_table(capsys, files):
    _, _, _, p = files
    code, out, _ = run_cli(capsys, "certify", p["mdp"], "--current", p["cur"], "--target", p["tar"])
    assert code == 0
    for k in BOUND_KEYS:
        assert k in out
    assert "true improvement" in out


def test_json_is_strict_with_infinite_kl(capsys, tmp_path):
    """A target with a zero where the current policy has mass: δ = +∞, still strict JSON."""
    mdp = random_mdp(3, 2, 2, seed=0)
    cur = TeamPolicy.uniform(mdp)
    tar = TeamPolicy((np.tile([1.0, 0.0], (3, 1)), cur.factors[1]))
    mdp.save(tmp_path / "m.npz")
    cur.save(tmp_path / "c.npz")
    tar.save(tmp_path / "t.npz")
    code, out, _ = run_cli(capsys, "certify", tmp_path / "m.npz", "--current", tmp_path / "c.npz",
                           "--target", tmp_path / "t.npz", "--json")
    assert code == 0
    obj = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
    assert float(obj["steps"][0]["delta"]) == math.inf


# --------------------------------------------------------------- bad MDP files
@pytest.mark.parametrize("name,base,mutate,pattern", BAD_MDP_CASES, ids=[c[0] for c in BAD_MDP_CASES])
def test_bad_mdp_file_eval_and_certify(capsys, tmp_path, name, base, mutate, pattern):
    path = write_bad_mdp(tmp_path, base, mutate)
    pol = policy_for(tmp_path, base)
    assert_clean_error(*run_cli(capsys, "eval", path, "--policy", pol), pattern)
    assert_clean_error(*run_cli(capsys, "certify", path, "--current", pol, "--target", pol), pattern)


@pytest.mark.parametrize("which", BAD_PATH_IDS)
def test_unreadable_files(capsys, tmp_path, files, which):
    _, _, _, p = files
    bad, pattern = bad_paths(tmp_path)[which]
    assert_clean_error(*run_cli(capsys, "eval", bad, "--policy", p["cur"]), pattern)
    assert_clean_error(*run_cli(capsys, "eval", p["mdp"], "--policy", bad))
    assert_clean_error(*run_cli(capsys, "certify", p["mdp"], "--current", p["cur"], "--target", bad))


# ------------------------------------------------------------ bad policy files
@pytest.mark.parametrize("name,mutate,pattern", BAD_POLICY_CASES, ids=[c[0] for c in BAD_POLICY_CASES])
def test_bad_policy_file_eval_and_certify(capsys, tmp_path, name, mutate, pattern):
    policy_mdp().save(tmp_path / "m.npz")
    good = good_policy_arrays()
    np.savez(tmp_path / "good.npz", **good)
    mutate(good)
    np.savez(tmp_path / "bad.npz", **good)
    m, ok, bad = tmp_path / "m.npz", tmp_path / "good.npz", tmp_path / "bad.npz"
    assert_clean_error(*run_cli(capsys, "eval", m, "--policy", bad), pattern)
    assert_clean_error(*run_cli(capsys, "certify", m, "--current", bad, "--target", ok), pattern)
    assert_clean_error(*run_cli(capsys, "certify", m, "--current", ok, "--target", bad), pattern)


# ------------------------------------------------------------------- --order
@pytest.mark.parametrize("order", ["0,0,1", "0,1", "0,1,2,3", "1,2,3", "-1,0,1", "a,b,c", "0;1;2", ""])
def test_order_not_a_permutation(capsys, files, order):
    _, _, _, p = files
    assert_clean_error(*run_cli(capsys, "certify", p["mdp"], "--current", p["cur"],
                                "--target", p["tar"], f"--order={order}"), r"order")


def test_missing_required_argument(capsys, files):
    _, _, _, p = files
    assert_clean_error(*run_cli(capsys, "eval", p["mdp"]), r"--policy")
    assert_clean_error(*run_cli(capsys, "certify", p["mdp"], "--current", p["cur"]), r"--target")


# ------------------------------------------------- the real console entry point
def test_subprocess_bad_input_and_json(tmp_path, files):
    """Through a separate interpreter, as a user runs it: exit 2, one stderr line."""
    _, _, _, p = files
    exe = [sys.executable, "-m", "sat_theory.cli"]
    r = subprocess.run(exe + ["eval", str(tmp_path / "missing.npz"), "--policy", str(p["cur"])],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr
    assert "not found" in r.stderr
    r = subprocess.run(exe + ["eval", str(p["mdp"]), "--policy", str(p["cur"]), "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and set(json.loads(r.stdout)) == {"J", "V", "d"}


# ------------------------------------------------------------------ sat bench
def test_bench_smoke_json(capsys):
    """The benchmark scripts run end to end (tiny sizes; numbers meaningless, never asserted)."""
    code, out, err = run_cli(capsys, "bench", "--smoke", "--only", "certificate,sparse,scaling", "--json")
    assert code == 0, err
    obj = json.loads(out)
    assert set(obj) == {"machine", "benchmarks", "targets"}
    assert set(obj["benchmarks"]) == {"certificate", "sparse", "scaling"}
    for t in obj["targets"]:
        assert {"target", "value", "goal", "met"} <= set(t)
    # the naive certificate and ours agree: the speed comparison is between equal answers
    assert all(r["max_abs_diff"] < 1e-9 for r in obj["benchmarks"]["certificate"]["rows"])


def test_bench_unknown_name(capsys):
    assert_clean_error(*run_cli(capsys, "bench", "--only", "nope"), r"unknown benchmark")


# ------------------------------------------------------------------ typos, repeats, defaults
def test_a_flag_typo_gets_a_suggestion(capsys):
    assert main(["train", "--env", "bandit", "--stgaes", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean" in err and "--stages" in err, err


def test_a_flag_typed_twice_is_refused(capsys, monkeypatch, tmp_path):
    """``--stages 12 ... --stages 1`` on the command line used to keep the last silently."""
    out = tmp_path / "run"
    monkeypatch.setattr(sys, "argv", ["sat", "train", "--env", "bandit", "--stages", "12",
                                      "--out", str(out), "--stages=1"])
    assert main() == 2
    err = capsys.readouterr().err.strip()
    assert err == "sat train: error: --stages is given twice (12 and 1); give it once"
    assert not out.exists()
    # repeatable flags and switches may repeat
    monkeypatch.setattr(sys, "argv", ["sat", "train", "--env", "bandit", "--stages", "1",
                                      "--quiet", "--quiet", "--out", str(out)])
    assert main() == 0


@pytest.mark.parametrize("argv", [["plot", "figures/llm_team_learning/sat_s0"],
                                  ["figures", "--plot-only", "--only", "fig_n_scaling"]])
def test_default_outputs_never_land_in_the_source_checkout(argv, capsys, monkeypatch):
    """``sat plot RUN`` wrote RUN/plots into the committed figures, ``sat figures`` wrote the
    committed figures/ when run from the checkout; an explicit --out still may."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    if not (root / argv[1].split(",")[0]).exists() and argv[0] == "plot":
        pytest.skip("no committed run to point at")
    monkeypatch.chdir(root)
    before = sorted(p.name for p in (root / "figures").rglob("*"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "inside the source checkout" in err and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in (root / "figures").rglob("*")) == before
