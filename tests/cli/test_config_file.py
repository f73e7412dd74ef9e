"""``sat train --config FILE``: TOML settings with command-line overrides, and a run's own
config.json fed back reproduces the run record for record."""

import json

import pytest

from sat_theory.cli import main


def _records(run):
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        r.pop("seconds", None)  # wall time, the one field a rerun does not reproduce
        r.pop("peak_memory_bytes", None)  # resident memory of the process
        out.append(r)
    return out


def _one_line_error(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err


@pytest.mark.parametrize("flags", [
    ["--env", "random-turn", "--agents", "2", "--states", "4", "--groups", "2",
     "--group-size", "3", "--order", "1,0", "--method", "naive", "--no-std-norm"],
    ["--env", "coordination", "--delta", "0.02", "--no-adv-clip", "--save-policies"],
])
def test_a_runs_config_json_reproduces_it(tmp_path, capsys, flags):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", *flags, "--stages", "2", "--seed", "3", "--out", str(a), "--quiet"]) == 0
    assert main(["train", "--config", str(a / "config.json"), "--out", str(b), "--quiet"]) == 0
    assert json.loads((a / "config.json").read_text()) == json.loads((b / "config.json").read_text())
    assert _records(a) == _records(b) and len(_records(a)) > 2
    # a flag typed on the command line overrides the file
    c = tmp_path / "c"
    assert main(["train", "--config", str(a / "config.json"), "--delta", "0.04", "--out", str(c),
                 "--quiet"]) == 0
    assert json.loads((c / "config.json").read_text())["algorithm"]["delta"] == 0.04
    assert _records(c) != _records(a)


def test_toml_settings_and_overrides(tmp_path):
    f = tmp_path / "run.toml"
    f.write_text('env = "random-simultaneous"\nagents = 2\nstates = 3\n\n[algorithm]\n'
                 'stages = 3\ndelta = 0.02\ngroup-size = 2\ngroups = 2\nsave_policies = true\n')
    out = tmp_path / "r"
    assert main(["train", "--config", str(f), "--stages", "2", "--out", str(out), "--quiet"]) == 0
    alg = json.loads((out / "config.json").read_text())["algorithm"]
    assert (alg["stages"], alg["delta"], alg["group_size"], alg["n_groups"]) == (2, 0.02, 2, 2)
    assert (out / "policies" / "stage2.npz").is_file()
    # the same settings typed as flags give the same run
    typed = tmp_path / "t"
    assert main(["train", "--env", "random-simultaneous", "--agents", "2", "--states", "3",
                 "--stages", "2", "--delta", "0.02", "--group-size", "2", "--groups", "2",
                 "--save-policies", "--out", str(typed), "--quiet"]) == 0
    assert _records(out) == _records(typed)


@pytest.mark.parametrize("text, pattern", [
    ('colour = "red"\n', "'colour' is not a setting"),
    ('stages = "many"\n', "--stages: must be"),
    ("save-policies = 3\n", "is a switch"),
    ('out = "elsewhere"\n', "give it on the command line"),
    ("stages = [\n", "not valid TOML"),
    ("stages = 1\n[x]\nstages = 2\n", "appears twice"),
    ("delta = nan\n", "--delta: must be"),
])
def test_bad_toml_is_one_line(tmp_path, capsys, text, pattern):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    rc = main(["train", "--config", str(f), "--env", "bandit", "--out", str(tmp_path / "o")])
    _one_line_error(capsys, rc, pattern)
    assert not (tmp_path / "o" / "metrics.jsonl").exists()


def test_bad_config_files_are_one_line(tmp_path, capsys):
    _one_line_error(capsys, main(["train", "--config", str(tmp_path / "none.toml"), "--out",
                                  str(tmp_path / "o")]), "not found")
    j = tmp_path / "x.json"
    j.write_text('{"a": 1}')
    _one_line_error(capsys, main(["train", "--config", str(j), "--out", str(tmp_path / "o")]),
                    "not a run's config.json")
    y = tmp_path / "x.yaml"
    y.write_text("a: 1")
    _one_line_error(capsys, main(["train", "--config", str(y), "--out", str(tmp_path / "o")]),
                    "must be .toml")
    t = tmp_path / "ok.toml"
    t.write_text("stages = 1\n")
    _one_line_error(capsys, main(["train", "--config", str(t), "--resume", str(tmp_path)]),
                    "use one")


def test_llm_config_json_reproduces_the_run(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
                 "--agents", "2", "--stages", "1", "--prompts", "2", "--group-size", "2",
                 "--max-new-tokens", "4", "--n-train", "8", "--n-eval", "2", "--task-option",
                 "length=3", "--llm-lr", "0.003", "--threads", "1", "--out", str(a),
                 "--quiet"]) == 0
    assert main(["train", "--config", str(a / "config.json"), "--out", str(b), "--quiet"]) == 0
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (a, b))
    assert ca == cb and ca["backend"]["llm"]["task_options"] == {"length": 3}
    assert _records(a) == _records(b)
