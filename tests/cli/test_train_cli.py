"""``sat train``: runs, writes its run folder, prints one summary line; bad input gets one
line on stderr and exit status 2, never a traceback."""

import json
import re
import subprocess
import sys

import pytest

from sat_theory import TeamPolicy, random_mdp, stage_certificate
from sat_theory.cli import main
from sat_theory.errors import InputError
from sat_theory.metrics import load_run


def sat(*argv):
    return main(list(argv))


def test_train_exact_writes_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    rc = sat("train", "--env", "random-turn", "--agents", "3", "--states", "6", "--stages", "3",
             "--delta", "0.05", "--seed", "1", "--save-policies", "--out", str(out), "--quiet")
    assert rc == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sat: 3 stages, J ")
    run = load_run(out)
    assert run.config["algorithm"]["method"] == "sat"
    assert run.config["backend"]["mode"] == "exact"
    assert len(run.stages) == 3 and len(run.steps) == 9
    assert sorted(p.name for p in (out / "policies").iterdir()) == [
        f"stage{k}.npz" for k in range(4)]
    # the logged bound is the core's certificate of the saved policies
    mdp = random_mdp(6, 3, 2, layout="turn", seed=1)
    s = run.stages[1]
    cert = stage_certificate(mdp, TeamPolicy.load(out / "policies" / "stage1.npz", mdp),
                             TeamPolicy.load(out / "policies" / "stage2.npz", mdp), s["order"])
    assert s["lower_bound"] == pytest.approx(cert.lower_bound, rel=1e-9)


def test_train_sampled_with_mdp_file_and_explicit_order(tmp_path, capsys):
    mdp = random_mdp(4, 3, 2, layout="masked", seed=2)
    mdp.save(tmp_path / "m.npz")
    out = tmp_path / "run"
    rc = sat("train", "--mdp", str(tmp_path / "m.npz"), "--method", "naive", "--stages", "2",
             "--group-size", "4", "--groups", "3", "--order", "2,0,1", "--horizon-tol", "0.05",
             "--out", str(out), "--quiet")
    assert rc == 0
    run = load_run(out)
    assert run.config["backend"]["mode"] == "sampled"
    assert all(s["order"] == [2, 0, 1] for s in run.stages)
    assert all(s["n_episodes"] == 12 for s in run.steps)
    assert len({s["rollout_id"] for s in run.steps}) == 2  # naive: one batch per stage
    # strict JSON on every line
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)


def test_progress_bar_goes_to_stderr(tmp_path, capsys):
    # --verbose: bars although stderr is not a terminal here (default: only on a terminal)
    rc = sat("train", "--env", "bandit", "--stages", "2", "--out", str(tmp_path / "r"), "--verbose")
    assert rc == 0
    cap = capsys.readouterr()
    assert len(cap.out.strip().splitlines()) == 1
    assert "stage" in cap.err


BAD = [
    (["--env", "bandit", "--method", "ppo"], "unknown method"),
    (["--env", "nowhere"], "unknown env"),
    (["--env", "bandit", "--delta", "0"], "delta"),
    (["--env", "bandit", "--delta", "-0.1"], "delta"),
    (["--env", "chain", "--agents", "3"], "does not match"),
    (["--env", "random-turn"], "--agents"),
    (["--env", "bandit", "--mdp", "x.npz"], "exactly one"),
    ([], "exactly one"),
    (["--mdp", "missing.npz"], "not found"),
    (["--env", "bandit", "--order", "0,0"], "permutation"),
    (["--env", "bandit", "--order", "sideways"], "--order"),
    (["--env", "bandit", "--occupancy", "fresh"], "occupancy"),
    (["--env", "bandit", "--exact", "--group-size", "4"], "--exact"),
    (["--env", "bandit", "--group-size", "0"], "group-size"),
    (["--env", "bandit", "--swap-stage", "0", "--swap-strategy", "teleport"], "swap_strategy"),
    (["--env", "bandit", "--stages", "x"], "integer"),
]


@pytest.mark.parametrize("argv,needle", BAD)
def test_bad_input_one_line_exit_2(tmp_path, capsys, argv, needle):
    rc = _exit_status(argv, tmp_path)
    cap = capsys.readouterr()
    assert rc == 2
    err = cap.err.strip().splitlines()
    assert len(err) == 1, cap.err
    assert needle in err[0]
    assert "Traceback" not in cap.err


def _exit_status(argv, tmp_path):
    """The exit status, whether argparse refused a flag (SystemExit) or the command did."""
    try:
        return sat("train", *argv, "--out", str(tmp_path / "r"), "--quiet")
    except SystemExit as e:
        return e.code


def test_missing_out_is_an_input_error(capsys):
    assert sat("train", "--env", "bandit", "--quiet") == 2
    assert "--out" in capsys.readouterr().err


def test_llm_backend_without_sat_llm_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "sat_llm.backend", None)  # import fails
    assert sat("train", "--backend", "llm", "--out", str(tmp_path / "r")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e '.[llm]'" in err[0]


def test_subprocess_bad_input_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "sat_theory.cli", "train", "--env", "bandit",
                        "--method", "nope", "--out", str(tmp_path / "r")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "unknown method" in p.stderr
    assert "Traceback" not in p.stderr


def test_same_seed_same_bytes_through_the_cli(tmp_path):
    files = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert sat("train", "--env", "random-simultaneous", "--agents", "2", "--states", "4",
                   "--stages", "2", "--group-size", "3", "--groups", "2", "--order", "random",
                   "--horizon-tol", "0.1", "--seed", "5", "--out", str(out), "--quiet") == 0
        # every byte equal but the wall-clock seconds of each record
        files.append(re.sub(rb'"seconds": [^,}]+', b"", (out / "metrics.jsonl").read_bytes()))
    assert files[0] == files[1]
    assert files[0].count(b"\n") == 2 * 2 + 2  # 2 stages × (2 steps + 1 stage record)


def test_tabular_train_does_not_import_torch(tmp_path):
    """Parsing ``--device``'s default ``auto`` resolved it, which imported torch (≈ 3–8 s)
    for every tabular ``sat train``."""
    code = ("import sys\nfrom sat_theory.cli import main\n"
            "rc = main(['train', '--env', 'bandit', '--stages', '1', '--out', sys.argv[1], '--quiet'])\n"
            "print(rc, 'torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.split()[-2:] == ["0", "False"], p.stdout + p.stderr


def test_one_stage_is_reported_as_one_stage(tmp_path, capsys):
    assert sat("train", "--env", "bandit", "--stages", "1", "--out", str(tmp_path / "r")) == 0
    assert " 1 stage," in capsys.readouterr().out


def test_beta_zero_is_plain_grpo_only_without_a_trust_region(tmp_path, capsys):
    """``--beta 0`` was refused for every method, so plain GRPO (``--method no-tr``) had to
    pass 1e-300; it is allowed there for the LLM backend, refused with a trust region (β
    could never grow from 0), and refused by the tabular update, which divides by β."""
    from sat_theory.algorithm import TrainConfig

    assert TrainConfig(method="no-tr", beta_init=0.0).beta_init == 0.0
    with pytest.raises(InputError, match="beta 0 needs --trust-region none"):
        TrainConfig(method="sat", beta_init=0.0)
    assert sat("train", "--env", "bandit", "--method", "no-tr", "--beta", "0",
               "--out", str(tmp_path / "r")) == 2
    assert "needs β > 0" in capsys.readouterr().err
