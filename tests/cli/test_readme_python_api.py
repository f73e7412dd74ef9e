"""The README's "Python API" examples run as written: the tabular example (exact mode, J
improves) and ``SATTrainer`` on the tiny random model."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
