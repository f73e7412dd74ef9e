"""Tasks with verifiers, generated locally (no datasets are downloaded).

Every task yields :class:`Problem` s (a prompt and what the verifier needs) for a ``"train"``
or ``"eval"`` split; the two splits come from independent seeded streams and the eval split
never repeats a train prompt. A task scores the *final* message of an episode (the last
agent's) with :meth:`Task.score` in ``[0, 1]``; multi-turn tasks also answer every message
with environment feedback (:meth:`Task.feedback`).

- ``arithmetic``: ``a op b`` with ``digits``-digit operands, op in ``+ - *``; the answer is
  the last integer of the final message.
- ``countdown``: reach a target with ``+ - * /`` from given numbers, each used at most once
  (the target is built from a random expression, so it is reachable); the final message's
  ``Answer:`` line (else its last line) is parsed with :mod:`ast` and evaluated exactly in
  rationals.
- ``guess``: number guessing with bulls/cows feedback (ARBench GN style, multi-turn): a
  secret of ``digits`` distinct digits; each message's last ``digits``-digit group is a guess;
  the environment answers ``B bulls, C cows``; score 1 when some guess hits the secret.
- ``blocksworld``: plan generation (PlanBench style): an initial arrangement of stacks and a
  goal arrangement; a plan is lines ``pick up X`` / ``put down X`` / ``stack X on Y`` /
  ``unstack X from Y``; :func:`validate_plan` simulates the four-operator domain (hand empty,
  clear blocks) and the score is 1 when every action is legal and the goal holds at the end.
- ``copy``: repeat a random ``length``-letter string; partial credit (the fraction of
  positions that match), so even a random model's scores vary within a group — a sanity
  task for tiny models and tests.
- ``dataset`` (also called ``jsonl``): the user's own local dataset (``--dataset PATH``: a
  ``save_to_disk`` folder, parquet, JSONL or CSV, read by :mod:`sat_llm.data`), a training
  split and a held-out split or fraction; the answer checker is ``--checker`` (:data:`CHECKERS`:
  math-verify by default, ``exact``, or our own :func:`math_equal` as ``builtin``).
"""

from __future__ import annotations

import ast
import functools
import logging
import random
import re
import threading
from fractions import Fraction
from pathlib import Path

from sat_theory.errors import InputError

from .config import EVAL_FRACTION
from .task_base import (  # noqa: F401  (re-exported: the tasks' public names stay here)
    ANSWER_HINT,
    DEFAULT_RANGE,
    ArithmeticTask,
    Problem,
    Task,
    answer_value,
    extract_answer,
    plain_integer,
    with_hint,
)
from .team_tasks import RelayTask  # builds on task_base, not on this table: no cycle

__all__ = ["Problem", "Task", "TASKS", "make_task", "validate_plan", "math_equal",
           "extract_answer", "bulls_cows", "ArithmeticTask", "CountdownTask", "GuessTask",
           "BlocksworldTask", "CopyTask", "DatasetTask", "CHECKERS", "exact_equal",
           "math_verify_equal", "plain_integer", "answer_value"]

_ALLOWED_BINOPS = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y,
                   ast.Mult: lambda x, y: x * y, ast.Div: lambda x, y: x / y}


