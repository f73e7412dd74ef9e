"""Quiet, conventional output: progress bars only on a terminal (``--verbose``: always,
``--quiet``: never, third-party bars included), bars inside an LLM agent update, and no
third-party FutureWarning when an LLM team is built."""

import os
import warnings

import numpy as np
import pytest

from sat_theory import progress
from sat_theory.cli import main

TRAIN = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "3",
         "--report-to", "none"]


@pytest.fixture(autouse=True)
def _default_level():
    yield
    progress._level = progress.NORMAL  # the level is process-wide; leave the default behind


class _Terminal:
    """A stand-in stderr that says it is a terminal."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_bars_only_on_a_terminal_unless_verbose_or_quiet(monkeypatch):
    progress.configure()
    assert not progress.enabled()  # pytest's stderr is not a terminal
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    assert progress.enabled()
    with progress.bar(3, desc="shown on a terminal") as b:
        b.update(3)
    assert "shown on a terminal" in term.text
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    progress.configure(quiet=True)
    assert not progress.enabled()
    assert progress.bar(3, desc="x").disable
    assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # for hub/transformers imported later


def test_quiet_silences_transformers_bars(monkeypatch):
    logging = pytest.importorskip("transformers.utils.logging")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")
    logging.enable_progress_bar()
    try:
        progress.configure(quiet=True)
        assert not logging.is_progress_bar_enabled()  # "Loading weights" and the like
    finally:
        monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # else re-enabling is refused
        logging.enable_progress_bar()


def test_default_run_off_a_terminal_prints_only_the_summary(tmp_path, capsys):
    assert main(TRAIN + ["--out", str(tmp_path / "r")]) == 0
    cap = capsys.readouterr()
    assert cap.err == ""
    assert len(cap.out.splitlines()) == 1 and cap.out.startswith("sat: 3 stages")


def test_verbose_prints_bars_and_one_line_per_stage(tmp_path, capsys):
    assert main(TRAIN + ["--out", str(tmp_path / "r"), "--verbose"]) == 0
    cap = capsys.readouterr()
    assert "sat train sat" in cap.err  # the bar, although stderr is not a terminal
    lines = [ln for ln in cap.err.replace("\r", "\n").splitlines() if ln.startswith("stage ")]
    assert [ln.split(":")[0] for ln in lines] == ["stage 0", "stage 1", "stage 2"]
    assert all(" -> " in ln and "lower bound" in ln for ln in lines)
    assert len(cap.out.splitlines()) == 1


def test_quiet_and_verbose_together_is_one_line_exit_2(tmp_path, capsys):
    rc = main(TRAIN + ["--out", str(tmp_path / "r"), "--quiet", "--verbose"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "cannot be combined" in err


def test_resume_takes_quiet_verbose_and_report_to(tmp_path, capsys):
    out = str(tmp_path / "r")
    assert main(TRAIN + ["--out", out, "--quiet"]) == 0
    assert main(["train", "--resume", out, "--stages", "4", "--verbose", "--report-to", "none"]) == 0
    assert "stage 3:" in capsys.readouterr().err


# ------------------------------------------------------------------ inside an LLM update
def test_llm_update_has_bars_inside_and_no_future_warning(capsys):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from tests.llm.helpers import make_team  # the tiny team whose rewards vary in a group

    progress.configure(verbose=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        team = make_team(agents=2)
        batch = team.rollout(2, 2)
        snap = team.snapshot(0)
        adv = np.linspace(-1.0, 1.0, len(batch.turns_of(0)))
        info = team.update(0, batch, adv, 0.1, snap)
        team.kl(0, batch, snap)
        team.evaluate()
    assert info["opt_steps"] >= 1
    future = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert not future, future
    err = capsys.readouterr().err
    for desc in ("rollout", "generation", "reference scoring (agent 0)", "update (agent 0)",
                 "KL monitor (agent 0)", "evaluation (greedy)"):
        assert desc in err, desc


def test_off_a_terminal_a_long_run_writes_periodic_progress_lines(tmp_path, capsys, monkeypatch):
    """A log file, CI or nohup used to see nothing until the end (30 minutes for the LLM
    study); now one plain line per interval names the run's progress (interval 0 here: a
    line per update; the default 60 s keeps short commands silent, as above)."""
    monkeypatch.setenv("SAT_PROGRESS_INTERVAL", "0")
    assert main(TRAIN + ["--out", str(tmp_path / "r")]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines and all("\r" not in ln for ln in lines)
    assert lines[-1].startswith("sat train sat: 6/6 step (100%)"), lines
    assert main(TRAIN + ["--out", str(tmp_path / "q"), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
