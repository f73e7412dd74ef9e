"""The power of ``sat verify`` itself (docs/theory.md §8, "A check that cannot fail").

A green ``sat verify`` means something only if its checks can fail. Two checks run last:

- ``planted_violations``: every comparison the checks decide with — ``Tally.lower``,
  ``Tally.upper``, ``Tally.equal`` (:mod:`sat_theory.verify.tally`), the estimator checks'
  ``Tally.record``, ``certificates.holds`` and the named tolerances of the other checks — is
  handed a violation :data:`PLANTED` times its designed tolerance and must report it, and a
  statement that holds (slack 0 or more) must pass. A swapped inequality or a tolerance
  loosened 10× or more fails here;
- ``checker_power``: every other check is run with each of its declared mutations — the
  known-false variant of its statement (a stronger constant, a dropped term, a swapped
  argument) — on its quick cases and the saved adversarial cases, and must report
  violations without crashing. A check that compares a term with itself, or whose cases or
  comparison no longer reach the statement, fails here.
"""

from __future__ import annotations

import importlib

from .base import CHECKS, CheckResult, check
from .tally import Tally, check_mutation

SECTION = "docs/theory.md §8 power of the checks"

#: a planted violation is this many times the tolerance a comparison was designed with
#: (DESIGNED): a tolerance loosened by PLANTED or more lets it through, and the check fails
PLANTED = 3.0

#: the tolerances as designed (module, name, value); docs/theory.md §8 says why each
DESIGNED = (
    ("sat_theory.certificates", "HOLD_TOL", 1e-9),
    ("sat_theory.verify.estimators", "TOL", 1e-9),
    ("sat_theory.verify.identities", "PDL_TOL", 1e-9),
    ("sat_theory.verify.identities", "FACTOR_KL_TOL", 1e-10),
    ("sat_theory.verify.identities", "FACTOR_TV_TOL", 1e-12),
    ("sat_theory.verify.definitions", "DEFINITION_TOL", 1e-9),
    ("sat_theory.verify.pipeline", "ROUND_TRIP_TOL", 1e-12),
    ("sat_theory.verify.pipeline", "BATCH_TOL", 1e-10),
    ("sat_theory.verify.estimators", "GROUP_TOL", 1e-12),
    ("sat_theory.verify.optimization", "ALIGN_BOUNDARY_TOL", 1e-9),
)

#: bounds the comparisons are tried at (relative tolerances scale with 1 + |bound|)
BOUNDS = (-1e3, -1.0, 0.0, 1e-6, 1.0, 1e3)

#: checks not run by checker_power (the power checks themselves)
POWER_CHECKS = ("planted_violations", "checker_power")


def _tol(module: str, attr: str) -> float:
    return float(getattr(importlib.import_module(module), attr))


def _tally_cases(designed: dict):
    """(label, flagged) for the comparison primitives: ``flagged`` must be True for the
    planted violations and False for statements that hold."""
    import sat_theory.verify.estimators as est
    import sat_theory.verify.identities as ident

    from ..certificates import holds

    v = PLANTED * designed[("sat_theory.certificates", "HOLD_TOL")]
    for b in BOUNDS:
        e = v * (1 + abs(b))
        for what, call, should in (
            ("lower, true below the bound", lambda t, b=b, e=e: t.lower(b - e, b, ""), True),
            ("lower, true = bound", lambda t, b=b: t.lower(b, b, ""), False),
            ("lower, true above the bound", lambda t, b=b: t.lower(b + 1.0, b, ""), False),
            ("upper, value above the bound", lambda t, b=b, e=e: t.upper(b + e, b, ""), True),
            ("upper, value = bound", lambda t, b=b: t.upper(b, b, ""), False),
            ("upper, value below the bound", lambda t, b=b: t.upper(b - 1.0, b, ""), False),
        ):
            t = Tally()
            call(t)
            yield f"Tally.{what} (bound {b:g})", t.violations == 1, should
        yield f"certificates.holds, true below the bound {b:g}", not holds(b - e, b), True
        yield f"certificates.holds, true = bound {b:g}", not holds(b, b), False
        for name in ("PDL_TOL", "FACTOR_KL_TOL", "FACTOR_TV_TOL"):
            tol_now = getattr(ident, name)
            ve = PLANTED * designed[("sat_theory.verify.identities", name)] * (1 + 2 * abs(b))
            t = Tally()
            t.equal(b, b + ve, "", tol_now)
            yield f"Tally.equal with {name}, a − b planted (at {b:g})", t.violations == 1, True
            t = Tally()
            t.equal(b, b, "", tol_now)
            yield f"Tally.equal with {name}, a = b (at {b:g})", t.violations == 1, False
        ve = PLANTED * designed[("sat_theory.verify.estimators", "TOL")] * (1 + abs(b))
        t = est.Tally("planted_violations")
        t.record(-ve, scale=b)
        yield f"estimators Tally.record, slack −{ve:.3g} (scale {b:g})", t.violations == 1, True
        t = est.Tally("planted_violations")
        t.record(0.0, scale=b)
        yield f"estimators Tally.record, slack 0 (scale {b:g})", t.violations == 1, False