def _eval_expr(node, used: list[int]) -> Fraction:
    """Exact value of an arithmetic AST over integer literals (``+ - * /``, parentheses)."""
    if isinstance(node, ast.Expression):
        return _eval_expr(node.body, used)
    if isinstance(node, ast.BinOp) and type(node.op) in _ALLOWED_BINOPS:
        left, right = _eval_expr(node.left, used), _eval_expr(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _ALLOWED_BINOPS[type(node.op)](left, right)
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        used.append(node.value)
        return Fraction(node.value)
    raise ValueError("not an arithmetic expression")


class CountdownTask(Task):
    """Reach ``target`` from ``count`` numbers in [1, ``max_number``], each used at most once."""

    name = "countdown"
    answer_line = True

    def __init__(self, count: int = 3, max_number: int = 20):
        if count < 2:
            raise InputError(f"countdown needs at least 2 numbers, got {count}")
        self.count, self.max_number = count, max_number

    def _generate(self, rng):
        while True:
            nums = [rng.randint(1, self.max_number) for _ in range(self.count)]
            val = Fraction(nums[0])
            for x in nums[1:]:
                op = rng.choice("+-*")
                val = {"+": val + x, "-": val - x, "*": val * x}[op]
            if val.denominator == 1 and 0 < val <= 1000:
                target = int(val)
                shown = nums[:]
                rng.shuffle(shown)
                prompt = (f"Using the numbers {shown} (each at most once) and + - * / with "
                          f"parentheses, write an expression equal to {target}. {ANSWER_HINT}")
                return Problem(prompt, target, {"numbers": shown})

    def user_problem(self, prompt, answer=None):
        if answer is not None:
            raise InputError(f"task {self.name!r} scores against generated problem data; "
                             "a typed answer cannot be checked (omit it)")
        return Problem(prompt, None)

    def score(self, problem, final_message):
        expr = extract_answer(final_message).split("=")[0].strip().replace("×", "*").replace("÷", "/")
        try:
            used: list[int] = []
            val = _eval_expr(ast.parse(expr, mode="eval"), used)
        except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
            return 0.0
        pool = list(problem.meta["numbers"])
        for u in used:
            if u not in pool:
                return 0.0
            pool.remove(u)
        return float(val == problem.answer)


def bulls_cows(secret: str, guess: str) -> tuple[int, int]:
    """Bulls: right digit in the right place; cows: right digit in the wrong place."""
    bulls = sum(s == g for s, g in zip(secret, guess, strict=False))
    common = sum(min(secret.count(d), guess.count(d)) for d in set(guess))
    return bulls, common - bulls


class GuessTask(Task):
    """Guess a secret of ``digits`` distinct digits from bulls/cows feedback (multi-turn)."""

    name = "guess"
    multi_turn = True

    def __init__(self, digits: int = 3):
        if not 1 <= digits <= 10:
            raise InputError(f"guess digits must be in 1..10, got {digits}")
        self.digits = digits

    def _generate(self, rng):
        secret = "".join(rng.sample("0123456789", self.digits))
        prompt = (f"Guess my secret number: {self.digits} distinct digits. After each guess I "
                  f"reply with bulls (right digit, right place) and cows (right digit, wrong "
                  f"place). End each message with 'Guess: <{self.digits} digits>'.")
        return Problem(prompt + f" [game {rng.getrandbits(32):08x}]", secret)

    def _guess(self, message: str) -> str | None:
        groups = re.findall(rf"(?<!\d)\d{{{self.digits}}}(?!\d)", message)
        return groups[-1] if groups else None

    def feedback(self, problem, message):
        g = self._guess(message)
        if g is None:
            return f"No {self.digits}-digit guess found.", False
        b, c = bulls_cows(problem.answer, g)
        if b == self.digits:
            return f"{g}: correct!", True
        return f"{g}: {b} bulls, {c} cows.", False

    def score(self, problem, final_message):
        return float(self._guess(final_message) == problem.answer)


# ---------------------------------------------------------------- blocksworld (PlanBench-like)

_ACTION_RE = [
    (re.compile(r"^pick\s*up\s+(?:the\s+)?(?:block\s+)?([a-z])$"), "pickup"),
    (re.compile(r"^put\s*down\s+(?:the\s+)?(?:block\s+)?([a-z])$"), "putdown"),
    (re.compile(r"^stack\s+(?:the\s+)?(?:block\s+)?([a-z])\s+on(?:\s+top\s+of)?\s+(?:the\s+)?(?:block\s+)?([a-z])$"), "stack"),
    (re.compile(r"^unstack\s+(?:the\s+)?(?:block\s+)?([a-z])\s+from(?:\s+on\s+top\s+of)?\s+(?:the\s+)?(?:block\s+)?([a-z])$"), "unstack"),
]


def _stacks_to_on(stacks: list[list[str]]) -> dict[str, str]:
    """``on[x]`` = the block under ``x`` or ``"table"`` (stacks listed bottom to top)."""
    on = {}
    for st in stacks:
        for i, b in enumerate(st):
            on[b] = "table" if i == 0 else st[i - 1]
    return on


def _describe(stacks: list[list[str]]) -> str:
    parts = []
    for st in stacks:
        parts.append(f"{st[0]} is on the table")
        parts += [f"{st[i]} is on {st[i - 1]}" for i in range(1, len(st))]
    return ", ".join(parts)


def validate_plan(plan: str, init: dict[str, str], goal: dict[str, str]) -> tuple[bool, str]:
    """Simulate a plan in the 4-operator blocksworld; ``(goal reached with legal actions,
    reason)``. ``init``/``goal`` map each block to what it sits on (``"table"`` or a block);
    the goal may be partial. Preconditions: pick up x — x on the table, clear, hand empty;
    put down x — holding x; stack x on y — holding x, y clear; unstack x from y — x on y,
    x clear, hand empty. Lines that are not actions (empty, ``Plan:``, numbering) are skipped."""
    on = dict(init)
    holding: str | None = None
    for raw in plan.splitlines():
        action = _plan_action(raw)
        if action is None:
            continue
        kind, args, line = action
        if any(a not in on and a != holding for a in args):
            return False, f"unknown block in {line!r}"
        legal, holding = _blocksworld_step(kind, args, on, holding)
        if not legal:
            return False, f"illegal: {line}"
    if holding is not None:
        return False, "still holding a block"
    ok = all(on.get(b) == w for b, w in goal.items())
    return ok, "goal reached" if ok else "goal not reached"


def _plan_action(raw: str) -> tuple[str, tuple[str, ...], str] | None:
    """``(kind, blocks, line)`` of one plan line (numbering, bullets, ``Plan:`` and a final
    period stripped; lower case), or ``None`` when the line is no action."""
    line = re.sub(r"^\s*(?:\d+[.)]|[-*])\s*", "", raw.strip().lower()).rstrip(".")
    line = re.sub(r"^(?:plan|answer)\s*:\s*", "", line)
    if not line:
        return None
    for rx, name in _ACTION_RE:
        m = rx.match(line)
        if m:
            return name, m.groups(), line
    return None


def _blocksworld_step(kind: str, args: tuple[str, ...], on: dict[str, str],
                      holding: str | None) -> tuple[bool, str | None]:
    """One action under :func:`validate_plan`'s preconditions: ``(legal, the block held
    after)``; ``on`` (block → what it sits on) changes in place only when it is legal."""
    def clear(b):
        return holding != b and all(v != b for v in on.values())

    x = args[0]
    if kind == "pickup":
        if holding or on.get(x) != "table" or not clear(x):
            return False, holding
        del on[x]
        return True, x
    if kind == "putdown":
        if holding != x:
            return False, holding
        on[x] = "table"
        return True, None
    y = args[1]
    if kind == "stack":
        if holding != x or x == y or y not in on or not clear(y):
            return False, holding
        on[x] = y
        return True, None
    if holding or on.get(x) != y or not clear(x):  # unstack
        return False, holding
    del on[x]
    return True, x


class BlocksworldTask(Task):
    """Rearrange ``blocks`` blocks from a random arrangement to a random goal arrangement."""

    name = "blocksworld"

    def __init__(self, blocks: int = 3):
        if not 2 <= blocks <= 8:
            raise InputError(f"blocksworld blocks must be in 2..8, got {blocks}")
        self.blocks = blocks

    def _random_stacks(self, rng, names):
        names = names[:]
        rng.shuffle(names)
        stacks: list[list[str]] = []
        for b in names:
            if stacks and rng.random() < 0.6:
                rng.choice(stacks).append(b)
            else:
                stacks.append([b])
        return stacks

    def _generate(self, rng):
        names = [chr(ord("a") + i) for i in range(self.blocks)]
        while True:
            s0, s1 = self._random_stacks(rng, names), self._random_stacks(rng, names)
            init, goal = _stacks_to_on(s0), _stacks_to_on(s1)
            if init != goal:
                break
        prompt = (f"Blocksworld. Initially: {_describe(s0)}; the hand is empty. Goal: "
                  f"{_describe(s1)}. Actions: 'pick up X', 'put down X', 'stack X on Y', "
                  f"'unstack X from Y'. Write the plan, one action per line.")
        return Problem(prompt, goal, {"init": init})

    def user_problem(self, prompt, answer=None):
        if answer is not None:
            raise InputError(f"task {self.name!r} scores against generated problem data; "
                             "a typed answer cannot be checked (omit it)")
        return Problem(prompt, None)

    def score(self, problem, final_message):
        return float(validate_plan(final_message, problem.meta["init"], problem.answer)[0])


class CopyTask(Task):
    """Repeat a random lowercase string; score = matching positions / length."""

    name = "copy"

    def __init__(self, length: int = 4):
        if length < 1:
            raise InputError(f"copy length must be >= 1, got {length}")
        self.length = length

    def _generate(self, rng):
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(self.length))
        return Problem(f"Repeat exactly: {word}", word)

    def score(self, problem, final_message):
        text = final_message.strip()
        return sum(a == b for a, b in zip(text, problem.answer, strict=False)) / len(problem.answer)


