"""``LLMTeam``: a team of language-model agents behind :class:`sat_theory.team.Team`.

Agents are LoRA adapters (peft) on one shared frozen base model (default), or each on its
own base (heterogeneous teams, e.g. after a plug-and-play swap to another model). Agent
``j``'s policy is its adapted model at temperature ``τ`` (see :mod:`sat_llm.rollout`).

- ``rollout``: episodes of the canonical turn-taking protocol (:mod:`sat_llm.protocol`) on
  training problems of the task, ``group_size`` episodes per problem (a group); turns are
  generated in batches, one batch per (turn, speaking agent). Each :class:`Turn` carries the
  context token ids, the message token ids and the behaviour log-probability of the message.
- ``snapshot``/``restore``: the agent's adapter weights and its AdamW state (cheap: the base
  is frozen and shared).
- ``update``: AdamW steps on ``−L^clip + β·KL̂_exact`` (:mod:`sat_llm.loss`) for that agent's
  adapter only (the optimizer holds no other parameter), learning rate ``lr·step_scale``,
  gradient-norm clipping, float32.
- ``kl``: exact and sampled token-level KL (:mod:`sat_llm.kl`) from the reference snapshot to
  the current adapter on the agent's messages in the batch, plus the current per-turn
  log-probabilities the algorithm needs for its surrogate estimate.
- ``evaluate``: held-out accuracy of the team, greedy decoding, cached per parameter version.
- ``new_agent``/``align``/``replace``/``reset``: plug-and-play (Stage-0 in :mod:`sat_llm.align`).

The reference policy of a KL is evaluated through a scratch adapter ``ref`` on the same
base, into which the snapshot's weights are copied; its log-probabilities on a batch are
cached while the (batch, reference) pair stays the same (the backtracking loop re-uses them).
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch

from sat_theory.errors import InputError
from sat_theory.team import Batch, Episode, Turn

from .kl import sampled_sequence_kl, sequence_kl
from .loss import RATIOS, clipped_surrogate, ratio_clip_fraction, token_clipped_surrogate
from .protocol import Protocol
from .rollout import generate, message_logprobs, score_logits
from .tasks import Problem, make_task

__all__ = ["LLMConfig", "LLMTeam", "AgentSnapshot"]


def _f(default, help_):
    return field(default=default, metadata={"help": help_})


@dataclass
class LLMConfig:
    """Backend configuration of an LLM team (the algorithm's settings live in
    :class:`sat_theory.algorithm.TrainConfig`)."""

    model: str = _f("tiny-random", "base model: smollm2-135m | tiny-random | HF directory | .gguf file")
    agent_models: tuple | None = _f(None, "heterogeneous team: one model per agent (separate bases)")
    task: str = _f("arithmetic", "task: arithmetic | countdown | guess | blocksworld | jsonl")
    prompts: str | None = _f(None, "JSONL of {prompt, answer} lines (task jsonl)")
    task_options: dict = _f(None, "task constructor options, e.g. {'digits': 2}")
    agents: int = _f(2, "number of agents n")
    router: str = _f("round-robin", "turn router: round-robin | random")
    turns: int = _f(0, "turns per episode (0: one per agent)")
    reasoning_tags: bool = _f(False, "keep <think> blocks in the shared context")
    max_new_tokens: int = _f(32, "tokens per message at most")
    temperature: float = _f(1.0, "sampling temperature τ; the policy is softmax(logits/τ) "
                            "(TeamTR §5.1.2 samples at 0.8)")
    lora_r: int = _f(8, "LoRA rank")
    lora_alpha: int = _f(16, "LoRA alpha")
    lora_targets: tuple = _f(("q_proj", "v_proj"), "modules that get LoRA adapters")
    lr: float = _f(2e-4, "AdamW learning rate (times the algorithm's step_scale)")
    epochs: int = _f(1, "passes over the batch per update")
    minibatch: int = _f(16, "turns per optimizer step")
    grad_clip: float = _f(1.0, "gradient-norm clipping")
    eps_w: float = _f(0.2, "ratio clip ε of the surrogate (PPO clip range)")
    ratio: str = _f("sequence", "surrogate ratio: sequence (w = exp(Σ_u Δ_u), TeamTR eq. 17) | "
                    "token (per-token exp(Δ_u), clipped per token: TRL's dr_grpo × max_new_tokens; "
                    "see sat_llm.loss)")
    gamma: float = _f(1.0, "discount over turns (1: episodic score; the γ-terms of the "
                      "certificate need γ < 1)")
    n_train: int = _f(512, "training problems in the pool")
    n_eval: int = _f(32, "held-out problems for evaluate()")
    eval_batch: int = _f(32, "episodes generated together in evaluate()")
    seed: int = _f(0, "seed of sampling, problem choice and model init")
    engine: str = _f("hf", "rollout engine: hf (transformers generate, CPU/GPU) | vllm "
                     "(multi-LoRA on a GPU; not exercised, see sat_llm.vllm_engine)")
    threads: int = _f(0, "torch CPU threads (0: torch's default; 1 is fastest on a busy machine)")

    def __post_init__(self):
        if not isinstance(self.agents, int) or self.agents < 1:
            raise InputError(f"a team needs at least 1 agent, got {self.agents}")
        if self.agent_models is not None:
            self.agent_models = tuple(self.agent_models)
            if len(self.agent_models) != self.agents:
                raise InputError(f"agent_models has {len(self.agent_models)} entries for "
                                 f"{self.agents} agents")
        for k in ("max_new_tokens", "lora_r", "epochs", "minibatch", "n_train", "n_eval", "eval_batch"):
            if getattr(self, k) < 1:
                raise InputError(f"{k} must be >= 1, got {getattr(self, k)}")
        if not self.temperature > 0:
            raise InputError(f"temperature must be > 0, got {self.temperature}")
        if not (self.lr > 0 and self.grad_clip > 0 and self.eps_w > 0):
            raise InputError("need lr > 0, grad_clip > 0 and eps_w > 0")
        if not 0 < self.gamma <= 1:
            raise InputError(f"gamma must lie in (0, 1], got {self.gamma}")
        if self.ratio not in RATIOS:
            raise InputError(f"unknown ratio {self.ratio!r}; choose {' or '.join(RATIOS)}")
        if self.engine not in ("hf", "vllm"):
            raise InputError(f"unknown engine {self.engine!r}; choose hf or vllm")
        self.lora_targets = tuple(self.lora_targets)
        self.task_options = dict(self.task_options or {})

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in fields(cls)}


@dataclass
class AgentSnapshot:
    """One agent's adapter weights and optimizer state, plus the parameter version they
    belong to (so the evaluation cache knows a restored agent)."""

    agent: int
    base: str
    weights: dict
    optim: dict | None
    version: int


@dataclass
class _Ctx:
    """An LLM turn's context: token ids (the rendered chat) of the speaking agent."""

    ids: tuple

    def __len__(self):
        return len(self.ids)


