"""``sat train``: train a team with the shared SAT algorithm (:mod:`sat_theory.runner`).

``sat train --backend tabular (--mdp FILE | --env NAME) --method sat|naive|joint|no-tr|happo
--agents N --stages K --delta D --seed S [--exact | --group-size G --groups B] [--order ...]
[--save-policies] --out DIR [--overwrite]`` and ``sat train --resume DIR [--stages K]``.

``--env``: a named MDP of :mod:`sat_theory.envs` (``bandit``, ``chain``, ``two_state``,
``coordination``, ``naive_reuse``) or a seeded random generator ``random-simultaneous``,
``random-masked``, ``random-turn`` (sizes from ``--states``/``--actions``/``--agents``, seed
from ``--env-seed``, default ``--seed``). ``--backend`` picks a backend from
:data:`sat_theory.runner.BACKENDS` (``llm``: :mod:`sat_llm.train`, its flags from
``sat_llm.cli_args``). Every number is checked while the flags are parsed (the valid range is
in ``--help``), and every cross-flag rule before any work. The run folder (config.json,
metrics.jsonl, checkpoint, ``policies/``) is described in :mod:`sat_theory.runner`; a
progress bar goes to stderr and a one-line summary to stdout.

``--resume DIR`` continues the run saved in DIR; it takes only ``--stages`` (more stages, or
as many as saved), ``--report-to`` (trackers for this process; default: the saved run's),
``--quiet`` and ``--verbose``, since every other setting belongs to the saved run.

Output (:mod:`sat_theory.progress`): progress bars on stderr only on a terminal (``--verbose``:
always, plus one line per stage; ``--quiet``: never); ``--report-to`` mirrors the records to
TensorBoard / W&B / MLflow (:mod:`sat_theory.tracking`).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import fields

from ..algorithm import METHODS, OCCUPANCIES, ORDERS, RANGES, TRUST_REGIONS, TrainConfig
from ..cli import arg_type, with_range
from ..errors import InputError

#: TrainConfig fields exposed one to one as ``--field-name`` (the others have flags above)
_ADVANCED = ("correction", "eps_norm", "eps_w", "beta_min", "beta_max", "beta_growth",
             "step_shrink", "max_backtracks", "delta_up", "delta_down", "delta_min", "delta_max",
             "delta_conf")

RANDOM_ENVS = {"random-simultaneous": "simultaneous", "random-masked": "masked",
               "random-turn": "turn"}


#: tabular-world flags' ranges (the algorithm's are :data:`sat_theory.algorithm.RANGES`)
TABULAR_RANGES = {
    "states": ("int", 1, None, True, False), "actions": ("int", 1, None, True, False),
    "agents": ("int", 1, None, True, False), "gamma": ("float", 0.0, 1.0, False, False),
    "env_seed": ("int", 0, None, True, False), "lr": ("float", 0.0, None, False, False),
    "epochs": ("int", 1, None, True, False), "horizon_tol": ("float", 0.0, 1.0, False, False),
}
#: the flags ``--resume`` accepts (everything else belongs to the saved run)
RESUME_FLAGS = {"resume", "stages", "quiet", "verbose", "report_to", "backend"}


def _llm_args(p) -> None:
    try:
        from sat_llm import cli_args  # no heavy imports by contract
    except Exception:  # sat_llm absent or broken: --backend llm will say so when used
        return
    cli_args.add_arguments(p)


def _num(p, flag: str, spec: tuple, help_: str, **kw):
    p.add_argument(flag, type=arg_type(spec), help=with_range(help_, spec), **kw)


def add_arguments(p):
    help_ = TrainConfig.help()
    R, T = RANGES, TABULAR_RANGES
    p.add_argument("--backend", choices=("tabular", "llm"), default="tabular",
                   help="tabular (exact or sampled MDP world) or llm (sat_llm)")
    src = p.add_argument_group("tabular world")
    src.add_argument("--mdp", default=None, help="MDP .npz file")
    src.add_argument("--env", default=None,
                     help="named MDP (bandit, chain, two_state, coordination, naive_reuse) or "
                          "random-simultaneous | random-masked | random-turn")
    _num(src, "--states", T["states"], "random envs: number of states", default=8)
    _num(src, "--actions", T["actions"], "random envs: actions per agent", default=2)
    _num(src, "--gamma", T["gamma"], "discount for --env (default: the env's own, 0.9 for "
         "random envs)", default=None)
    _num(src, "--env-seed", T["env_seed"], "random envs: seed (default --seed)", default=None)
    src.add_argument("--init", default="uniform",
                     help="initial team policy: uniform | random | a policy .npz file")
    mode = src.add_mutually_exclusive_group()
    mode.add_argument("--exact", action="store_true",
                      help="exact mode: expectations computed exactly (default)")
    mode.add_argument("--sampled", action="store_true",
                      help="sampled mode (implied by --group-size/--groups)")
    src.add_argument("--exact-step", choices=("proximal", "npg"), default="proximal",
                     help="exact mode: the trust-region step on the exact surrogate")
    _num(src, "--lr", T["lr"], "sampled mode: Adam learning rate (0.5: the trust region "
         "δ = 0.01 binds)", default=0.5)
    _num(src, "--epochs", T["epochs"], "sampled mode: Adam steps per update", default=10)
    _num(src, "--horizon-tol", T["horizon_tol"], "sampled mode: truncate episodes at H with "
         "γ^H ≤ this", default=1e-3)
    alg = p.add_argument_group("algorithm (TrainConfig)")
    alg.add_argument("--method", default="sat", help=help_["method"])
    _num(alg, "--agents", T["agents"], "number of agents (random envs: required size; "
         "otherwise checked)", default=None)
    _num(alg, "--stages", R["stages"], help_["stages"], default=10)
    _num(alg, "--eval-every", R["eval_every"], help_["eval_every"], default=1)
    _num(alg, "--delta", R["delta"], help_["delta"] + " (default 0.01 tabular, 0.05 llm)",
         default=None)
    alg.add_argument("--delta-per-agent", default=None,
                     help="comma-separated per-agent radii (overrides --delta) [each > 0]")
    _num(alg, "--seed", R["seed"], "seed of rollouts and the algorithm", default=0)
    _num(alg, "--group-size", R["group_size"], help_["group_size"], default=None)
    _num(alg, "--groups", R["n_groups"], help_["n_groups"], default=None)
    alg.add_argument("--order", default=None,
                     help=f"{' | '.join(ORDERS)}, or a permutation like 2,0,1 (fixed order)")
    alg.add_argument("--occupancy", default=None, help=f"{' | '.join(OCCUPANCIES)}")
    _num(alg, "--resample-k", R["resample_k"], help_["resample_k"], default=2)
    alg.add_argument("--trust-region", default=None, help=f"{' | '.join(TRUST_REGIONS)}")
    alg.add_argument("--on-violation", default="reject", help=help_["on_violation"])
    _num(alg, "--beta", R["beta_init"], help_["beta_init"], default=1.0)
    alg.add_argument("--no-std-norm", action="store_true", help="ablation: " + help_["normalize_std"])
    alg.add_argument("--no-adv-clip", action="store_true", help="ablation: no advantage clipping")
    _num(alg, "--adv-clip", R["A_clip"], help_["A_clip"], default=5.0)
    adv = p.add_argument_group("algorithm, advanced (TrainConfig fields one to one)")
    for f in fields(TrainConfig):
        if f.name in _ADVANCED:
            flag = "--" + f.name.replace("_", "-")
            text = f.metadata["help"] + f" (default {f.default})"
            if f.name in RANGES:
                _num(adv, flag, RANGES[f.name], text, default=f.default)
            else:
                adv.add_argument(flag, default=f.default, help=text)
    pnp = p.add_argument_group("plug-and-play")
    _num(pnp, "--swap-stage", R["swap_stage"], help_["swap_stage"] + " (< --stages)", default=None)
    _num(pnp, "--swap-agent", R["swap_agent"], help_["swap_agent"] + " (< --agents)", default=0)
    pnp.add_argument("--swap-kind", default="stronger", help=help_["swap_kind"])
    pnp.add_argument("--swap-strategy", default="stage0", help=help_["swap_strategy"])
    pnp.add_argument("--stage0-form", default="distill", help=help_["stage0_form"])
    _num(pnp, "--delta-align", R["delta_align"], help_["delta_align"], default=None)
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
                          "only --stages, --report-to, --quiet and --verbose may be given with it")
    _report_to_arg(out)
    out.add_argument("--quiet", action="store_true",
                     help="no progress bars (nor transformers' loading bars): only the summary "
                          "line, warnings and errors")
    out.add_argument("--verbose", action="store_true",
                     help="progress bars even when stderr is not a terminal (default: only on "
                          "a terminal) and one line per stage on stderr")
    _llm_args(p)
    _scale_out_args(p)


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


# ------------------------------------------------------------------ the tabular world
def _sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def mdp_spec(args) -> dict:
    """What identifies the run's MDP (saved in config.json, so ``--resume`` rebuilds it)."""
    if (args.mdp is None) == (args.env is None):
        raise InputError("give exactly one of --mdp FILE or --env NAME")
    if args.mdp is not None:
        path = os.path.abspath(args.mdp)
        if not os.path.isfile(path):
            raise InputError(f"MDP file not found: {args.mdp}")
        return dict(mdp=path, mdp_sha256=_sha256(path), env=None)
    if args.env in RANDOM_ENVS and args.agents is None:
        raise InputError(f"--env {args.env} needs --agents N")
    return dict(mdp=None, env=args.env, states=args.states, actions=args.actions,
                env_agents=args.agents, env_gamma=args.gamma,
                env_seed=args.seed if args.env_seed is None else args.env_seed)