# ------------------------------------------------------------------- answer checkers (math)

def _normalize_math(s: str) -> str:
    s = str(s).strip()
    m = re.search(r"\\boxed\{(.*)\}", s)
    if m:
        s = m.group(1)
    s = s.replace("$", "").replace(",", "").replace("\\!", "").replace(" ", "")
    s = re.sub(r"\\(?:d|t)?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    s = s.replace("\\left", "").replace("\\right", "").rstrip(".")
    return s


def _as_number(s: str) -> Fraction | None:
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        pass
    m = re.fullmatch(r"\(?(-?[\d.]+)\)?/\(?(-?[\d.]+)\)?", s)
    if m:
        try:
            return Fraction(m.group(1)) / Fraction(m.group(2))
        except (ValueError, ZeroDivisionError):
            return None
    return None


def math_equal(pred: str, gold: str) -> bool:
    """Our own checker (``--checker builtin``): answers equal after normalisation —
    numerically (exact rationals, so ``0.5 == 1/2 == \\frac{1}{2}``) when both parse as
    numbers, else as normalised strings."""
    a, b = _normalize_math(pred), _normalize_math(gold)
    na, nb = _as_number(a), _as_number(b)
    if na is not None and nb is not None:
        return na == nb
    return a.lower() == b.lower() and a != ""


def exact_equal(pred: str, gold: str) -> bool:
    """``--checker exact``: the same non-empty string once surrounding whitespace is stripped."""
    return pred.strip() == gold.strip() != ""


#: seconds math-verify may spend parsing or comparing one answer (its signal-based timeout)
MATH_VERIFY_TIMEOUT = 5
_MATH_DELIMS = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


class _NoTimeoutNotice:
    """Drops math-verify's notice that its timeout is off: we turn it off on purpose outside
    the main thread (``signal.alarm`` works only there) — see :func:`math_verify_equal`."""

    @staticmethod
    def filter(record) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


@functools.cache
def _math_verify():
    """``(parse, verify)`` of math-verify, imported on first use."""
    try:
        from math_verify import parse, verify
    except ImportError:
        raise InputError("the math-verify checker needs the 'math-verify' package: pip install "
                         "math-verify (or choose --checker builtin)") from None
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_NoTimeoutNotice)
    return parse, verify


