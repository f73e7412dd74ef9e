"""The run folder contract of :mod:`sat_theory.runner` through ``sat train``: ownership (lock,
refusal, ``--overwrite``), ``--resume`` and its flags, and every flag checked before work."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sat_theory.cli import main
from sat_theory.runner import RunFolder

RUN = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "2",
       "--groups", "2", "--group-size", "2", "--method", "naive", "--quiet"]


def _err(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err
    return err


def _records(d):
    out = []
    for line in (d / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds")
        out.append(r)
    return out


def test_a_second_process_on_the_folder_fails_at_once(tmp_path, capsys):
    out = tmp_path / "r"
    with RunFolder(out):  # another run holds the folder
        _err(capsys, main(RUN + ["--out", str(out)]), "is in use by another run")
        _err(capsys, main(["train", "--resume", str(out)]), "is in use by another run")
        p = subprocess.run([sys.executable, "-m", "sat_theory.cli", *RUN, "--out", str(out)],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2 and "in use" in p.stderr and p.stderr.count("\n") == 1
    assert main(RUN + ["--out", str(out)]) == 0  # released with its holder


def test_an_existing_run_is_refused_and_overwrite_replaces_it(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(RUN + ["--stages", "3", "--save-policies", "--out", str(out)]) == 0
    before = (out / "metrics.jsonl").read_text()
    _err(capsys, main(RUN + ["--out", str(out)]), "holds a run already")
    assert (out / "metrics.jsonl").read_text() == before  # untouched
    (out / "notes.txt").write_text("mine")
    assert main(RUN + ["--out", str(out), "--overwrite"]) == 0
    assert not (out / "policies").exists()  # no stale stage{k}.npz of the replaced run
    assert len(_records(out)) == 2 * 3 and (out / "notes.txt").read_text() == "mine"


def test_out_that_is_a_file_is_an_input_error(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    _err(capsys, main(RUN + ["--out", str(f)]), "is a file")


def test_resume_takes_more_stages_and_refuses_other_flags(tmp_path, capsys):
    out, full = tmp_path / "r", tmp_path / "full"
    assert main(RUN + ["--out", str(out)]) == 0
    assert main(RUN + ["--stages", "4", "--out", str(full)]) == 0
    _err(capsys, main(["train", "--resume", str(out), "--seed", "3"]), "--seed cannot change")
    _err(capsys, main(["train", "--resume", str(out), "--delta", "0.5", "--quiet"]), "--delta")
    _err(capsys, main(["train", "--resume", str(out), "--stages", "1"]), "done 2 stages")
    _err(capsys, main(["train", "--resume", str(out), "--backend", "llm"]), "contradicts")
    assert main(["train", "--resume", str(out), "--stages", "4", "--quiet"]) == 0
    assert _records(out) == _records(full)
    assert json.loads((out / "config.json").read_text())["algorithm"]["stages"] == 4
    assert main(["train", "--resume", str(out), "--quiet"]) == 0  # finished: nothing to do
    assert _records(out) == _records(full)


def test_resume_refuses_a_changed_mdp_file_and_a_malformed_config(tmp_path, capsys):
    from sat_theory.envs import random_mdp

    mdp = tmp_path / "m.npz"
    random_mdp(4, 2, 2, layout="turn", seed=1).save(mdp)
    out = tmp_path / "r"
    assert main(["train", "--mdp", str(mdp), "--stages", "1", "--quiet", "--out", str(out)]) == 0
    random_mdp(4, 2, 2, layout="turn", seed=2).save(mdp)
    _err(capsys, main(["train", "--resume", str(out), "--stages", "2"]), "changed since")
    (out / "config.json").write_bytes(b"\xff\xfe not json")
    _err(capsys, main(["train", "--resume", str(out)]), "not valid JSON")
    _err(capsys, main(["train", "--resume", str(tmp_path / "none")]), "config.json missing")


BAD_FLAGS = [
    (["--eps-w", "-1"], "--eps-w: must be a number in (0, 1]"),
    (["--adv-clip", "nan"], "--adv-clip: must be a number > 0"),
    (["--beta", "nan"], "--beta: must be a number >= 0"),
    (["--beta", "inf"], "--beta: must be a number >= 0"),
    (["--max-backtracks", "-1"], "--max-backtracks: must be an integer >= 0"),
    (["--delta-min", "nan"], "--delta-min"),
    (["--delta-max", "0.001", "--delta-min", "0.01"], "delta_min 0.01 exceeds delta_max"),
    (["--beta-growth", "1"], "--beta-growth: must be a number > 1"),
    (["--step-shrink", "0"], "--step-shrink"),
    (["--delta-conf", "1"], "--delta-conf"),
    (["--seed", "-1"], "--seed: must be an integer >= 0"),
    (["--stages", "2.5"], "--stages: must be an integer >= 0"),
    (["--swap-stage", "99"], "swap_stage 99 is not a stage of this run"),
    (["--swap-agent", "5", "--swap-stage", "1"], "--swap-agent 5 is not an agent index"),
    (["--delta-per-agent", "0.1"], "--delta-per-agent has 1 entries for 2 agents"),
    (["--delta-per-agent", "0.1,nan"], "delta_per_agent must be a number > 0"),
    (["--lr", "0"], "--lr: must be a number > 0"),
    (["--horizon-tol", "1"], "--horizon-tol"),
    (["--gamma", "1.5"], "--gamma: must be a number in (0, 1)"),
    (["--resample-k", "0"], "--resample-k"),
]


@pytest.mark.parametrize("extra,pattern", BAD_FLAGS)
def test_every_bad_flag_is_refused_before_any_work(tmp_path, capsys, extra, pattern):
    out = tmp_path / "r"
    _err(capsys, main(RUN + extra + ["--out", str(out)]), pattern)
    assert not out.exists()  # refused before the run folder was even created


def test_help_shows_the_valid_ranges(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--delta DELTA", "[a number > 0]", "--eps-w EPS_W", "[a number in (0, 1]]",
                   "--max-backtracks MAX_BACKTRACKS", "[an integer >= 0]", "--overwrite"):
        assert needle in text, needle


@pytest.mark.parametrize("argv,pattern", [
    (["verify", "--seed", "-1"], "--seed: must be an integer >= 0"),
    (["figures", "--seeds", "0"], "--seeds: must be an integer >= 1"),
    (["bench", "--blas-threads", "0"], "--blas-threads: must be an integer >= 1"),
])
def test_other_commands_refuse_bad_counts_with_exit_2(capsys, argv, pattern):
    _err(capsys, main(argv), pattern)
