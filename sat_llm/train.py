"""``sat train --backend llm``: the shared algorithm on an :class:`~sat_llm.team.LLMTeam`.

``run_train(args)`` builds the team (:class:`~sat_llm.team.LLMConfig`) and the algorithm's
:class:`~sat_theory.algorithm.TrainConfig` (with ``sat_theory.commands.train.build_config``,
the same as the tabular world), then drives ``sat_theory.algorithm.run_stage`` stage by stage,
unchanged, with a checkpoint after every agent update (:mod:`sat_llm.checkpoint`).

Output (``--out DIR``): ``config.json`` (``algorithm``: the TrainConfig; ``backend``: the
LLMConfig and library versions) and ``metrics.jsonl`` in the tabular schema
(:mod:`sat_theory.metrics`); each step record additionally carries ``kl_sampled`` (TeamTR
eq. 18 beside the exact ``kl``), ``kl_per_token``, ``n_tokens``, the optimizer's ``loss``,
``grad_norm``, ``opt_steps``, ``lr``, ``tokens`` generated and ``seconds``; each stage record
``eval_accuracy`` (= ``J_after``, the held-out accuracy) and ``seconds``. ``lower_bound`` is
the algorithm's THEORY §4 bound from the stage's own estimates; with the default γ = 1
(episodic score) its γ-terms are undefined and it is logged as ``NaN``.

``--resume DIR`` continues a killed run from ``DIR/checkpoint.pt`` (settings from
``DIR/config.json``), losing no completed agent step. ``--executor ray`` puts every agent in a
Ray actor (:mod:`sat_llm.ray_team`, same records as the in-process team); its options are
saved as ``config.json["ray"]`` so a resume rebuilds the actors the same way.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from sat_theory.errors import InputError

__all__ = ["run_train", "build_llm_config", "Runner", "write_run_config", "resume_run"]


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


def build_llm_config(args):
    from .team import LLMConfig

    models = tuple(m.strip() for m in args.agent_models.split(",")) if args.agent_models else None
    return LLMConfig(model=args.model, agent_models=models, task=args.task, prompts=args.jsonl,
                     task_options=_task_options(args.task_option), agents=args.agents,
                     router=args.router, turns=args.turns, max_new_tokens=args.max_new_tokens,
                     temperature=args.temperature, lora_r=args.lora_r, lr=args.llm_lr,
                     epochs=args.llm_epochs, minibatch=args.minibatch, gamma=args.gamma,
                     n_train=args.n_train, n_eval=args.n_eval, seed=args.seed,
                     engine=args.engine, threads=args.threads, ratio=args.ratio)


def _apply_defaults(args) -> None:
    from .cli_args import LLM_DEFAULTS

    for k, v in LLM_DEFAULTS.items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if getattr(args, "prompts", None) is not None:
        args.groups = args.prompts
    if args.agents < 1:
        raise InputError(f"--agents must be >= 1, got {args.agents}")


class Runner:
    """Drives ``run_stage`` over the stages of one run directory with checkpoints."""

    def __init__(self, team, cfg, out_dir, *, state=None, append=False, n_records=0,
                 progress=True):
        from sat_theory.algorithm import RunState
        from sat_theory.metrics import RunWriter

        self.team, self.cfg, self.out = team, cfg, Path(out_dir)
        self.state = state or RunState.initial(cfg, team.n_agents)
        self.writer = RunWriter(str(self.out), append=append)
        self.n_records = n_records
        self.pos: dict = {}
        self.bar = None
        self._t = time.perf_counter()
        if progress:
            from tqdm import tqdm

            done = self.state.stage * team.n_agents
            self.bar = tqdm(total=cfg.stages * team.n_agents, initial=done, unit="step",
                            desc=f"sat train llm {cfg.method}", file=sys.stderr, leave=False,
                            dynamic_ncols=True)

    # ------------------------------------------------------------- logging and checkpoints
    def log(self, rec: dict) -> None:
        rec = dict(rec)
        now = time.perf_counter()
        rec["seconds"], self._t = now - self._t, now
        if rec["kind"] == "step":
            j = rec["agent"]
            kl = self.team.last_kl.get(j, {})
            up = self.team.last_update.get(j, {})
            rec.update(kl_sampled=kl.get("kl_sampled"), kl_per_token=kl.get("kl_per_token"),
                       n_tokens=kl.get("n_tokens"), loss=up.get("loss"),
                       grad_norm=up.get("grad_norm"), opt_steps=up.get("opt_steps"),
                       lr=up.get("lr"),
                       tokens=(self.team.last_batch.extra.get("tokens")
                               if self.team.last_batch is not None else None))
            self.pos["steps"].append(rec)
        elif rec["kind"] == "stage":
            rec["eval_accuracy"] = rec.get("J_after")
        self.writer.log(rec)
        self.n_records += 1

    def _payload(self, stage: int, step: int) -> dict:
        keep_batch = self.cfg.occupancy != "intermediate" and step > 0
        return dict(version=1, team=self.team.state_dict(), run_state=self.state.to_dict(),
                    stage=stage, step=step, order=list(self.pos.get("order", [])),
                    steps=list(self.pos.get("steps", [])), start=self.pos.get("start"),
                    J_before=self.pos.get("J_before"),
                    batch=self.team.last_batch if keep_batch else None,
                    n_records=self.n_records)

    def on_step(self, rec: dict) -> None:
        if self.cfg.order == "greedy":
            self.pos["order"] = [r["agent"] for r in self.pos["steps"]]
        from .checkpoint import save_checkpoint

        save_checkpoint(self.out, self._payload(self.state.stage, len(self.pos["steps"])))
        if self.bar is not None:
            self.bar.set_postfix(kl=f"{rec['kl']:.3g}", R=f"{rec.get('reward_mean') or 0:.2f}")
            self.bar.update(1)

    def on_begin(self, info: dict) -> None:
        """Stage set up by run_stage: keep what a mid-stage checkpoint needs."""
        self.pos = dict(order=list(info["order"]), steps=[], start=info["start"],
                        J_before=info["J_before"])

    # ------------------------------------------------------------- the loop
    def run(self, resume: dict | None = None) -> dict:
        from sat_theory.algorithm import run_stage, swap_agent

        from .checkpoint import save_checkpoint

        team, cfg = self.team, self.cfg
        J0 = float(team.evaluate())
        stages: list[dict] = []
        try:
            if resume is not None and resume["step"] > 0:
                self.pos = dict(order=resume["order"], steps=list(resume["steps"]),
                                start=resume["start"], J_before=resume["J_before"])
                stages.append(run_stage(team, cfg, self.state, log=self.log,
                                        on_step=self.on_step, resume=resume))
                save_checkpoint(self.out, self._payload(self.state.stage, 0))
            while self.state.stage < cfg.stages:
                if cfg.swap_stage is not None and self.state.stage == cfg.swap_stage:
                    self.log(swap_agent(team, cfg, self.state))
                stages.append(run_stage(team, cfg, self.state, log=self.log,
                                        on_step=self.on_step, on_begin=self.on_begin))
                save_checkpoint(self.out, self._payload(self.state.stage, 0))
        finally:
            self.writer.close()
            if self.bar is not None:
                self.bar.close()
        return dict(J_start=J0, J_end=float(team.evaluate()), stages=len(stages),
                    rollouts=self.state.rollouts,
                    rejected_steps=sum(s["rejected_steps"] for s in stages))


def write_run_config(runner: Runner, cfg, llm_cfg, **extra) -> None:
    """``config.json`` of an LLM run (what ``--resume`` rebuilds the run from)."""
    runner.writer.write_config(dict(algorithm=cfg.to_dict(),
                                    backend=dict(backend="llm", llm=llm_cfg.to_dict(),
                                                 versions=_versions()), **extra))


def _check_out(out) -> Path:
    if out is None:
        raise InputError("--out DIR is required")
    return Path(out)


def run_train(args) -> int:
    """Entry point of ``sat train --backend llm`` (see module docstring)."""
    if getattr(args, "resume", None):
        return _resume(args)
    _apply_defaults(args)
    from sat_theory.commands.train import build_config

    out = _check_out(args.out)
    if (out / "checkpoint.pt").exists():
        raise InputError(f"{out} holds a run already; use --resume {out} to continue it")
    cfg = build_config(args, args.agents, sampled=True)
    if cfg.swap_stage is not None:  # fail now, not after the stages before the swap
        if cfg.swap_kind != "random":
            raise InputError("the LLM backend builds only 'random' replacement agents "
                             "(use --swap-kind random)")
        if cfg.swap_strategy == "stage0" and cfg.stage0_form != "distill":
            raise InputError("the LLM backend's Stage-0 is the TeamTR distillation "
                             "(--stage0-form distill)")
    llm_cfg = build_llm_config(args)
    extra = {}
    if getattr(args, "executor", "serial") == "ray":  # agents as Ray actors (sat_llm.ray_team)
        from .ray_team import build_ray_team

        team = build_ray_team(llm_cfg, args, out=out)
        extra["ray"] = team.opts.to_dict()
    else:
        from .team import LLMTeam

        team = LLMTeam(llm_cfg)
    try:
        runner = Runner(team, cfg, out, progress=not args.quiet)
        write_run_config(runner, cfg, llm_cfg, **extra)
        return _finish(runner.run(), cfg, out)
    finally:
        _close(team)


def _close(team) -> None:
    close = getattr(team, "close", None)  # Ray actors are killed; an in-process team has none
    if close is not None:
        close()


def _resume(args) -> int:
    summary, cfg, out = resume_run(args.resume, progress=not getattr(args, "quiet", False))
    return _finish(summary, cfg, out)


def resume_run(run_dir, *, progress: bool = True):
    """Continue the run in ``run_dir`` from its checkpoint; ``(summary, TrainConfig, dir)``."""
    from sat_theory.algorithm import RunState, TrainConfig

    from .checkpoint import load_checkpoint, truncate_metrics
    from .team import LLMConfig, LLMTeam

    out = Path(run_dir)
    cfg_path = out / "config.json"
    if not cfg_path.is_file():
        raise InputError(f"no run to resume in {out} (config.json missing)")
    conf = json.loads(cfg_path.read_text())
    ck = load_checkpoint(out)
    cfg = TrainConfig(**{k: tuple(v) if isinstance(v, list) else v
                         for k, v in conf["algorithm"].items()})
    llm_cfg = LLMConfig(**conf["backend"]["llm"])
    if "ray" in conf:  # the run's agents were Ray actors: rebuild them the same way
        from .ray_team import RayOptions, RayTeam

        team = RayTeam(llm_cfg, RayOptions(**conf["ray"]))
    else:
        team = LLMTeam(llm_cfg)
    try:
        team.load_state_dict(ck["team"])
        state = RunState.from_dict(ck["run_state"])
        truncate_metrics(out, ck["n_records"])
        runner = Runner(team, cfg, out, state=state, append=True, n_records=ck["n_records"],
                        progress=progress)
        return runner.run(resume=ck), cfg, out
    finally:
        _close(team)


def _finish(summary: dict, cfg, out) -> int:
    print(f"{cfg.method} (llm): {summary['stages']} stages, held-out accuracy "
          f"{summary['J_start']:.4g} -> {summary['J_end']:.4g}, rejected steps "
          f"{summary['rejected_steps']}, rollouts {summary['rollouts']} -> {out}")
    return 0 if all(math.isfinite(summary[k]) for k in ("J_start", "J_end")) else 1
