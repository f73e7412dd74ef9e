"""Sample-based estimators and their finite-sample terms (THEORY §6).

- Group-normalized, clipped advantage over the ``G`` rollouts of one group (start state /
  prompt): ``Ã_g = clip((R_g − μ̂)/σ̂, −A_clip, A_clip)`` with ``μ̂ = mean_g R_g`` and
  ``σ̂ = sqrt(mean_g (R_g − μ̂)² + ε_norm)`` (TeamTR §4).
- Hoeffding deviation (TeamTR Lemma E.8): ``Pr(|L̂ − E L̂| > ε) ≤ 2 exp(−N ε²/(2B²))`` with
  ``B = (1+ε_w) A_clip/(1−γ)``, i.e. ``ε = B sqrt(2 log(2/η)/N)``.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import InputError

__all__ = ["group_advantages", "hoeffding_epsilon", "dkw_epsilon"]


def group_advantages(returns, groups, *, eps_norm: float = 1e-6, A_clip: float | None = 5.0,
                     normalize_std: bool = True) -> np.ndarray:
    """Per-episode ``Ã_g = clip((R_g − μ̂)/σ̂, −A_clip, A_clip)`` within each group.

    ``returns`` (N,), ``groups`` (N,) int labels. ``normalize_std=False`` drops the division
    by ``σ̂`` (ablation); ``A_clip=None`` drops the clipping (ablation). A group of size 1
    gets advantage 0 (its own mean).
    """
    R = np.asarray(returns, dtype=np.float64)
    g = np.asarray(groups)
    if R.shape != g.shape or R.ndim != 1:
        raise InputError(f"returns and groups must be 1-D of equal length, got {R.shape}, {g.shape}")
    if eps_norm < 0:
        raise InputError(f"eps_norm must be >= 0, got {eps_norm}")
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    mu = np.bincount(inv, weights=R) / counts
    dev = R - mu[inv]
    out = dev
    if normalize_std:
        var = np.bincount(inv, weights=dev * dev) / counts
        out = dev / np.sqrt(var + eps_norm)[inv]
    if A_clip is not None:
        out = np.clip(out, -A_clip, A_clip)
    return out


def hoeffding_epsilon(B: float, N: int, eta: float) -> float:
    """``ε`` with ``2 exp(−N ε²/(2B²)) = η``: ``ε = B sqrt(2 log(2/η) / N)`` (Lemma E.8)."""
    if N < 1 or not (0 < eta < 1):
        raise InputError(f"need N >= 1 and 0 < eta < 1, got N={N}, eta={eta}")
    return B * math.sqrt(2.0 * math.log(2.0 / eta) / N)


def dkw_epsilon(N: int, eta: float) -> float:
    """Probe-set relaxation ``ε(N, η) = sqrt(log(2/η) / (2N))`` (SAT, DKW)."""
    if N < 1 or not (0 < eta < 1):
        raise InputError(f"need N >= 1 and 0 < eta < 1, got N={N}, eta={eta}")
    return math.sqrt(math.log(2.0 / eta) / (2.0 * N))
