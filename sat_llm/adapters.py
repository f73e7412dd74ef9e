"""The agents of an LLM team as LoRA adapters: each agent ``j`` is the adapter ``agent{j}``
(peft) on a frozen base model, one base shared by all agents (default) or each agent on its
own base (heterogeneous teams, e.g. after a plug-and-play swap to another model), plus a
scratch adapter ``ref`` per base into which a reference snapshot's weights are copied.

- parameter versions: every change of an agent's weights gets a new team-wide number, so
  rollouts and the evaluation cache know which adapters produced them;
- ``snapshot``/``restore``: the agent's adapter weights and its AdamW state (cheap: the base
  is frozen and shared);
- ``new_agent``/``align``/``replace``/``reset``: plug-and-play (Stage-0 in :mod:`sat_llm.align`);
- ``state_dict``/``load_state_dict``: what a run checkpoint holds; team files
  (:meth:`~sat_llm.episodes.EpisodeLoop.save`) are read by :func:`load_team_file`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from sat_theory.errors import InputError

from .models import place

__all__ = ["AgentSnapshot", "Adapters", "load_team_file", "restore_counters", "swap_adapter"]


@dataclass
class AgentSnapshot:
    """One agent's adapter weights and optimizer state, plus the parameter version they
    belong to (so the evaluation cache knows a restored agent)."""

    agent: int
    base: str
    weights: dict
    optim: dict | None
    version: int


def load_team_file(path: str) -> dict[int, dict]:
    """``{j: adapter weights}`` of a team file written by :meth:`LLMTeam.save` (safetensors,
    tensors ``agent{j}.{name}``; no pickle). Bad input is one :class:`InputError` line."""
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise InputError(f"no team file {path!r}")
    try:
        from safetensors.torch import load_file

        flat = load_file(str(p))
    except Exception as e:  # safetensors raises its own types for a non-safetensors file
        raise InputError(f"{path} is not a safetensors team file ({type(e).__name__})") from None
    out: dict[int, dict] = {}
    for key, t in flat.items():
        head, _, name = key.partition(".")
        if not (head.startswith("agent") and head[5:].isdigit() and name):
            raise InputError(f"{path}: tensor {key[:80]!r} is not named agent<j>.<parameter>")
        out.setdefault(int(head[5:]), {})[name] = t.float()
    return out


def swap_adapter(spec: str) -> dict:
    """Agent ``J``'s adapter weights of ``FILE[:J]`` (default ``J = 0``)."""
    path, sep, j = spec.rpartition(":")
    if not sep or not j.isdigit():
        path, j = spec, "0"
    saved = load_team_file(path)
    if int(j) not in saved:
        raise InputError(f"{path} holds no adapter for agent {j} (has {sorted(saved)})")
    return saved[int(j)]


def _float32_adapters(pm) -> None:
    """Keep every LoRA weight float32 whatever the base dtype (peft casts them to the base's
    dtype unless told not to); its optimizer state then is float32 too."""
    for n, p in pm.named_parameters():
        if "lora_" in n and p.dtype != torch.float32:
            p.data = p.data.float()


