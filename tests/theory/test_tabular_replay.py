"""``sat train --config RUN/config.json`` for the tabular backend: the flags come from the
``TabularConfig`` fields (``TabularBackend.flag_values`` = ``to_values`` of the saved
section), and replaying them writes the same config.json."""

from __future__ import annotations

import json

import pytest

from sat_theory.cli import main
from sat_theory.envs import random_mdp
from sat_theory.errors import InputError
from sat_theory.tabular_team import TabularBackend, saved_settings


@pytest.mark.parametrize("kind", ["mdp", "env"])
def test_a_tabular_run_replays_to_the_same_config(tmp_path, kind):
    if kind == "mdp":
        path = tmp_path / "m.npz"
        random_mdp(4, 2, 2, seed=1).save(str(path))
        flags = ["--mdp", str(path), "--sampled", "--lr", "0.3", "--epochs", "3",
                 "--init", "random", "--horizon-tol", "0.01"]
    else:
        flags = ["--env", "random-masked", "--agents", "2", "--states", "5", "--actions", "3",
                 "--gamma", "0.8", "--env-seed", "5", "--exact-step", "npg"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["train", *flags, "--stages", "1", "--out", str(a), "--quiet"]) == 0
    conf = json.loads((a / "config.json").read_text())
    values = TabularBackend.flag_values(conf)
    if kind == "mdp":
        assert values["mdp"] == str(path) and values["sampled"] is True and "states" not in values
    else:
        assert values["agents"] == 2 and values["gamma"] == 0.8 and values["env_seed"] == 5
    assert main(["train", "--config", str(a / "config.json"), "--out", str(b), "--quiet"]) == 0
    assert json.loads((b / "config.json").read_text()) == conf


def test_a_saved_section_missing_a_setting_is_one_line():
    with pytest.raises(InputError, match="backend setting 'lr' missing"):
        saved_settings({"mdp": None, "env": "bandit", "states": 8, "actions": 2,
                        "env_agents": None, "env_gamma": None, "env_seed": 0, "init": "uniform",
                        "exact_step": "proximal", "epochs": 1, "horizon_tol": 1e-3,
                        "mode": "exact"})