def build_mdp_from_spec(spec: dict):
    from ..envs import NAMED, named_mdp, random_mdp
    from ..mdp import FactorizedMDP

    if spec["mdp"] is not None:
        if spec.get("mdp_sha256") and _sha256_or_none(spec["mdp"]) != spec["mdp_sha256"]:
            raise InputError(f"the MDP file {spec['mdp']} is missing or changed since the run "
                             "started (sha256 differs)")
        return FactorizedMDP.load(spec["mdp"])
    env = spec["env"]
    if env in RANDOM_ENVS:
        return random_mdp(spec["states"], spec["env_agents"], spec["actions"],
                          layout=RANDOM_ENVS[env],
                          gamma=0.9 if spec["env_gamma"] is None else spec["env_gamma"],
                          seed=spec["env_seed"])
    if env in NAMED:
        return named_mdp(env, spec["env_gamma"])
    raise InputError(f"unknown env {env!r}; choose one of "
                     f"{', '.join(sorted(NAMED) + sorted(RANDOM_ENVS))}")


def _sha256_or_none(path):
    return _sha256(path) if os.path.isfile(path) else None


def build_mdp(args):
    """The MDP of ``--mdp``/``--env`` (checked against ``--agents``)."""
    mdp = build_mdp_from_spec(mdp_spec(args))
    if args.agents is not None and args.agents != mdp.n_agents:
        raise InputError(f"--agents {args.agents} does not match the MDP, which has "
                         f"{mdp.n_agents} agents")
    return mdp


