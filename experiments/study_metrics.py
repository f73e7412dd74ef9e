"""Headline metrics of a held-out learning curve, with paired intervals over problems.

A run's held-out evaluations on one schedule form a 0/1 matrix ``S`` of shape ``(K, n)``:
checkpoint ``k`` (``k = 0`` the untrained model), problem ``i``. With the accuracy curve
``a_k = (1/n) Σ_i S[k, i]``:

- ``auc = (1/K) Σ_k a_k``: the area under the held-out curve, as the mean accuracy over the
  checkpoints (every method on the same checkpoints of the sampled-message budget);
- ``final = a_{K−1}``; ``best = max_k a_k``; ``drawdown = best − final``;
- ``worst_drop = max(0, max_k (a_k − a_{k+1}))``: the largest fall between two consecutive
  checkpoints;
- ``below_untrained = #{k ≥ 1 : a_k < a_0} / (K − 1)``: the fraction of checkpoints worse than
  the untrained model.

Intervals: a paired bootstrap over problems (:func:`bootstrap`): the same resampled problem
indices are applied to every checkpoint of both runs, so the problem-difficulty variance
cancels in a difference; the 95% percentile interval of ``metric(A[:, idx]) −
metric(B[:, idx])``. Finals are also compared by McNemar's exact test (:func:`mcnemar_exact`).
Over seeds (:func:`bootstrap_pooled`): the mean of the per-seed differences, its interval from
resampling the problems of each seed independently (a stratified paired bootstrap).

Those intervals cover the evaluation's noise (which problems), not the training run's (its
sampling, LoRA initialisation and prompt order). :func:`run_noise_interval` adds the run's
noise, measured by re-running one method with another trainer seed on the same problems.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["curve_metrics", "METRICS", "bootstrap", "bootstrap_pooled", "mcnemar_exact",
           "compare_runs", "common_checkpoints", "run_noise_interval"]

#: metric name -> function of the accuracy curves ``acc`` (..., K) -> (...)
METRICS = {
    "auc": lambda acc: acc.mean(-1),
    "final": lambda acc: acc[..., -1],
    "best": lambda acc: acc.max(-1),
    "drawdown": lambda acc: acc.max(-1) - acc[..., -1],
    "worst_drop": lambda acc: (np.maximum((acc[..., :-1] - acc[..., 1:]).max(-1), 0.0)
                               if acc.shape[-1] > 1 else np.zeros(acc.shape[:-1])),
    "below_untrained": lambda acc: ((acc[..., 1:] < acc[..., :1]).mean(-1)
                                    if acc.shape[-1] > 1 else np.zeros(acc.shape[:-1])),
}


def _matrix(S) -> np.ndarray:
    S = np.asarray(S, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 1 or S.shape[1] < 1:
        raise ValueError(f"need a (checkpoints, problems) score matrix, got shape {S.shape}")
    return S


def curve_metrics(S) -> dict[str, float]:
    """Every metric of :data:`METRICS` of one run's score matrix ``S`` (K, n)."""
    acc = _matrix(S).mean(1)
    return {name: float(f(acc)) for name, f in METRICS.items()}


def bootstrap(S_a, S_b=None, *, reps: int = 10000, seed: int = 0) -> dict[str, tuple]:
    """``{metric: (value, lo, hi)}``: the metric of run ``a`` (or, with ``S_b``, of ``a`` minus
    ``b`` on the same problems and checkpoints) and its paired-bootstrap 95% percentile
    interval over problems (``reps`` resamples of the ``n`` problem indices with
    replacement, shared by both runs and all checkpoints)."""
    A = _matrix(S_a)
    B = None if S_b is None else _matrix(S_b)
    if B is not None and B.shape != A.shape:
        raise ValueError(f"paired runs need the same checkpoints and problems: {A.shape} vs {B.shape}")
    n = A.shape[1]
    idx = np.random.default_rng(seed).integers(0, n, size=(reps, n))
    # (reps, K) resampled accuracy curves: the mean over the resampled problems per checkpoint
    boot_a = A[:, idx].mean(-1).T
    boot_b = None if B is None else B[:, idx].mean(-1).T
    out = {}
    for name, f in METRICS.items():
        value = f(A.mean(1)) - (0.0 if B is None else f(B.mean(1)))
        draws = f(boot_a) - (0.0 if boot_b is None else f(boot_b))
        lo, hi = np.percentile(draws, [2.5, 97.5])
        out[name] = (float(value), float(lo), float(hi))
    return out