@functools.lru_cache(maxsize=4096)
def _mv_parse(text: str, timeout: int | None) -> tuple:
    """math-verify's parse of an answer; a bare answer (no ``$``, ``\\(``, ``\\[`` or
    ``\\boxed``) is read as inline LaTeX ``$text$``, which math-verify reads far more
    reliably than bare text (bare ``1,2`` parses as 1.2, bare ``1+x`` as 1)."""
    parse, _ = _math_verify()
    if not _MATH_DELIMS.search(text):
        text = f"${text}$"
    return tuple(parse(text, parsing_timeout=timeout))


def math_verify_equal(pred: str, gold: str) -> bool:
    """``--checker math-verify`` (the default of the dataset task): math-verify's
    ``verify(parse(gold), parse(pred))``, except that two plain integers
    (:func:`plain_integer`) are compared as integers — the fast path, measured to agree with
    math-verify (tests/llm/test_answer_check.py) and far faster. math-verify's timeouts use
    ``signal.alarm``, which works only in the main thread; elsewhere they are off."""
    a, b = plain_integer(pred), plain_integer(gold)
    if a is not None and b is not None:
        return a == b
    _, verify = _math_verify()
    timeout = MATH_VERIFY_TIMEOUT if threading.current_thread() is threading.main_thread() else None
    g, p = _mv_parse(gold, timeout), _mv_parse(pred, timeout)
    return bool(g and p and verify(list(g), list(p), timeout_seconds=timeout))


