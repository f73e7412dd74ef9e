"""``sat train``: train a team with the shared SAT algorithm (:mod:`sat_theory.runner`).

``sat train --backend tabular (--mdp FILE | --env NAME) --method sat|naive|joint|no-tr|happo
--agents N --stages K --delta D --seed S [--exact | --group-size G --groups B] [--order ...]
[--save-policies] --out DIR [--overwrite]`` and ``sat train --resume DIR [--stages K]``.

``--env``: a named MDP of :mod:`sat_theory.envs` (``bandit``, ``chain``, ``two_state``,
``coordination``, ``naive_reuse``) or a seeded random generator ``random-simultaneous``,
``random-masked``, ``random-turn`` (sizes from ``--states``/``--actions``/``--agents``, seed
from ``--env-seed``, default ``--seed``). ``--backend`` picks a backend from
the registry :data:`sat_theory.backends.BACKENDS` (this module registers ``llm``:
:mod:`sat_llm.backend`, its flags from ``sat_llm.cli_args``). Every flag of a setting is
generated from its dataclass field (:class:`~sat_theory.algorithm.TrainConfig`,
:class:`~sat_theory.tabular_team.TabularConfig`, :class:`~sat_llm.config.LLMConfig`;
:mod:`sat_theory.config_file`). Every number is checked while the flags are parsed (the
valid range is in ``--help``), and every cross-flag rule before any work; the runner then
gets configurations, not flags. The run folder (config.json,
metrics.jsonl, checkpoint, ``policies/``) is described in :mod:`sat_theory.runner`; a
progress bar goes to stderr and a one-line summary to stdout.

``--resume DIR`` continues the run saved in DIR; it takes only ``--stages`` (more stages, or
as many as saved), ``--report-to`` (trackers for this process; default: the saved run's),
``--quiet``, ``--verbose`` and ``--allow-task-import`` (a task class the saved config.json
names may be imported), since every other setting belongs to the saved run.

Output (:mod:`sat_theory.progress`): progress bars on stderr only on a terminal (``--verbose``:
always, plus one line per stage; ``--quiet``: never); ``--report-to`` mirrors the records to
TensorBoard / W&B / MLflow (:mod:`sat_theory.tracking`).
"""

from __future__ import annotations

from ..algorithm import TrainConfig
from ..backends import BACKENDS, load_backend, register
from ..config_file import add_flags, resume_dests, to_values
from ..errors import InputError
from ..tabular_team import TabularConfig

register("llm", "sat_llm.backend:LLMBackend", install="pip install -e '.[llm]'")

#: flags that are not settings of the saved run, so ``--resume`` takes them
RUN_FLAGS = {"resume", "quiet", "verbose", "report_to", "backend", "debug",
             "allow_task_import_cmd"}


def resume_flags() -> set[str]:
    """The flag ``dest``s ``--resume`` accepts: :data:`RUN_FLAGS` and the settings declared
    ``resume=True`` (``--stages``); every other setting belongs to the saved run."""
    return RUN_FLAGS | resume_dests(TrainConfig, TabularConfig, *_llm_settings())


def _llm_settings() -> tuple:
    try:
        from sat_llm.config import LLMConfig  # no heavy imports by contract
    except Exception:  # sat_llm absent or broken: --backend llm will say so when used
        return ()
    return (LLMConfig,)


def _llm_defaults() -> dict:
    """``{"--backend llm": {field: default}}`` of shared settings, for the help texts."""
    try:
        from dataclasses import fields

        from sat_llm.config import ALGORITHM_DEFAULTS, LLMConfig
    except Exception:
        return {}
    shared = {f.name: f.default for f in fields(LLMConfig) if f.name in ("agents", "gamma")}
    return {"--backend llm": {**ALGORITHM_DEFAULTS, **shared}}


def replay_config(conf: dict) -> dict:
    """The flag values that reproduce a saved run configuration (``--config
    RUN/config.json``): the backend's (``backend.flag_values``) and the algorithm's
    (:func:`sat_theory.config_file.to_values` of :class:`TrainConfig`, less the settings
    the run did not use)."""
    b = conf["backend"]
    name = b.get("backend") if isinstance(b, dict) else None
    if name is None:
        raise InputError("config.json: the backend has no name")
    backend = load_backend(name)
    values = dict(backend=name)
    values.update(backend.flag_values(conf))
    if not isinstance(conf["algorithm"], dict):
        raise InputError("config.json: 'algorithm' is not an object")
    values.update(to_values(TrainConfig, conf["algorithm"],
                            skip=backend.unused_algorithm_settings(conf)))
    if (conf.get("run") or {}).get("save_policies"):
        values["save_policies"] = True
    return values


