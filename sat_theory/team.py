"""The ``Team`` interface: what a backend (tabular or LLM) provides to the shared algorithm.

See docs/architecture.md. The algorithm (:mod:`sat_theory.algorithm`) needs, per agent step, only
the methods of :class:`Team`; nothing of the algorithm (update order, advantages, trust-region
control, resampling, importance weights, certificates) lives in a backend, and nothing of a
backend (states vs token ids, logits tables vs LoRA adapters) leaks into the algorithm.

Data passed between them:

- :class:`Turn` — one decision of one agent: its context (a state index, or prompt+history
  token ids), the action/message it emitted, the behaviour log-probability of that action
  (summed over tokens for messages), its time step ``t`` and, if known, the discounted
  reward-to-go from that step on.
- :class:`Episode` — one rollout: its group (rollouts of one start state / prompt form a
  group for group-normalized advantages), its turns and its (discounted) return.
- :class:`Batch` — the episodes of one ``rollout`` call, tagged with a ``rollout_id`` that
  is distinct for every fresh sample (intermediate occupancy resamples after every agent
  update; stale occupancy reuses one batch for the whole stage). ``exact=True`` marks the
  tabular exact mode's infinite-sample "batch": it has no episodes, and every expectation
  is computed exactly by the backend from ``extra``. ``versions`` (optional) names the
  parameter version of every agent that generated it.

Conventions every backend follows (the algorithm relies on them):

- *Per-turn arrays* are aligned with ``batch.turns_of(agent)`` (batch order).
- ``kl(agent, batch, reference)`` estimates the trust-region radius of THEORY §4,
  ``δ_i = E_{s∼d} KL_s(π_ref^(j) ‖ π^(j))`` (behaviour-to-updated), on the batch's states,
  where ``d`` is the batch's own (discounted) occupancy and ``KL_s = 0`` where ``j`` does not
  act. Tabular sampled mode: ``mean over episodes of Σ_{turns of j} (1−γ)γ^t KL_{s_t}``.
  LLM: the mean over the agent's turns of the exact token-level KL (TeamTR Lemma B.3).
- ``reference`` is always a snapshot returned by ``snapshot(agent)``.
- Everything is deterministic given the backend's seed and the sequence of calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Turn", "Episode", "Batch", "TurnArrays", "Team", "Checkpointable",
           "SupportsExactTerms", "HasAdvantageBound", "Versioned", "ReportsMetrics",
           "SupportsSwap", "SupportsAlign", "Resettable", "SavesPolicy", "HasPolicyFormat",
           "HasEvalRecords", "Closeable"]


@dataclass
class Turn:
    agent: int
    context: Any  # tabular: state index; LLM: token ids / chat context
    action: Any  # tabular: action index; LLM: generated token ids
    logp: float  # behaviour log-probability of `action` under the acting agent
    t: int = 0  # time step within the episode (for discounting)
    reward_to_go: float | None = None  # discounted return from step t on (γ^0 at t), if known


@dataclass
class Episode:
    group: int
    turns: list[Turn]
    ret: float  # the episode's (discounted) return / final score


@dataclass
class TurnArrays:
    """Column form of ``batch.turns_of(agent)``: ``episode`` (M,) int index into
    ``batch.episodes``, ``t`` (M,) int, ``logp`` (M,) behaviour log-probs, ``reward_to_go``
    (M,) (the episode return where a turn has none), ``context`` and ``action`` (M,)
    object arrays (a backend that pre-fills them may use int arrays)."""

    episode: np.ndarray
    t: np.ndarray
    logp: np.ndarray
    reward_to_go: np.ndarray
    context: np.ndarray
    action: np.ndarray


@dataclass
class Batch:
    episodes: list[Episode]
    rollout_id: int
    # Backend-specific payload (e.g. the exact policy/evaluation in the tabular exact mode,
    # generation statistics for LLMs). The algorithm never looks inside.
    extra: dict = field(default_factory=dict)
    # True for the tabular exact mode's infinite-sample batch (no episodes; every
    # expectation is exact). The algorithm then passes ``advantages=None`` to ``update``.
    exact: bool = False
    # The parameter version of every agent whose policy generated the batch (LLM teams:
    # the adapter versions the rollout engine served), or None when the backend does not
    # track versions (the tabular team). A backend checks it before an update: the batch
    # must come from the versions it expects (stale rollouts are an error, not a warning).
    versions: tuple | None = None
    _arrays: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def returns(self) -> np.ndarray:
        return np.array([e.ret for e in self.episodes], dtype=np.float64)

    @property
    def groups(self) -> np.ndarray:
        return np.array([e.group for e in self.episodes], dtype=np.int64)

    @property
    def n_episodes(self) -> int:
        return len(self.episodes)

    def turns_of(self, agent: int) -> list[tuple[int, Turn]]:
        """``(episode index, turn)`` for every turn taken by ``agent``, in batch order."""
        return [(i, t) for i, e in enumerate(self.episodes) for t in e.turns if t.agent == agent]

    def arrays(self, agent: int) -> TurnArrays:
        """:class:`TurnArrays` of ``agent`` (cached; a backend may pre-fill ``_arrays``)."""
        if agent not in self._arrays:
            turns = self.turns_of(agent)
            ctx = np.empty(len(turns), dtype=object)
            act = np.empty(len(turns), dtype=object)
            for k, (_, t) in enumerate(turns):
                ctx[k] = t.context
                act[k] = t.action
            self._arrays[agent] = TurnArrays(
                episode=np.array([i for i, _ in turns], dtype=np.int64),
                t=np.array([t.t for _, t in turns], dtype=np.int64),
                logp=np.array([t.logp for _, t in turns], dtype=np.float64),
                reward_to_go=np.array(
                    [self.episodes[i].ret if t.reward_to_go is None else t.reward_to_go
                     for i, t in turns], dtype=np.float64),
                context=ctx,
                action=act,
            )
        return self._arrays[agent]


@runtime_checkable
class Team(Protocol):
    """A team of ``n_agents`` trainable agents (see module docstring).

    Required attributes: ``n_agents`` and ``gamma`` (the discount of the certificates;
    ``gamma >= 1`` switches the γ-dependent certificate terms off, they are logged as null).

    Optional hooks are the protocols below (each ``runtime_checkable``: the algorithm and
    the runner use a hook exactly when ``isinstance(team, Hook)``): :class:`Checkpointable`
    (required by the runner), :class:`SupportsExactTerms`, :class:`HasAdvantageBound`,
    :class:`Versioned`, :class:`ReportsMetrics`, :class:`SupportsSwap`,
    :class:`SupportsAlign`, :class:`Resettable`, :class:`SavesPolicy`,
    :class:`HasPolicyFormat`, :class:`HasEvalRecords` and :class:`Closeable`.
    """

    n_agents: int
    gamma: float

    def rollout(self, n_groups: int, group_size: int) -> Batch:
        """Fresh episodes under the *current* team (all agents as they are now), with a new
        ``rollout_id``: ``n_groups`` groups (start states / prompts) of ``group_size``
        episodes each. The tabular exact mode returns an ``exact=True`` batch instead."""

    def snapshot(self, agent: int) -> Any:
        """A cheap, independent copy of one agent's parameters (and optimizer state)."""

    def restore(self, agent: int, snap: Any) -> None:
        """Put back a snapshot taken by :meth:`snapshot`."""

    def update(self, agent: int, batch: Batch, advantages: np.ndarray | None, beta: float,
               reference: Any, *, step_scale: float = 1.0, correction: str = "none") -> dict:
        """Optimizer steps for ``agent`` alone on the clipped surrogate with ``advantages``
        plus ``beta ·`` KL(reference ‖ agent) on the batch's states.

        ``advantages``: one per turn of ``batch.turns_of(agent)``, already multiplied by any
        importance weight the algorithm applies (stale+IS, HAPPO's M-factor); ``None`` only
        for ``exact`` batches (the backend then uses the exact advantages of the batch's
        policy). ``step_scale`` (≤ 1) shrinks the step on backtracking (learning rate or
        step length). ``correction`` matters only for exact batches, where there are no
        samples to reweight: ``"none"`` (use the batch as it is — stale occupancy and stale
        team), ``"trajectory"`` (exact trajectory importance weighting: the current team's
        occupancy and advantages), ``"step"`` (HAPPO's per-step M-factor: the batch's
        occupancy and advantages, the other agents' current factors).
        Returns metrics; ``ratio_clip_frac`` (fraction of turns whose ratio ends outside
        ``[1−ε, 1+ε]``) and ``ess`` (ESS/B of the importance weights the backend applied
        itself, exact batches) are logged when present. Must leave the agent's parameters
        updated in place; the algorithm restores the snapshot itself when it backtracks."""

    def kl(self, agent: int, batch: Batch, reference: Any) -> dict:
        """Behaviour-to-updated KL of ``agent`` from ``reference`` to its current parameters
        on the batch's states: ``{"kl": δ̂ (see module docstring), "kl_max": max over the
        agent's contexts}``; for sampled batches also ``"logp"``: the agent's *current*
        log-probabilities of its turns (per-turn array), from which the algorithm computes
        ratios, the surrogate estimate and importance weights; for exact batches also
        ``"surrogate"``: the exact ``L = 1/(1−γ) E_{s∼d_batch} E_{a∼π_now} Â_batch(s,a)``."""

    def evaluate(self) -> float:
        """The team's score: exact ``J`` in the tabular world, held-out accuracy for LLMs."""

    def replace(self, agent: int, new: Any) -> None:
        """Swap in a new agent (plug-and-play); alignment is done before, via ``align``."""


