"""``RayTeam``: an LLM team whose agents are Ray actors, behind :class:`sat_theory.team.Team`.

Each agent ``j`` is one :class:`AgentWorker` actor that owns its model (base + LoRA adapter),
its AdamW state and its rollout engine (``hf`` generate, or vLLM on the actor's GPUs), with
its own resource request (``agent_gpus``/``agent_cpus``). The actor reuses
:class:`~sat_llm.team.LLMTeam`'s code for everything an agent does alone (generation,
scoring, the clipped-surrogate update, the exact/sampled token KL, snapshots, Stage-0's
replacement agents), so the numbers are those of the in-process backend.

The proxy :class:`RayTeam` implements the ``Team`` protocol, so
:func:`sat_theory.algorithm.run_stage` drives it unchanged. It holds what belongs to the
team rather than to one agent: the task and its problem pools, the turn-taking protocol and
router, the numpy RNG (problem choice, random router), the sampling RNG, parameter
versions, and the evaluation cache. A shared-context episode passes *text* between actors:
per turn the proxy sends every episode's prompt and transcript to the speaking agent's
actor, which renders them with its own tokenizer and chat template (heterogeneous teams
have different ones), generates the messages and returns the context/message token ids, the
behaviour log-probability and the cleaned message text; the proxy appends the text to the
transcripts and asks the task for feedback and scores.

**Same numbers as in process.** In :class:`~sat_llm.team.LLMTeam` every agent samples from
one global torch RNG, in the order (turn, agent). The proxy keeps that RNG's state and
hands it to each sampling call and takes the advanced state back, so the sequence of draws
is the in-process one; with the same thread count the CPU kernels give the same bits (the
tests check equality of every logged metric). Sampling is therefore sequential over the
agents of one turn (round-robin routing has one speaker per turn anyway); greedy
evaluation, which draws nothing, runs the agents of a turn in parallel. The running
statistics of the behaviour log-prob check (``logp_diff_mean``/``logp_diff_max`` of a step
record) travel the same way, so they are summed in the in-process order; the rollout's
``peak_memory_bytes`` is the largest peak of the agent processes during its generation calls
(each actor measures its own process or GPU, as ``LLMTeam`` measures its one process). The
team's ``cfg`` records the device kind and the dtype the actors resolved.

**Fault tolerance.** Every actor writes ``checkpoint_dir/agent{j}/checkpoint.pt``
(atomically, :func:`sat_llm.checkpoint.save_checkpoint`) after every call that changes its
parameters (update, restore, replace, reset, load), and is created with ``max_restarts`` and
``max_task_retries``: a killed actor is restarted by Ray, reloads its last checkpoint in its
constructor (only when Ray reports a reconstruction, so a fresh run never picks up an old
file), and a call that was in flight is retried. Every actor call is a deterministic
function of the actor's checkpointed state and the call's arguments (the sampling RNG
state travels with the call), so a retried call returns what the lost one would have. A
parameter-changing call carries a unique id that is checkpointed with its result, so a
retry of a call whose checkpoint was already written (the actor died before replying)
returns that result instead of updating twice. Nothing is lost and nothing is repeated. On
several machines ``checkpoint_dir`` must be on a shared filesystem.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from sat_theory.errors import InputError
from sat_theory.team import Batch, Episode

from .adapters import restore_counters
from .tasks import TASK_IMPORT_ENV
from .team import EpisodeLoop

__all__ = ["RayOptions", "AgentWorker", "RayTeam", "ray_options", "build_ray_team"]


def _f(default, help_):
    return field(default=default, metadata={"help": help_})


@dataclass
class RayOptions:
    """Placement and fault tolerance of a :class:`RayTeam` (the model settings live in
    :class:`~sat_llm.team.LLMConfig`)."""

    agent_gpus: float = _f(0.0, "GPUs reserved per agent actor (0: CPU; >1: a GPU group for "
                                "vLLM tensor parallelism inside the actor)")
    agent_cpus: float = _f(1.0, "CPUs reserved per agent actor (also its torch thread count)")
    ray_address: str | None = _f(None, "Ray cluster to join ('auto', 'ray://head:10001'); "
                                       "default: start a local cluster")
    checkpoint_dir: str | None = _f(None, "folder of the per-actor checkpoints (shared "
                                          "filesystem on several nodes; default: a temp dir)")
    max_restarts: int = _f(3, "how often Ray restarts a dead agent actor")
    max_task_retries: int = _f(3, "how often a call in flight on a dead actor is retried")

    def __post_init__(self):
        if not (self.agent_gpus >= 0 and self.agent_cpus > 0):
            raise InputError(f"need agent_gpus >= 0 and agent_cpus > 0, got "
                             f"{self.agent_gpus}, {self.agent_cpus}")
        if self.max_restarts < 0 or self.max_task_retries < 0:
            raise InputError("max_restarts and max_task_retries must be >= 0")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in fields(cls)}


#: :class:`AgentWorker`'s default permission: keep the process's own ``$SAT_ALLOW_TASK_IMPORT``
INHERIT = "inherit"


def set_task_import(allowed: str | None | object) -> None:
    """Make ``allowed`` this process's task-import permission (:data:`TASK_IMPORT_ENV`;
    ``None``: unset, a library caller's; :data:`INHERIT`: leave it). An actor gets the
    driver's permission this way, as an argument: a Ray worker's environment is the one
    the cluster started with — another command's, or none on a cluster started elsewhere."""
    if allowed is INHERIT:
        return
    if allowed is None:
        os.environ.pop(TASK_IMPORT_ENV, None)
    else:
        os.environ[TASK_IMPORT_ENV] = str(allowed)


