"""The per-agent loss: sequence-level clipped surrogate plus ``β·KL`` (TeamTR §4, eq. 17).

For the agent's messages ``m`` in the batch (contexts ``s``), behaviour log-probabilities
``log π_beh(m|s) = Σ_u log π_beh(x_u|s,x_<u)`` and advantages ``Ã`` (group-normalized and
clipped by :func:`sat_theory.estimators.group_advantages`, computed by the algorithm):

    w(m;s) = π_θ(m|s) / π_beh(m|s) = Π_u π_θ(x_u|·)/π_beh(x_u|·)
    L^clip = mean_m min(w Ã, clip(w, 1−ε, 1+ε) Ã)
    loss   = −L^clip + β · mean_m KL̂_exact(m)        (exact token-sum KL to the reference)

The ratio is computed in log space with the log-ratio clamped to ``[−20, 20]`` (a guard
against overflow only: ``clip`` already caps the objective far inside that range).
"""

from __future__ import annotations

import torch

__all__ = ["clipped_surrogate", "ratio_clip_fraction", "MAX_LOG_RATIO"]

MAX_LOG_RATIO = 20.0


def clipped_surrogate(seq_logp_new: torch.Tensor, seq_logp_beh: torch.Tensor, adv: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """Per-message ``min(w Ã, clip(w, 1−ε, 1+ε) Ã)`` with ``w = exp(logp_new − logp_beh)`` (B,)."""
    w = torch.exp((seq_logp_new - seq_logp_beh).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return torch.minimum(w * adv, w.clamp(1.0 - eps, 1.0 + eps) * adv)


def ratio_clip_fraction(seq_logp_new: torch.Tensor, seq_logp_beh: torch.Tensor, eps: float) -> float:
    """Fraction of messages whose ratio lies outside ``[1−ε, 1+ε]``."""
    w = torch.exp((seq_logp_new - seq_logp_beh).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return float(((w < 1.0 - eps) | (w > 1.0 + eps)).double().mean()) if w.numel() else 0.0