#: ``--checker`` choices: name -> ``check(pred, gold) -> bool``
CHECKERS = {"math-verify": math_verify_equal, "exact": exact_equal, "builtin": math_equal}


# --------------------------------------------------------------- the user's own data set

class DatasetTask(Task):
    """A local dataset of prompts and gold answers (``--dataset PATH``, read by
    :mod:`sat_llm.data`). Training problems come from ``split``; held-out ones from
    ``eval_split`` when given, else from ``eval_fraction`` (default
    :data:`~sat_llm.config.EVAL_FRACTION`, 0.2) of ``split``'s rows
    (seeded shuffle, the rest train). The final message's answer (:func:`extract_answer`) is
    scored 1 when ``checker`` (:data:`CHECKERS`) finds it equal to the gold answer.
    ``fingerprint``: the rows' hash recorded by a run; a dataset that no longer matches it
    is refused (a resumed run must see the same problems)."""

    name = "dataset"
    answer_line = True

    def __init__(self, path: str | None, prompt_column: str | None = None,
                 answer_column: str | None = None, split: str | None = None,
                 eval_split: str | None = None, eval_fraction: float | None = None,
                 checker: str = "math-verify", fingerprint: str | None = None):
        from . import data

        if not path:
            raise InputError("the dataset task needs a local dataset (--dataset PATH)")
        if checker not in CHECKERS:
            raise InputError(f"unknown checker {checker!r}; choose {', '.join(CHECKERS)}")
        if checker == "math-verify":
            _math_verify()  # a missing package fails now, before any data is read
        if eval_split is not None and eval_fraction is not None:
            raise InputError("give --eval-split or --eval-fraction, not both")
        if eval_split is None:
            eval_fraction = EVAL_FRACTION if eval_fraction is None else eval_fraction
            if not 0 < eval_fraction < 1:
                raise InputError(f"eval fraction must be in (0, 1), got {eval_fraction}")
        splits = data.load_splits(path)
        split = self._split_name(splits, split, path)
        ds = splits[split]
        cols = dict(prompt_column=data.pick_column(ds.column_names, prompt_column, data.PROMPT_COLUMNS,
                                                   "--prompt-column", path),
                    answer_column=data.pick_column(ds.column_names, answer_column, data.ANSWER_COLUMNS,
                                                   "--answer-column", path))
        self.rows = data.split_rows(ds, *cols.values(), f"{path} [{split}]")
        self.eval_rows = None
        if eval_split is not None:
            if eval_split not in splits or eval_split == split:
                raise InputError(f"--eval-split {eval_split!r}: {path} has the splits "
                                 f"{', '.join(splits)} (and the training split is {split!r})")
            ev = splits[eval_split]
            for c in cols.values():
                data.pick_column(ev.column_names, c, (), "the training split's column",
                                 f"{path} [{eval_split}]")
            self.eval_rows = data.split_rows(ev, *cols.values(), f"{path} [{eval_split}]")
        elif len(self.rows) < 2:
            raise InputError(f"{path}: need at least 2 rows to hold some out, found {len(self.rows)}")
        self.fingerprint = data.fingerprint(self.rows, *([self.eval_rows] if self.eval_rows else []))
        if fingerprint is not None and fingerprint != self.fingerprint:
            raise InputError(f"{path}: the dataset changed since this run started (rows hash "
                             f"{self.fingerprint}, recorded {fingerprint}); restore it or start a "
                             "new run")
        self.path = str(Path(path).resolve())
        self.check = CHECKERS[checker]
        self._options = dict(**cols, split=split, eval_split=eval_split,
                             eval_fraction=eval_fraction, checker=checker,
                             fingerprint=self.fingerprint)

    @staticmethod
    def _split_name(splits: dict, split: str | None, path: str) -> str:
        if split is not None:
            if split not in splits:
                raise InputError(f"--split {split!r}: {path} has the splits {', '.join(splits)}")
            return split
        if "train" in splits or len(splits) == 1:
            return "train" if "train" in splits else next(iter(splits))
        raise InputError(f"{path} has the splits {', '.join(splits)}: choose one with --split")

    def options(self) -> dict:
        """The resolved constructor options (columns and split named, fingerprint set):
        ``DatasetTask(task.path, **task.options())`` rebuilds this task exactly."""
        return dict(self._options)

    def record(self, n_train: int, n_eval: int, seed: int) -> dict:
        """What a run's ``config.json`` says about its data: the path, the options and the
        number of rows available (``rows``) and used (``used``) in each role."""
        train, held = self._roles(seed)
        used_train = self.problems("train", n_train, seed)
        used_eval = self.problems("eval", n_eval, seed, exclude={p.prompt for p in used_train})
        return dict(path=self.path, **self.options(), rows=dict(train=len(train), eval=len(held)),
                    used=dict(train=len(used_train), eval=len(used_eval)))

    def _roles(self, seed: int) -> tuple[list, list]:
        """``(training rows, held-out rows)``, each in a seeded order: the two splits, or
        the first ``max(1, round(eval_fraction · N))`` rows of a seeded shuffle held out."""
        def shuffled(xs):
            xs = list(xs)
            random.Random(seed).shuffle(xs)
            return xs

        if self.eval_rows is not None:
            return shuffled(self.rows), shuffled(self.eval_rows)
        order = shuffled(range(len(self.rows)))
        k = min(len(order) - 1, max(1, round(self._options["eval_fraction"] * len(order))))
        return [self.rows[i] for i in order[k:]], [self.rows[i] for i in order[:k]]

    def problems(self, split, n, seed=0, exclude=None):
        """At most ``n`` problems of ``split`` ("train" or "eval", :meth:`_roles`); the eval
        split drops prompts in ``exclude`` (duplicates of training prompts)."""
        if split not in ("train", "eval"):
            raise InputError(f"split must be 'train' or 'eval', got {split!r}")
        rows = self._roles(seed)[split == "eval"]
        out = [Problem(f"{prompt} {ANSWER_HINT}", answer) for prompt, answer in rows]
        if split == "eval" and exclude:
            out = [p for p in out if p.prompt not in exclude]
        return out[:n]

    def score(self, problem, final_message):
        return float(self.check(extract_answer(final_message), problem.answer))

    def user_problem(self, prompt, answer=None):
        """The training prompts' form (the answer hint appended) and a gold answer read by
        the dataset rule (``#### x`` → ``x``)."""
        from .data import gold_answer

        return Problem(with_hint(prompt),
                       None if answer is None else gold_answer(answer, "--answer"))