# ------------------------------------------------------------------ optional hooks
@runtime_checkable
class Checkpointable(Protocol):
    """The team's whole state for checkpoints (:mod:`sat_theory.runner`): a tree of arrays,
    tensors, registered dataclasses and JSON values (:mod:`sat_theory.checkpoint`)."""

    def state_dict(self) -> dict:
        """Everything that determines the team's future (parameters, optimizer and RNG
        states, caches that change numbers), so that ``load_state_dict`` resumes exactly."""

    def load_state_dict(self, d: dict) -> None:
        """Restore a :meth:`state_dict`."""


@runtime_checkable
class SupportsExactTerms(Protocol):
    """Exact THEORY §4 terms (the tabular oracle), used instead of estimates."""

    def exact_step_terms(self, agent: int, reference: Any, stage_start: list,
                         delta_i: float | None = None) -> dict:
        """Exact terms of the step just taken: ``L_seq, L_stale, delta, delta_max, tv, A_max,
        f_inf, true_gain, J`` (and the per-state violation rate of ``δ_i``); ``stage_start``
        is the list of all agents' snapshots at the stage start."""

    def exact_stage_terms(self, stage_start: list, order: list[int]) -> dict:
        """The exact stage certificate (:meth:`sat_theory.certificates.StageCertificate.to_dict`)
        of stage-start → now in ``order``."""


