"""The per-agent loss: clipped surrogate plus ``β·KL`` (TeamTR §4, eq. 17), in two ratio forms.

For the agent's messages ``m = (x_1..x_{L_m})`` in the batch (contexts ``s``), ``M`` of them,
advantages ``Ã_m`` (group-normalized and clipped by
:func:`sat_theory.estimators.group_advantages`, computed by the algorithm) and per-token
log-ratios ``Δ_u = log π_θ(x_u|s,x_<u) − log π_old(x_u|s,x_<u)``:

- ``ratio="sequence"`` (the default; TeamTR eq. 17, the theory's form): one ratio per message,
  ``w_m = π_θ(m|s)/π_beh(m|s) = exp(Σ_u Δ_u)``,
  ``L^clip = (1/M) Σ_m min(w_m Ã_m, clip(w_m, 1−ε, 1+ε) Ã_m)``;
- ``ratio="token"`` (PPO/GRPO's per-token form): ``r_u = exp(Δ_u)``,
  ``L^clip_tok = (1/M) Σ_m Σ_u min(r_u Ã_m, clip(r_u, 1−ε, 1+ε) Ã_m)``.

    loss = −L^clip + β · (1/M) Σ_m KL̂_exact(m)        (exact token-sum KL to the reference)

**The token form is TRL's ``dr_grpo`` times ``L_max``.** TRL 1.16 ``GRPOTrainer._compute_loss``
with ``loss_type="dr_grpo"``, ``importance_sampling_level="token"``, β = 0 computes, on a batch
of ``B`` completions, ``Σ_m Σ_u −min(r_u A_m, clip(r_u) A_m) / (B · max_completion_length)``.
With ``B = M`` and ``max_completion_length = L_max`` (our ``max_new_tokens``) that is
``−L^clip_tok / L_max``: our token loss is ``L_max · loss_dr_grpo`` in value and gradient
(a constant factor, chosen so that the two forms have the same learning-rate scale, below).
TRL's ``dapo`` differs only by the normalizer (the batch's token count ``N`` instead of
``B·L_max``): ours is ``(N/M) · loss_dapo``, a batch-dependent factor, hence ``dr_grpo``.

**On-policy both forms have the same gradient** (θ = θ_old, so every ``Δ_u = 0``, ``w = r = 1``,
and no clip is active): ``∇w_m = w_m Σ_u ∇log π_θ(x_u|·) = Σ_u ∇log π_θ(x_u|·) = Σ_u ∇r_u``,
so ``∇L^clip = ∇L^clip_tok = (1/M) Σ_m Ã_m Σ_u ∇log π_θ(x_u|·)``, the REINFORCE gradient. This
is also TRL's ``luspo`` gradient (sequence-level ratio ``w̄_m = exp(mean_u Δ_u)``, loss
``(1/B) Σ_m L_m · (−min(w̄_m A_m, clip(w̄_m) A_m))``): ``∇(L_m w̄_m) = L_m · (1/L_m) Σ_u ∇log π``.
Off-policy the forms differ: ``w_m`` multiplies the token ratios (clipping the whole message
once), the token form clips each token separately.

``π_old`` of the sequence form is the behaviour log-probability recorded at rollout time;
that of the token form is the update's reference (the agent before the update, rescored on
the batch — in ``run_stage`` the same policy, and what TRL's ``old_per_token_logps`` is).
Ratios are computed in log space with the log-ratio clamped to ``[−20, 20]`` (a guard against
overflow only: ``clip`` already caps the objective far inside that range).
"""

from __future__ import annotations

import torch

__all__ = ["clipped_surrogate", "token_clipped_surrogate", "MAX_LOG_RATIO", "RATIOS"]

MAX_LOG_RATIO = 20.0

#: the surrogate's ratio forms (``LLMConfig.ratio``)
RATIOS = ("sequence", "token")


def _clipped(log_ratio: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """``min(r Ã, clip(r, 1−ε, 1+ε) Ã)`` with ``r = exp(log_ratio)`` (clamped, see module)."""
    r = torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    return torch.minimum(r * adv, r.clamp(1.0 - eps, 1.0 + eps) * adv)


def clipped_surrogate(seq_logp_new: torch.Tensor, seq_logp_beh: torch.Tensor, adv: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """Per-message ``min(w Ã, clip(w, 1−ε, 1+ε) Ã)`` with ``w = exp(logp_new − logp_beh)`` (B,)."""
    return _clipped(seq_logp_new - seq_logp_beh, adv, eps)


def token_clipped_surrogate(tok_logp_new: torch.Tensor, tok_logp_old: torch.Tensor,
                            mask: torch.Tensor, adv: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-message ``Σ_u min(r_u Ã, clip(r_u, 1−ε, 1+ε) Ã)``, ``r_u = exp(logp_new_u − logp_old_u)``:
    per-token log-probabilities (B,T), ``mask`` (B,T) 1 on message tokens, ``adv`` (B,) -> (B,)."""
    return (_clipped(tok_logp_new - tok_logp_old, adv[:, None], eps) * mask).sum(-1)

