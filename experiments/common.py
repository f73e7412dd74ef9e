"""Shared pieces of the experiment scripts: options, output files, and the exact
trust-region step used by the studies that need only the exact core.

Every script in ``experiments/`` follows the same shape::

    def run(opts: Options) -> list[Path]   # computes, writes CSV + PNG + PDF, returns paths
    def main(argv=None) -> int              # parses --quick/--out/--seeds, calls run()

The exact step (:func:`tr_factor_step`) is the infinite-sample limit of one agent's
trust-region update: the exponentiated-advantage (mirror-ascent) step

    π'^(j)(a|s) ∝ π^(j)(a|s) · exp(η · A_j(s,a)),   η ≥ 0,

where ``A_j`` is agent j's marginal advantage (THEORY §4, ``marginal_advantage``), with ``η``
found by bisection so that the expected behaviour-to-updated KL
``E_{s∼d} KL_s(π^(j)‖π'^(j))`` equals the radius ``δ``. ``KL(π‖π_η) = log Z(η) − η E_π A_j``
has derivative ``E_{π_η} A_j − E_π A_j ≥ 0``, so it is non-decreasing in ``η`` and bisection
is exact up to its tolerance.

Which ``(policy, A, d)`` a method uses is what distinguishes the occupancy modes:

- ``intermediate`` (SAT / TeamTR): step i uses ``π̂^{i−1}``, ``A^{π̂^{i−1}}``, ``d^{π̂^{i−1}}``;
- ``stale`` (naive sequential): every step uses the stage-start ``π̂^0``, ``A^{π̂^0}``,
  ``d^{π̂^0}`` — what stage-start rollouts estimate. In the exact world this makes naive
  sequential identical to a joint update (every target is computed from ``π̂^0``).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from sat_theory.certificates import StageCertificate, intermediate_policies, stage_certificate
from sat_theory.evaluate import Evaluation, evaluate
from sat_theory.executor import add_executor_arguments
from sat_theory.mdp import FactorizedMDP
from sat_theory.policy import TeamPolicy, factor_kl, marginal_advantage

OCCUPANCY_MODES = ("intermediate", "stale")
#: the method each occupancy mode stands for in the exact studies
MODE_METHOD = {"intermediate": "sat", "stale": "naive"}


@dataclass
class Options:
    """Options shared by every experiment script."""

    out: Path = field(default=Path("figures"), metadata={"help": "output directory"})
    quick: bool = field(default=False, metadata={"help": "small settings (smoke run, < 5 min total)"})
    seeds: int | None = field(default=None, metadata={
        "help": "number of seeds (default: the script's quick/full setting)"})
    executor: str = field(default="serial", metadata={
        "help": "where independent training runs execute: serial | process | ray"})
    workers: int | None = field(default=None, metadata={"help": "process-pool size"})
    ray_address: str | None = field(default=None, metadata={"help": "Ray cluster address"})

    def executor_kwargs(self) -> dict:
        return dict(executor=self.executor, workers=self.workers, ray_address=self.ray_address)

    def n_seeds(self, quick: int, full: int) -> int:
        return self.seeds if self.seeds is not None else (quick if self.quick else full)


def parse_options(argv=None, description: str = "") -> Options:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--out", type=Path, default=Path("figures"), help="output directory")
    p.add_argument("--quick", action="store_true", help="small settings (smoke run)")
    p.add_argument("--seeds", type=int, default=None, help="number of seeds")
    add_executor_arguments(p)
    a = p.parse_args(argv)
    return Options(out=a.out, quick=a.quick, seeds=a.seeds, executor=a.executor,
                   workers=a.workers, ray_address=a.ray_address)


def run_study(run, doc: str, argv=None) -> int:
    """``main()`` of a study script: parse the shared options, run, print the written paths."""
    for p in run(parse_options(argv, doc)):
        print(p)
    return 0


def write_csv(df: pd.DataFrame, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.csv"
    df.to_csv(path, index=False, float_format="%.10g")
    return path


def write_json(obj, out: Path, name: str) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    return path


# ------------------------------------------------------------------ exact trust-region step
def _tilt(pi: np.ndarray, A: np.ndarray, eta: float) -> np.ndarray:
    """``π_η(a|s) ∝ π(a|s) exp(η A(s,a))`` row-wise, computed in log space."""
    with np.errstate(divide="ignore"):
        z = np.log(pi) + eta * A
    return np.exp(z - logsumexp(z, axis=1, keepdims=True))


def expected_factor_kl(mdp: FactorizedMDP, p: np.ndarray, q: np.ndarray, j: int,
                       d: np.ndarray) -> float:
    """``E_{s∼d} KL_s(p‖q)`` for agent j's factors (0 where j is inactive)."""
    return float(d @ factor_kl(mdp, p, q, j))