class Adapters:
    """The adapters, optimizers and parameter versions of an LLM team (a mixin of
    :class:`~sat_llm.team.LLMTeam`, which provides ``cfg``, ``n_agents``, ``devices``,
    ``dtypes``, ``rng`` and the episode counters that :meth:`state_dict` saves)."""

    # ---------------------------------------------------------------- bases and adapters
    def _open_bases(self, model=None, tokenizer=None) -> None:
        """The bases and every agent's adapter on one: ``_bases`` maps a base's key to its
        ``(peft model, tokenizer)``, ``_agent_base[j]`` is agent ``j``'s key. Agents share a
        base when they name the same model and live on the same device. ``model`` and
        ``tokenizer`` (tests) stand for the first base instead of loading it."""
        cfg = self.cfg
        self._bases: dict[str, tuple] = {}
        names = cfg.agent_models or (cfg.model,) * cfg.agents
        split = len(set(self.devices)) > 1
        self._agent_base: list[str] = []
        for j, name in enumerate(names):
            key = (f"{name}#{j}" if cfg.agent_models is not None
                   else f"{name}@{self.devices[j]}" if split else name)
            if key not in self._bases:
                given = (model, tokenizer) if model is not None and not self._bases else None
                self._bases[key] = self._open_base(j, name, given)
            else:
                self._add_adapter(self._bases[key][0], f"agent{j}")
            self._agent_base.append(key)

    def _open_base(self, j: int, name: str, given: tuple | None) -> tuple:
        """``(peft model, tokenizer)`` of a new base for agent ``j``: model ``name`` (or the
        ``given`` pair) placed on the agent's device and dtype, with the agent's adapter and
        the scratch ``ref`` adapter."""
        from .models import load_model

        cfg = self.cfg
        m, tok = given or load_model(name, seed=cfg.seed)
        place(m, self.devices[j], self.dtypes[j])
        if cfg.grad_checkpointing:
            m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # an agent that opens a base copy gets the seed it has on a shared base
        seed = cfg.seed + (j + 1 if j and cfg.agent_models is None else 0)
        return self._wrap(m, f"agent{j}", seed), tok

    def _start_from(self, path: str) -> None:
        """Every agent's adapter weights from the team file ``path`` (``init_from``)."""
        saved = load_team_file(path)
        missing = [j for j in range(self.n_agents) if j not in saved]
        if missing:
            raise InputError(f"{path} holds no adapter for agent(s) {missing}")
        for j in range(self.n_agents):
            self._set_weights(j, saved[j])

    def _lora_config(self):
        from peft import LoraConfig

        return LoraConfig(r=self.cfg.lora_r, lora_alpha=self.cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(self.cfg.lora_targets), bias="none")

    def _wrap(self, base, name, seed):
        import warnings

        from peft import get_peft_model

        for p in base.parameters():
            p.requires_grad_(False)
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft (<= 0.21) probes the deprecated `model.is_gradient_checkpointing`, which
            # transformers 5 answers with a FutureWarning on every run; not our call to fix
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            # LoRA A init: identical across runs and devices (peft draws it on the host)
            torch.manual_seed(seed)
            pm = get_peft_model(base, self._lora_config(), adapter_name=name)
            pm.add_adapter("ref", self._lora_config())
        _float32_adapters(pm)
        pm.eval()
        return pm

    def _add_adapter(self, pm, name):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed + len(pm.peft_config))
            pm.add_adapter(name, self._lora_config())
        _float32_adapters(pm)

    def _model(self, agent: int):
        return self._bases[self._agent_base[agent]][0]

    def tokenizer(self, agent: int):
        return self._bases[self._agent_base[agent]][1]

    def _params(self, agent: int, adapter: str | None = None) -> dict[str, torch.nn.Parameter]:
        """The adapter's parameters by name (with the adapter name removed from the key)."""
        name = adapter or f"agent{agent}"
        tag = f".{name}."
        return {k.replace(tag, "."): p for k, p in self._model(agent).named_parameters() if tag in k}

    def _get_weights(self, agent: int) -> dict:
        return {k: p.detach().clone() for k, p in self._params(agent).items()}

    def _set_weights(self, agent: int, weights: dict, adapter: str | None = None) -> None:
        params = self._params(agent, adapter)
        if set(params) != set(weights):
            raise InputError("adapter weights do not match this agent's adapter layout")
        for k, p in params.items():  # copy_ would broadcast a wrong shape and cast a wrong dtype
            w = weights[k]
            if (tuple(w.shape) != tuple(p.shape) or not w.is_floating_point()
                    or not bool(torch.isfinite(w).all())):
                raise InputError(f"agent {agent} adapter tensor {k}: {tuple(w.shape)} {w.dtype}; "
                                 f"needs {tuple(p.shape)} finite floats")
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(weights[k])

    def _make_opt(self, agent: int):
        return torch.optim.AdamW(list(self._params(agent).values()), lr=self.cfg.lr,
                                 weight_decay=0.0)

    def _activate(self, agent: int, adapter: str | None = None):
        m = self._model(agent)
        m.set_adapter(adapter or f"agent{agent}")
        return m

    def _bump(self, agent: int) -> None:
        self._version_counter += 1
        self._version[agent] = self._version_counter

    @property
    def version(self) -> tuple:
        return tuple(self._version)


    # ---------------------------------------------------------------- snapshots
    def snapshot(self, agent: int) -> AgentSnapshot:
        return AgentSnapshot(agent, self._agent_base[agent], self._get_weights(agent),
                             copy.deepcopy(self._opt[agent].state_dict()), self._version[agent])

    def restore(self, agent: int, snap: AgentSnapshot) -> None:
        if snap.base != self._agent_base[agent]:
            raise InputError(f"snapshot of base {snap.base!r} cannot restore agent {agent} "
                             f"(base {self._agent_base[agent]!r})")
        self._set_weights(agent, snap.weights)
        if snap.optim is not None:
            self._opt[agent].load_state_dict(copy.deepcopy(snap.optim))
        self._version[agent] = snap.version

    # ---------------------------------------------------------------- plug-and-play
    def new_agent(self, agent: int, kind: str, seed: int) -> AgentSnapshot:
        """A replacement for ``agent`` on its base (plug-and-play): ``random`` — a LoRA
        adapter with both factors drawn at random (seeded; a perturbed policy);
        ``stronger`` — the adapter named by ``swap_from`` (``FILE[:J]``: agent ``J`` of a
        saved team file, e.g. a longer-trained single agent), which must have this agent's
        adapter layout."""
        if kind == "stronger":
            if not self.cfg.swap_from:
                raise InputError("--swap-kind stronger on the LLM backend needs --swap-from "
                                 "FILE[:J] (a saved team file's adapter)")
            w = swap_adapter(self.cfg.swap_from)
            mine = self._get_weights(agent)
            if set(w) != set(mine) or any(w[k].shape != mine[k].shape for k in mine):
                raise InputError(f"{self.cfg.swap_from}: adapter layout differs from agent "
                                 f"{agent}'s (LoRA rank and targets must match)")
            return AgentSnapshot(agent, self._agent_base[agent], w, None, -1 - int(seed))
        if kind != "random":
            raise InputError(f"unknown replacement kind {kind!r}; choose random or stronger")
        gen = torch.Generator().manual_seed(int(seed))
        w = {k: torch.randn(v.shape, generator=gen) * 0.05
             for k, v in self._get_weights(agent).items()}
        return AgentSnapshot(agent, self._agent_base[agent], w, None, -1 - int(seed))

    def replace(self, agent: int, new: AgentSnapshot) -> None:
        """Swap in ``new`` (adapter weights on this agent's base); fresh optimizer state."""
        self._set_weights(agent, new.weights)
        self._opt[agent] = self._make_opt(agent)
        self._bump(agent)

    def reset(self, agents) -> None:
        for j in agents:
            self._set_weights(j, self._init_weights[j])
            self._opt[j] = self._make_opt(j)
            self._bump(j)

    def align(self, agent: int, new: AgentSnapshot, delta_align: float, form: str):
        from .align import stage0_align

        return stage0_align(self, agent, new, delta_align, form)

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict:
        """Everything needed to continue bit-for-bit: adapters, optimizer states, RNGs,
        counters, versions."""
        return dict(weights=[self._get_weights(j) for j in range(self.n_agents)],
                    optim=[self._opt[j].state_dict() for j in range(self.n_agents)],
                    torch_rng=torch.get_rng_state(), np_rng=self.rng.bit_generator.state,
                    rollouts=self._rollouts, version=list(self._version),
                    version_counter=self._version_counter, eval_cache=dict(self._eval_cache),
                    last_eval=list(getattr(self, "last_eval", [])))

    def load_state_dict(self, d: dict) -> None:
        for j in range(self.n_agents):
            self._set_weights(j, d["weights"][j])
            self._opt[j] = self._make_opt(j)
            self._opt[j].load_state_dict(d["optim"][j])
        torch.set_rng_state(d["torch_rng"])
        restore_counters(self, d)
        self._ref_cache = None


def restore_counters(team, d: dict) -> None:
    """The team-level state of a ``state_dict`` ``d`` both team classes share (the in-process
    :class:`Adapters` and :class:`~sat_llm.ray_team.RayTeam`): the numpy stream, rollout and
    version counters, and a cached evaluation."""
    team.rng.bit_generator.state = d["np_rng"]
    team._rollouts = int(d["rollouts"])
    team._version = list(d["version"])
    team._version_counter = int(d["version_counter"])
    team._eval_cache = dict(d.get("eval_cache", {}))
    team.last_eval = list(d.get("last_eval", []))  # eval_records() of a cached evaluation