def bootstrap_pooled(pairs, *, reps: int = 10000, seed: int = 0) -> dict[str, tuple]:
    """``{metric: (value, lo, hi)}`` over ``P`` paired runs (one pair ``(S_a, S_b)`` per seed;
    each pair on its own problems and checkpoints): ``value = (1/P) Σ_p [metric(A_p) −
    metric(B_p)]`` and the 95% percentile interval of that mean when every seed's problems
    are resampled with replacement independently (a stratified paired bootstrap: the
    problem-difficulty variance cancels within each pair, the seeds stay fixed strata)."""
    if not pairs:
        raise ValueError("need at least one pair of runs")
    rng = np.random.default_rng(seed)
    values = {name: [] for name in METRICS}
    draws = {name: np.zeros(reps) for name in METRICS}
    for S_a, S_b in pairs:
        A, B = _matrix(S_a), _matrix(S_b)
        if B.shape != A.shape:
            raise ValueError(f"paired runs need the same checkpoints and problems: {A.shape} vs {B.shape}")
        idx = rng.integers(0, A.shape[1], size=(reps, A.shape[1]))
        boot_a, boot_b = A[:, idx].mean(-1).T, B[:, idx].mean(-1).T
        for name, f in METRICS.items():
            values[name].append(f(A.mean(1)) - f(B.mean(1)))
            draws[name] += (f(boot_a) - f(boot_b)) / len(pairs)
    out = {}
    for name in METRICS:
        lo, hi = np.percentile(draws[name], [2.5, 97.5])
        out[name] = (float(np.mean(values[name])), float(lo), float(hi))
    return out


def mcnemar_exact(a, b) -> float:
    """Two-sided exact McNemar p-value of paired 0/1 outcomes ``a``, ``b`` (same problems):
    with ``n10 = #(a right, b wrong)`` and ``n01 = #(a wrong, b right)``, under H0 the
    discordant pairs split Binomial(``n10 + n01``, 1/2), and
    ``p = min(1, 2 · P[X ≤ min(n10, n01)])`` (1 when there are no discordant pairs)."""
    a, b = np.asarray(a) > 0.5, np.asarray(b) > 0.5
    if a.shape != b.shape:
        raise ValueError("paired outcomes need the same problems")
    n10, n01 = int(np.sum(a & ~b)), int(np.sum(~a & b))
    m, k = n10 + n01, min(n10, n01)
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, j) for j in range(k + 1)) / 2 ** m
    return float(min(1.0, 2 * tail))


def compare_runs(S_a, S_b, *, reps: int = 10000, seed: int = 0) -> dict:
    """``a − b`` for every metric with its paired CI (:func:`bootstrap`), each run's own
    metrics and the McNemar p-value of the finals."""
    diff = bootstrap(S_a, S_b, reps=reps, seed=seed)
    return dict(a=curve_metrics(S_a), b=curve_metrics(S_b), diff=diff,
                mcnemar_p=mcnemar_exact(np.asarray(S_a)[-1], np.asarray(S_b)[-1]))


def common_checkpoints(budgets: list[dict[int, float]], grid: float, *, tol: float = 0.25):
    """The checkpoints every run has on one budget grid: ``budgets[r] = {checkpoint: sampled
    messages so far}``; returns, per grid point ``j·grid`` (``j = 0, 1, …``) that every run
    reaches within ``tol·grid``, each run's nearest checkpoint: ``[[k_r0, k_r1, ...], ...]``
    (one row per grid point, one column per run), in budget order."""
    if grid <= 0:
        raise ValueError("grid must be > 0")
    top = min(max(b.values()) for b in budgets)
    rows = []
    for j in range(int(math.floor(top / grid + tol)) + 1):
        target, row = j * grid, []
        for b in budgets:
            k = min(b, key=lambda c: abs(b[c] - target))
            if abs(b[k] - target) > tol * grid:
                break
            row.append(k)
        else:
            rows.append(row)
    return rows


