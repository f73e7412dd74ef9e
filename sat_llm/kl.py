"""Token-level KL monitors of an agent's update (TeamTR §4, eq. 18; Lemma B.3).

For a message ``m = (x_1..x_T)`` sampled by the behaviour policy ``π`` (the agent before the
update, the *reference*) in context ``s``, and the updated policy ``π'``:

- exact (full vocabulary at every position of the message):
  ``KL̂_exact(m) = Σ_u Σ_v π(v|s,x_<u) log(π(v|s,x_<u) / π'(v|s,x_<u))``;
- sampled log-ratio (TeamTR eq. 18): ``KL̂_sampled(m) = Σ_u log(π(x_u|s,x_<u) / π'(x_u|s,x_<u))``.

By the autoregressive chain rule (THEORY §6, TeamTR Lemma B.3) both have expectation
``KL(π(·|s) ‖ π'(·|s))`` over ``m ∼ π``: the exact form replaces each sampled log-ratio by its
conditional expectation (lower variance, never negative); the sampled form is what large
vocabularies force on the papers. The trust-region statistic is the mean over the agent's
messages in the batch, ``δ̂ = (1/|M_j|) Σ_{m ∈ M_j} KL̂(m)``.
"""

from __future__ import annotations

import torch

__all__ = ["token_kl", "sequence_kl", "sampled_sequence_kl", "upstream_agents",
           "context_log_weights", "STALE_WEIGHT"]

#: a training context of a stale batch is "wrong" when the current upstream agents give its
#: upstream messages less than this fraction of the probability the agents that generated it
#: gave them (``w < 1/2``; issue 22 item 4)
STALE_WEIGHT = 0.5


def token_kl(logp_ref: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``KL(π_ref(·|s,x_<u) ‖ π_new(·|s,x_<u))`` at every position: ``(B,T,V), (B,T,V), (B,T)
    -> (B,T)``, ``Σ_v p_ref (log p_ref − log p_new)``, zero where ``mask`` is 0.
    Vocabulary entries with ``p_ref = 0`` contribute 0 (``0 log 0 = 0``)."""
    p_ref = logp_ref.exp()
    diff = torch.where(p_ref > 0, logp_ref - logp_new, torch.zeros_like(logp_ref))
    return (p_ref * diff).sum(-1) * mask


def sequence_kl(logp_ref, logp_new, mask) -> torch.Tensor:
    """Exact token-sum KL per message, ``Σ_u token_kl`` (B,)."""
    return token_kl(logp_ref, logp_new, mask).sum(-1)


def sampled_sequence_kl(tok_logp_ref: torch.Tensor, tok_logp_new: torch.Tensor,
                        mask: torch.Tensor) -> torch.Tensor:
    """TeamTR eq. 18 per message: ``Σ_u (log π_ref(x_u|·) − log π_new(x_u|·))`` (B,) from the
    per-token log-probabilities of the sampled tokens (B,T)."""
    return ((tok_logp_ref - tok_logp_new) * mask).sum(-1)



def upstream_agents(batch, agent: int) -> list[int]:
    """The agents whose messages precede a turn of ``agent`` in some episode of ``batch``."""
    up = set()
    for e, turn in batch.turns_of(agent):
        for u in batch.episodes[e].turns:
            if u is turn:
                break
            if u.agent != agent:
                up.add(u.agent)
    return sorted(up)


def context_log_weights(batch, agent: int, now: dict):
    """How likely the *current* upstream agents are to produce each training context of
    ``agent`` in ``batch``, relative to the agents that generated it:

    ``log w(c) = Σ_{u < t, agent(u) ≠ agent} (log π_now^(agent(u))(m_u | c_u) − log π_beh(m_u | c_u))``

    over the earlier turns ``u`` of the same episode spoken by other agents (the upstream
    messages in the context ``c`` of the turn at ``t``); ``now[k]``: the current summed
    log-probabilities of agent ``k``'s turns in ``batch.turns_of(k)`` order, for every ``k`` in
    :func:`upstream_agents`. A fresh batch has ``w = 1`` (up to recomputation roundoff); a
    stale one has ``E_beh[w] = 1``, and a context with ``w < STALE_WEIGHT`` is one the current
    upstream agents would now rarely produce. One value per turn of ``agent``, in
    ``batch.turns_of(agent)`` order (a float64 array)."""
    import numpy as np

    delta: dict[int, float] = {}  # id(turn) -> log-ratio of that upstream turn
    for k, lp in now.items():
        for (_, t), a in zip(batch.turns_of(k), lp, strict=True):
            delta[id(t)] = float(a) - float(t.logp)
    out = []
    for e, turn in batch.turns_of(agent):
        total = 0.0
        for u in batch.episodes[e].turns:
            if u is turn:
                break
            if u.agent != agent:
                total += delta[id(u)]
        out.append(total)
    return np.asarray(out, dtype=np.float64)
