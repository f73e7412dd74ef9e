"""Task generators and verifiers of ``sat_llm.tasks`` (pure Python: no torch needed)."""

import json

import pytest

from sat_llm.tasks import bulls_cows, extract_answer, make_task, math_equal, validate_plan
from sat_theory.errors import InputError


@pytest.mark.parametrize("name", ["arithmetic", "countdown", "guess", "blocksworld", "copy"])
def test_splits_are_seeded_and_disjoint(name):
    t = make_task(name)
    train, ev = t.problems("train", 40, seed=3), t.problems("eval", 20, seed=3)
    assert [p.prompt for p in train] == [p.prompt for p in make_task(name).problems("train", 40, seed=3)]
    assert not {p.prompt for p in train} & {p.prompt for p in ev}
    assert len({p.prompt for p in train}) == 40


def test_arithmetic_scores_the_last_integer_of_the_answer_line():
    t = make_task("arithmetic")
    p = t.problems("train", 1)[0]
    assert t.score(p, f"I think 3.\nAnswer: {p.answer}") == 1.0
    assert t.score(p, f"Answer: {p.answer + 1}") == 0.0
    assert t.score(p, "no number") == 0.0


def test_countdown_verifier_exact_rationals_and_number_use():
    t = make_task("countdown")
    p = t.problems("train", 1)[0]
    p.meta["numbers"], p.answer = [3, 4, 6], 2
    assert t.score(p, "Answer: (3 + 6) / 4 - 1/4") == 0.0  # 1 and the second 4 are not given
    assert t.score(p, "Answer: 6 / 3") == 1.0  # at most once each: unused numbers are fine
    assert t.score(p, "Answer: 6/3 = 2") == 1.0
    assert t.score(p, "Answer: 3 * 4 / 6") == 1.0
    assert t.score(p, "Answer: 6 / (4 - 4)") == 0.0  # reuses 4 (and divides by zero)
    assert t.score(p, "Answer: __import__('os')") == 0.0


def test_countdown_targets_are_reachable():
    t = make_task("countdown")
    for p in t.problems("train", 30, seed=1):
        assert 0 < p.answer <= 1000 and len(p.meta["numbers"]) == 3


def test_guess_feedback_and_score():
    assert bulls_cows("123", "132") == (1, 2)
    assert bulls_cows("123", "456") == (0, 0)
    t = make_task("guess")
    p = t.problems("train", 1)[0]
    fb, done = t.feedback(p, "Guess: " + p.answer)
    assert done and "correct" in fb and t.score(p, "Guess: " + p.answer) == 1.0
    wrong = "".join(sorted(set("0123456789") - set(p.answer))[:3])
    fb, done = t.feedback(p, f"Guess: {wrong}")
    assert not done and fb.endswith("0 bulls, 0 cows.")


def test_blocksworld_validator():
    init = {"a": "table", "b": "a", "c": "table"}
    goal = {"a": "b", "b": "c"}
    ok_plan = "1. unstack b from a\n2. stack b on c\n3. pick up a\n4. stack a on b"
    assert validate_plan(ok_plan, init, goal) == (True, "goal reached")
    assert not validate_plan("pick up a", init, goal)[0]  # a is not clear (b is on it)
    assert not validate_plan("unstack b from a\nstack b on c", init, goal)[0]  # goal not reached
    assert not validate_plan("unstack b from a", init, {"b": "table"})[0]  # still holding b
    t = make_task("blocksworld")
    p = t.problems("train", 1)[0]
    assert t.score(p, "") == 0.0


def test_math_equal_and_extract_answer():
    assert math_equal("\\boxed{\\frac{1}{2}}", "0.5")
    assert math_equal("1,000", "1000") and math_equal("$12$", "12")
    assert not math_equal("1/3", "0.33")
    assert math_equal("x+1", "X+1") and not math_equal("", "")
    assert extract_answer("blah\nAnswer: 42\n") == "42"
    assert extract_answer("just 7") == "just 7"


def test_jsonl_task(tmp_path):
    f = tmp_path / "d.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) for i in range(10)))
    t = make_task("jsonl", str(f))
    tr, ev = t.problems("train", 100), t.problems("eval", 100)
    assert len(tr) == 8 and len(ev) == 2 and not {p.prompt for p in tr} & {p.prompt for p in ev}
    assert t.score(ev[0], f"Answer: {ev[0].answer}") == 1.0


