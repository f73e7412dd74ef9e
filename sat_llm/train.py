"""``sat train --backend llm``: the LLM backend of :mod:`sat_theory.runner`.

:class:`LLMBackend` checks the flags (:class:`~sat_llm.team.LLMConfig` and the algorithm's
:class:`~sat_theory.algorithm.TrainConfig`, built by ``sat train`` exactly as for the tabular
world) before any model is loaded, and builds the team — an :class:`~sat_llm.team.LLMTeam`,
or a :class:`~sat_llm.ray_team.RayTeam` for ``--executor ray`` — from the saved
configuration, for a fresh run and for ``--resume`` alike. The runner (one for both
backends) drives ``run_stage`` unchanged, with an atomic checkpoint after every agent update
(safetensors + JSON, :mod:`sat_theory.checkpoint`).

Output (``--out DIR``): ``config.json`` (``algorithm``: the TrainConfig; ``backend``: the
LLMConfig and library versions; ``ray``: the Ray options, so a resume rebuilds the actors
the same way) and ``metrics.jsonl`` in the tabular schema (:mod:`sat_theory.metrics`); each
step record additionally carries ``kl_sampled`` (TeamTR eq. 18 beside the exact ``kl``),
``kl_per_token``, ``n_tokens``, the optimizer's ``loss``, ``grad_norm``, ``opt_steps``,
``lr``, ``tokens`` generated (:meth:`sat_llm.team.EpisodeLoop.step_metrics`) and
``seconds``; each stage record ``eval_accuracy`` (= ``J_after``, the held-out accuracy).
``lower_bound`` is the algorithm's THEORY §4 bound from the stage's own estimates; with the
default γ = 1 (episodic score) its γ-terms are undefined and it is logged as ``NaN``.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields

from sat_theory.errors import InputError

__all__ = ["build_llm_config", "LLMBackend"]


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "transformers", "peft", "gguf", "accelerate"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def _task_options(items) -> dict:
    opts = {}
    for it in items or []:
        if "=" not in it:
            raise InputError(f"--task-option must look like KEY=VALUE, got {it!r}")
        k, v = it.split("=", 1)
        try:
            opts[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            opts[k.strip()] = v
    return opts


#: LLMConfig fields whose flag has another name (every other field is ``--field-name``)
_FLAG_OF = {"lr": "llm_lr", "epochs": "llm_epochs", "prompts": "dataset",
            "task_options": "task_option"}


def build_llm_config(args):
    """The :class:`~sat_llm.team.LLMConfig` of the flags: every field whose flag was parsed
    (``--llm-lr`` → ``lr``, ``--llm-epochs`` → ``epochs``, ``--dataset`` → ``prompts``,
    repeated ``--task-option`` → ``task_options``; comma lists for tuple fields). The
    dataset flags (``cli_args.DATASET_FLAGS``) become task options of the dataset task,
    which ``--dataset`` selects when ``--task`` is not given."""
    from .cli_args import DATASET_FLAGS
    from .team import LLMConfig

    kw = {}
    for f in fields(LLMConfig):
        v = getattr(args, _FLAG_OF.get(f.name, f.name), None)
        if v is None:
            continue
        if f.name == "task_options":
            v = _task_options(v)
        elif isinstance(v, str) and "tuple" in str(f.type):
            v = tuple(x.strip() for x in v.split(","))
        kw[f.name] = v
    dataset_opts = {k: getattr(args, k) for k in DATASET_FLAGS if getattr(args, k, None) is not None}
    if kw.get("prompts") is not None or dataset_opts:
        kw.setdefault("task", "dataset")
        if kw["task"] not in ("dataset", "jsonl"):
            raise InputError(f"--dataset and its options go with --task dataset, not --task {kw['task']}")
        kw["task_options"] = {**kw.get("task_options", {}), **dataset_opts}
    return LLMConfig(**kw)


def _apply_defaults(args) -> None:
    from .cli_args import LLM_DEFAULTS

    for k, v in LLM_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if getattr(args, "prompts", None) is not None:
        args.groups = args.prompts


class LLMBackend:
    """``sat train --backend llm`` for :mod:`sat_theory.runner` (module docstring)."""

    def __init__(self):
        from . import checkpoint  # noqa: F401  (registers the LLM state types)

    def configure(self, args, make_config) -> tuple:
        if args.out is None:
            raise InputError("--out DIR is required")
        _apply_defaults(args)
        cfg = make_config(args, args.agents, True)
        if cfg.swap_stage is not None:  # fail now, not after the stages before the swap
            if cfg.swap_kind == "stronger":
                if not getattr(args, "swap_from", None):
                    raise InputError("--swap-kind stronger on the LLM backend needs --swap-from "
                                     "FILE[:J] (a saved team file's adapter)")
                from .team import swap_adapter

                swap_adapter(args.swap_from)  # a bad file fails now, not at the swap
            if cfg.swap_strategy == "stage0" and cfg.stage0_form != "distill":
                raise InputError("the LLM backend's Stage-0 is the TeamTR distillation "
                                 "(--stage0-form distill)")
        llm_cfg = build_llm_config(args)
        from .tasks import DatasetTask, make_task

        # an unknown task or one too small for --n-train + --n-eval fails now, before any work
        task = make_task(llm_cfg.task, llm_cfg.prompts, **llm_cfg.task_options)
        task.check_sizes(llm_cfg.n_train, llm_cfg.n_eval)
        config = dict(backend=dict(backend="llm"))
        if isinstance(task, DatasetTask):  # resolved path, columns, split and rows hash: a
            # resume rebuilds (and checks) the same problems; `dataset` is for the reader
            llm_cfg.prompts, llm_cfg.task_options = task.path, task.options()
            config["backend"]["dataset"] = task.record(llm_cfg.n_train, llm_cfg.n_eval, llm_cfg.seed)
        config["backend"].update(llm=llm_cfg.to_dict(), versions=_versions())
        if getattr(args, "executor", "serial") == "ray":  # agents as Ray actors
            from .ray_team import ray_options

            config["ray"] = ray_options(args, out=args.out).to_dict()
        return cfg, config

    def make_team(self, config: dict, cfg, out):
        from .team import LLMConfig

        try:
            llm_cfg = LLMConfig(**config["backend"]["llm"])
        except (KeyError, TypeError) as e:
            raise InputError(f"config.json: bad LLM settings ({e})") from None
        if "ray" in config:
            from .ray_team import RayOptions, RayTeam

            return RayTeam(llm_cfg, RayOptions(**config["ray"]))
        from .team import LLMTeam

        return LLMTeam(llm_cfg)

    @staticmethod
    def sampled(config: dict) -> bool:
        return True

    @staticmethod
    def flag_values(config: dict) -> dict:
        """The LLM flags of a saved run (``sat train --config RUN/config.json``): every
        :class:`~sat_llm.team.LLMConfig` field under its flag's name (:data:`_FLAG_OF`)."""
        import argparse

        from .cli_args import add_arguments
        from .team import LLMConfig

        saved = config["backend"].get("llm")
        if not isinstance(saved, dict):
            raise InputError("config.json: no LLM settings")
        p = argparse.ArgumentParser()
        add_arguments(p)
        flags = {a.dest for a in p._actions}
        v = {}
        for f in fields(LLMConfig):
            if f.name in ("agents", "seed", "eps_w") or f.name not in saved:
                continue  # the algorithm's flags (same values in both sections)
            dest = _FLAG_OF.get(f.name, f.name)
            if dest in flags:
                v[dest] = saved[f.name]
            elif saved[f.name] != (list(f.default) if isinstance(f.default, tuple) else f.default):
                raise InputError(f"config.json: LLM setting {f.name} = {saved[f.name]!r} has "
                                 "no sat train flag to reproduce it")
        v["agents"] = saved.get("agents")
        if "ray" in config:
            v["executor"] = "ray"
        return v

    @staticmethod
    def report(summary: dict, cfg, out) -> int:
        print(f"{cfg.method} (llm): {summary['stages']} stages, held-out accuracy "
              f"{summary['J_start']:.4g} -> {summary['J_end']:.4g}, rejected steps "
              f"{summary['rejected_steps']}, rollouts {summary['rollouts']} -> {out}")
        return 0 if all(math.isfinite(summary[k]) for k in ("J_start", "J_end")) else 1
