"""The ``Team`` interface: what a backend (tabular or LLM) provides to the shared algorithm.

See ARCHITECTURE.md. The algorithm (:mod:`sat_theory.algorithm`) needs, per agent step, only
the methods below; nothing of the algorithm lives in a backend and nothing of a backend
(states vs token ids, logits tables vs LoRA adapters) leaks into the algorithm.

Data passed between them:

- :class:`Turn` — one decision of one agent: its context (a state index, or prompt+history
  token ids), the action/message it emitted, and the behaviour log-probability of that
  action (summed over tokens for messages).
- :class:`Episode` — one rollout: its group (rollouts of one start state / prompt form a
  group for group-normalized advantages), its turns and its return.
- :class:`Batch` — the episodes of one ``rollout`` call, tagged with a ``rollout_id`` that
  is distinct for every fresh sample (intermediate occupancy resamples after every agent
  update; stale occupancy reuses one batch for the whole stage).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["Turn", "Episode", "Batch", "Team"]


@dataclass
class Turn:
    agent: int
    context: Any  # tabular: state index; LLM: token ids / chat context
    action: Any  # tabular: action index; LLM: generated token ids
    logp: float  # behaviour log-probability of `action` under the acting agent
    t: int = 0  # time step within the episode (for discounting)
    reward_to_go: float | None = None  # discounted return from this turn on, if known


@dataclass
class Episode:
    group: int
    turns: list[Turn]
    ret: float  # the episode's (discounted) return / final score


@dataclass
class Batch:
    episodes: list[Episode]
    rollout_id: int
    # Backend-specific payload (e.g. the exact policy/evaluation in the tabular exact mode,
    # generation statistics for LLMs). The algorithm never looks inside.
    extra: dict = field(default_factory=dict)

    @property
    def returns(self) -> np.ndarray:
        return np.array([e.ret for e in self.episodes], dtype=np.float64)

    @property
    def groups(self) -> np.ndarray:
        return np.array([e.group for e in self.episodes], dtype=np.int64)

    def turns_of(self, agent: int) -> list[tuple[int, Turn]]:
        """``(episode index, turn)`` for every turn taken by ``agent``, in batch order."""
        return [(i, t) for i, e in enumerate(self.episodes) for t in e.turns if t.agent == agent]


@runtime_checkable
class Team(Protocol):
    """A team of ``n_agents`` trainable agents (see module docstring)."""

    n_agents: int

    def rollout(self, n_groups: int, group_size: int) -> Batch:
        """Fresh episodes under the *current* team (all agents as they are now)."""

    def snapshot(self, agent: int) -> Any:
        """A cheap, independent copy of one agent's parameters (and optimizer state)."""

    def restore(self, agent: int, snap: Any) -> None:
        """Put back a snapshot taken by :meth:`snapshot`."""

    def update(self, agent: int, batch: Batch, advantages: np.ndarray | None, beta: float,
               reference: Any) -> dict:
        """Optimizer steps for ``agent`` alone on the clipped surrogate with ``advantages``
        (one per turn of ``batch.turns_of(agent)``; ``None`` = exact advantages, where the
        backend has them) plus ``beta ·`` KL to ``reference`` (a snapshot). Returns metrics."""

    def kl(self, agent: int, batch: Batch, reference: Any) -> dict:
        """Behaviour-to-updated KL of ``agent`` from ``reference`` (a snapshot) to its current
        parameters on the batch's contexts: ``{"kl": mean, "kl_max": max, ...}``."""

    def evaluate(self) -> float:
        """The team's score: exact ``J`` in the tabular world, held-out accuracy for LLMs."""

    def replace(self, agent: int, new: Any) -> None:
        """Swap in a new agent (plug-and-play); alignment is done by the algorithm."""
