"""``sat verify``'s file checks run ``sat eval`` as a user does: through the installed ``sat``
console-script entry point (the verify suite imports no command-line module)."""

from __future__ import annotations

import importlib.metadata

from sat_theory.verify import load_checks


def test_file_round_trip_runs_the_installed_sat_command():
    res = load_checks()["file_round_trip"].fn(quick=True, seed=0, mutation=None)
    assert res.passed and res.violations == 0 and "sat eval --json agrees" in res.findings[-1]


def test_without_an_installed_sat_command_the_check_fails_saying_so(monkeypatch):
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kw: [])
    res = load_checks()["file_round_trip"].fn(quick=True, seed=0, mutation=None)
    assert not res.passed
    assert any("exit 127" in f and "not installed" in f for f in res.findings)