def run_noise_interval(diffs, reruns, *, conf: float = 0.95, reruns_a=None) -> dict:
    """Method difference against the training runs' own noise, over ``P`` seeds.

    ``diffs[s] = m(A_s) − m(B_s)``: a metric of method ``A`` minus method ``B`` on seed ``s``'s
    problems; ``reruns[s] = m(B_s) − m(B'_s)``: ``B`` minus ``B`` again with another trainer
    seed on the same problems. Model: every run's metric is a seed effect (its problems) plus
    its method's effect plus independent run noise of variance ``u_A`` (runs of ``A``) or
    ``u_B``, so that ``d_s = δ + e_s`` with ``var e_s = u_A + u_B`` and ``var r_s = 2 u_B``.

    - Without ``reruns_a`` the two methods' runs are assumed equally noisy (``u_A = u_B``):
      ``v̂ = Q_B = (1/R) Σ r_s²`` (the reruns' mean is 0 by construction) estimates
      ``var e_s``, and ``(mean(d) − δ) / sqrt(v̂/P)`` is Student-t with ``k = R`` degrees of
      freedom.
    - With ``reruns_a[s] = m(A_s) − m(A'_s)`` (``A``'s own reruns) no such assumption is
      needed: ``v̂ = (Q_A + Q_B)/2`` is unbiased for ``u_A + u_B``, and ``k`` is
      Welch–Satterthwaite's ``v̂² / ((Q_A/2)²/R_A + (Q_B/2)²/R_B)`` (``R_A + R_B`` when the
      two are equal).

    Then

    - ``delta = (mean(d), lo, hi)``, ``mean(d) ± t_k · sqrt(v̂/P)``: the interval of ``δ``;
    - ``per_seed_bound = t_k · sqrt(v̂)``: a single seed's ``|d_s|`` exceeds it with
      probability ``1 − conf`` when ``δ = 0``; ``within_noise[s] = |d_s| ≤ per_seed_bound``;
    - ``run_noise_sd = sqrt(v̂)``, ``dof = k``;
    - ``seeds_only = (mean(d), lo, hi)``: the plain t-interval ``mean(d) ± t_{P−1} · s_d/√P``
      from the differences alone (no rerun needed; wide with few seeds).

    ``t_k`` is the two-sided ``conf`` quantile of Student-t with ``k`` degrees of freedom."""
    from scipy.stats import t as student_t

    d, r = np.asarray(diffs, dtype=np.float64), np.asarray(reruns, dtype=np.float64)
    ra = None if reruns_a is None else np.asarray(reruns_a, dtype=np.float64)
    if (d.ndim != 1 or r.ndim != 1 or len(d) < 2 or len(r) < 1
            or (ra is not None and (ra.ndim != 1 or len(ra) < 1))):
        raise ValueError("need >= 2 per-seed differences and >= 1 rerun difference")
    q = 0.5 + conf / 2
    P = len(d)
    v, k = float(np.mean(r ** 2)), float(len(r))
    if ra is not None:
        qa, qb = float(np.mean(ra ** 2)), v
        v = (qa + qb) / 2
        k = v ** 2 / ((qa / 2) ** 2 / len(ra) + (qb / 2) ** 2 / len(r)) if v > 0 else float(len(ra) + len(r))
    half = float(student_t.ppf(q, k) * math.sqrt(v / P))
    bound = float(student_t.ppf(q, k) * math.sqrt(v))
    half_seeds = float(student_t.ppf(q, P - 1) * d.std(ddof=1) / math.sqrt(P))
    mean = float(d.mean())
    return dict(delta=(mean, mean - half, mean + half), run_noise_sd=math.sqrt(v), dof=k,
                per_seed_bound=bound, within_noise=[bool(abs(x) <= bound) for x in d],
                seeds_only=(mean, mean - half_seeds, mean + half_seeds))
