"""The ``relay`` task (split information): views, problems, chance levels, bad options."""

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sat_llm.protocol import problem_views, protocol_for
from sat_llm.tasks import make_task
from sat_llm.team_tasks import RELAY_REVIEW, SPLITS, RelayTask, chance_accuracy, split_facts
from sat_theory.errors import InputError


def _facts_seen(text: str, x: int, op: str, y: int) -> set[str]:
    """Which facts of ``x op y`` occur in ``text`` (the problem is chosen so every number
    and the operation symbol are unambiguous: x, y >= 4, distinct, op '*')."""
    return {k for k, v in (("x", str(x)), ("y", str(y)), ("op", op)) if v in text}


@pytest.mark.parametrize("n", [2, 3])
def test_each_agent_sees_exactly_its_own_part(n):
    task = make_task("relay")
    x, op, y = 7, "*", 8
    p = task.user_problem(f"Compute {x} {op} {y}")
    shared, private = problem_views(task, p, n)
    assert _facts_seen(shared, x, op, y) == set()  # the shared message names no fact
    for j in range(n):
        assert _facts_seen(private[j], x, op, y) == set(SPLITS[n][j]), (j, private[j])


@pytest.mark.parametrize("parts, only", [(2, 1), (2, 2), (3, 1), (3, 2), (3, 3)])
def test_one_view_agent_sees_one_part_and_full_view_everything(parts, only):
    x, op, y = 7, "*", 8
    one = RelayTask(parts=parts, only=only)
    shared, (view,) = problem_views(one, one.user_problem("7 * 8"), 1)
    assert _facts_seen(view, x, op, y) == set(SPLITS[parts][only - 1])
    # the shared message is the same for every problem: it carries no fact
    assert {problem_views(one, p, 1)[0] for p in one.problems("train", 40)} == {shared}
    full = RelayTask()
    shared, (view,) = problem_views(full, full.user_problem("7 * 8"), 1)
    assert view is None and _facts_seen(shared, x, op, y) == {"x", "op", "y"}
    # exactly the arithmetic task's prompt of the same problem
    assert shared == make_task("arithmetic").user_problem("Compute 7 * 8.").prompt


@pytest.mark.parametrize("n", [2, 3])
def test_the_team_shared_message_is_the_same_for_every_problem(n):
    t = RelayTask()
    assert len({problem_views(t, p, n)[0] for p in t.problems("train", 40)}) == 1


def test_views_are_a_function_of_the_problem_and_problems_match_across_variants():
    a, b, c = RelayTask(), RelayTask(parts=2, only=1), make_task("relay", lo=1, hi=9)
    pa, pb, pc = (t.problems("eval", 30, seed=3) for t in (a, b, c))
    assert [p.prompt for p in pa] == [p.prompt for p in pb] == [p.prompt for p in pc]
    assert [problem_views(a, p, 2) for p in pa] == [problem_views(c, p, 2) for p in pc]


def test_answer_and_score():
    t = RelayTask()
    for p in t.problems("train", 50, seed=0):
        m = p.meta
        assert p.answer == {"+": m["x"] + m["y"], "-": m["x"] - m["y"], "*": m["x"] * m["y"]}[m["op"]]
        assert t.score(p, f"so\nAnswer: {p.answer}") == 1.0
        assert t.score(p, f"Answer: {p.answer + 1}") == 0.0


def test_protocol_takes_the_relay_instruction_and_checks_the_team_size():
    assert protocol_for(RelayTask(), 2).review_prompt == RELAY_REVIEW[2]
    assert protocol_for(RelayTask(), 3).review_prompt == RELAY_REVIEW[3]
    protocol_for(RelayTask(), 1)  # a single agent sees everything
    with pytest.raises(InputError, match="parts"):
        protocol_for(RelayTask(), 4)
    with pytest.raises(InputError, match="3 agents or 1"):
        protocol_for(RelayTask(parts=3), 2)


@pytest.mark.parametrize("kw, pattern", [(dict(parts=5), "parts"), (dict(only=-1), "only"),
                                         (dict(parts=2, only=3), "only"),
                                         (dict(lo=5, hi=2), "lo <= hi"), (dict(ops="/"), "ops")])
def test_bad_options_are_one_input_error(kw, pattern):
    with pytest.raises(InputError, match=pattern):
        make_task("relay", **kw)


def test_user_prompt_without_an_expression_is_refused():
    with pytest.raises(InputError, match="x op y"):
        RelayTask().user_problem("what is seven times eight")


def _chance_by_simulation(lo, hi, ops, parts, part):
    """Independent oracle: the Bayes guesser's accuracy, guessing per problem from the
    posterior it computes by scanning every problem with the same view."""
    probs = list(itertools.product(range(lo, hi + 1), range(lo, hi + 1), ops))
    keys = SPLITS[parts][part - 1]

    def view(x, y, op):
        return split_facts(x, op, y, parts)[part - 1]

    def val(x, y, op):
        return {"+": x + y, "-": x - y, "*": x * y}[op]

    hits = 0
    for x, y, op in probs:
        same = [val(*q) for q in probs if view(*q) == view(x, y, op)]
        best = max(same.count(v) for v in same)
        hits += Fraction(best, len(same))  # the guesser is right with its posterior's max
    assert keys  # every part holds a fact
    return hits / len(probs)


@settings(max_examples=15, deadline=None)
@given(lo=st.integers(0, 3), width=st.integers(0, 3), ops=st.sampled_from(["+", "-*", "+-*"]),
       split=st.sampled_from([(2, 1), (2, 2), (3, 1), (3, 2), (3, 3)]))
def test_chance_equals_the_bayes_guessers_accuracy(lo, width, ops, split):
    assert chance_accuracy(lo, lo + width, ops, *split) == _chance_by_simulation(
        lo, lo + width, ops, *split)


def test_chance_closed_forms():
    # + alone: the unseen operand is uniform and x + y is injective in it
    assert chance_accuracy(1, 9, "+", 2, 1) == Fraction(1, 9)
    # seeing every fact determines the answer
    assert chance_accuracy(1, 9, "+-*", 1, 1) == 1
    # a zero operand with * determines the answer, so 0 raises the chance above 1/|range|
    assert chance_accuracy(0, 9, "*", 2, 1) > Fraction(1, 10)
