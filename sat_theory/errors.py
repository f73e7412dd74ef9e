"""Errors raised for bad input.

Every problem with user-supplied data (files, shapes, probabilities, CLI arguments) raises
:class:`InputError` with a one-line message naming the problem; the CLI turns it into
``sat: error: <message>`` on stderr and exit status 2, never a traceback.
"""


class InputError(ValueError):
    """Bad user input: malformed MDP/policy file, wrong shape, invalid argument."""


# Absolute tolerance for "sums to 1" and "is a distribution" checks: a row p passes when
# |sum(p) - 1| <= SUM_TOL and min(p) >= -SUM_TOL. Files written in float32 pass (their rows
# sum to 1 within ~1e-7 only after renormalisation), so loaders renormalise rows that pass.
SUM_TOL = 1e-6


def range_text(spec: tuple) -> str:
    """A range ``(kind, low, high, low included, high included)`` in words, e.g.
    ``an integer >= 1`` or ``a number in (0, 1]`` (``high=None``: unbounded)."""
    kind, lo, hi, lo_in, hi_in = spec
    what = "an integer" if kind == "int" else "a number"
    if hi is None:
        return f"{what} {'>=' if lo_in else '>'} {lo:g}"
    return f"{what} in {'[' if lo_in else '('}{lo:g}, {hi:g}{']' if hi_in else ')'}"


def check_range(name: str, value, spec: tuple):
    """``value`` if it is a finite number (an integer for kind ``"int"``) inside ``spec``
    (:func:`range_text`); else :class:`InputError` naming the valid range. ``None`` passes
    (optional settings)."""
    import math
    from numbers import Integral, Real

    if value is None:
        return value
    kind, lo, hi, lo_in, hi_in = spec
    ok = isinstance(value, Integral) and not isinstance(value, bool)
    if kind == "float":
        ok = (ok or isinstance(value, Real)) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = (value >= lo if lo_in else value > lo) and (
            hi is None or (value <= hi if hi_in else value < hi))
    if not ok:
        raise InputError(f"{name} must be {range_text(spec)}, got {value!r}")
    return value