def _order(args, n: int):
    if args.order is None or args.order in ORDERS:
        return args.order, None
    try:
        perm = tuple(int(x) for x in args.order.split(","))
    except ValueError:
        raise InputError(f"--order must be one of {', '.join(ORDERS)} or a permutation like "
                         f"2,0,1, got {args.order!r}") from None
    if sorted(perm) != list(range(n)):
        raise InputError(f"--order {args.order} is not a permutation of the agents 0..{n - 1}")
    return "fixed", perm


def build_config(args, n_agents: int, sampled: bool) -> TrainConfig:
    """The :class:`TrainConfig` of the flags, with every cross-flag rule checked for a team
    of ``n_agents`` (order permutation, per-agent radii, swap agent and stage)."""
    if args.method not in METHODS:
        raise InputError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    order, perm = _order(args, n_agents)
    dpa = None
    if args.delta_per_agent is not None:
        try:
            dpa = tuple(float(x) for x in args.delta_per_agent.split(","))
        except ValueError:
            raise InputError("--delta-per-agent must be comma-separated numbers") from None
        if len(dpa) != n_agents:
            raise InputError(f"--delta-per-agent has {len(dpa)} entries for {n_agents} agents")
    if not args.swap_agent < n_agents:
        raise InputError(f"--swap-agent {args.swap_agent} is not an agent index in "
                         f"[0, {n_agents - 1}]")
    kw = {}
    if sampled:
        kw.update(n_groups=args.groups if args.groups is not None else 8,
                  group_size=args.group_size if args.group_size is not None else 8)
    return TrainConfig(
        method=args.method, stages=args.stages, eval_every=args.eval_every, delta=args.delta,
        delta_per_agent=dpa,
        trust_region=args.trust_region, occupancy=args.occupancy, resample_k=args.resample_k,
        order=order, fixed_order=perm, normalize_std=not args.no_std_norm,
        A_clip=None if args.no_adv_clip else args.adv_clip, beta_init=args.beta,
        on_violation=args.on_violation, seed=args.seed, swap_stage=args.swap_stage,
        swap_agent=args.swap_agent, swap_kind=args.swap_kind, swap_strategy=args.swap_strategy,
        stage0_form=args.stage0_form, delta_align=args.delta_align,
        **{k: getattr(args, k) for k in _ADVANCED if hasattr(args, k)}, **kw)


