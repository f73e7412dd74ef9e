"""Bookkeeping shared by the exact checks of ``sat verify`` (docs/theory.md, "How a check reads").

Conventions of every check built on :class:`Tally`:

- a lower bound ``true ≥ bound`` holds when ``true ≥ bound − HOLD_TOL·(1+|bound|)``; an upper
  bound ``value ≤ bound`` when ``value ≤ bound + HOLD_TOL·(1+|bound|)``;
- ``min_slack``: min over cases of ``true − bound`` (lower bounds) or ``bound − value``
  (upper bounds); negative means violated;
- ``tightness``: median ``bound/true`` over cases with ``true > 0`` (lower bounds: ≤ 1, 1 is
  tight, negative means the certificate is vacuous) or ``bound/value`` over ``value > 0``
  (upper bounds: ≥ 1, 1 is tight). Findings say more (penalty actually used, vacuous share);
- ``mutation``: a deliberate break of the statement (see each check's ``mutations``); under a
  mutation the check must report violations — tests/theory/test_verify_bounds.py shows it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..certificates import HOLD_TOL, intermediate_policies
from ..evaluate import Evaluation, evaluate
from ..policy import TeamPolicy
from .base import CheckResult
from .cases import Case, trap_mdp

__all__ = ["SQ2", "Tally", "check_mutation", "expect", "summary", "count", "trap_cases",
           "evals", "random_order", "share_by_gamma", "MIN_PENALTY"]

#: penalties below this are not scored as shares: (L − ΔJ)/pen would be roundoff of J
MIN_PENALTY = 1e-7

SQ2 = math.sqrt(2.0)


@dataclass
class Tally:
    """Accumulates per-case slacks, ratios and the first violations of one check."""

    cases: int = 0
    violations: int = 0
    slacks: list = field(default_factory=list)
    ratios: list = field(default_factory=list)
    examples: list = field(default_factory=list)

    def lower(self, true: float, bound: float, label: str) -> bool:
        """Record ``true ≥ bound``; return whether it held."""
        self.cases += 1
        ok = bool(true >= bound - HOLD_TOL * (1.0 + abs(bound)))
        self.slacks.append(true - bound)
        if true > 1e-12:
            self.ratios.append(bound / true)
        self._note(ok, f"{label}: true {true:.6g} < bound {bound:.6g}")
        return ok

    def upper(self, value: float, bound: float, label: str) -> bool:
        """Record ``value ≤ bound``; return whether it held."""
        self.cases += 1
        ok = bool(value <= bound + HOLD_TOL * (1.0 + abs(bound)))
        self.slacks.append(bound - value)
        if value > 1e-12:
            self.ratios.append(bound / value)
        self._note(ok, f"{label}: value {value:.6g} > bound {bound:.6g}")
        return ok

    def equal(self, a: float, b: float, label: str, tol: float) -> bool:
        """Record ``|a − b| ≤ tol·(1+|a|+|b|)`` (an identity); slack is ``−|a − b|``."""
        self.cases += 1
        err = abs(a - b)
        ok = bool(err <= tol * (1.0 + abs(a) + abs(b)))
        self.slacks.append(-err)
        self._note(ok, f"{label}: {a:.10g} != {b:.10g}")
        return ok

    def record(self, ok: bool, slack: float, ratio: float | None, msg: str) -> bool:
        """Record one case of a compound statement with its own slack and ratio."""
        self.cases += 1
        self.slacks.append(float(slack))
        if ratio is not None and np.isfinite(ratio):
            self.ratios.append(float(ratio))
        self._note(bool(ok), msg)
        return bool(ok)

    def _note(self, ok: bool, msg: str) -> None:
        if not ok:
            self.violations += 1
            if len(self.examples) < 3:
                self.examples.append(msg)

    def result(self, name: str, findings: list[str], *, tightness=True) -> CheckResult:
        from .base import CHECKS

        meta = CHECKS[name]
        findings = list(findings)
        if self.examples:
            findings = [f"violation: {e}" for e in self.examples] + findings
        tight = float(np.median(self.ratios)) if (tightness and self.ratios) else None
        return CheckResult(
            name=name, reference=meta.reference, section=meta.section, cases=self.cases,
            violations=self.violations, passed=self.violations == 0 and self.cases > 0,
            min_slack=float(min(self.slacks)) if self.slacks else None, tightness=tight,
            findings=findings,
        )


def check_mutation(mutation: str | None, name: str, extra: tuple[str, ...] = ()) -> None:
    """Reject unknown mutation names. ``extra``: mutations a check implements for exploration
    but does not declare, because they are (provably or empirically) not violations."""
    from .base import CHECKS

    if mutation is not None and mutation not in CHECKS[name].mutations + tuple(extra):
        raise ValueError(f"check {name} has no mutation {mutation!r}; "
                         f"known: {', '.join(CHECKS[name].mutations)}")


def expect(d: np.ndarray, x: np.ndarray) -> float:
    """``E_{s∼d} x(s)`` counting ``+∞`` entries only where ``d(s) > 0``."""
    m = d > 0
    return float(d[m] @ x[m])


def summary(xs, fn=np.median) -> float:
    """A summary statistic that is NaN (not an error) for an empty list."""
    return float(fn(xs)) if len(xs) else float("nan")


def count(quick: bool, q: int, full: int) -> int:
    return q if quick else full


def trap_cases(gammas=(0.9, 0.99), ts=(1e-3, 0.02, 0.3), n_agents=(1, 2, 3)) -> list[Case]:
    """Hand-built near-extremal cases: the trap MDP, ``π_cur`` deterministic 'stay' (action 0)
    and targets playing 1 with probability ``t`` (occupancy shifts nearly as large as the
    bound allows as ``t → 0``)."""
    out = []
    for g in gammas:
        for n in n_agents:
            mdp = trap_mdp(g, n)
            cur = TeamPolicy(tuple(np.tile([1.0, 0.0], (2, 1)) for _ in range(n)))
            for t in ts:
                tar = TeamPolicy(tuple(np.tile([1 - t, t], (2, 1)) for _ in range(n)))
                out.append(Case(mdp, cur, tar, "trap", None, f"trap n={n} γ={g:g} t={t:g}"))
    return out


def evals(case: Case, order) -> list[Evaluation]:
    return [evaluate(case.mdp, p) for p in intermediate_policies(case.current, case.target, order)]


def random_order(rng, n: int) -> tuple[int, ...]:
    return tuple(int(x) for x in rng.permutation(n))


#: case kinds built for the agent order 0..n−1 (trap constructions, saved adversarial search
#: results): checked in that order, where they bite, not in a random one
BUILT_FOR_ORDER = ("trap", "adversarial-saved")


def case_order(rng, c) -> tuple[int, ...]:
    """The agent order a case is checked in: ``0..n−1`` for :data:`BUILT_FOR_ORDER` cases,
    else a random order. The random draw is made either way, so the other cases' orders do
    not depend on which built cases are in the pool."""
    order = random_order(rng, c.n)
    return tuple(range(c.n)) if c.kind in BUILT_FOR_ORDER else order


def share_by_gamma(rows) -> str:
    """``rows`` of ``(γ, used, penalty)``: the largest share ``used/penalty`` per γ (over
    penalties above :data:`MIN_PENALTY`), as ``"γ=0.1: 0.78, γ=0.5: 0.45, …"``."""
    best: dict[float, float] = {}
    for g, used, pen in rows:
        if pen > MIN_PENALTY and np.isfinite(pen):
            best[g] = max(best.get(g, -np.inf), used / pen)
    return ", ".join(f"γ={g:g}: {u:.3g}" for g, u in sorted(best.items())) or "no cases"
