"""Answer checkers of the dataset task (``sat_llm.tasks.CHECKERS``): math-verify (the default)
against our own ``math_equal`` (``builtin``) on one table of equivalent and non-equivalent
answer pairs, the integer fast path against raw math-verify, and math-verify off the main
thread. ``python tests/llm/test_answer_check.py`` prints both checkers' agreement and speed on the
table (a benchmark print, not a timed test)."""

import logging
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sat_llm.tasks import CHECKERS, exact_equal, math_equal, plain_integer

pytest.importorskip("math_verify")

from sat_llm.tasks import _math_verify, _mv_parse, math_verify_equal  # noqa: E402

#: (prediction, gold, equivalent?) — what a careful human grader says
TABLE = [
    # integers, signs, leading zeros, thousands commas
    ("42", "42", True), ("42", "43", False), ("-3", "-3", True), ("-3", "3", False),
    ("+3", "3", True), ("+1,000", "1000", True), ("007", "7", True), ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("12,345,678", "12345678", True), ("1,000", "1", False), ("1", "1,000", False),
    ("1234567890123456789", "1234567890123456788", False),
    # decimals
    ("3.0", "3", True), ("0.50", "0.5", True), ("42.5", "42", False), ("1,5", "1.5", False),
    ("0.1234567", "0.1234568", False), ("1e3", "1000", True),
    # fractions against decimals
    ("0.5", "1/2", True), ("1/2", "0.5", True), ("2/4", "1/2", True), ("-0.25", "-1/4", True),
    ("0.5", "1/3", False), ("1/3", "0.33", False), ("1/3", "0.333333", False), ("3/0", "3", False),
    # LaTeX
    ("\\frac{1}{2}", "0.5", True), ("\\dfrac{3}{4}", "0.75", True), ("$\\frac12$", "0.5", True),
    ("\\frac{1}{2}", "\\frac{1}{3}", False), ("10^3", "1000", True), ("\\sqrt{4}", "2", True),
    ("$12$", "12", True), ("\\$5", "5", True),
    # \boxed{}
    ("\\boxed{7}", "7", True), ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("The answer is \\boxed{12}", "12", True), ("\\boxed{7}", "8", False),
    # units
    ("5 cm", "5", True), ("5 \\text{ cm}", "5", True), ("5", "6 cm", False),
    # expressions, tuples, words, empty answers
    ("x+1", "1+x", True), ("x+1", "x+2", False), ("(1,2)", "(1, 2)", True),
    ("yes", "no", False), ("", "5", False), ("", "", False),
]

#: rows where math-verify (0.9) disagrees with the grader: it rounds to 6 decimals
#: (``float_rounding=6``), reads ``1e3`` as e·3 and ``+1,000`` as the set {0, 1}
MATH_VERIFY_MISSES = {("0.1234567", "0.1234568"), ("1e3", "1000"), ("1/3", "0.333333"),
                      ("+1,000", "1000")}
#: rows where our normaliser disagrees: LaTeX beyond \frac, units, \$, algebra
BUILTIN_MISSES = {("$\\frac12$", "0.5"), ("10^3", "1000"), ("\\sqrt{4}", "2"), ("\\$5", "5"),
                  ("5 cm", "5"), ("5 \\text{ cm}", "5"), ("x+1", "1+x")}


def raw_math_verify(pred: str, gold: str) -> bool:
    """math-verify alone (no integer fast path), as :func:`math_verify_equal` calls it."""
    _, verify = _math_verify()
    return bool(verify(list(_mv_parse(gold, 5)), list(_mv_parse(pred, 5)), timeout_seconds=5))


def misses(check) -> set:
    return {(p, g) for p, g, truth in TABLE if check(p, g) != truth}


def test_table_misses_of_each_checker():
    assert misses(math_verify_equal) == MATH_VERIFY_MISSES
    assert misses(math_equal) == BUILTIN_MISSES
    assert not MATH_VERIFY_MISSES & BUILTIN_MISSES  # each one fixes the other's misses here


def test_fast_path_agrees_with_math_verify_on_the_table():
    ints = [(p, g) for p, g, _ in TABLE if plain_integer(p) is not None and plain_integer(g) is not None]
    assert len(ints) >= 10
    for p, g in ints:
        assert math_verify_equal(p, g) == raw_math_verify(p, g), (p, g)