@check("planted_violations", "docs/theory.md §8 (tolerances of every check)", SECTION,
       mutations=("tolerance_10x",))
def planted_violations(*, quick: bool = False, seed: int = 0,
                       mutation: str | None = None) -> CheckResult:
    """Every comparison primitive reports a violation of ``PLANTED``× its designed tolerance
    and passes a statement that holds, at bounds from −1e3 to 1e3; every named tolerance of
    :data:`DESIGNED` is below ``PLANTED``× its designed value. Mutation ``tolerance_10x``
    judges with tolerances 10× looser (the planted violations must then pass unseen)."""
    name = "planted_violations"
    check_mutation(mutation, name)
    # tolerance_10x: every planted violation 10× smaller, i.e. every tolerance 10× looser
    shrink = 10.0 if mutation == "tolerance_10x" else 1.0
    designed = {(m, a): v / shrink for m, a, v in DESIGNED}
    T = Tally()
    for label, flagged, should in _tally_cases(designed):
        T.record(flagged == should, 0.0 if flagged == should else -1.0, None,
                 f"{label}: {'reported' if flagged else 'not reported'}"
                 f"{'' if flagged == should else ' (wrong)'}")
    for module, attr, value in DESIGNED:
        now = _tol(module, attr)
        planted = PLANTED * value / shrink
        T.record(now < planted, planted - now, None,
                 f"{module}.{attr} = {now:g}: a violation of {planted:g} (PLANTED × designed "
                 f"{value:g}) passes unseen")
    return T.result(name, [
        f"{T.cases} comparisons: violations of {PLANTED:g}× each designed tolerance reported, "
        f"statements that hold passed; tolerances now: "
        + ", ".join(f"{a} {_tol(m, a):g}" for m, a, _ in DESIGNED),
    ], tightness=False)


@check("checker_power", "docs/theory.md §8 (every check's known-false variants)", SECTION,
       mutations=("skip_mutations",))
def checker_power(*, quick: bool = False, seed: int = 0,
                  mutation: str | None = None) -> CheckResult:
    """Every other check, run with each of its declared mutations (quick cases, including the
    saved adversarial ones, this ``seed``), reports violations and does not crash; ``quick``
    runs the first declared mutation of each check (the whole list costs about 2.3× the
    quick suite). Mutation ``skip_mutations`` runs the checks unmutated (which must then
    count as misses)."""
    name = "checker_power"
    check_mutation(mutation, name)
    T = Tally()
    missed, crashed, total = [], [], 0
    for cname, c in list(CHECKS.items()):
        if cname in POWER_CHECKS:
            continue
        for m in c.mutations[:1] if quick else c.mutations:
            total += 1
            try:
                res = c.fn(quick=True, seed=seed, mutation=None if mutation else m)
            except Exception as e:  # a crash is not a detection
                crashed.append(f"{cname}/{m}: {type(e).__name__}: {e}")
                T.record(False, -1.0, None, f"{cname} with mutation {m} crashed: {e}")
                continue
            ok = res.violations > 0 and not res.passed
            if not ok:
                missed.append(f"{cname}/{m}")
            T.record(ok, float(res.violations), None,
                     f"{cname} with mutation {m!r} (a known-false variant) reported no violation")
    return T.result(name, [
        f"{total - len(missed) - len(crashed)}/{total} known-false variants of "
        f"{len(CHECKS) - len(POWER_CHECKS)} checks reported as violated"
        + (" (quick: the first declared mutation of each)" if quick else "")
        + (f"; missed: {', '.join(missed[:8])}" if missed else "")
        + (f"; crashed: {len(crashed)}" if crashed else ""),
    ], tightness=False)