def tr_factor_step(mdp: FactorizedMDP, policy: TeamPolicy, A: np.ndarray, d: np.ndarray, j: int,
                   delta: float, *, iters: int = 80) -> np.ndarray:
    """Agent j's exact trust-region step (module docstring): the (S, A_j) factor
    ``∝ π^(j) exp(η A_j)`` with ``E_{s∼d} KL_s(π^(j)‖·) = δ``.

    ``A`` is the (S, K) joint advantage of ``policy``; ``A_j`` marginalizes the other agents
    under ``policy``. The result's expected KL is finite and ``≤ δ`` (equal up to the bisection
    tolerance). If even ``η → ∞`` stays below ``δ`` the largest tried step is returned.
    """
    pi = policy.factors[j]
    Aj = marginal_advantage(mdp, policy, A, j)
    Aj = Aj - Aj.mean(axis=1, keepdims=True)  # shift-invariant; keeps exp() well scaled

    def kl(eta):
        return expected_factor_kl(mdp, pi, _tilt(pi, Aj, eta), j, d)

    hi = 1.0
    while kl(hi) < delta and hi < 1e8:
        hi *= 4.0
    if kl(hi) < delta:
        return _tilt(pi, Aj, hi)
    lo = 0.0
    for _ in range(iters):  # bisection in η; the KL is monotone in η
        mid = 0.5 * (lo + hi)
        if kl(mid) < delta:
            lo = mid
        else:
            hi = mid
    # return the lower end: its KL is finite and ≤ δ (at the upper end a probability can
    # underflow to 0 and make the KL jump to +∞)
    return _tilt(pi, Aj, lo)


def exact_stage(mdp: FactorizedMDP, current: TeamPolicy, order, delta: float | list[float],
                mode: str = "intermediate") -> tuple[TeamPolicy, StageCertificate, list[Evaluation]]:
    """One stage of exact trust-region steps in ``order`` under occupancy ``mode``.

    Returns the per-agent targets (``π̄``), the core's exact certificate of the stage and the
    exact evaluations of ``π̂^0 … π̂^n``.
    """
    if mode not in OCCUPANCY_MODES:
        raise ValueError(f"unknown occupancy mode {mode!r}")
    n = mdp.n_agents
    deltas = [float(delta)] * n if np.isscalar(delta) else [float(x) for x in delta]
    ev0 = evaluate(mdp, current)
    pol, ev = current, ev0
    for i, j in enumerate(order):
        if mode == "intermediate":
            new = tr_factor_step(mdp, pol, ev.A, ev.d, j, deltas[i])
        else:
            new = tr_factor_step(mdp, current, ev0.A, ev0.d, j, deltas[i])
        pol = pol.with_factor(j, new)
        if mode == "intermediate":
            ev = evaluate(mdp, pol)
    evs = [evaluate(mdp, p) for p in intermediate_policies(current, pol, order)]
    return pol, stage_certificate(mdp, current, pol, order, evaluations=evs), evs


def fit_power_law(x, y) -> tuple[float, float]:
    """Least-squares fit of ``log y = α log x + log C``; returns ``(α, C)``.

    Non-positive ``y`` cannot be fitted on a log scale and give ``(nan, nan)``.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if len(x) < 2 or np.any(y <= 0) or not np.all(np.isfinite(y)):
        return math.nan, math.nan
    alpha, logc = np.polyfit(np.log(x), np.log(y), 1)
    return float(alpha), float(math.exp(logc))
