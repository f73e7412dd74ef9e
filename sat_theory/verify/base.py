"""The check registry of ``sat verify``: :class:`CheckResult`, :class:`Check`, the
:func:`check` decorator and :data:`CHECKS`. The check modules import these from here, and
the package (:mod:`sat_theory.verify`) names the check modules in ``CHECK_MODULES``, so the
registry imports nothing of either (no import cycle between the package and its checks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

__all__ = ["CheckResult", "Check", "check", "CHECKS"]


@dataclass
class CheckResult:
    name: str
    reference: str  # paper + theorem, e.g. "TeamTR Thm 3.6; SAT Thm 4.4"
    section: str  # grouping for the readable table, e.g. "docs/theory.md §4 stage bounds"
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
