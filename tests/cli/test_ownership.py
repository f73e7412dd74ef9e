"""Own only what is ours: run folders carry a marker, ``--overwrite`` and cleanup delete only
the entries a run writes (after the lock is held), ``--out`` inside or above a run is
refused, a refused run leaves the folder as it was, replacements are atomic."""

from __future__ import annotations

import os
import signal

import pytest

from sat_theory import ownership
from sat_theory.cli import main
from sat_theory.errors import InputError
from tests.faults import interrupt_after  # noqa: E402

RUN = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "1",
       "--quiet", "--report-to", "none"]


def _refused(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def run(tmp_path):
    out = tmp_path / "run"
    assert main(RUN + ["--out", str(out)]) == 0
    return out


def test_a_run_folder_carries_its_marker(run):
    assert ownership.read_marker(run) == "run"
    assert ownership.kind_of(run) == "run"


def test_overwrite_keeps_files_a_run_did_not_write(run, capsys):
    for name in ("notes.txt", "eval_notes.jsonl", ".draft.tmp.txt", "eval_3.jsonl.bak"):
        (run / name).write_text("mine")
    (run / "data").mkdir()
    (run / "data" / "x.csv").write_text("1")
    assert main(RUN + ["--out", str(run), "--overwrite"]) == 0
    for name in ("notes.txt", "eval_notes.jsonl", ".draft.tmp.txt", "eval_3.jsonl.bak",
                 "data/x.csv"):
        assert (run / name).read_text() in ("mine", "1"), name
    assert (run / "checkpoint.safetensors").is_file()  # the run itself was replaced


def test_overwrite_refuses_a_folder_without_the_marker(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in ("config.json", "metrics.jsonl", "eval_1.jsonl"):
        (docs / name).write_text('{"mine": true}\n')
    for name in ("agents", "policies", "tb"):
        (docs / name).mkdir()
        (docs / name / "keep.txt").write_text("mine")
    before = _tree(docs)
    _refused(capsys, main(RUN + ["--out", str(docs), "--overwrite"]), "nothing was deleted")
    assert _tree(docs) == before and (docs / "config.json").read_text() == '{"mine": true}\n'


def test_a_run_written_before_markers_resumes_but_is_never_overwritten(run, capsys):
    (run / ownership.RUN_MARKER).unlink()
    before = _tree(run)
    _refused(capsys, main(RUN + ["--out", str(run), "--overwrite"]), "not a sat run folder")
    assert _tree(run) == before
    assert main(["train", "--resume", str(run), "--stages", "2", "--quiet"]) == 0


def test_out_inside_or_above_a_run_is_refused(run, capsys):
    _refused(capsys, main(RUN + ["--out", str(run / "sub")]), "inside the run folder")
    assert not (run / "sub").exists()
    parent = run.parent
    _refused(capsys, main(RUN + ["--out", str(parent), "--overwrite"]), "contains the run")
    assert not (parent / "config.json").exists() and not (parent / ".lock").exists()


def test_opening_a_run_folder_deletes_no_file_before_its_checks(tmp_path, capsys):
    """A refused resume deletes nothing (it used to remove every ``.*.tmp*`` first)."""
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / ".thesis.tmp1").write_text("mine")
    (folder / ".config.json.tmp123").write_text("looks like ours, but no run is here")
    _refused(capsys, main(["train", "--resume", str(folder), "--quiet"]), "no run to resume")
    assert sorted(os.listdir(folder)) == [".config.json.tmp123", ".thesis.tmp1"]


def test_resume_removes_only_the_runners_exact_temp_names(run, capsys):
    torn = run / f".checkpoint.safetensors.tmp{os.getpid() + 1}"
    torn.write_bytes(b"torn")
    (run / ".notes.tmp.txt").write_text("mine")
    (run / ".checkpoint.safetensors.tmpX").write_text("mine too: not a pid")
    assert main(["train", "--resume", str(run), "--stages", "2", "--quiet"]) == 0
    assert not torn.exists()
    assert (run / ".notes.tmp.txt").exists() and (run / ".checkpoint.safetensors.tmpX").exists()


def test_a_refused_run_leaves_no_lock_and_no_folder(tmp_path, capsys):
    missing = tmp_path / "missing"
    _refused(capsys, main(["train", "--resume", str(missing), "--quiet"]), "no run to resume")
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(capsys, main(["train", "--resume", str(empty), "--quiet"]), "no run to resume")
    assert os.listdir(empty) == []


def test_run_entries_are_exact_names():
    ours = ["config.json", "metrics.jsonl", "checkpoint.safetensors", "eval_0.jsonl",
            "eval_12_swap.jsonl", "policies", "tb", ".metrics.jsonl.tmp77", ".eval_3.jsonl.tmp9"]
    theirs = ["notes.txt", "eval_x.jsonl", "eval_1.jsonl.bak", ".notes.tmp1", ".config.json.tmp",
              ".config.json.tmp1.txt", "config.json.tmp1", "tb2", ".lock", ".sat-run"]
    assert all(ownership.is_run_entry(n) for n in ours)
    assert not any(ownership.is_run_entry(n) for n in theirs)


def test_a_marker_cannot_widen_what_is_deleted(tmp_path):
    """The marker's own list is informational: a crafted one naming other files deletes
    nothing beyond the runner's entries."""
    f = tmp_path / "r"
    f.mkdir()
    ownership.write_marker(f, "run", ["precious.txt", "../outside"])
    (f / "precious.txt").write_text("mine")
    (f / "metrics.jsonl").write_text("")
    (tmp_path / "outside").write_text("mine")
    assert ownership.remove_run_entries(f) == ["metrics.jsonl"]
    assert (f / "precious.txt").exists() and (tmp_path / "outside").exists()
    g = tmp_path / "g"
    g.mkdir()
    (g / "metrics.jsonl").write_text("")
    with pytest.raises(InputError, match="nothing was deleted"):
        ownership.remove_run_entries(g)
    assert (g / "metrics.jsonl").exists()


def test_an_interrupted_replacement_leaves_the_new_folder_whole(tmp_path, monkeypatch):
    out, new = tmp_path / "out", tmp_path / ".out.tmp1"
    for d, text in ((out, "old"), (new, "new")):
        d.mkdir()
        for k in range(3):
            (d / f"f{k}").write_text(text)
    fired = interrupt_after(monkeypatch, out, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        ownership.replace_folder(new, out)
    assert fired
    assert [(out / f"f{k}").read_text() for k in range(3)] == ["new"] * 3
    assert sorted(os.listdir(tmp_path)) == ["out"]  # nothing aside, nothing temporary


def test_a_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "f").write_text("old")
    with pytest.raises(OSError):
        ownership.replace_folder(tmp_path / "does-not-exist", out)
    assert (out / "f").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_special_files_are_refused(tmp_path):
    fifo = tmp_path / "p.npz"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="FIFO"):
        ownership.regular_file(fifo)
    link = tmp_path / "zero.jsonl"
    link.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="device"):
        ownership.regular_file(link)
    (tmp_path / "ok").write_text("x")
    assert ownership.regular_file(tmp_path / "ok") == tmp_path / "ok"