@pytest.mark.parametrize("content, msg", [
    ('{"prompt": "a", "answer": 1}\n{"prompt": ', "malformed JSON"),
    ('{"prompt": "a"}\n{"prompt": "b", "answer": 2}', "row 0, column 'answer': the answer must be"),
    ('{"prompt": "a", "answer": 1}', "at least 2"),
])
def test_jsonl_bad_input(tmp_path, content, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(content)
    with pytest.raises(InputError, match=msg):
        make_task("jsonl", str(f))


def test_unknown_task_and_bad_options():
    with pytest.raises(InputError, match="unknown task"):
        make_task("chess")
    with pytest.raises(InputError, match="bad option"):
        make_task("copy", colour=1)
    with pytest.raises(InputError, match="needs a local dataset"):
        make_task("jsonl")


@pytest.mark.parametrize("option", [dict(hi="x"), dict(digits=1.5), dict(lo=True), dict(ops=3)])
def test_task_options_of_the_wrong_type_are_refused(option):
    """``--task-option hi=x`` was accepted (exit 0) and compared as a string later."""
    with pytest.raises(InputError, match=f"bad option for task 'arithmetic': {next(iter(option))}="):
        make_task("arithmetic", **option)


def test_task_options_of_the_declared_type_pass():
    t = make_task("arithmetic", lo=1, hi=9, ops="+-")
    assert (t.lo, t.hi, t.ops) == (1, 9, "+-")


def test_user_problems_take_the_training_form():
    """``sat team``: a typed prompt gets the task's answer hint once; a typed answer is read
    as the task scores it; tasks that score against generated data refuse a typed answer."""
    from sat_llm.tasks import ANSWER_HINT, make_task

    t = make_task("arithmetic")
    p = t.user_problem("What is 7 * 8?", "56")
    assert p.prompt == f"What is 7 * 8? {ANSWER_HINT}" and p.answer == 56
    assert t.score(p, "7 * 8 = 56\nAnswer: 56") == 1.0
    assert t.user_problem(p.prompt).prompt == p.prompt and t.user_problem("x").answer is None
    with pytest.raises(InputError, match="integers"):
        t.user_problem("What is 7 * 8?", "fifty-six")
    with pytest.raises(InputError, match="cannot be checked"):
        make_task("countdown").user_problem("Reach 10 from [2, 5]", "2*5")
    assert make_task("copy").user_problem("Repeat exactly: ab", " ab ").answer == "ab"


def test_extract_answer_reads_the_last_answer_on_its_line():
    """The value of the *last* ``Answer:``, up to its line's end: the old greedy
    ``Answer:(.*)`` returned ``"1 + 7 = 8. Answer: 9"`` here (the text after the first)."""
    from sat_llm.tasks import answer_value

    assert extract_answer("Answer: 1 + 7 = 8. Answer: 9") == "9"
    assert answer_value("Answer: 1 + 7 = 8. Answer: 9") == "9"
    assert answer_value("Answer: 5\nthen more\nAnswer: 6 apples\nbye") == "6 apples"
    assert answer_value("no answer line here") is None
    assert extract_answer("Answer: 12\n\nThe answer is 13") == "12"  # "answer is" is no Answer:
    from sat_llm.tasks import Problem

    # countdown evaluates the answer's expression: "9" (the last Answer:) reaches 9 from [9, 1]
    p = Problem("reach 9 from [9, 1]", 9, {"numbers": [9, 1]})
    assert make_task("countdown").score(p, "Answer: 1 + 7 = 8. Answer: 9") == 1.0


@pytest.mark.parametrize("final, lenient, strict, fmt", [
    ("Answer: 11", 1.0, 1.0, True),
    ("Answer: 11.", 1.0, 1.0, True),
    ("Answer: 8 + 3 = 11", 1.0, 0.0, False),   # right, but not an Answer: <int> line
    ("8 + 3 = 11", 1.0, 0.0, False),           # no Answer: line: the lenient last-line rule
    ("Answer: 12", 0.0, 0.0, True),            # the format, a wrong value
    ("Answer: 1 + 7 = 8. Answer: 11", 1.0, 1.0, True),
    ("Answer: 11\n\nThe answer is", 1.0, 1.0, True),
    ("8 + 3 = 11, which is the sum of 8", 0.0, 0.0, False),
])
def test_arithmetic_strict_lenient_and_format(final, lenient, strict, fmt):
    from sat_llm.tasks import Problem

    t = make_task("arithmetic")
    p = Problem("Compute 8 + 3.", 11)
    assert (t.score(p, final), t.strict_score(p, final), t.format_ok(final)) == (lenient, strict, fmt)


def test_tasks_without_an_answer_line_have_one_score():
    t = make_task("copy", length=3)
    p = t.problems("train", 1, 0)[0]
    assert t.format_ok(p.answer) is None and t.strict_score(p, p.answer) == t.score(p, p.answer) == 1.0


def test_arithmetic_validation_split_is_disjoint_and_keeps_the_test_set():
    """``validation=V``: train on the pool's last N−V problems, validate on its first V; the
    test set is the run-without-validation's held-out set, untouched by either."""
    from sat_llm.team import task_setup

    class Cfg:
        task, prompts, agents, router, turns, reasoning_tags = "arithmetic", None, 1, "round-robin", 0, False
        n_train, n_eval, seed = 100, 200, 3
        problems_seed = seed  # LLMConfig's: the seed of the problem choice
        task_options = {}

    _, _, pool, test = task_setup(Cfg)
    Cfg.task_options, Cfg.n_train, Cfg.n_eval = dict(validation=50, heldout="validation"), 50, 50
    _, _, tune_pool, val = task_setup(Cfg)
    Cfg.task_options, Cfg.n_eval = dict(validation=50), 200
    _, _, tune_pool2, test2 = task_setup(Cfg)
    prompts = lambda ps: [p.prompt for p in ps]  # noqa: E731
    assert prompts(val) == prompts(pool[:50]) and prompts(tune_pool) == prompts(pool[50:])
    assert prompts(tune_pool2) == prompts(tune_pool) and prompts(test2) == prompts(test)
    assert not set(prompts(val)) & set(prompts(test)) and not set(prompts(val)) & set(prompts(tune_pool))
    with pytest.raises(InputError, match="validation problems"):
        Cfg.task_options, Cfg.n_eval = dict(validation=50, heldout="validation"), 60
        task_setup(Cfg)
    with pytest.raises(InputError, match="heldout"):
        make_task("arithmetic", heldout="validation")
