"""``sat train``: train a team with the shared SAT algorithm.

``sat train --backend tabular (--mdp FILE | --env NAME) --method sat|naive|joint|no-tr|happo
--agents N --stages K --delta D --seed S [--exact | --group-size G --groups B] [--order ...]
[--save-policies] --out DIR``

``--env``: a named MDP of :mod:`sat_theory.envs` (``bandit``, ``chain``, ``two_state``,
``coordination``, ``naive_reuse``) or a seeded random generator ``random-simultaneous``,
``random-masked``, ``random-turn`` (sizes from ``--states``/``--actions``/``--agents``, seed
from ``--env-seed``, default ``--seed``). ``--backend llm`` hands over to ``sat_llm.train``
(its own arguments come from ``sat_llm.cli_args``).
Writes ``DIR/config.json``, ``DIR/metrics.jsonl`` (schema: :mod:`sat_theory.metrics`) and with
``--save-policies`` ``DIR/policies/stage{k}.npz``; a progress bar on stderr and a one-line
summary on stdout.
"""

from __future__ import annotations

import math
import sys
from dataclasses import fields

from ..algorithm import METHODS, OCCUPANCIES, ORDERS, TRUST_REGIONS, TrainConfig, train
from ..errors import InputError

#: TrainConfig fields exposed one to one as ``--field-name`` (the others have flags above)
_ADVANCED = ("correction", "eps_norm", "eps_w", "beta_min", "beta_max", "beta_growth",
             "step_shrink", "max_backtracks", "delta_up", "delta_down", "delta_min", "delta_max",
             "delta_conf")

RANDOM_ENVS = {"random-simultaneous": "simultaneous", "random-masked": "masked",
               "random-turn": "turn"}


def _llm_args(p) -> None:
    try:
        from sat_llm import cli_args  # no heavy imports by contract
    except Exception:  # sat_llm absent or broken: --backend llm will say so when used
        return
    cli_args.add_arguments(p)


