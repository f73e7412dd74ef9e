"""Where ``sat figures`` / ``sat bench`` find the studies (``sat_theory.commands._studies``):
``--experiments DIR``, else ``$SAT_EXPERIMENTS``, else the package's own checkout; loaded by
path, never by editing ``sys.path``; a missing folder is one line and exit 2."""

from __future__ import annotations

import sys
import textwrap

import pytest

from sat_theory.cli import main
from sat_theory.commands import _studies

_NAMES = ("experiments", "_common", "bench_")


@pytest.fixture
def clean_modules():
    """The studies' modules are process-wide: hide those already imported (the checkout's
    ``experiments``) and drop what the test loads, so other tests see the checkout again."""
    saved = {k: v for k, v in sys.modules.items() if k.startswith(_NAMES)}
    for k in saved:
        del sys.modules[k]
    path = list(sys.path)
    yield path
    for k in [k for k in sys.modules if k.startswith(_NAMES)]:
        del sys.modules[k]
    sys.modules.update(saved)


def _studies_folder(root, tag: str):
    """A synthetic ``experiments/`` whose one study records where it was loaded from."""
    folder = root / "experiments"
    (folder / "benchmarks").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "common.py": """
            from dataclasses import dataclass
            @dataclass
            class Options:
                out: object; quick: bool; seeds: object; executor: str; workers: object
                ray_address: object
        """,
        "fig_n_scaling.py": f"""
            import json, sys
            from experiments.common import Options  # the studies import each other so
            def run(opts):
                p = opts.out / "where.json"
                p.write_text(json.dumps({{"tag": {tag!r}, "name": __name__,
                                         "sys_path": sys.path}}))
                return [p]
        """,
        "benchmarks/_common.py": "TAG = " + repr(tag) + "\n",
        "benchmarks/bench_eval.py": "from _common import TAG\n",
    }
    for name, text in files.items():
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def test_figures_runs_the_studies_of_the_experiments_folder_given_without_editing_sys_path(
        tmp_path, clean_modules, capsys):
    import json

    folder = _studies_folder(tmp_path / "checkout", "given")
    out = tmp_path / "out"
    rc = main(["figures", "--experiments", str(folder), "--only", "fig_n_scaling", "--out",
               str(out), "--no-report"])
    assert rc == 0, capsys.readouterr().err
    got = json.loads((out / "where.json").read_text())
    assert got["tag"] == "given" and got["name"] == "experiments.fig_n_scaling"
    assert got["sys_path"] == clean_modules and sys.path == clean_modules
    assert sys.modules["experiments"].__file__ == str(folder / "__init__.py")


def test_the_environment_variable_names_the_folder_below_the_flag(tmp_path, clean_modules,
                                                                 monkeypatch):
    env = _studies_folder(tmp_path / "env", "env")
    flag = _studies_folder(tmp_path / "flag", "flag")
    monkeypatch.setenv(_studies.ENV, str(env))
    assert _studies.experiments_dir() == env.resolve()
    assert _studies.experiments_dir(str(flag)) == flag.resolve()
    assert _studies.import_bench("bench_eval").TAG == "env"
    assert sys.path == clean_modules


def test_without_a_checkout_figures_and_bench_say_what_to_pass_in_one_line(
        tmp_path, clean_modules, monkeypatch, capsys):
    """A wheel install: no ``experiments/`` next to ``sat_theory`` and nothing given."""
    monkeypatch.delenv(_studies.ENV, raising=False)
    monkeypatch.setattr(_studies, "checkout_experiments", lambda: tmp_path / "experiments")
    for argv in (["figures", "--quick", "--out", str(tmp_path / "o")], ["bench", "--smoke"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"sat {argv[0]}: error: ")
        assert "--experiments DIR" in err[0] and _studies.ENV in err[0]
    assert not (tmp_path / "o").exists()  # refused before anything is written
    assert main(["figures", "--experiments", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a studies folder" in capsys.readouterr().err


def test_a_second_checkouts_studies_are_refused_in_the_same_process(tmp_path, clean_modules):
    from sat_theory.errors import InputError

    a = _studies_folder(tmp_path / "a", "a")
    b = _studies_folder(tmp_path / "b", "b")
    assert _studies.import_study("common", str(a)).__file__ == str(a / "common.py")
    assert _studies.import_study("common", str(a)) is sys.modules["experiments.common"]
    with pytest.raises(InputError, match="already loaded"):
        _studies.import_study("common", str(b))


def test_the_checkout_of_the_running_package_is_the_default(clean_modules, monkeypatch):
    from pathlib import Path

    monkeypatch.delenv(_studies.ENV, raising=False)
    root = Path(__file__).resolve().parents[2]
    assert _studies.experiments_dir() == root / "experiments"
    assert _studies.bench_dir() == root / "experiments" / "benchmarks"