def task_setup(cfg):
    """``(task, protocol, train_pool, eval_set)`` of a team config: the task, the canonical
    turn-taking protocol, the seeded training prompts and the held-out problems (disjoint
    from the training pool). Shared by every team class so they see the same problems."""
    task = make_task(cfg.task, cfg.prompts, **cfg.task_options)
    protocol = Protocol(cfg.agents, router=cfg.router, turns=cfg.turns,
                        reasoning_tags=cfg.reasoning_tags)
    if task.multi_turn and not cfg.turns:
        protocol.turns = 2 * cfg.agents  # interactive tasks need several rounds
    task.check_sizes(cfg.n_train, cfg.n_eval)  # before any model is loaded
    train_pool = task.problems("train", cfg.n_train, cfg.seed)
    eval_set = task.problems("eval", cfg.n_eval, cfg.seed,
                             exclude={p.prompt for p in train_pool})
    return task, protocol, train_pool, eval_set


def stop_ids(tok) -> list[int]:
    """Stop tokens of a message: eos and, for chat models, ``<|im_end|>``."""
    return sorted({tok.eos_token_id, *([tok.convert_tokens_to_ids("<|im_end|>")]
                                       if "<|im_end|>" in tok.get_vocab() else [])})


class EpisodeLoop:
    """Shared-context turn-taking episodes, rollouts and held-out evaluation, written once for
    every LLM team class. A team provides ``cfg``, ``protocol``, ``task``, ``train_pool``,
    ``eval_set``, ``rng``, ``gamma``, ``version``, ``_rollouts``, ``_eval_cache`` and
    :meth:`_speak` (where the speakers' messages are generated: in process, or on actors)."""

    def _speak(self, items: dict, last: bool, greedy: bool) -> dict:
        """``items = {agent: [(prompt, history), ...]}`` → ``{agent: (contexts, messages,
        logps, texts)}`` for one turn; sampling draws happen in ascending agent order."""
        raise NotImplementedError

    def _rollout_extra(self) -> dict:
        return {}

    def _run_episodes(self, problems: list[Problem], *, greedy: bool):
        """Play the protocol on ``problems`` (one episode each). Returns per-episode
        ``(turns, history, score)`` with turns ``(agent, t, ctx_ids, msg_ids, logp)``."""
        proto = self.protocol
        E = len(problems)
        schedules = [proto.schedule(self.rng) for _ in range(E)]
        history: list[list[tuple[str, str]]] = [[] for _ in range(E)]
        turns: list[list[tuple]] = [[] for _ in range(E)]
        done = [False] * E
        for t in range(proto.n_turns):
            last = t == proto.n_turns - 1
            by_agent: dict[int, list[int]] = {}
            for e in range(E):
                if not done[e]:
                    by_agent.setdefault(schedules[e][t], []).append(e)
            results = self._speak({j: [(problems[e].prompt, history[e]) for e in idx]
                                   for j, idx in by_agent.items()}, last, greedy)
            # each episode has one speaker per turn, so applying the results after all
            # speakers generated equals applying them speaker by speaker
            for j in sorted(by_agent):
                ctxs, msgs, lps, texts = results[j]
                for e, c, m, lp, text in zip(by_agent[j], ctxs, msgs, lps, texts, strict=True):
                    turns[e].append((j, t, tuple(c), tuple(m), lp))
                    history[e].append((f"agent {j + 1}", text))
                    fb, fin = self.task.feedback(problems[e], text)
                    if fb is not None:
                        history[e].append(("environment", fb))
                    done[e] = done[e] or fin
        out = []
        for e in range(E):
            final = next((txt for who, txt in reversed(history[e]) if who.startswith("agent")), "")
            out.append((turns[e], history[e], self.task.score(problems[e], final)))
        return out

    def rollout(self, n_groups: int, group_size: int) -> Batch:
        """``n_groups`` training problems (drawn with the team's seeded RNG) × ``group_size``
        sampled episodes each, under the current agents."""
        if n_groups < 1 or group_size < 1:
            raise InputError(f"need n_groups >= 1 and group_size >= 1, got {n_groups}, {group_size}")
        pick = self.rng.choice(len(self.train_pool), size=n_groups, replace=n_groups > len(self.train_pool))
        problems = [self.train_pool[int(i)] for i in pick for _ in range(group_size)]
        eps = self._run_episodes(problems, greedy=False)
        episodes = []
        for e, (turns, _hist, score) in enumerate(eps):
            T = max((t for _, t, *_ in turns), default=0)
            tl = [Turn(agent=j, context=_Ctx(c), action=m, logp=lp, t=t,
                       reward_to_go=score * self.gamma ** (T - t)) for j, t, c, m, lp in turns]
            episodes.append(Episode(group=e // group_size, turns=tl,
                                    ret=score * self.gamma ** T))
        self._rollouts += 1
        extra = dict(problems=[int(i) for i in pick],
                     transcripts=[h for _, h, _ in eps],
                     scores=[s for *_, s in eps],
                     tokens=int(sum(len(m) for tr, *_ in eps for *_, m, _ in tr)),
                     **self._rollout_extra())
        self.last_batch = Batch(episodes=episodes, rollout_id=self._rollouts, extra=extra)
        return self.last_batch

    def evaluate(self) -> float:
        """Held-out accuracy: mean score over the eval split, greedy decoding (cached per
        parameter version; uses no RNG, so it does not perturb training)."""
        key = self.version
        if key not in self._eval_cache:
            state = self.rng.bit_generator.state
            eps = self._run_episodes(self.eval_set, greedy=True)
            self.rng.bit_generator.state = state  # the random router must not consume training RNG
            self._eval_cache[key] = float(np.mean([s for *_, s in eps]))
            self.last_eval = [(h, s) for _, h, s in eps]
        return self._eval_cache[key]

    def eval_records(self) -> list[dict]:
        """Per-problem results of the latest held-out evaluation (what ``eval_{k}.jsonl``
        holds, so anyone can recompute the accuracy): ``id`` (index in the held-out set),
        ``prompt``, ``answer``, ``final`` (the last agent's message, which is scored),
        ``score`` and ``correct`` (``score == 1``). Empty before the first evaluation."""
        out = []
        for i, (p, (hist, score)) in enumerate(zip(self.eval_set, getattr(self, "last_eval", []),
                                                    strict=False)):
            final = next((txt for who, txt in reversed(hist) if who.startswith("agent")), "")
            out.append(dict(id=i, prompt=p.prompt, answer=p.answer, final=final,
                            score=float(score), correct=bool(score == 1.0)))
        return out


