"""experiments/recompute_llm_study.py: the independent recomputation of the issue-21 study's
per-run numbers (runs.json) from the committed eval files."""

import ast
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "recompute_llm_study.py"
STUDY = ROOT / "figures" / "llm_team_learning" / "v2"
RUN = "plain_lr0.001_s0"  # ours: has KL per update; its last checkpoint is eval_48


def run_script(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def copy_study(tmp_path: Path, names: list[str]) -> Path:
    """A study folder holding only the runs ``names`` and their entries of runs.json."""
    out = tmp_path / "v2"
    out.mkdir()
    runs = json.loads((STUDY / "runs.json").read_text())
    (out / "runs.json").write_text(json.dumps({n: runs[n] for n in names}))
    for n in names:
        shutil.copytree(STUDY / n, out / n, ignore=shutil.ignore_patterns("ckpt", "tb"))
    return out


def flip_first_record(path: Path, keys: tuple[str, ...]) -> None:
    lines = path.read_text().splitlines()
    rec = json.loads(lines[0])
    for k in keys:
        rec[k] = 1.0 - float(rec[k])
    lines[0] = json.dumps(rec)
    path.write_text("\n".join(lines) + "\n")


def test_committed_study_matches_runs_json():
    r = run_script()  # the default folder is the committed v2 study
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads((STUDY / "runs.json").read_text())
    ok = {line.split()[1] for line in r.stdout.splitlines() if line.startswith("ok ")}
    assert set(runs) <= ok
    assert f"{len(runs)} runs in runs.json: {len(runs)} match, 0 differ" in r.stdout


@pytest.mark.parametrize("scoring,keys", [("lenient", ("score", "lenient")),
                                          ("strict", ("strict",))])
def test_flipped_eval_score_fails_naming_run_and_field(tmp_path, scoring, keys):
    out = copy_study(tmp_path, [RUN, "tune/trl_lr0.001_s0"])
    assert run_script(out).returncode == 0  # the copy matches before the flip
    flip_first_record(out / RUN / "eval_48.jsonl", keys)
    r = run_script(out)
    assert r.returncode == 1
    fail = [line for line in r.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fail) == 1 and fail[0].startswith(f"FAIL {RUN}:")
    assert f"{scoring}.final recomputed=" in fail[0] and f"{scoring}.auc recomputed=" in fail[0]
    assert "ok   tune/trl_lr0.001_s0" in r.stdout
    assert "2 runs in runs.json: 1 match, 1 differ" in r.stdout


def test_score_and_lenient_fields_disagreeing_is_a_failure(tmp_path):
    out = copy_study(tmp_path, [RUN])
    flip_first_record(out / RUN / "eval_0.jsonl", ("lenient",))
    r = run_script(out)
    assert r.returncode == 1
    assert "eval_0: lenient != score" in r.stdout


def test_run_in_runs_json_without_its_folder_fails(tmp_path):
    out = copy_study(tmp_path, [RUN])
    shutil.rmtree(out / RUN)
    r = run_script(out)
    assert r.returncode == 1
    assert f"FAIL {RUN}: in runs.json but no finished run folder" in r.stdout


def test_finished_run_missing_from_runs_json_is_listed_not_failed(tmp_path):
    out = copy_study(tmp_path, [RUN])
    (out / "runs.json").write_text("{}")
    r = run_script(out)
    assert r.returncode == 0
    assert f"note {RUN}: finished but not in runs.json" in r.stdout


def test_missing_folder_exits_2_with_one_line(tmp_path):
    r = run_script(tmp_path / "nowhere")
    assert r.returncode == 2
    assert r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "no such folder" in r.stderr and "Traceback" not in r.stderr


def test_unreadable_json_exits_2_with_one_line(tmp_path):
    out = copy_study(tmp_path, [RUN])
    (out / RUN / "eval_4.jsonl").write_text('{"id": 0, "score": \n')
    r = run_script(out)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "eval_4.jsonl" in r.stderr
    assert "Traceback" not in r.stderr


def test_help_describes_the_formulas():
    r = run_script("--help")
    assert r.returncode == 0
    for word in ("auc", "drawdown", "worst_drop", "below_untrained", "kl_per_update", "1e-9"):
        assert word in r.stdout


def test_script_imports_nothing_from_the_project():
    tree = ast.parse(SCRIPT.read_text())
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    froms = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert not [n.module for n in froms if n.level]  # no relative import
    names += [n.module for n in froms]
    assert names
    assert not [m for m in names if m.split(".")[0] in ("sat_llm", "sat_theory", "experiments")]
    assert {m.split(".")[0] for m in names} <= set(sys.stdlib_module_names) | {"numpy"}


def test_curve_metrics_of_a_hand_computed_curve():
    spec = importlib.util.spec_from_file_location("recompute_llm_study", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = mod.curve_metrics([0.5, 0.7, 0.4, 0.6])
    expect = dict(auc=0.55, final=0.6, best=0.7, drawdown=0.1, worst_drop=0.3,
                  below_untrained=1 / 3)
    assert m == pytest.approx(expect, abs=1e-12)
    assert mod.curve_metrics([0.3]) == dict(auc=0.3, final=0.3, best=0.3, drawdown=0.0,
                                            worst_drop=0.0, below_untrained=0.0)