TASKS = {
    "arithmetic": "multi-digit arithmetic (a op b), exact integer answer",
    "countdown": "reach a target from given numbers with + - * /",
    "guess": "number guessing with bulls/cows feedback (multi-turn)",
    "blocksworld": "blocksworld plan generation with a plan validator",
    "copy": "repeat a random string (partial credit; sanity task for tiny models)",
    "relay": "split-information arithmetic: each agent sees one part (sat_llm.team_tasks)",
    "dataset": "your own local dataset (--dataset PATH: save_to_disk folder, parquet, JSONL, "
               "CSV); answers checked by --checker (default math-verify)",
    "jsonl": "the same as dataset (the older name, for a JSONL file)",
}


def _import_task(spec: str, kw: dict) -> Task:
    """``package.module:ClassName`` -> an instance of that :class:`Task` subclass."""
    import importlib

    mod_name, _, cls_name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), cls_name)
    except (ImportError, AttributeError, ValueError):
        raise InputError(f"cannot import task class {spec!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise InputError(f"{spec!r} is not a sat_llm.tasks.Task subclass")
    return cls(**kw)


#: the environment variable holding the task-import permission of this process (below)
TASK_IMPORT_ENV = "SAT_ALLOW_TASK_IMPORT"


def make_task(name: str, prompts: str | None = None, **kw) -> Task:
    """The task called ``name`` (see :data:`TASKS`), or a user's ``package.module:Class``
    (a :class:`Task` subclass); unknown names or options -> InputError.

    Importing a class runs its module's code, so inside ``sat`` it needs an explicit opt-in:
    the command line sets ``$SAT_ALLOW_TASK_IMPORT`` (:data:`TASK_IMPORT_ENV`) to the
    ``--task`` the user typed, or to ``*`` with ``--allow-task-import`` (of ``sat`` or of
    ``sat train``/``export``/``team``; :func:`sat_theory.cli.main`); a name read from a
    ``config.json`` or ``team.json`` is then refused before anything is imported. Unset (a
    library caller naming its own class) imports. Ray agent actors get the driver's value
    as an argument (:class:`sat_llm.ray_team.AgentWorker`), not from the cluster's
    environment."""
    import os

    classes = {"arithmetic": ArithmeticTask, "countdown": CountdownTask, "guess": GuessTask,
               "blocksworld": BlocksworldTask, "copy": CopyTask,
               "relay": RelayTask}
    if name not in classes and name not in ("dataset", "jsonl") and ":" not in name:
        raise InputError(f"unknown task {name!r}: choose one of {', '.join(TASKS)} "
                         "(or package.module:TaskClass)")
    allowed = os.environ.get(TASK_IMPORT_ENV)
    if ":" in name and allowed is not None and allowed != "*" and name not in allowed.split(","):
        raise InputError(f"task {name!r} names a Python class to import (its module would run); "
                         "sat imports a task class named in a file only when asked: rerun with "
                         "--allow-task-import if you trust it")
    try:
        if ":" in name:
            return _import_task(name, kw)
        if name in ("dataset", "jsonl"):
            return DatasetTask(prompts, **kw)
        check_option_types(classes[name], name, kw)
        return classes[name](**kw)
    except (TypeError, ValueError) as e:
        raise InputError(f"bad option for task {name!r}: {e}") from None


def check_option_types(cls, name: str, kw: dict) -> None:
    """Each task option must have the type its constructor declares (``int``, ``float``,
    ``str``, ``bool``; ``None`` where the annotation allows it; an int where a float is
    declared): ``--task-option hi=x`` or ``digits=1.5`` is an InputError here, not a string
    or a float that fails (or silently works) later."""
    import types
    import typing

    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # an annotation that does not evaluate: leave the check to the class
        return
    for key, value in kw.items():
        t = hints.get(key)
        union = typing.get_origin(t) in (typing.Union, types.UnionType)
        allowed = tuple(a for a in (typing.get_args(t) if union else (t,)) if isinstance(a, type))
        if not allowed or value is None and type(None) in allowed:
            continue
        ok = isinstance(value, allowed) and (bool in allowed or not isinstance(value, bool))
        ok = ok or (float in allowed and type(value) is int)
        if not ok:
            names = " or ".join("None" if a is type(None) else a.__name__ for a in allowed)
            raise InputError(f"{key}={value!r} must be {names}")  # make_task names the task
