"""Issue 15 leftovers: pool workers die with their parent, a torn ``timings.json`` does not
block ``sat figures``, non-UTF-8 JSONL is one input-error line, the README's Python API
example runs, ``sat plot`` refuses to mix backends, ``sat bench --out/--strict``, and the
exit-code contract of item 8 (internal errors, quiet stderr, temporary files on signals)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ pool workers
def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an orphan's zombie waits for its reaper)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    if stat.exists():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False
    return True


POOL_SCRIPT = """
import functools, os, sys, time
import sat_theory.executor as E
from sat_theory.executor import map_tasks

if sys.argv[2] == "poll":  # the watcher thread of systems without prctl
    E._die_with_parent = functools.partial(E._die_with_parent, poll_s=0.1, prctl=False)

def hold(path):
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(600)

map_tasks(hold, [os.path.join(sys.argv[1], f"w{k}") for k in range(2)],
          executor="process", workers=2)
"""


@pytest.mark.parametrize("mode", ["prctl", "poll"])
def test_process_pool_workers_die_with_a_killed_parent(tmp_path, mode):
    if mode == "prctl" and not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux-only")
    parent = subprocess.Popen([sys.executable, "-c", POOL_SCRIPT, str(tmp_path), mode], cwd=ROOT)
    files = [tmp_path / "w0", tmp_path / "w1"]
    try:
        deadline = time.monotonic() + 120  # a loaded CI machine starts interpreters slowly
        while not all(f.exists() for f in files):
            assert parent.poll() is None, "the pool script failed"
            assert time.monotonic() < deadline, "the workers never started"
            time.sleep(0.1)
        pids = [int(f.read_text()) for f in files]
        assert all(_alive(p) for p in pids)
    finally:
        parent.kill()  # SIGKILL: the parent runs no clean-up at all
        parent.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for p in left:  # do not leave orphans behind when the test fails
        os.kill(p, signal.SIGKILL)
    assert not left, f"pool workers {left} outlived their killed parent"


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


# ------------------------------------------------------------------ non-UTF-8 files, sat plot
def _tabular_run(out: Path) -> Path:
    from sat_theory import cli

    assert cli.main(["train", "--env", "bandit", "--stages", "2", "--quiet",
                     "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("name", ["metrics.jsonl", "config.json"])
def test_non_utf8_run_files_are_one_input_error_line(tmp_path, capsys, name):
    from sat_theory import cli

    run = _tabular_run(tmp_path / "r")
    path = run / name
    data = path.read_bytes()
    path.write_bytes(data.replace(b'"', b'"\xff', 1))  # one Latin-1 byte after the first quote
    line = data[:data.index(b'"')].count(b"\n") + 1
    capsys.readouterr()
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sat plot: error:")
    assert f"{name}: line {line} is not UTF-8 text (byte 0xff" in err[0]


def test_a_config_json_that_is_not_json_is_an_input_error(tmp_path, capsys):
    from sat_theory import cli

    run = _tabular_run(tmp_path / "r")
    (run / "config.json").write_text('{"algorithm": ')
    capsys.readouterr()
    assert cli.main(["plot", str(run), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "config.json: not valid JSON" in err[0]


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


# ------------------------------------------------------------------ sat verify --help
def test_verify_help_names_the_projects_theory_document(capsys):
    from sat_theory import cli
    from sat_theory.commands import verify

    assert cli.main(["verify", "--help"]) == 0
    text = capsys.readouterr().out
    assert verify.THEORY_DOC in " ".join(text.split()) and "THEORY.md" not in text
    assert (ROOT / verify.THEORY_DOC).is_file()
    assert "THEORY.md" not in (verify.__doc__ or "")


# ------------------------------------------------------------------ sat bench
def _reference_results() -> dict:
    from sat_theory.commands.bench import bench_dir

    return {p: p.stat().st_mtime_ns for p in (bench_dir() / "results").rglob("*.json")}


def test_bench_writes_to_out_and_strict_exits_1_on_a_miss(tmp_path, capsys, monkeypatch):
    from sat_theory import cli
    from sat_theory.commands.bench import MISSED_NOTE, bench_dir, out_folder

    before = _reference_results()
    out = tmp_path / "o"
    argv = ["bench", "--smoke", "--only", "certificate", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    result = json.loads((out / "bench_certificate.json").read_text())
    assert result["benchmark"] == "certificate" and f"results: {out}" in text
    assert _reference_results() == before  # the source tree's reference results untouched
    # a goal no run can reach: MISSED, explained; --strict turns it into exit status 1
    monkeypatch.syspath_prepend(str(bench_dir()))
    import _common
    import bench_certificate

    monkeypatch.setattr(bench_certificate, "target_line",
                        lambda name, value, goal, **kw: _common.target_line(name, value, 1e300, **kw))
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "MISSED" in text and MISSED_NOTE in " ".join(text.split())
    assert cli.main(argv + ["--strict"]) == 1
    capsys.readouterr()
    assert cli.main(argv + ["--strict", "--json"]) == 1
    assert not any(t["met"] for t in json.loads(capsys.readouterr().out)["targets"])
    # defaults: ./bench_out (relative, so never the source tree's results/), a temporary
    # folder for --smoke; a file as --out is refused
    assert out_folder(None, False) == (Path("bench_out"), None)
    folder, tmp = out_folder(None, True)
    assert folder.is_dir() and bench_dir() not in folder.parents
    tmp.cleanup()
    (tmp_path / "f").write_text("x")
    assert cli.main(["bench", "--smoke", "--only", "certificate", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


# ------------------------------------------------------------------ README Python API
def readme_api_example() -> str:
    """The first ```python block of README.md's "## Python API" section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_readme_python_api_example_runs_as_written(tmp_path, monkeypatch, capsys):
    code = readme_api_example()
    monkeypatch.chdir(tmp_path)  # whatever it writes stays out of the checkout
    exec(compile(code, "README.md (Python API)", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[0].startswith("J = ") and out[0].endswith(": True")
    j_start, j_end = (float(x) for x in out[1].removeprefix("J ").split(" -> "))
    assert j_end > j_start  # SAT's stages improved the team (exact mode, monotone)
    assert not list(tmp_path.iterdir())


def test_readme_sat_trainer_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """The second ```python block: ``SATTrainer`` on the tiny random model (seconds)."""
    pytest.importorskip("torch")
    pytest.importorskip("datasets")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n")[2].split("\n```", 1)[0]
    assert "SATTrainer(" in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md (SATTrainer)", "exec"), {"__name__": "__readme__"})
    (line,) = capsys.readouterr().out.splitlines()
    start, end = (float(x) for x in line.removeprefix("held-out reward ").split(" -> "))
    assert 0 <= start <= 1 and 0 <= end <= 1
    assert not list(tmp_path.iterdir())  # everything went to the temporary directory


# ------------------------------------------------------------------ item 8: exit-code contract
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


# ------------------------------------------------------------------ UTF-8 checks
@settings(max_examples=60)
@given(text=st.text(max_size=40), bad=st.integers(0, 40), chunk=st.integers(1, 8),
       byte=st.sampled_from([0xFF, 0x80, 0xC3]))
def test_streamed_utf8_check_agrees_with_reading_the_whole_file(tmp_path_factory, text, bad,
                                                                 chunk, byte):
    """Any text passes in any chunk size (characters cut at a chunk boundary are carried);
    one invalid byte anywhere is reported at the same line and offset as read_utf8."""
    from sat_theory.errors import InputError
    from sat_theory.fileio import check_utf8, read_utf8

    path = tmp_path_factory.mktemp("u") / "f.jsonl"
    data = text.encode()
    path.write_bytes(data)
    check_utf8(path, chunk=chunk)
    assert read_utf8(path) == text
    k = min(bad, len(data))
    while k < len(data) and (data[k] & 0xC0) == 0x80:  # not inside a character
        k += 1
    path.write_bytes(data[:k] + bytes([byte]) + b"\n" + data[k:])
    with pytest.raises(InputError) as whole:
        read_utf8(path)
    with pytest.raises(InputError) as streamed:
        check_utf8(path, chunk=chunk)
    assert str(streamed.value) == str(whole.value)
    line = data[:k].count(b"\n") + 1
    assert f"line {line} is not UTF-8 text (byte 0x{byte:02x} at offset {k})" in str(whole.value)


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_non_utf8_prompts_file_is_one_input_error_line(tmp_path, capsys, monkeypatch, suffix):
    """``sat train --backend llm --jsonl FILE`` (the dataset reader): exit 2, one line, before
    any model loads (the model named does not exist: reaching it would fail differently)."""
    pytest.importorskip("datasets")
    from sat_theory import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    path = tmp_path / f"prompts{suffix}"
    rows = ([b'{"prompt": "1+1", "answer": "2"}', b'{"prompt": "caf\xe9", "answer": "3"}']
            if suffix == ".jsonl" else [b"prompt,answer", b"1+1,2", b"caf\xe9,3"])
    path.write_bytes(b"\n".join(rows) + b"\n")
    argv = ["train", "--backend", "llm", "--model", str(tmp_path / "no-model"), "--jsonl",
            str(path), "--stages", "1", "--quiet", "--out", str(tmp_path / "r")]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sat train: error:")
    line = 2 if suffix == ".jsonl" else 3
    assert f"line {line} is not UTF-8 text (byte 0xe9" in err[0]


# ------------------------------------------------------------------ item 1: layering
LAYERS_SCRIPT = """
import sys
import sat_theory, sat_theory.runner, sat_theory.backends, sat_theory.tabular_team
assert not [m for m in sys.modules if m.split(".")[0] == "sat_llm"], "the core imported sat_llm"
assert "llm" not in sat_theory.backends.BACKENDS  # the core does not name sat_llm
import sat_llm.backend, sat_llm.trainer
deferred = ("sat_theory.commands", "sat_theory.commands._io")  # JSON helpers (test_layering)
assert not [m for m in sys.modules if m.startswith("sat_theory.commands") and m not in deferred]
assert sat_theory.runner.load_backend("llm").__module__ == "sat_llm.backend"
import sat_theory.commands.train  # the command line registers it too
assert sat_theory.backends.BACKENDS["llm"] == "sat_llm.backend:LLMBackend"
"""


def test_backends_come_from_the_registry_without_an_import_circle():
    """The core never imports ``sat_llm`` (nor the command line); the LLM backend registers
    itself in ``sat_theory.backends`` (tests/test_layering.py checks every module's imports)."""
    pytest.importorskip("torch")
    r = subprocess.run([sys.executable, "-c", LAYERS_SCRIPT], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