def _call_id() -> str:
    """A unique id for a parameter-changing actor call (see :meth:`AgentWorker._once`)."""
    return uuid.uuid4().hex


class AgentWorker:
    """One agent as a Ray actor (module docstring). Plain class; :class:`RayTeam` wraps it
    with ``ray.remote``. ``agent`` is the team index; the inner :class:`LLMTeam` holds the
    agent at index ``k`` (``k = agent`` for a shared-base team, whose adapters are built
    exactly as in process; ``k = 0`` for a heterogeneous team, where the actor loads only
    this agent's base)."""

    def __init__(self, cfg: dict, agent: int, checkpoint_dir: str | None,
                 allow_task_import: str | None | object = INHERIT):
        import torch

        from .checkpoint import CHECKPOINT, load_checkpoint
        from .protocol import protocol_for
        from .team import LLMConfig, LLMTeam

        c = LLMConfig(**dict(cfg, **self._placement(cfg)))
        self.agent = agent
        set_task_import(allow_task_import)  # before LLMTeam builds the task
        if c.agent_models is None:
            self.team, self.k = LLMTeam(c), agent
            self.base_public = c.model
        else:
            name = c.agent_models[agent]
            self.team = LLMTeam(dataclasses.replace(c, agents=1, agent_models=(name,)))
            self.k, self.base_public = 0, f"{name}#{agent}"  # LLMTeam's key for this base
        self.base_inner = self.team._agent_base[self.k]
        # the sampling RNG as LLMTeam leaves it after construction (the proxy starts from it)
        self.init_torch_rng = torch.get_rng_state()
        # the team's protocol (the task's between-agent instruction and views included)
        self.protocol = protocol_for(self.team.task, c.agents, router=c.router, turns=c.turns,
                                     reasoning_tags=c.reasoning_tags)
        self._batch: tuple | None = None  # (key, Batch): stable objects keep LLMTeam's
        self._refs: dict = {}  # reference-logprob cache (keyed by id()) warm across calls
        self.ckpt = Path(checkpoint_dir) / f"agent{agent}" if checkpoint_dir else None
        self._last_call: tuple = (None, None)  # (id, result) of the last changing call
        self.reconstructed = self._reconstructed()
        self.loaded_checkpoint = False
        if self.ckpt is not None and self.reconstructed and (self.ckpt / CHECKPOINT).is_file():
            self._load(load_checkpoint(self.ckpt))
            self.loaded_checkpoint = True
        else:
            self._save()  # a fresh actor overwrites any file of an earlier run

    @staticmethod
    def _placement(cfg: dict) -> dict:
        """The actor's device: the GPUs Ray reserved for it (``agent_gpus``; Ray makes them
        visible as ``cuda:0..``), else the CPU; one agent per actor, so no per-agent
        devices. Outside Ray (tests of the plain class) the configured device stays."""
        try:
            import ray

            if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
                return {}
            return dict(device="cuda" if ray.get_gpu_ids() else "cpu", agent_devices=None)
        except Exception:
            return {}

    @staticmethod
    def _reconstructed() -> bool:
        try:
            import ray

            if not ray.is_initialized():
                return False
            ctx = ray.get_runtime_context()
            if ctx.get_actor_id() is None:  # the driver, not an actor
                return False
            return bool(ctx.was_current_actor_reconstructed)
        except Exception:  # used outside Ray (tests of the plain class)
            return False

    # ------------------------------------------------------------ checkpoints
    def _state(self) -> dict:
        t, k = self.team, self.k
        return dict(weights=t._get_weights(k), optim=t._opt[k].state_dict(), version=t._version[k])

    def _checkpoint(self) -> dict:
        return dict(self._state(), last_call=self._last_call)

    def _load(self, d: dict) -> None:
        t, k = self.team, self.k
        t._set_weights(k, d["weights"])
        t._opt[k] = t._make_opt(k)
        t._opt[k].load_state_dict(d["optim"])
        t._version[k] = int(d["version"])
        t._ref_cache = None
        self._last_call = tuple(d.get("last_call", (None, None)))

    def _save(self) -> None:
        if self.ckpt is None:
            return
        from .checkpoint import save_checkpoint

        self.ckpt.mkdir(parents=True, exist_ok=True)
        save_checkpoint(self.ckpt, self._checkpoint())

    def _once(self, call_id, fn):
        """Run a parameter-changing call exactly once, then checkpoint (state and the call's
        id and result together). A call retried by Ray after a crash that came after the
        checkpoint returns the recorded result instead of changing the parameters twice; a
        crash before it left the previous checkpoint, which the retry starts from."""
        if call_id is not None and self._last_call[0] == call_id:
            return self._last_call[1]
        out = fn()
        self._last_call = (call_id, out)
        self._save()
        return out

    # ------------------------------------------------------------ helpers
    def _public(self, snap):
        snap = dataclasses.replace(snap, agent=self.agent, base=self.base_public)
        snap._ray_key = uuid.uuid4().hex  # identifies this snapshot across calls (ref cache)
        return snap

    def _inner(self, snap, *, reference: bool = False):
        """The inner team's form of a snapshot. References (weights only, read by ``kl`` and
        ``update``) are kept by key so that repeated calls hit LLMTeam's reference cache;
        snapshots to restore carry optimizer state and are never taken from that cache."""
        if snap.base != self.base_public:
            raise InputError(f"snapshot of base {snap.base!r} cannot restore agent "
                             f"{self.agent} (base {self.base_public!r})")
        key = getattr(snap, "_ray_key", None) if reference else None
        if key is not None and key in self._refs:
            return self._refs[key]
        inner = dataclasses.replace(snap, agent=self.k, base=self.base_inner)
        if key is not None:
            self._refs = {key: inner}  # the latest reference only: backtracking reuses it
        return inner

    def _stable(self, key: str, batch: Batch) -> Batch:
        if self._batch is not None and self._batch[0] == key:
            return self._batch[1]
        self._batch = (key, batch)
        return batch

    def _set_version(self, counter_before: int, new_version: int) -> bool:
        """Renumber a bump of the inner team with the proxy's team-wide counter (LLMTeam's
        own counter advances on every bump; its values are not the proxy's)."""
        t = self.team
        bumped = t._version_counter != counter_before
        if bumped:
            t._version[self.k] = int(new_version)
        return bumped

    # ------------------------------------------------------------ the agent's calls
    def info(self) -> dict:
        return dict(pid=os.getpid(), k=self.k, base=self.base_public,
                    reconstructed=self.reconstructed, loaded_checkpoint=self.loaded_checkpoint,
                    init_torch_rng=self.init_torch_rng, version=self.team._version[self.k],
                    dtype=self.team.cfg.dtype)

    def generate(self, items, last: bool, greedy: bool, rng_state, chunk: int, checks=None):
        """:meth:`sat_llm.team.LLMTeam._messages` of this agent for ``items = [(prompt,
        history, view), ...]`` (``view``: this agent's private part or ``None``), plus the
        sampling RNG state after the draws (``None`` when none was given): the proxy's RNG stream travels with the call. ``checks``: the rollout's
        running behaviour log-prob check ``(Σ|Δ|, tokens, max|Δ|, rescored)`` so far (a
        sampled turn); the call continues it as ``LLMTeam`` does across its speakers and also
        returns it, with the inner team's ``_rollout_extra`` (the check's summary and this
        call's peak memory); ``None`` for both without ``checks``."""
        import torch

        t = self.team
        if rng_state is not None:
            torch.set_rng_state(rng_state)
        if checks is not None:
            t._begin_rollout()  # the peak-memory window of this call
            t._logp_stats, t._rescored = list(checks[:3]), int(checks[3])
        out = t._messages(self.k, items, last, greedy, chunk, protocol=self.protocol,
                          speaker=self.agent)
        rng_after = torch.get_rng_state() if rng_state is not None else None
        if checks is None:
            return (*out, rng_after, None, None)
        return (*out, rng_after, (*t._logp_stats, t._rescored), t._rollout_extra())

    def update(self, key, batch, advantages, beta, reference, step_scale, correction,
               new_version, call_id=None):
        """LLMTeam.update of this agent; ``(info, bumped, recorded)``: did the parameters
        change (the proxy then advances its version counter), and did LLMTeam record
        ``info`` as ``last_update``."""
        def run():
            t = self.team
            before = t._version_counter
            t.last_update.pop(self.k, None)
            info = t.update(self.k, self._stable(key, batch), advantages, beta,
                            self._inner(reference, reference=True),
                            step_scale=step_scale, correction=correction)
            return info, self._set_version(before, new_version), self.k in t.last_update

        return self._once(call_id, run)

    def kl(self, key, batch, reference) -> dict:
        return self.team.kl(self.k, self._stable(key, batch), self._inner(reference, reference=True))

    def snapshot(self):
        return self._public(self.team.snapshot(self.k))

    def restore(self, snap, call_id=None) -> None:
        self._once(call_id, lambda: self.team.restore(self.k, self._inner(snap)))

    def new_agent(self, kind: str, seed: int):
        return self._public(self.team.new_agent(self.k, kind, seed))

    def replace(self, new, new_version: int, call_id=None) -> None:
        def run():
            self.team.replace(self.k, self._inner(new))
            self.team._version[self.k] = int(new_version)

        self._once(call_id, run)

    def reset(self, new_version: int, call_id=None) -> None:
        def run():
            self.team.reset([self.k])
            self.team._version[self.k] = int(new_version)

        self._once(call_id, run)

    def state(self) -> dict:
        return self._state()

    def load_state(self, d: dict, call_id=None) -> None:
        self._once(call_id, lambda: self._load(d))