class LLMTeam(EpisodeLoop):
    """See module docstring. ``model``/``tokenizer`` may be passed in (tests) to skip loading."""

    def __init__(self, cfg: LLMConfig, model=None, tokenizer=None):
        from .models import load_model

        self.cfg = cfg
        self.n_agents = cfg.agents
        self.gamma = float(cfg.gamma)
        self.advantage_bound = 1.0  # scores lie in [0, 1], so |A| <= 1
        self.task, self.protocol, self.train_pool, self.eval_set = task_setup(cfg)
        if cfg.threads > 0:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.rng = np.random.default_rng(cfg.seed)
        self._rollouts = 0
        self._version_counter = 0
        self._eval_cache: dict = {}
        self._ref_cache: tuple | None = None
        self.last_kl: dict[int, dict] = {}
        self.last_update: dict[int, dict] = {}
        self.last_batch: Batch | None = None
        # bases: name -> (peft model, tokenizer); agents index into them
        self._bases: dict[str, tuple] = {}
        names = cfg.agent_models or (cfg.model,) * cfg.agents
        self._agent_base: list[str] = []
        for j, name in enumerate(names):
            key = name if cfg.agent_models is None else f"{name}#{j}"
            if key not in self._bases:
                if model is not None and not self._bases:
                    m, tok = model, tokenizer
                else:
                    m, tok = load_model(name, seed=cfg.seed)
                self._bases[key] = (self._wrap(m, f"agent{j}"), tok)
            else:
                self._add_adapter(self._bases[key][0], f"agent{j}")
            self._agent_base.append(key)
        self._init_weights = [self._get_weights(j) for j in range(self.n_agents)]
        self._opt = [self._make_opt(j) for j in range(self.n_agents)]
        self._version = [0] * self.n_agents
        self._engine = None
        if cfg.engine == "vllm":
            from .vllm_engine import VLLMEngine  # lazily: vLLM and a GPU only

            self._engine = VLLMEngine(self)

    # ---------------------------------------------------------------- model plumbing
    def _lora_config(self):
        from peft import LoraConfig

        return LoraConfig(r=self.cfg.lora_r, lora_alpha=self.cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(self.cfg.lora_targets), bias="none")

    def _wrap(self, base, name):
        from peft import get_peft_model

        for p in base.parameters():
            p.requires_grad_(False)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed)  # LoRA A init: identical across runs
            pm = get_peft_model(base, self._lora_config(), adapter_name=name)
            pm.add_adapter("ref", self._lora_config())
        pm.eval()
        return pm

    def _add_adapter(self, pm, name):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.cfg.seed + len(pm.peft_config))
            pm.add_adapter(name, self._lora_config())

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

    # ---------------------------------------------------------------- episodes
    @torch.no_grad()
    def _speak(self, items: dict, last: bool, greedy: bool) -> dict:
        """:meth:`EpisodeLoop._speak`: every speaker generates here, in agent order."""
        return {j: self._messages(j, it, last, greedy, self.cfg.eval_batch if greedy else len(it))
                for j, it in sorted(items.items())}

    @torch.no_grad()
    def _messages(self, k: int, items, last: bool, greedy: bool, chunk: int, *,
                  protocol: Protocol | None = None, speaker: int | None = None):
        """Messages of agent ``k`` for ``items = [(prompt, history), ...]`` in chunks of
        ``chunk``: ``(contexts, messages, logps, texts)`` — context/message token ids, the
        summed behaviour log-probability and the cleaned text for the shared context.
        ``protocol``/``speaker``: the team's protocol and the agent's index in it (default:
        this team's and ``k``; a Ray actor holds a one-agent team of a larger protocol)."""
        cfg, proto = self.cfg, protocol or self.protocol
        tok = self.tokenizer(k)
        ctxs = [proto.render(tok, p, h, k if speaker is None else speaker, last) for p, h in items]
        model = self._activate(k)
        stop = stop_ids(tok)
        msgs, lps = [], []
        for s in range(0, len(ctxs), chunk):
            if self._engine is not None:  # GPU engine; behaviour log-probs rescored here
                m_ = self._engine.generate(k, ctxs[s:s + chunk], max_new_tokens=cfg.max_new_tokens,
                                           temperature=cfg.temperature, stop_ids=stop, greedy=greedy)
                l_ = self._score(k, ctxs[s:s + chunk], m_)
            else:
                m_, l_ = generate(model, ctxs[s:s + chunk], max_new_tokens=cfg.max_new_tokens,
                                  temperature=cfg.temperature, stop_ids=stop,
                                  pad_id=tok.pad_token_id, greedy=greedy)
            msgs += m_
            lps += l_
        texts = [proto.clean(tok.decode(m, skip_special_tokens=True)) for m in msgs]
        return ctxs, msgs, [float(np.sum(lp)) for lp in lps], texts

    @torch.no_grad()
    def _score(self, agent: int, ctxs, msgs) -> list[np.ndarray]:
        """Per-token log-probabilities of ``msgs`` under the agent (teacher forcing)."""
        model = self._activate(agent)
        out = []
        for s in range(0, len(ctxs), self.cfg.minibatch):
            logp, toks, mask = score_logits(model, ctxs[s:s + self.cfg.minibatch],
                                            msgs[s:s + self.cfg.minibatch],
                                            pad_id=self.tokenizer(agent).pad_token_id,
                                            temperature=self.cfg.temperature, share_prefix=True)
            tl = message_logprobs(logp, toks, mask).double().numpy()
            out += [tl[b, :len(m)] for b, m in enumerate(msgs[s:s + self.cfg.minibatch])]
        return out

    # ---------------------------------------------------------------- parameters
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

    # ---------------------------------------------------------------- KL and update
    def _turns(self, agent: int, batch: Batch):
        turns = [t for _, t in batch.turns_of(agent)]
        return [t.context.ids for t in turns], [t.action for t in turns], np.array([t.logp for t in turns])

    def _ref_logps(self, agent: int, batch: Batch, reference: AgentSnapshot, ctxs, msgs):
        """Reference log-probabilities (full vocabulary) per minibatch, cached for the
        current (batch, agent, reference) triple."""
        key = (id(batch), batch.rollout_id, agent, id(reference), reference.version)
        if self._ref_cache is not None and self._ref_cache[0] == key:
            return self._ref_cache[1]
        self._set_weights(agent, reference.weights, adapter="ref")
        model = self._activate(agent, "ref")
        pad = self.tokenizer(agent).pad_token_id
        out = []
        with torch.no_grad():
            for s in range(0, len(ctxs), self.cfg.minibatch):
                out.append(score_logits(model, ctxs[s:s + self.cfg.minibatch],
                                        msgs[s:s + self.cfg.minibatch], pad_id=pad,
                                        temperature=self.cfg.temperature, dtype=torch.float64,
                                        share_prefix=True))
        self._ref_cache = (key, out)
        return out

    def _minibatch_loss(self, agent: int, ctxs, msgs, beh, adv, ref_mb, beta: float, M: int):
        """``(loss, seq_logp, kl, surr)`` of one minibatch at the current adapter:
        ``loss = −(Σ_m surr_m − β Σ_m KL̂_exact(m)) / M`` (so a pass over the batch sums to
        ``−L^clip + β·mean KL̂``), ``surr_m`` in the configured ratio form (:mod:`sat_llm.loss`;
        ``beh``: summed behaviour log-probs for ``sequence``; ``token`` takes its old per-token
        log-probs from the reference pass ``ref_mb = (logp, tokens, mask)``)."""
        lp_ref, toks_ref, mask_ref = ref_mb
        # shared context prefixes run once here too: autograd sums the gradient of
        # each repeated KV cache over its rows (same loss and gradient up to roundoff)
        logp, toks, mask = score_logits(self._activate(agent), ctxs, msgs,
                                        pad_id=self.tokenizer(agent).pad_token_id,
                                        temperature=self.cfg.temperature, share_prefix=True)
        tok = message_logprobs(logp, toks, mask)
        seq = tok.sum(-1)
        if self.cfg.ratio == "token":
            old = message_logprobs(lp_ref, toks_ref, mask_ref).to(tok.dtype)
            surr = token_clipped_surrogate(tok, old, mask, adv, self.cfg.eps_w)
        else:
            surr = clipped_surrogate(seq, beh, adv, self.cfg.eps_w)
        klv = sequence_kl(lp_ref, logp.double(), mask.double()).float()
        return -(surr.sum() - float(beta) * klv.sum()) / M, seq, klv, surr

    def loss(self, agent: int, batch: Batch, advantages, beta: float,
             reference: AgentSnapshot) -> torch.Tensor:
        """The objective ``update`` descends, ``−L^clip + β·mean KL̂``, on the whole batch at the
        current adapter, differentiable (the sum of its minibatch losses; for oracle tests)."""
        ctxs, msgs, beh = self._turns(agent, batch)
        M, mb = len(msgs), self.cfg.minibatch
        refs = self._ref_logps(agent, batch, reference, ctxs, msgs)
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32))
        behT = torch.as_tensor(beh, dtype=torch.float32)
        return sum(self._minibatch_loss(agent, ctxs[s:s + mb], msgs[s:s + mb], behT[s:s + mb],
                                        adv[s:s + mb], refs[k], beta, M)[0]
                   for k, s in enumerate(range(0, M, mb)))

    def update(self, agent: int, batch: Batch, advantages, beta: float, reference: AgentSnapshot,
               *, step_scale: float = 1.0, correction: str = "none") -> dict:
        """AdamW steps on ``−L^clip + β·KL̂_exact`` for this agent's adapter only (see
        :mod:`sat_llm.loss`); ``correction`` is ignored (it concerns exact batches only)."""
        ctxs, msgs, beh = self._turns(agent, batch)
        M = len(msgs)
        if M == 0:
            return {"opt_steps": 0}
        if advantages is None or len(advantages) != M:
            raise ValueError(f"need one advantage per turn of agent {agent} ({M})")
        if not np.any(advantages) and self._version[agent] == reference.version:
            # The objective −L^clip + β·KL has exactly zero gradient here (w ≡ 1 and the KL
            # is at its minimum); Adam would blow float noise (~1e-9) up to full-size steps.
            info = dict(opt_steps=0, loss=0.0, kl_train=0.0, surrogate_clip=0.0, grad_norm=0.0,
                        lr=self.cfg.lr * float(step_scale))
            self.last_update[agent] = info
            return info
        refs = self._ref_logps(agent, batch, reference, ctxs, msgs)
        opt = self._opt[agent]
        for g in opt.param_groups:
            g["lr"] = self.cfg.lr * float(step_scale)
        params = list(self._params(agent).values())
        adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32))
        behT = torch.as_tensor(beh, dtype=torch.float32)
        mb = self.cfg.minibatch
        steps, loss_sum, kl_sum, surr_sum, gnorm = 0, 0.0, 0.0, 0.0, 0.0
        clip_fracs = []
        for _ in range(self.cfg.epochs):
            for k, s in enumerate(range(0, M, mb)):
                loss, seq, klv, surr = self._minibatch_loss(agent, ctxs[s:s + mb], msgs[s:s + mb],
                                                            behT[s:s + mb], adv[s:s + mb], refs[k],
                                                            beta, M)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                gnorm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip))
                opt.step()
                steps += 1
                loss_sum += loss.item() * M / len(seq)
                kl_sum += float(klv.detach().sum())
                surr_sum += float(surr.detach().sum())
                clip_fracs.append(ratio_clip_fraction(seq.detach(), behT[s:s + mb], self.cfg.eps_w))
        opt.zero_grad(set_to_none=True)
        self._bump(agent)
        n = self.cfg.epochs * M
        info = dict(opt_steps=steps, loss=loss_sum / max(steps, 1), kl_train=kl_sum / n,
                    surrogate_clip=surr_sum / n, grad_norm=gnorm,
                    lr=self.cfg.lr * float(step_scale))
        self.last_update[agent] = info
        return info

    @torch.no_grad()
    def kl(self, agent: int, batch: Batch, reference: AgentSnapshot) -> dict:
        """``{"kl": mean exact token-sum KL, "kl_max", "kl_sampled": mean eq. 18 estimate,
        "logp": current per-turn log-probabilities}`` on the agent's messages in ``batch``."""
        ctxs, msgs, _ = self._turns(agent, batch)
        if not msgs:
            res = dict(kl=0.0, kl_max=0.0, kl_sampled=0.0, logp=np.zeros(0), n_turns=0, n_tokens=0)
            self.last_kl[agent] = res
            return res
        refs = self._ref_logps(agent, batch, reference, ctxs, msgs)
        model = self._activate(agent)
        pad = self.tokenizer(agent).pad_token_id
        exact, sampled, logps = [], [], []
        n_tok = 0
        for k, s in enumerate(range(0, len(ctxs), self.cfg.minibatch)):
            lp_ref, toks, mask = refs[k]
            logp, _, _ = score_logits(model, ctxs[s:s + self.cfg.minibatch], msgs[s:s + self.cfg.minibatch],
                                      pad_id=pad, temperature=self.cfg.temperature,
                                      dtype=torch.float64, share_prefix=True)
            tok_new = message_logprobs(logp, toks, mask)
            tok_ref = message_logprobs(lp_ref, toks, mask)
            exact.append(sequence_kl(lp_ref, logp, mask).double())
            sampled.append(sampled_sequence_kl(tok_ref, tok_new, mask).double())
            logps.append(tok_new.sum(-1).double())
            n_tok += int(mask.sum())
        ex, sa = torch.cat(exact).numpy(), torch.cat(sampled).numpy()
        res = dict(kl=float(ex.mean()), kl_max=float(ex.max()), kl_sampled=float(sa.mean()),
                   logp=torch.cat(logps).numpy(), n_turns=len(msgs), n_tokens=n_tok,
                   kl_per_token=float(ex.sum() / max(n_tok, 1)))
        self.last_kl[agent] = res
        return res

    # ---------------------------------------------------------------- plug-and-play
    def new_agent(self, agent: int, kind: str, seed: int) -> AgentSnapshot:
        """A replacement for ``agent`` on its base (plug-and-play): ``random`` — a LoRA
        adapter with both factors drawn at random (seeded; a perturbed policy). A
        ``stronger`` agent needs a stronger model, which this backend cannot invent: that
        kind is refused with a one-line message."""
        if kind != "random":
            raise InputError(f"the LLM backend builds only 'random' replacement agents, not "
                             f"{kind!r} (use --swap-kind random)")
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
                    version_counter=self._version_counter, eval_cache=dict(self._eval_cache))

    def load_state_dict(self, d: dict) -> None:
        for j in range(self.n_agents):
            self._set_weights(j, d["weights"][j])
            self._opt[j] = self._make_opt(j)
            self._opt[j].load_state_dict(d["optim"][j])
        torch.set_rng_state(d["torch_rng"])
        self.rng.bit_generator.state = d["np_rng"]
        self._rollouts = int(d["rollouts"])
        self._version = list(d["version"])
        self._version_counter = int(d["version_counter"])
        self._eval_cache = dict(d.get("eval_cache", {}))
        self._ref_cache = None

    def adapter_norms(self) -> list[float]:
        """``‖θ_j‖`` of each agent's adapter (diagnostics and tests)."""
        return [math.sqrt(sum(float((w.double() ** 2).sum()) for w in self._get_weights(j).values()))
                for j in range(self.n_agents)]
