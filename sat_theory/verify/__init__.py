"""``sat verify``: every result of THEORY.md checked exactly on many toy MDPs.

Each check is one plain function registered with :func:`check`; it draws its cases, evaluates
the statement exactly and returns a :class:`CheckResult`. Every check accepts a
``mutation`` argument naming a deliberate break of the statement (halve a constant, drop a
term, stale occupancy for intermediate, flipped KL direction); with a mutation the check
must report violations — the tests use this to show that each check can fail.

Check modules register themselves on import; :data:`CHECK_MODULES` lists them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["CheckResult", "Check", "check", "CHECKS", "run_checks", "load_checks"]

#: modules holding registered checks (imported by :func:`load_checks`)
CHECK_MODULES = (
    "sat_theory.verify.bounds",
    "sat_theory.verify.estimators",
    "sat_theory.verify.optimization",
)


@dataclass
class CheckResult:
    name: str
    reference: str  # paper + theorem, e.g. "TeamTR Thm 3.6; SAT Thm 4.4"
    section: str  # grouping for the readable table, e.g. "THEORY §4 stage bounds"
    cases: int
    violations: int
    passed: bool
    min_slack: float | None = None  # min over cases of (true − bound), or bound − true for upper bounds
    tightness: float | None = None  # median bound / true value, where meaningful (1 = tight)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Check:
    name: str
    reference: str
    section: str
    fn: Callable[..., CheckResult]
    mutations: tuple[str, ...]  # names accepted by fn(mutation=...)


CHECKS: dict[str, Check] = {}


def check(name: str, reference: str, section: str, mutations: tuple[str, ...] = ()):
    """Register ``fn(*, quick: bool, seed: int, mutation: str | None) -> CheckResult``."""

    def deco(fn):
        if name in CHECKS:
            raise RuntimeError(f"check {name!r} registered twice")
        CHECKS[name] = Check(name, reference, section, fn, tuple(mutations))
        return fn

    return deco


def load_checks() -> dict[str, Check]:
    """Import every module of :data:`CHECK_MODULES` (each registers its checks on import) and
    return the registry. A missing or broken module is an error: the suite is all or nothing."""
    import importlib

    for m in CHECK_MODULES:
        importlib.import_module(m)
    return CHECKS


def run_checks(names=None, *, quick: bool = False, seed: int = 0, progress=None,
               catch: bool = True) -> list[CheckResult]:
    """Run the named checks (default all, in registration order) and time each one.

    ``progress(result)`` is called after each check. With ``catch`` a check that raises is
    reported as failed (one violation, the exception in ``findings``) instead of aborting the
    run; ``catch=False`` lets the exception propagate (for debugging).
    """
    checks = load_checks()
    names = list(checks) if names is None else list(names)
    unknown = [n for n in names if n not in checks]
    if unknown:
        raise KeyError(f"unknown check(s): {', '.join(unknown)}")
    out = []
    for name in names:
        c = checks[name]
        t0 = time.perf_counter()
        try:
            res = c.fn(quick=quick, seed=seed, mutation=None)
        except Exception as e:  # a crashing check is a failed check, not a crashed suite
            if not catch:
                raise
            res = CheckResult(name=name, reference=c.reference, section=c.section, cases=0,
                              violations=1, passed=False,
                              findings=[f"error: {type(e).__name__}: {e}"])
        res.seconds = time.perf_counter() - t0
        out.append(res)
        if progress is not None:
            progress(res)
    return out