def algorithm_values(alg: dict, *, sampled: bool) -> dict:
    """The flag values (``{dest: value}``) that :func:`build_config` turns into the saved
    :class:`TrainConfig` ``alg`` (``sat train --config RUN/config.json``,
    :mod:`sat_theory.config_file`); ``sampled``: the run drew batches (``--groups``,
    ``--group-size`` belong to it)."""
    try:
        v = {k: alg[k] for k in ("method", "stages", "delta", "trust_region", "occupancy",
                                 "resample_k", "on_violation", "seed", "swap_stage",
                                 "swap_agent", "swap_kind", "swap_strategy", "stage0_form",
                                 "delta_align", *_ADVANCED)}
        v.update(delta_per_agent=alg["delta_per_agent"], beta=alg["beta_init"],
                 order=alg["fixed_order"] if alg["fixed_order"] else alg["order"],
                 no_std_norm=not alg["normalize_std"], no_adv_clip=alg["A_clip"] is None,
                 adv_clip=alg["A_clip"])
        v["eval_every"] = alg.get("eval_every", 1)  # absent in runs of older versions
        if sampled:
            v.update(groups=alg["n_groups"], group_size=alg["group_size"])
    except KeyError as e:
        raise InputError(f"config.json: algorithm setting {e} missing") from None
    return v


#: the tabular default radius (TeamTR: δ = 0.01); the LLM one is in sat_llm.cli_args
TABULAR_DELTA = 0.01