def add_arguments(p):
    p.replay_config = replay_config  # for --config RUN/config.json (sat_theory.config_file)
    llm = _llm_defaults()
    p.add_argument("--backend", choices=tuple(BACKENDS), default="tabular",
                   help="tabular (exact or sampled MDP world) or llm (sat_llm)")
    add_flags(p.add_argument_group("tabular world (TabularConfig)"), TabularConfig,
              defaults=llm)
    add_flags(p.add_argument_group("algorithm (TrainConfig)"), TrainConfig, defaults=llm)
    out = p.add_argument_group("output")
    out.add_argument("--save-policies", action="store_true",
                     help="write policies/stage{k}.npz (start of stage k; stage{K} final; LLM: "
                          "the adapters as .safetensors)")
    out.add_argument("--out", default=None, help="run folder (config.json, metrics.jsonl, "
                     "checkpoint); an existing run there is refused without --overwrite")
    out.add_argument("--overwrite", action="store_true",
                     help="replace the run in --out (its files are removed first)")
    out.add_argument("--config", default=None, metavar="FILE",
                     help="settings from a TOML file (keys = these flags) or a run's "
                          "config.json (repeats that run); flags given here override it "
                          "(sat_theory.config_file)")
    out.add_argument("--resume", default=None, metavar="DIR",
                     help="continue the run in DIR from its last checkpoint (either backend); "
                          "only --stages, --report-to, --quiet, --verbose and "
                          "--allow-task-import may be given with it")
    _report_to_arg(out)
    out.add_argument("--allow-task-import", dest="allow_task_import_cmd", action="store_true",
                     help="let a run's config.json (--resume, --config) name a task class "
                          "(module:Class) to import; its code runs, so only for files you "
                          "trust (a --task typed here is always allowed). Same as sat "
                          "--allow-task-import train ...")
    out.add_argument("--quiet", action="store_true",
                     help="no progress bars (nor transformers' loading bars): only the summary "
                          "line, warnings and errors")
    out.add_argument("--verbose", action="store_true",
                     help="progress bars even when stderr is not a terminal (default: only on "
                          "a terminal) and one line per stage on stderr")
    _llm_args(p)
    _scale_out_args(p)


def _llm_args(p) -> None:
    try:
        from sat_llm import cli_args  # no heavy imports by contract
    except Exception:  # sat_llm absent or broken: --backend llm will say so when used
        return
    cli_args.add_arguments(p)


def _report_to_arg(g) -> None:
    from ..tracking import default_report_to

    default = ",".join(default_report_to()) or "none"
    g.add_argument("--report-to", default=None, metavar="NAMES",
                   help="experiment trackers, comma-separated (like transformers' report_to): "
                        "none | tensorboard (event files in OUT/tb) | wandb (offline unless "
                        "WANDB_MODE is set) | mlflow (a file: store in OUT/mlruns unless "
                        "MLFLOW_TRACKING_URI is set); the records once checkpointed, the config "
                        "as hyperparameters; metrics.jsonl stays the record. Default: "
                        f"tensorboard when installed, else none (here: {default}). With "
                        "--resume: the saved run's unless given")


def _scale_out_args(p) -> None:
    """``--executor``, ``--agent-gpus``, ``--agent-cpus``, ``--ray-address`` (LLM agents as Ray
    actors, :mod:`sat_llm.ray_team`); each only if ``sat_llm.cli_args`` has not added it."""
    have = set(p._option_string_actions)
    g = p.add_argument_group("scale-out (--backend llm)")
    if "--executor" not in have:
        g.add_argument("--executor", choices=("serial", "ray"), default="serial",
                       help="ray: every agent is a Ray actor owning its model, optimizer and "
                            "rollout engine (same metrics as serial, the in-process team)")
    if "--agent-gpus" not in have:
        g.add_argument("--agent-gpus", type=float, default=0.0,
                       help="--executor ray: GPUs per agent actor (0: CPU; >1: a GPU group "
                            "for vLLM tensor parallelism)")
    if "--agent-cpus" not in have:
        g.add_argument("--agent-cpus", type=float, default=1.0,
                       help="--executor ray: CPUs per agent actor")
    if "--ray-address" not in have:
        g.add_argument("--ray-address", default=None,
                       help="--executor ray: cluster to join ('auto' after `ray start --head`; "
                            "default: start a local one)")


def run(args) -> int:
    from ..progress import configure
    from ..runner import RunOptions, run_fresh, run_resume

    configure(quiet=args.quiet, verbose=args.verbose)
    given = getattr(args, "given", set())
    if args.resume is not None:
        allowed = resume_flags()
        extra = sorted(given - allowed)
        if extra:
            flags = ", ".join("--" + d.replace("_", "-") for d in extra)
            ok = ", ".join("--" + d.replace("_", "-") for d in sorted(allowed - {"resume", "debug"}))
            raise InputError(f"--resume continues the saved run; {flags} cannot change it "
                             f"(allowed with --resume: {ok})")
        summary, cfg, backend = run_resume(
            args.resume, stages=args.stages if "stages" in given else None,
            report_to=args.report_to, backend=args.backend if "backend" in given else None)
        return backend.report(summary, cfg, args.resume)
    if args.out is None:
        raise InputError("--out DIR is required")
    backend = load_backend(args.backend)
    cfg, config = backend.configure(args)
    summary = run_fresh(backend, cfg, config, RunOptions(
        out=args.out, overwrite=args.overwrite, save_policies=args.save_policies,
        report_to=args.report_to))
    return backend.report(summary, cfg, args.out)