def add_arguments(p):
    help_ = TrainConfig.help()
    p.add_argument("--backend", choices=("tabular", "llm"), default="tabular",
                   help="tabular (exact or sampled MDP world) or llm (sat_llm)")
    src = p.add_argument_group("tabular world")
    src.add_argument("--mdp", default=None, help="MDP .npz file")
    src.add_argument("--env", default=None,
                     help="named MDP (bandit, chain, two_state, coordination, naive_reuse) or "
                          "random-simultaneous | random-masked | random-turn")
    src.add_argument("--states", type=int, default=8, help="random envs: number of states")
    src.add_argument("--actions", type=int, default=2, help="random envs: actions per agent")
    src.add_argument("--gamma", type=float, default=None,
                     help="discount for --env (default: the env's own, 0.9 for random envs)")
    src.add_argument("--env-seed", type=int, default=None, help="random envs: seed (default --seed)")
    src.add_argument("--init", default="uniform",
                     help="initial team policy: uniform | random | a policy .npz file")
    mode = src.add_mutually_exclusive_group()
    mode.add_argument("--exact", action="store_true",
                      help="exact mode: expectations computed exactly (default)")
    mode.add_argument("--sampled", action="store_true",
                      help="sampled mode (implied by --group-size/--groups)")
    src.add_argument("--exact-step", choices=("proximal", "npg"), default="proximal",
                     help="exact mode: the trust-region step on the exact surrogate")
    src.add_argument("--lr", type=float, default=0.5,
                     help="sampled mode: Adam learning rate (0.5: the trust region δ = 0.01 binds)")
    src.add_argument("--epochs", type=int, default=10, help="sampled mode: Adam steps per update")
    src.add_argument("--horizon-tol", type=float, default=1e-3,
                     help="sampled mode: truncate episodes at H with γ^H ≤ this")
    alg = p.add_argument_group("algorithm (TrainConfig)")
    alg.add_argument("--method", default="sat", help=help_["method"])
    alg.add_argument("--agents", type=int, default=None,
                     help="number of agents (random envs: required size; otherwise checked)")
    alg.add_argument("--stages", type=int, default=10, help=help_["stages"])
    alg.add_argument("--delta", type=float, default=0.01, help=help_["delta"])
    alg.add_argument("--delta-per-agent", default=None,
                     help="comma-separated per-agent radii (overrides --delta)")
    alg.add_argument("--seed", type=int, default=0, help="seed of rollouts and the algorithm")
    alg.add_argument("--group-size", type=int, default=None, help=help_["group_size"])
    alg.add_argument("--groups", type=int, default=None, help=help_["n_groups"])
    alg.add_argument("--order", default=None,
                     help=f"{' | '.join(ORDERS)}, or a permutation like 2,0,1 (fixed order)")
    alg.add_argument("--occupancy", default=None, help=f"{' | '.join(OCCUPANCIES)}")
    alg.add_argument("--resample-k", type=int, default=2, help=help_["resample_k"])
    alg.add_argument("--trust-region", default=None, help=f"{' | '.join(TRUST_REGIONS)}")
    alg.add_argument("--on-violation", default="reject", help=help_["on_violation"])
    alg.add_argument("--beta", type=float, default=1.0, help=help_["beta_init"])
    alg.add_argument("--no-std-norm", action="store_true", help="ablation: " + help_["normalize_std"])
    alg.add_argument("--no-adv-clip", action="store_true", help="ablation: no advantage clipping")
    alg.add_argument("--adv-clip", type=float, default=5.0, help=help_["A_clip"])
    adv = p.add_argument_group("algorithm, advanced (TrainConfig fields one to one)")
    for f in fields(TrainConfig):
        if f.name in _ADVANCED:
            kind = str if f.default is None else type(f.default)
            adv.add_argument("--" + f.name.replace("_", "-"), type=kind, default=f.default,
                             help=f.metadata["help"] + f" (default {f.default})")
    pnp = p.add_argument_group("plug-and-play")
    pnp.add_argument("--swap-stage", type=int, default=None, help=help_["swap_stage"])
    pnp.add_argument("--swap-agent", type=int, default=0, help=help_["swap_agent"])
    pnp.add_argument("--swap-kind", default="stronger", help=help_["swap_kind"])
    pnp.add_argument("--swap-strategy", default="stage0", help=help_["swap_strategy"])
    pnp.add_argument("--stage0-form", default="distill", help=help_["stage0_form"])
    pnp.add_argument("--delta-align", type=float, default=None, help=help_["delta_align"])
    out = p.add_argument_group("output")
    out.add_argument("--save-policies", action="store_true",
                     help="write policies/stage{k}.npz (start of stage k; stage{K} final)")
    out.add_argument("--out", default=None, help="run folder (config.json, metrics.jsonl)")
    out.add_argument("--quiet", action="store_true", help="no progress bar")
    _llm_args(p)
    _scale_out_args(p)


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


# ------------------------------------------------------------------ helpers
def _positive(name: str, x, *, integer: bool = False, allow_zero: bool = False):
    ok = x is not None and math.isfinite(x) and (x >= 0 if allow_zero else x > 0)
    if not ok:
        raise InputError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {x}")
    return x


def build_mdp(args):
    from ..envs import NAMED, named_mdp, random_mdp
    from ..mdp import FactorizedMDP

    if (args.mdp is None) == (args.env is None):
        raise InputError("give exactly one of --mdp FILE or --env NAME")
    if args.mdp is not None:
        mdp = FactorizedMDP.load(args.mdp)
    elif args.env in RANDOM_ENVS:
        if args.agents is None:
            raise InputError(f"--env {args.env} needs --agents N")
        _positive("--agents", args.agents)
        _positive("--states", args.states)
        _positive("--actions", args.actions)
        mdp = random_mdp(args.states, args.agents, args.actions, layout=RANDOM_ENVS[args.env],
                         gamma=0.9 if args.gamma is None else args.gamma,
                         seed=args.seed if args.env_seed is None else args.env_seed)
    elif args.env in NAMED:
        mdp = named_mdp(args.env, args.gamma)
    else:
        raise InputError(f"unknown env {args.env!r}; choose one of "
                         f"{', '.join(sorted(NAMED) + sorted(RANDOM_ENVS))}")
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
    if args.method not in METHODS:
        raise InputError(f"unknown method {args.method!r}; choose one of {', '.join(METHODS)}")
    _positive("--delta", args.delta)
    _positive("--stages", args.stages, allow_zero=True)
    order, perm = _order(args, n_agents)
    dpa = None
    if args.delta_per_agent is not None:
        try:
            dpa = tuple(float(x) for x in args.delta_per_agent.split(","))
        except ValueError:
            raise InputError("--delta-per-agent must be comma-separated numbers") from None
    kw = {}
    if sampled:
        kw.update(n_groups=args.groups if args.groups is not None else 8,
                  group_size=args.group_size if args.group_size is not None else 8)
    return TrainConfig(
        method=args.method, stages=args.stages, delta=args.delta, delta_per_agent=dpa,
        trust_region=args.trust_region, occupancy=args.occupancy, resample_k=args.resample_k,
        order=order, fixed_order=perm, normalize_std=not args.no_std_norm,
        A_clip=None if args.no_adv_clip else args.adv_clip, beta_init=args.beta,
        on_violation=args.on_violation, seed=args.seed, swap_stage=args.swap_stage,
        swap_agent=args.swap_agent, swap_kind=args.swap_kind, swap_strategy=args.swap_strategy,
        stage0_form=args.stage0_form, delta_align=args.delta_align,
        **{k: getattr(args, k) for k in _ADVANCED if hasattr(args, k)}, **kw)


