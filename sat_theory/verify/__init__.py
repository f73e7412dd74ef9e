"""``sat verify``: every result of docs/theory.md checked exactly on many toy MDPs.

Each check is one plain function registered with :func:`check`; it draws its cases, evaluates
the statement exactly and returns a :class:`CheckResult`. Every check accepts a
``mutation`` argument naming a deliberate break of the statement (halve a constant, drop a
term, stale occupancy for intermediate, flipped KL direction); with a mutation the check
must report violations — the tests use this to show that each check can fail.

Check modules register themselves on import (the registry is :mod:`sat_theory.verify.base`, which
they import; this package names them in :data:`CHECK_MODULES` and imports them in
:func:`load_checks`).
"""

from __future__ import annotations

import contextlib
import time

from .base import CHECKS, Check, CheckResult, check

__all__ = ["CheckResult", "Check", "check", "CHECKS", "run_checks", "load_checks"]

#: modules holding registered checks (imported by :func:`load_checks`)
CHECK_MODULES = (
    "sat_theory.verify.identities",
    "sat_theory.verify.occupancy",
    "sat_theory.verify.stage_bounds",
    "sat_theory.verify.definitions",
    "sat_theory.verify.naive_reuse",
    "sat_theory.verify.plug_and_play",
    "sat_theory.verify.estimators",
    "sat_theory.verify.optimization",
    "sat_theory.verify.pipeline",
    "sat_theory.verify.power",  # last: checker_power runs every check registered before it
)


def load_checks() -> dict[str, Check]:
    """Import every module of :data:`CHECK_MODULES` (each registers its checks on import) and
    return the registry. A missing or broken module is an error: the suite is all or nothing."""
    import importlib

    for m in CHECK_MODULES:
        importlib.import_module(m)
    # registration order is import order, which a caller importing one module early would
    # change: keep the CHECK_MODULES order (stable within a module)
    rank = {m: i for i, m in enumerate(CHECK_MODULES)}
    items = sorted(CHECKS.items(), key=lambda kv: rank.get(kv[1].fn.__module__, len(rank)))
    if list(CHECKS) != [k for k, _ in items]:
        CHECKS.clear()
        CHECKS.update(items)
    return CHECKS


_blas = None


def _one_blas_thread():
    """A context with one BLAS thread (``threadpoolctl``; a no-op without it).

    Why: BLAS reductions round differently with different thread counts (``group_mean_bias``'s
    ``min_slack`` was −2.0e−14 with two OpenBLAS threads and −6.2e−14 with one, as in a Ray
    worker, which runs with ``OMP_NUM_THREADS`` = its CPUs). With one thread every check is
    the same computation on every executor and machine; the cases are tiny, so nothing is
    lost."""
    global _blas
    if _blas is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _blas = False
        else:
            _blas = ThreadpoolController()  # finds the loaded BLAS libraries once
    return _blas.limit(limits=1, user_api="blas") if _blas else contextlib.nullcontext()


def _run_one(item: tuple) -> CheckResult:
    """Run one check: ``item = (name, quick, seed, catch)`` (a module-level function so that
    process pools and Ray workers can import it by name; each imports the checks itself)."""
    name, quick, seed, catch = item
    c = load_checks()[name]
    t0 = time.perf_counter()
    try:
        with _one_blas_thread():
            res = c.fn(quick=quick, seed=seed, mutation=None)
    except Exception as e:  # a crashing check is a failed check, not a crashed suite
        if not catch:
            raise
        res = CheckResult(name=name, reference=c.reference, section=c.section, cases=0,
                          violations=1, passed=False,
                          findings=[f"error: {type(e).__name__}: {e}"])
    res.seconds = time.perf_counter() - t0
    return res


def run_checks(names=None, *, quick: bool = False, seed: int = 0, progress=None,
               catch: bool = True, executor: str = "serial", workers: int | None = None,
               ray_address: str | None = None) -> list[CheckResult]:
    """Run the named checks (default all, in registration order) and time each one.

    ``progress(result)`` is called after each check. With ``catch`` a check that raises is
    reported as failed (one violation, the exception in ``findings``) instead of aborting the
    run; ``catch=False`` lets the exception propagate (for debugging).

    ``executor`` (``serial`` | ``process`` | ``ray``, see :mod:`sat_theory.executor`) runs
    the checks as independent tasks: every check draws its cases from ``seed`` alone, so the
    results equal the serial ones but for ``seconds``; they come back in the order of
    ``names``, and ``progress`` is then called for each once all are done.
    """
    from ..executor import map_tasks

    checks = load_checks()
    names = list(checks) if names is None else list(names)
    unknown = [n for n in names if n not in checks]
    if unknown:
        raise KeyError(f"unknown check(s): {', '.join(unknown)}")
    items = [(name, quick, seed, catch) for name in names]
    if executor == "serial":
        out = []
        for item in items:
            out.append(_run_one(item))
            if progress is not None:
                progress(out[-1])
        return out
    out = map_tasks(_run_one, items, executor=executor, workers=workers, ray_address=ray_address)
    if progress is not None:
        for res in out:
            progress(res)
    return out
