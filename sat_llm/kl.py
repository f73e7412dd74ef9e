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

__all__ = ["token_kl", "sequence_kl", "sampled_sequence_kl"]


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