def _init_policy(args, mdp):
    from ..policy import TeamPolicy

    if args.init == "uniform":
        return TeamPolicy.uniform(mdp)
    if args.init == "random":
        return TeamPolicy.random(mdp, args.seed)
    return TeamPolicy.load(args.init, mdp)


def run(args) -> int:
    if args.backend == "llm" or getattr(args, "resume", None):  # only LLM runs resume
        try:
            from sat_llm.train import run_train
        except ImportError:
            raise InputError("the LLM backend is not installed: pip install -e '.[llm]'") from None
        return run_train(args)
    if getattr(args, "executor", "serial") != "serial":
        raise InputError("--executor ray runs LLM agents as Ray actors; it needs --backend llm")
    from ..metrics import RunWriter
    from ..tabular_team import TabularTeam

    if args.out is None:
        raise InputError("--out DIR is required")
    sampled = bool(args.sampled or args.group_size is not None or args.groups is not None)
    if sampled and args.exact:
        raise InputError("--exact cannot be combined with --group-size/--groups")
    for name in ("group_size", "groups"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise InputError(f"--{name.replace('_', '-')} must be >= 1, got {v}")
    mdp = build_mdp(args)
    cfg = build_config(args, mdp.n_agents, sampled)
    _positive("--lr", args.lr)
    _positive("--epochs", args.epochs)
    team = TabularTeam(mdp, _init_policy(args, mdp), mode="sampled" if sampled else "exact",
                       seed=args.seed, exact_step=args.exact_step, lr=args.lr,
                       epochs=args.epochs, horizon_tol=args.horizon_tol)
    backend = dict(backend="tabular", mode=team.mode, mdp=args.mdp, env=args.env,
                   mdp_description=mdp.describe(), states=mdp.n_states, agents=mdp.n_agents,
                   gamma=mdp.gamma, init=args.init, exact_step=args.exact_step, lr=args.lr,
                   epochs=args.epochs, horizon=team.horizon, seed=args.seed,
                   env_seed=args.env_seed)
    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=cfg.stages, desc=f"sat train {cfg.method}", unit="stage",
                   file=sys.stderr, leave=False, dynamic_ncols=True)

    def progress(rec):
        if bar is not None:
            bar.set_postfix(J=f"{rec['J_after']:.4g}", lb=_fmt(rec.get("lower_bound")))
            bar.update(1)

    with RunWriter(args.out) as writer:
        try:
            summary = train(team, cfg, writer=writer, save_policies=args.save_policies,
                            progress=progress, extra_config={"backend": backend})
        finally:
            if bar is not None:
                bar.close()
    print(f"{cfg.method}: {summary['stages']} stages, J {summary['J_start']:.6g} -> "
          f"{summary['J_end']:.6g}, certificate violations {summary['bound_violations']}, "
          f"rejected steps {summary['rejected_steps']}, rollouts {summary['rollouts']}, "
          f"{summary['seconds']:.2f}s -> {args.out}")
    return 0


def _fmt(x):
    return "-" if x is None else f"{x:.3g}"
