"""One signal contract for every command: SIGINT and SIGTERM end ``sat CMD`` with exit 130
and one ``interrupted`` line, after the command's temporary files are removed (SIGTERM used
to be handled by ``sat train`` only: export, figures, team … died with 143 and export left
its temporary folder)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from sat_theory.cli import COMMANDS

#: minimal argv per command (parsing must pass; the command's run() is replaced)
ARGV = {"eval": ["eval", "m.npz", "--policy", "p.npz"],
        "certify": ["certify", "m.npz", "--current", "a.npz", "--target", "b.npz"],
        "verify": ["verify"], "train": ["train"], "figures": ["figures", "--out", "f"],
        "plot": ["plot", "r"], "bench": ["bench"], "export": ["export", "r", "--out", "e"],
        "team": ["team", "r", "--prompt", "hi"]}

_CHILD = textwrap.dedent("""
    import importlib, os, signal, sys, time
    from sat_theory import cli
    name, sig = sys.argv[1], getattr(signal, sys.argv[2])
    module = importlib.import_module(cli.COMMANDS[name][0])
    def run(args):
        os.kill(os.getpid(), sig)
        time.sleep(30)  # the signal must end the command long before this
        return 0
    module.run = run
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job ignores it
    sys.exit(cli.main(sys.argv[3:]))
""")


def _child(args, tmp_path, timeout=120):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", _CHILD, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_every_command_has_an_argv_here():
    assert set(ARGV) == set(COMMANDS)


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_signal_ends_every_command_with_130(name, sig, tmp_path):
    if name in ("export", "team"):
        pytest.importorskip("torch")
    argv = ARGV[name]
    if name == "certify":
        from sat_theory.cli import build_parser

        p = build_parser(only="certify").commands["certify"]
        pos = [a.dest for a in p._actions if not a.option_strings and a.dest != "help"]
        argv = ["certify", *["x.npz"] * len(pos), "--current", "a.npz", "--target", "b.npz"]
    r = _child([name, sig, *argv], tmp_path)
    assert r.returncode == 130, (r.returncode, r.stderr[-500:])
    assert r.stderr.strip().splitlines()[-1] == f"sat {name}: interrupted"


def test_sigterm_during_export_removes_its_temporary_folder(tmp_path):
    """A real export, terminated while the new folder is being assembled: exit 130, no
    ``.OUT.tmp*`` left, nothing at --out."""
    pytest.importorskip("peft")
    from sat_theory.cli import main

    run = tmp_path / "run"
    assert main(["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
                 "--agents", "2", "--stages", "1", "--prompts", "2", "--group-size", "2",
                 "--max-new-tokens", "4", "--n-train", "8", "--n-eval", "2", "--quiet",
                 "--threads", "1", "--report-to", "none", "--out", str(run)]) == 0
    child = textwrap.dedent("""
        import os, signal, sys
        import sat_llm.export as e
        card = e._model_card
        def killed(*a):
            os.kill(os.getpid(), signal.SIGTERM)
            return card(*a)
        e._model_card = killed
        from sat_theory.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    r = subprocess.run([sys.executable, "-c", child, "export", str(run), "--out",
                        str(tmp_path / "ex")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 130, r.stderr[-500:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
