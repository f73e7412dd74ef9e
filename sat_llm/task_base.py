"""The base of every task: :class:`Problem`, :class:`Task`, the answer-line readers
(:func:`answer_value`, :func:`extract_answer`, :func:`plain_integer`) and the arithmetic task
that others build on (``sat_llm.team_tasks.RelayTask``). The task table and
:func:`sat_llm.tasks.make_task` sit above this module and every task module, so that no
task module imports the table that names it (no import cycle); :mod:`sat_llm.tasks`
re-exports all of it."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from sat_theory.errors import InputError

__all__ = ["ANSWER_HINT", "with_hint", "Problem", "answer_value", "extract_answer", "Task",
           "DEFAULT_RANGE", "ArithmeticTask", "plain_integer"]

ANSWER_HINT = "End your message with a line 'Answer: <answer>'."


def with_hint(prompt: str) -> str:
    """A typed prompt in the form the tasks train on: the answer hint appended (once)."""
    return prompt if ANSWER_HINT in prompt else f"{prompt.rstrip()} {ANSWER_HINT}"


@dataclass
class Problem:
    prompt: str
    answer: Any
    meta: dict = field(default_factory=dict)


_ANSWER = re.compile(r"answer\s*[:=]", flags=re.IGNORECASE)


def answer_value(text: str) -> str | None:
    """The value of the last ``Answer:`` in ``text``: what follows it up to the end of its
    line, stripped (``"Answer: 1 + 7 = 8. Answer: 9"`` → ``"9"``); ``None`` when the text has
    no ``Answer:``. (A greedy ``Answer:(.*)`` would return the text after the *first* one on
    the line.)"""
    last = None
    for last in _ANSWER.finditer(text):  # noqa: B007  (the last match is the one we want)
        pass
    return None if last is None else text[last.end():].split("\n", 1)[0].strip()


def extract_answer(text: str) -> str:
    """The answer a lenient scorer reads: the value of the last ``Answer:``
    (:func:`answer_value`), else the last non-empty line."""
    value = answer_value(text)
    if value is not None:
        return value
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _last_int(text: str) -> int | None:
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    return int(nums[-1]) if nums else None


class Task:
    """Base class: ``problems(split, n, seed)``, ``score(problem, final_message)`` in [0,1],
    ``feedback(problem, message) -> (text | None, done)`` (single-answer tasks: no feedback,
    the episode ends after the protocol's turns)."""

    name = "task"
    multi_turn = False
    #: the prompt asks for a final ``Answer: <value>`` line (:data:`ANSWER_HINT`): such a task
    #: has a strict score (:meth:`strict_score`) and a format flag (:meth:`format_ok`)
    answer_line = False

    def _generate(self, rng: random.Random) -> Problem:  # pragma: no cover - abstract
        raise NotImplementedError

    def problems(self, split: str, n: int, seed: int = 0, exclude=None) -> list[Problem]:
        """``n`` distinct problems of ``split`` ("train" or "eval") from a seeded stream.
        ``exclude``: prompts never returned (the team passes its training pool to the eval
        split); by default the eval split excludes the first 2000 draws of the train stream
        (half the task's capacity when it is finite)."""
        if split not in ("train", "eval"):
            raise InputError(f"split must be 'train' or 'eval', got {split!r}")
        if n < 1:
            raise InputError(f"number of problems must be >= 1, got {n}")
        rng = random.Random(f"{self.name}|{split}|{seed}")
        banned: set[str] = set(exclude or ())
        if split == "eval" and exclude is None:
            # a finite task keeps half of its problems for the eval split
            cap = self.capacity()
            trng = random.Random(f"{self.name}|train|{seed}")
            banned = {self._generate(trng).prompt for _ in range(2000 if cap is None else cap // 2)}
        out, seen, tries = [], set(), 0
        while len(out) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise InputError(f"task {self.name!r} cannot generate {n} distinct {split} problems")
            p = self._generate(rng)
            if p.prompt in seen or p.prompt in banned:
                continue
            seen.add(p.prompt)
            out.append(p)
        return out

    def capacity(self) -> int | None:
        """Number of distinct problems the task can generate, where it is known (``None``:
        unknown or practically unbounded)."""
        return None

    def check_sizes(self, n_train: int, n_eval: int) -> None:
        """Refuse, before anything is loaded, a train pool plus held-out set larger than the
        task can supply (the two are disjoint)."""
        cap = self.capacity()
        if cap is not None and n_train + n_eval > cap:
            raise InputError(f"task {self.name!r} has {cap} distinct problems, fewer than "
                             f"--n-train {n_train} + --n-eval {n_eval} = {n_train + n_eval} "
                             f"(the two sets are disjoint); lower them or change the task options")

    def score(self, problem: Problem, final_message: str) -> float:  # pragma: no cover
        raise NotImplementedError

    def answer_ok(self, value: str) -> bool:
        """Whether an ``Answer:`` line's value has the form the task asks for (default:
        non-empty)."""
        return value != ""

    def format_ok(self, final_message: str) -> bool | None:
        """Whether the final message follows the answer format: its last ``Answer:`` has a
        value of the task's form on its line (:func:`answer_value`, :meth:`answer_ok`);
        ``None`` for a task without an answer line."""
        if not self.answer_line:
            return None
        value = answer_value(final_message)
        return value is not None and self.answer_ok(value)

    def strict_score(self, problem: Problem, final_message: str) -> float:
        """The score under the format the prompt asks for: the task's score of the last
        ``Answer:`` line's value alone, 0 when the format is not followed (:meth:`format_ok`).
        :meth:`score` is the lenient score (it falls back to the last line). A task without
        an answer line has one score: :meth:`score`."""
        if not self.answer_line:
            return self.score(problem, final_message)
        if not self.format_ok(final_message):
            return 0.0
        return self.score(problem, f"Answer: {answer_value(final_message)}")

    def user_problem(self, prompt: str, answer=None) -> Problem:
        """A problem typed by a user (``sat team``): the prompt as given and the answer
        (``None``: unscored) in the form :meth:`score` compares against."""
        return Problem(prompt, None if answer is None else str(answer).strip())

    def feedback(self, problem: Problem, message: str) -> tuple[str | None, bool]:
        return None, False


#: default operand range of ``arithmetic``: the learning study's (300 problems with ``+-*``;
#: an untrained SmolLM2-135M team scores 30-34% greedy, and SAT adds 25-27 points)
DEFAULT_RANGE = (0, 9)


class ArithmeticTask(Task):
    """``a op b`` with operands drawn uniformly from ``[lo, hi]`` (default ``[0, 9]``), or
    ``digits``-digit operands (op from ``ops``). ``lo=0, hi=12`` gives 507 problems,
    one-digit operands (``digits=1``) only 243."""

    name = "arithmetic"
    answer_line = True

    def __init__(self, digits: int | None = None, ops: str = "+-*", lo: int | None = None,
                 hi: int | None = None, validation: int = 0, heldout: str = "test"):
        if digits is not None and lo is not None:
            raise InputError("arithmetic takes digits or lo/hi, not both")
        if digits is None and lo is None:  # the learning study's task: operands 0..9
            lo, hi = DEFAULT_RANGE
        digits = 1 if digits is None else digits
        if digits < 1:
            raise InputError(f"arithmetic digits must be >= 1, got {digits}")
        if not ops or set(ops) - set("+-*"):
            raise InputError(f"arithmetic ops must be a non-empty subset of '+-*', got {ops!r}")
        if (lo is None) != (hi is None):
            raise InputError("arithmetic needs both lo and hi, or neither")
        if lo is None:
            lo, hi = 10 ** (digits - 1), 10 ** digits - 1
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi):
            raise InputError(f"arithmetic needs integers 0 <= lo <= hi, got lo={lo}, hi={hi}")
        if not (isinstance(validation, int) and validation >= 0):
            raise InputError(f"arithmetic validation must be an integer >= 0, got {validation!r}")
        if heldout not in ("test", "validation"):
            raise InputError(f"arithmetic heldout must be 'test' or 'validation', got {heldout!r}")
        if heldout == "validation" and validation < 1:
            raise InputError("arithmetic heldout='validation' needs validation >= 1 problems")
        self.digits, self.ops, self.lo, self.hi = digits, ops, lo, hi
        self.validation, self.heldout = validation, heldout

    def problems(self, split, n, seed=0, exclude=None):
        """:meth:`Task.problems`, with ``validation = V > 0``: the first ``V`` distinct
        problems of the train stream are a validation set ``𝒱``; the train split is the
        next ``n`` (never in ``𝒱``); the eval split is ``𝒱`` (its first ``n``) when
        ``heldout="validation"``, else the usual held-out problems with ``𝒱`` also excluded.
        So a run with ``validation=V, n_train=N−V`` trains on the last ``N−V`` problems of
        the ``N``-problem pool of a run without validation, and its test set (``heldout=
        "test"``) is that run's held-out set: learning rates are chosen on ``𝒱`` without
        training or choosing on the held-out problems."""
        if not self.validation:
            return super().problems(split, n, seed, exclude)
        V = super().problems("train", self.validation, seed)
        if split == "train":
            return super().problems("train", self.validation + n, seed)[self.validation:]
        if self.heldout == "validation":
            if n > len(V):
                raise InputError(f"arithmetic has {len(V)} validation problems, asked for {n}")
            return V[:n]
        return super().problems(split, n, seed, {*(exclude or ()), *(p.prompt for p in V)})

    def check_sizes(self, n_train: int, n_eval: int) -> None:
        if self.heldout == "validation":
            super().check_sizes(self.validation + n_train, 0)
            if n_eval > self.validation:
                raise InputError(f"arithmetic has {self.validation} validation problems, fewer "
                                 f"than --n-eval {n_eval}")
        else:
            super().check_sizes(self.validation + n_train, n_eval)

    def answer_ok(self, value: str) -> bool:
        """An integer written plainly (:func:`plain_integer`; one trailing ``.`` allowed)."""
        return plain_integer(value.removesuffix(".")) is not None

    def capacity(self) -> int:
        """Number of distinct problems: ``(hi − lo + 1)² · |ops|``."""
        return (self.hi - self.lo + 1) ** 2 * len(set(self.ops))

    def _generate(self, rng):
        a, b, op = rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi), rng.choice(self.ops)
        val = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Problem(f"Compute {a} {op} {b}. {ANSWER_HINT}", val)

    def score(self, problem, final_message):
        return float(_last_int(extract_answer(final_message)) == problem.answer)

    def user_problem(self, prompt, answer=None):
        value = None if answer is None else _last_int(str(answer))
        if answer is not None and value is None:
            raise InputError(f"arithmetic answers are integers, got {answer!r}")
        return Problem(with_hint(prompt), value)


_PLAIN_INT = re.compile(r"-?(?:\d+|[1-9]\d{0,2}(?:,\d{3})+)")


def plain_integer(s: str) -> int | None:
    """``s`` as an integer when it is written plainly: an optional ``-`` and digits, or
    digits grouped in threes by commas after a non-zero lead (``-1,000``); else ``None``.
    Narrower than it could be, to stay where math-verify agrees (measured in
    tests/llm/test_answer_check.py): math-verify reads ``+1,000`` as the set {0, 1} and
    ``0,001`` as 0.001 (a decimal comma)."""
    s = s.strip()
    return int(s.replace(",", "")) if _PLAIN_INT.fullmatch(s) else None