@runtime_checkable
class HasAdvantageBound(Protocol):
    """``advantage_bound``: an a-priori bound on ``|A|`` (reward units) for the estimated
    stage bound and the empirical certificate when there are no exact terms."""

    advantage_bound: float


@runtime_checkable
class Versioned(Protocol):
    """Parameter versions, so a batch from stale or unsynced parameters is caught (LLM)."""

    @property
    def version(self) -> tuple:
        """One version per agent; it changes with every change of the agent's parameters."""

    def check_batch(self, agent: int, batch: Batch, reference: Any, *, expected=None) -> None:
        """Raise when ``batch`` was not generated by ``expected`` (the versions when it was
        drawn) or ``reference`` does not belong to it."""


@runtime_checkable
class ReportsMetrics(Protocol):
    """Backend fields of the records (LLM: tokens, loss, ``eval_accuracy``, ...)."""

    def step_metrics(self, agent: int, batch: Batch, update: dict, kl: dict) -> dict:
        """Extra fields of a step record, from the step's own update and KL results."""

    def stage_metrics(self, record: dict) -> dict:
        """Extra fields of a stage record (``record``: the record so far)."""


@runtime_checkable
class SupportsSwap(Protocol):
    """Plug-and-play (THEORY §5): build a replacement agent."""

    def new_agent(self, agent: int, kind: str, seed: int) -> Any:
        """A new agent for slot ``agent``: ``kind`` ``"stronger"`` or ``"random"``."""


@runtime_checkable
class SupportsAlign(Protocol):
    """Stage-0 alignment of a new agent before it is swapped in (THEORY §5)."""

    def align(self, agent: int, new: Any, delta_align: float, form: str) -> tuple[Any, dict]:
        """``(aligned_new, info)``: ``new`` aligned toward the current agent ``agent``
        (``form``: ``"distill"`` TeamTR, ``"project"`` SAT); ``info`` is logged in the swap
        record with an ``align_`` prefix."""


@runtime_checkable
class Resettable(Protocol):
    """Reinitialise agents (plug-and-play ``retrain``)."""

    def reset(self, agents: list[int]) -> None:
        """Put these agents back to their initial parameters."""


@runtime_checkable
class SavesPolicy(Protocol):
    """Write the team's current policy (``--save-policies``)."""

    def save(self, path: str) -> None:
        """Write the policy to ``path`` (tabular: the core's ``.npz`` format)."""


@runtime_checkable
class HasPolicyFormat(Protocol):
    """The file extension of :meth:`SavesPolicy.save` (default ``npz``)."""

    policy_format: str


@runtime_checkable
class HasEvalRecords(Protocol):
    """Per-problem results of the latest :meth:`Team.evaluate` (``eval_{k}.jsonl``)."""

    def eval_records(self) -> list[dict]:
        """One JSON-able dict per held-out problem."""


@runtime_checkable
class Closeable(Protocol):
    """Resources to release when the run ends (Ray actors, engines)."""

    def close(self) -> None:
        """Release them; the team is not used afterwards."""
