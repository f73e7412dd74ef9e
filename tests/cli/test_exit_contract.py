"""The exit-code contract: an internal error is one line with a hint to ``--debug`` (exit 1),
normal tabular runs write nothing to stderr, and SIGINT/SIGTERM in the middle of an atomic
write end the run with exit 130 and no temporary file left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest


def test_an_internal_error_is_one_line_with_a_hint_to_debug(capsys, monkeypatch):
    from sat_theory import cli
    from sat_theory.commands import eval as eval_cmd

    def bug(args):
        raise RuntimeError("an internal bug\nwith a second line")

    monkeypatch.setattr(eval_cmd, "run", bug)
    assert cli.main(["eval", "m.npz", "--policy", "p.npz"]) == 1
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err == ("sat eval: internal error: RuntimeError: an internal bug "
                       "(rerun with --debug for the traceback)\n")
    with pytest.raises(RuntimeError, match="an internal bug"):  # --debug: the traceback
        cli.main(["--debug", "eval", "m.npz", "--policy", "p.npz"])


def _sat(*argv, cwd):
    return subprocess.run([sys.executable, "-m", "sat_theory.cli", *argv], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_normal_tabular_runs_write_nothing_to_stderr(tmp_path):
    """Through a fresh interpreter, as a user runs it (warnings included)."""
    from sat_theory import TeamPolicy, random_mdp

    mdp = random_mdp(6, 3, 2, layout="turn", seed=3)
    mdp.save(tmp_path / "m.npz")
    TeamPolicy.random(mdp, 1).save(tmp_path / "cur.npz")
    TeamPolicy.random(mdp, 2).save(tmp_path / "tar.npz")
    runs = [
        ("eval", "m.npz", "--policy", "cur.npz", "--json"),
        ("certify", "m.npz", "--current", "cur.npz", "--target", "tar.npz", "--order", "2,0,1"),
        ("train", "--mdp", "m.npz", "--stages", "2", "--groups", "2", "--group-size", "3",
         "--occupancy", "stale+IS", "--method", "naive", "--save-policies", "--quiet",
         "--out", "r1"),
        ("train", "--mdp", "m.npz", "--stages", "2", "--exact", "--swap-stage", "1",
         "--swap-agent", "1", "--quiet", "--out", "r2"),
        ("train", "--resume", "r2", "--stages", "3", "--quiet"),
        ("plot", "r1", "--out", "p"),
    ]
    for argv in runs:
        r = _sat(*argv, cwd=tmp_path)
        assert r.returncode == 0 and r.stderr == "", (argv, r.stderr)


def _signalled_child(argv, sig, target):
    """Run ``main(argv)`` and deliver ``sig`` to this process in the middle of the first
    atomic write of ``target`` (its temporary file written, not yet renamed)."""
    import sat_theory.checkpoint as ck
    import sat_theory.metrics as metrics
    from sat_theory import cli

    orig = ck.write_atomic

    def write_atomic(path, write):
        def write_then_signal(tmp):
            write(tmp)
            if Path(path).name == target:
                assert tmp.exists()
                os.kill(os.getpid(), sig)
        return orig(path, write_then_signal)

    ck.write_atomic = metrics.write_atomic = write_atomic  # checkpoints; config.json
    # a shell starts background jobs with SIGINT ignored, and Python keeps that; Ctrl-C on a
    # terminal finds Python's own handler, which is the case tested here
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os._exit(cli.main(argv))


@pytest.mark.parametrize("target", ["config.json", "checkpoint.safetensors"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_temporary_files_are_removed_on_sigint_and_sigterm(tmp_path, sig, target):
    import multiprocessing

    out = tmp_path / "r"
    argv = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "2",
            "--exact", "--quiet", "--out", str(out)]
    ctx = multiprocessing.get_context("fork")  # the parent has imported everything
    p = ctx.Process(target=_signalled_child, args=(argv, sig, target))
    p.start()
    p.join(300)
    assert p.exitcode == 130  # "interrupted", not killed by the signal
    assert (out / "config.json").exists() == (target != "config.json")
    assert not list(out.glob(".*.tmp*")), list(out.iterdir())