class TabularBackend:
    """``sat train --backend tabular`` for :mod:`sat_theory.runner`: checks the flags and
    builds a :class:`~sat_theory.tabular_team.TabularTeam` from the saved configuration."""

    def __init__(self):
        self._mdp = None  # the MDP loaded while configuring (reused by make_team)

    def configure(self, args, make_config) -> tuple[TrainConfig, dict]:
        from ..tabular_team import horizon_for

        if args.out is None:
            raise InputError("--out DIR is required")
        if args.delta is None:
            args.delta = TABULAR_DELTA
        if getattr(args, "executor", "serial") != "serial":
            raise InputError("--executor ray runs LLM agents as Ray actors; it needs --backend llm")
        sampled = bool(args.sampled or args.group_size is not None or args.groups is not None)
        if sampled and args.exact:
            raise InputError("--exact cannot be combined with --group-size/--groups")
        spec = mdp_spec(args)
        mdp = self._mdp = build_mdp(args)
        cfg = make_config(args, mdp.n_agents, sampled)
        init = dict(init=args.init)
        if args.init not in ("uniform", "random"):
            self._init_policy(dict(init=args.init), mdp)  # a bad file fails now
            init = dict(init=os.path.abspath(args.init), init_sha256=_sha256(args.init))
        backend = dict(backend="tabular", mode="sampled" if sampled else "exact", **spec,
                       mdp_description=mdp.describe(), agents=mdp.n_agents,
                       gamma=mdp.gamma, **init, exact_step=args.exact_step, lr=args.lr,
                       epochs=args.epochs, horizon_tol=args.horizon_tol,
                       horizon=horizon_for(mdp.gamma, args.horizon_tol), seed=args.seed)
        return cfg, {"backend": backend}

    @staticmethod
    def sampled(config: dict) -> bool:
        return config["backend"].get("mode") == "sampled"

    @staticmethod
    def flag_values(config: dict) -> dict:
        """The tabular flags of a saved run (``--config RUN/config.json``)."""
        b = config["backend"]
        try:
            v = (dict(mdp=b["mdp"]) if b.get("mdp") else
                 dict(env=b["env"], states=b["states"], actions=b["actions"],
                      agents=b["env_agents"], gamma=b["env_gamma"], env_seed=b["env_seed"]))
            v.update(init=b["init"], exact_step=b["exact_step"], lr=b["lr"], epochs=b["epochs"],
                     horizon_tol=b["horizon_tol"], sampled=b["mode"] == "sampled")
        except KeyError as e:
            raise InputError(f"config.json: backend setting {e} missing") from None
        return v

    @staticmethod
    def _init_policy(b: dict, mdp):
        from ..policy import TeamPolicy

        if b["init"] == "uniform":
            return TeamPolicy.uniform(mdp)
        if b["init"] == "random":
            return TeamPolicy.random(mdp, b["seed"])
        if b.get("init_sha256") and _sha256_or_none(b["init"]) != b["init_sha256"]:
            raise InputError(f"the initial policy {b['init']} is missing or changed since the "
                             "run started (sha256 differs)")
        return TeamPolicy.load(b["init"], mdp)

    def make_team(self, config: dict, cfg: TrainConfig, out):
        from ..tabular_team import TabularTeam

        b = config["backend"]
        try:
            mdp = self._mdp if self._mdp is not None else build_mdp_from_spec(b)
            return TabularTeam(mdp, self._init_policy(b, mdp), mode=b["mode"], seed=b["seed"],
                               exact_step=b["exact_step"], lr=b["lr"], epochs=b["epochs"],
                               horizon_tol=b["horizon_tol"])
        except KeyError as e:
            raise InputError(f"config.json: backend setting {e} missing") from None

    @staticmethod
    def report(summary: dict, cfg: TrainConfig, out) -> int:
        print(f"{cfg.method}: {summary['stages']} stages, J {summary['J_start']:.6g} -> "
              f"{summary['J_end']:.6g}, certificate violations {summary['bound_violations']}, "
              f"rejected steps {summary['rejected_steps']}, rollouts {summary['rollouts']}, "
              f"{summary['seconds']:.2f}s -> {out}")
        return 0


def run(args) -> int:
    from ..progress import configure
    from ..runner import load_backend, run_fresh, run_resume

    configure(quiet=args.quiet, verbose=args.verbose)
    given = getattr(args, "given", set())
    if args.resume is not None:
        extra = sorted(given - RESUME_FLAGS - {"debug"})
        if extra:
            flags = ", ".join("--" + d.replace("_", "-") for d in extra)
            raise InputError(f"--resume continues the saved run; {flags} cannot change it "
                             "(allowed with --resume: --stages, --report-to, --quiet, --verbose)")
        args.resume_stages = args.stages if "stages" in given else None
        args.backend_given = args.backend if "backend" in given else None
        summary, cfg, backend = run_resume(args)
        return backend.report(summary, cfg, args.resume)
    backend = load_backend(args.backend)
    summary, cfg = run_fresh(backend, args, build_config)
    return backend.report(summary, cfg, args.out)