class RayTeam(EpisodeLoop):
    """See module docstring. ``cfg``: the :class:`~sat_llm.team.LLMConfig` of the team;
    ``opts``: :class:`RayOptions`. Connects to (or starts) Ray and creates one actor per
    agent; :meth:`close` kills them."""

    def __init__(self, cfg, opts: RayOptions | None = None):
        from sat_theory.executor import _ray  # one place that starts/joins a Ray cluster

        from .team import task_setup

        self.cfg, self.opts = cfg, opts or RayOptions()
        # the actors run where their reservation puts them (AgentWorker._placement): record it
        cfg.device, cfg.agent_devices = ("cuda" if self.opts.agent_gpus > 0 else "cpu"), None
        self.n_agents = cfg.agents
        self.gamma = float(cfg.gamma)
        self.advantage_bound = 1.0  # scores lie in [0, 1] (as LLMTeam)
        self.task, self.protocol, self.train_pool, self.eval_set = task_setup(cfg)
        self.rng = np.random.default_rng(cfg.seed)
        self._rollouts = 0
        self._version_counter = 0
        self._version = [0] * self.n_agents
        self._eval_cache: dict = {}
        self._subs: dict = {}
        self.last_kl: dict[int, dict] = {}
        self.last_update: dict[int, dict] = {}
        self.last_batch: Batch | None = None
        self.last_eval: list = []
        self._begin_rollout()
        self._ray = ray = _ray(self.opts.ray_address)
        self.checkpoint_dir = self.opts.checkpoint_dir or tempfile.mkdtemp(prefix="sat_ray_team_")
        o = self.opts
        self._check_resources(ray.cluster_resources())
        worker = ray.remote(AgentWorker)
        self.actors = [worker.options(num_cpus=o.agent_cpus, num_gpus=o.agent_gpus,
                                      max_restarts=o.max_restarts,
                                      max_task_retries=o.max_task_retries)
                       .remote(cfg.to_dict(), j, self.checkpoint_dir,
                               os.environ.get(TASK_IMPORT_ENV)) for j in range(self.n_agents)]
        infos = self.info()
        self._k = [i["k"] for i in infos]  # each agent's index inside its actor's LLMTeam
        self._torch_rng = infos[0]["init_torch_rng"]
        # 'auto' becomes what it meant, as in LLMTeam; every actor resolves the same dtype
        # (one configured dtype, one device kind)
        cfg.dtype = infos[0]["dtype"]

    # ---------------------------------------------------------------- plumbing
    def _check_resources(self, have: dict) -> None:
        """Refuse a team the cluster can never place (its actors would wait forever)."""
        n, o = self.n_agents, self.opts
        for key, per in (("CPU", o.agent_cpus), ("GPU", o.agent_gpus)):
            if per > 0 and n * per > have.get(key, 0) + 1e-9:
                flag = "--agent-cpus" if key == "CPU" else "--agent-gpus"
                raise InputError(f"{n} agents x {per:g} {key} ({flag}) exceed the Ray "
                                 f"cluster's {have.get(key, 0):g} {key}")

    def _get(self, ref):
        return self._ray.get(ref)

    def info(self) -> list[dict]:
        """Per actor: ``pid``, ``reconstructed`` and ``loaded_checkpoint`` (was it restarted
        and did it reload its checkpoint), its inner index ``k`` and parameter version."""
        return self._get([a.info.remote() for a in self.actors])

    @property
    def version(self) -> tuple:
        return tuple(self._version)

    def _next_version(self) -> int:
        return self._version_counter + 1

    def _bump(self, agent: int) -> None:
        self._version_counter += 1
        self._version[agent] = self._version_counter

    def _sub(self, agent: int, batch: Batch):
        """``(key, batch of agent's turns only)``: what the agent's actor needs of a batch
        (its contexts, messages and behaviour log-probs, in ``turns_of`` order)."""
        key = batch.extra.get("ray_key")
        if key is None:  # a batch this proxy did not draw (e.g. one from a checkpoint)
            key = batch.extra["ray_key"] = uuid.uuid4().hex
        if (key, agent) not in self._subs:
            turns = [dataclasses.replace(t, agent=self._k[agent]) for _, t in batch.turns_of(agent)]
            vs = batch.versions  # indexed as the actor's inner team (one agent if heterogeneous)
            sub = Batch(episodes=[Episode(group=0, turns=turns, ret=0.0)],
                        rollout_id=batch.rollout_id,
                        versions=(None if vs is None else vs if self._k[agent] == agent
                                  else (vs[agent],)))
            self._subs = {k: v for k, v in self._subs.items() if k[0] == key}
            self._subs[(key, agent)] = (f"{key}/{agent}", sub)
        return self._subs[(key, agent)]

    # ---------------------------------------------------------------- episodes
    def _speak(self, items: dict, last: bool, greedy: bool) -> dict:
        """:meth:`sat_llm.team.EpisodeLoop._speak` on the actors: greedy turns draw no random
        numbers, so the speakers generate in parallel; sampled turns pass one RNG stream
        from actor to actor in ascending agent order, as in process."""
        cfg = self.cfg
        if greedy:
            refs = {j: self.actors[j].generate.remote(it, last, True, None, cfg.eval_batch)
                    for j, it in items.items()}
            return {j: self._get(r)[:4] for j, r in refs.items()}
        results = {}
        for j in sorted(items):
            res = self._get(self.actors[j].generate.remote(items[j], last, False, self._torch_rng,
                                                           len(items[j]), self._checks))
            results[j], self._torch_rng, self._checks, extra = res[:4], res[4], res[5], res[6]
            # the latest summary covers every call so far (the statistics travel); memory:
            # the largest peak of any call
            peak = max(self._check_extra.get("peak_memory_bytes", 0), extra["peak_memory_bytes"])
            self._check_extra = dict(extra, peak_memory_bytes=peak)
        return results

    def _begin_rollout(self) -> None:
        """The behaviour log-prob check starts afresh (``LLMTeam._begin_rollout``)."""
        self._checks = (0.0, 0, 0.0, 0)  # Σ|Δ|, tokens, max|Δ|, rescored
        self._check_extra: dict = {}

    def _rollout_extra(self) -> dict:
        # ray_key names the batch on the actors; logp_check and peak_memory_bytes as LLMTeam's
        return dict(ray_key=uuid.uuid4().hex, **self._check_extra)

    # ---------------------------------------------------------------- parameters
    def snapshot(self, agent: int):
        return self._get(self.actors[agent].snapshot.remote())

    def restore(self, agent: int, snap) -> None:
        self._get(self.actors[agent].restore.remote(snap, _call_id()))
        self._version[agent] = snap.version

    @staticmethod
    def _as_reference(snap):
        """A reference travels without its optimizer state (KL and loss need the weights)."""
        ref = dataclasses.replace(snap, optim=None)
        if hasattr(snap, "_ray_key"):
            ref._ray_key = snap._ray_key
        return ref

    def update(self, agent: int, batch: Batch, advantages, beta: float, reference, *,
               step_scale: float = 1.0, correction: str = "none") -> dict:
        key, sub = self._sub(agent, batch)
        adv = None if advantages is None else np.asarray(advantages, dtype=np.float64)
        info, bumped, recorded = self._get(self.actors[agent].update.remote(
            key, sub, adv, float(beta), self._as_reference(reference), float(step_scale),
            correction, self._next_version(), _call_id()))
        if bumped:
            self._bump(agent)
        if recorded:
            self.last_update[agent] = info
        return info

    def kl(self, agent: int, batch: Batch, reference) -> dict:
        key, sub = self._sub(agent, batch)
        res = self._get(self.actors[agent].kl.remote(key, sub, self._as_reference(reference)))
        self.last_kl[agent] = res
        return res

    # ---------------------------------------------------------------- plug-and-play
    def new_agent(self, agent: int, kind: str, seed: int):
        return self._get(self.actors[agent].new_agent.remote(kind, int(seed)))

    def replace(self, agent: int, new) -> None:
        self._get(self.actors[agent].replace.remote(new, self._next_version(), _call_id()))
        self._bump(agent)

    def reset(self, agents) -> None:
        for j in agents:  # one version bump per agent, in order (as LLMTeam)
            self._get(self.actors[j].reset.remote(self._next_version(), _call_id()))
            self._bump(j)

    def align(self, agent: int, new, delta_align: float, form: str):
        from .align import stage0_align

        return stage0_align(self, agent, new, delta_align, form)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """:meth:`sat_llm.team.LLMTeam.state_dict`'s layout (so ``sat_llm.train``'s run
        checkpoints work unchanged); ``torch_rng`` is the team's sampling RNG."""
        states = self._get([a.state.remote() for a in self.actors])
        return dict(weights=[s["weights"] for s in states], optim=[s["optim"] for s in states],
                    torch_rng=self._torch_rng.clone(), np_rng=self.rng.bit_generator.state,
                    rollouts=self._rollouts, version=list(self._version),
                    version_counter=self._version_counter, eval_cache=dict(self._eval_cache),
                    last_eval=list(self.last_eval))

    def load_state_dict(self, d: dict) -> None:
        self._get([a.load_state.remote(dict(weights=d["weights"][j], optim=d["optim"][j],
                                            version=d["version"][j]), _call_id())
                   for j, a in enumerate(self.actors)])
        self._torch_rng = d["torch_rng"].clone()
        restore_counters(self, d)
        self._subs = {}

    def close(self) -> None:
        """Kill the agent actors (the Ray cluster itself is left running)."""
        for a in self.actors:
            self._ray.kill(a, no_restart=True)
        self.actors = []


def ray_options(args=None, *, out=None, **overrides) -> RayOptions:
    """:class:`RayOptions` from the ``sat train`` flags in ``args`` (``--agent-gpus``,
    ``--agent-cpus``, ``--ray-address``; absent ones keep their defaults) and ``overrides``;
    with ``out`` the actors checkpoint under ``out/agents``."""
    kw = {}
    for name in ("agent_gpus", "agent_cpus", "ray_address"):
        v = getattr(args, name, None) if args is not None else None
        if v is not None:
            kw[name] = v
    if out is not None:
        kw["checkpoint_dir"] = str(Path(out) / "agents")
    kw.update(overrides)
    return RayOptions(**kw)


def build_ray_team(llm_cfg, args=None, *, out=None, **overrides) -> RayTeam:
    """A :class:`RayTeam` for ``llm_cfg`` (an :class:`~sat_llm.team.LLMConfig`) with
    :func:`ray_options` ``(args, out=out, **overrides)``: what ``sat train --backend llm
    --executor ray`` builds instead of an :class:`~sat_llm.team.LLMTeam`."""
    return RayTeam(llm_cfg, ray_options(args, out=out, **overrides))
