"""Each setting is declared once (a dataclass field, :func:`sat_theory.config_file.setting`):
the flags, the ``--config`` TOML keys, the config.json replay and the ``--resume`` check are
generated from the fields, and ``LLMConfig()`` is what ``sat train --backend llm`` runs."""

from __future__ import annotations

import argparse
from dataclasses import fields, make_dataclass

import pytest

from sat_theory.algorithm import TrainConfig
from sat_theory.cli import main
from sat_theory.config_file import (
    add_flags,
    flag_of,
    from_args,
    resume_dests,
    setting,
    to_values,
    values_to_argv,
)
from sat_theory.errors import range_text
from sat_theory.tabular_team import TabularConfig


class _Exit(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Exit(message)


def parser_for(cls) -> argparse.ArgumentParser:
    p = Parser()
    add_flags(p, cls)
    return p


def a_value_other_than_the_default(f):
    """A valid value of field ``f`` different from its default (None: none is generated)."""
    m, d = f.metadata, f.default
    if m.get("negate") or f.type in (bool, "bool"):
        return not d
    if m.get("choices"):
        return next(c for c in m["choices"] if c != d)
    spec = m.get("range")
    if spec is None:
        return None
    kind, lo, hi, _, _ = spec
    if kind == "int":
        return (d if d is not None else lo) + 1
    if hi is not None:
        return (lo + hi) / 2 if d != (lo + hi) / 2 else (lo + 3 * hi) / 4
    return 2.5 * d if d else 0.75


def test_every_setting_with_a_flag_is_in_sat_train_help_with_its_range(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    classes = [TrainConfig, TabularConfig]
    try:
        from sat_llm.config import LLMConfig

        classes.append(LLMConfig)
    except ImportError:
        pass
    for cls in classes:
        for f in fields(cls):
            if not f.metadata.get("cli", True):
                continue
            flag = f.metadata.get("negate") or flag_of(f)
            assert f"--{flag}" in text, (cls.__name__, f.name)
            if f.metadata.get("range") is not None:
                assert f"[{range_text(f.metadata['range'])}]" in text


def test_a_saved_train_config_replays_through_the_generated_flags():
    """config.json → flag values → argv → parsed flags → TrainConfig, for a configuration
    with every generable setting away from its default."""
    kw = {}
    for f in fields(TrainConfig):
        v = a_value_other_than_the_default(f)
        if v is not None and f.name not in ("swap_stage", "swap_agent", "delta_min"):
            kw[f.name] = v
    kw.update(stages=5, swap_stage=3, swap_agent=1, delta_min=1e-3, delta_max=0.2,
              beta_min=1e-3, beta_max=1e3, method="naive", order="2,0,1",
              delta_per_agent=(0.1, 0.2, 0.3), trust_region="none")
    cfg = TrainConfig(**kw)
    cfg.check_team(3)
    p = parser_for(TrainConfig)
    argv = values_to_argv(p, to_values(TrainConfig, cfg.to_dict()))
    again = TrainConfig(**from_args(TrainConfig, p.parse_args(argv)))
    assert again == cfg and again.to_dict() == cfg.to_dict()
    assert cfg.fixed_order == (2, 0, 1) and cfg.normalize_std is False


def test_a_field_added_to_a_copy_of_the_config_gets_its_flag_toml_key_and_resume_rule():
    widgets = setting(3, "number of widgets", range=("int", 1, None, True, False))
    knobs = setting(0.5, "a knob --resume may change", range=("float", 0.0, 1.0, False, True),
                    resume=True)
    Copy = make_dataclass("Copy", [("widgets", int, widgets), ("knobs", float, knobs)],
                          bases=(TrainConfig,))
    p = parser_for(Copy)
    help_ = " ".join(p.format_help().split())
    assert "--widgets WIDGETS number of widgets (default 3) [an integer >= 1]" in help_
    # the flag, with its range checked while parsing
    assert from_args(Copy, p.parse_args(["--widgets", "5"]))["widgets"] == 5
    assert Copy(**from_args(Copy, p.parse_args([]))).widgets == 3  # the field's default
    with pytest.raises(_Exit, match="--widgets: must be an integer >= 1, got '0'"):
        p.parse_args(["--widgets", "0"])
    # a TOML key (sat_theory.config_file: keys are the flags) and the config.json replay
    assert values_to_argv(p, {"widgets": 7}) == ["--widgets", "7"]
    saved = Copy(widgets=9).to_dict()
    replayed = Copy(**from_args(Copy, p.parse_args(values_to_argv(p, to_values(Copy, saved)))))
    assert replayed.widgets == 9 and replayed.to_dict() == saved
    # --resume: a setting belongs to the saved run unless its field says resume=True
    assert "knobs" in resume_dests(Copy) and "widgets" not in resume_dests(Copy)
    assert resume_dests(TrainConfig) == {"stages"}


def test_the_resume_check_of_sat_train_is_generated_from_the_fields(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["train", "--env", "chain", "--stages", "1", "--out", str(out), "--quiet"]) == 0
    for flag, value in (("--eval-every", "2"), ("--states", "3"), ("--adv-clip", "1")):
        assert main(["train", "--resume", str(out), flag, value]) == 2
        assert f"{flag} cannot change it" in capsys.readouterr().err
    assert main(["train", "--resume", str(out), "--stages", "2", "--quiet"]) == 0


def train_args(argv: list[str]) -> argparse.Namespace:
    """``sat train ARGV``'s parsed flags."""
    from sat_theory.commands.train import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(argv)


def llm_configured(argv: list[str], out) -> tuple:
    """``(TrainConfig, config)`` of ``sat train --backend llm ARGV --out OUT``."""
    from sat_llm.backend import LLMBackend

    args = train_args(["--backend", "llm", *argv, "--out", str(out)])
    args.given = {"backend", "out"}
    return LLMBackend().configure(args)


def test_llm_config_defaults_are_what_sat_train_backend_llm_runs(tmp_path):
    pytest.importorskip("torch")
    from sat_llm.config import ALGORITHM_DEFAULTS, LLMConfig

    cfg, config = llm_configured([], tmp_path / "r")
    assert LLMConfig(**config["backend"]["llm"]) == LLMConfig()
    assert config["backend"]["llm"] == LLMConfig().to_dict()
    assert cfg == TrainConfig(**ALGORITHM_DEFAULTS)
    # and the tabular backend runs TrainConfig's own defaults
    from sat_theory.tabular_team import TabularBackend

    tab_cfg, _ = TabularBackend().configure(train_args(["--env", "chain", "--out", str(tmp_path / "t")]))
    assert tab_cfg == TrainConfig()


def test_the_learning_study_runs_sat_train_llm_defaults(tmp_path):
    """experiments/llm_team_learning.py's ``StudyConfig()`` reads the defaults of the
    settings it shares with ``sat train --backend llm`` (issue 24): its flags configure
    ``LLMConfig()`` but for the task options it names and one torch thread (its help says
    why), and the LLM backend's algorithm defaults."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from experiments.llm_team_learning import StudyConfig
    from sat_llm.config import ALGORITHM_DEFAULTS, LLMConfig

    study = StudyConfig()
    cfg, config = llm_configured(study.train_flags()[2:], tmp_path / "r")
    assert LLMConfig(**config["backend"]["llm"]) == replace(
        LLMConfig(), task_options=study.task_options(), threads=1)
    assert cfg == TrainConfig(**ALGORITHM_DEFAULTS)
    assert study.llm_config(2, 0) == replace(LLMConfig(), task_options=study.task_options(),
                                             threads=1)