def _written(n: int, commas: bool, zeros: int) -> str:
    """``n`` with thousands commas, or with ``zeros`` leading zeros."""
    return f"{n:,}" if commas else "-" * (n < 0) + "0" * zeros + str(abs(n))


@given(st.integers(-10**20, 10**20), st.integers(-10**20, 10**20), st.booleans(), st.booleans(),
       st.integers(0, 2))
def test_fast_path_agrees_with_math_verify_on_integers(a, b, commas_a, commas_b, zeros):
    """Every string the fast path takes (minus signs, commas, leading zeros) gets
    math-verify's answer, equal and unequal pairs alike."""
    for x, y in ((a, b), (a, a)):
        p, g = _written(x, commas_a, zeros), _written(y, commas_b, 0)
        assert plain_integer(p) == x and plain_integer(g) == y
        assert math_verify_equal(p, g) == raw_math_verify(p, g), (p, g)


def test_plain_integer():
    assert plain_integer(" -1,234 ") == -1234 and plain_integer("007") == 7
    for s in ("1,2", "12,34", "0,001", "+1,000", "+3", "1.0", "1e3", "", "4 2", "\\boxed{4}"):
        assert plain_integer(s) is None, s


def test_exact_checker():
    assert exact_equal(" 42\n", "42") and not exact_equal("42.0", "42") and not exact_equal("", "")
    assert set(CHECKERS) == {"math-verify", "exact", "builtin"}


def test_math_verify_off_the_main_thread(caplog, monkeypatch):
    """signal.alarm works only in the main thread: elsewhere the checker runs without a
    timeout, gets the same answers and says nothing (math-verify's own notice that the
    timeout is off, shown once per process, is filtered)."""
    import math_verify.grader
    import math_verify.parser

    latex = [(p, g) for p, g, _ in TABLE if "\\" in p]
    out = {}

    def work():
        out["r"] = [math_verify_equal(p, g) for p, g in latex]

    for mod in (math_verify.parser, math_verify.grader):
        monkeypatch.setattr(mod, "TIMEOUT_WARNING_SHOWN", False)
    _mv_parse.cache_clear()
    with caplog.at_level(logging.WARNING):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    assert len(latex) >= 8 and out["r"] == [math_verify_equal(p, g) for p, g in latex]
    assert not [r for r in caplog.records if r.name.startswith("math_verify")]


def test_missing_math_verify_one_line(monkeypatch):
    import sys

    from sat_theory.errors import InputError

    monkeypatch.setitem(sys.modules, "math_verify", None)
    _math_verify.cache_clear()
    try:
        with pytest.raises(InputError, match="needs the 'math-verify' package"):
            _math_verify()
    finally:
        _math_verify.cache_clear()


def benchmark(repeats: int = 20) -> None:
    """Agreement with the grader and time per pair of each checker on :data:`TABLE` (the
    math-verify parse cache cleared before every pass, so each pass parses afresh)."""
    import time

    ints = [r for r in TABLE if plain_integer(r[0]) is not None and plain_integer(r[1]) is not None]
    _math_verify()  # the import is paid once, not per pair
    rows = [("builtin (math_equal)", math_equal, TABLE), ("math-verify checker", math_verify_equal, TABLE),
            ("math-verify alone", raw_math_verify, TABLE),
            ("integer pairs: fast path", math_verify_equal, ints),
            ("integer pairs: math-verify alone", raw_math_verify, ints)]
    print(f"{len(TABLE)} pairs ({len(ints)} plain-integer pairs), {repeats} passes each")
    for name, check, table in rows:
        t0 = time.perf_counter()
        for _ in range(repeats):
            _mv_parse.cache_clear()
            for p, g, _ in table:
                check(p, g)
        us = (time.perf_counter() - t0) / (repeats * len(table)) * 1e6
        wrong = sum(check(p, g) != truth for p, g, truth in table)
        print(f"  {name:34s} {us:10.1f} µs/pair   disagrees with the grader on {wrong}/{len(table)}")


if __name__ == "__main__":
    benchmark()
