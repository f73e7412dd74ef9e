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
- ``jsonl``: the user's own file of ``{"prompt": ..., "answer": ...}`` lines, split into
  train/eval by a seeded shuffle; :func:`math_equal` compares answers (``\\boxed{}``, ``$``,
  commas, fractions and decimals normalised).
"""

from __future__ import annotations

import ast
import json
import random
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from sat_theory.errors import InputError

__all__ = ["Problem", "Task", "TASKS", "make_task", "validate_plan", "math_equal",
           "extract_answer", "bulls_cows", "ArithmeticTask", "CountdownTask", "GuessTask",
           "BlocksworldTask", "CopyTask", "JsonlTask"]

ANSWER_HINT = "End your message with a line 'Answer: <answer>'."


@dataclass
class Problem:
    prompt: str
    answer: Any
    meta: dict = field(default_factory=dict)


def extract_answer(text: str) -> str:
    """The text after the last ``Answer:`` (up to the line end), else the last non-empty line."""
    hits = re.findall(r"answer\s*[:=]\s*(.*)", text, flags=re.IGNORECASE)
    if hits:
        return hits[-1].strip()
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

    def __init__(self, digits: int | None = None, ops: str = "+-*", lo: int | None = None,
                 hi: int | None = None):
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
        self.digits, self.ops, self.lo, self.hi = digits, ops, lo, hi

    def capacity(self) -> int:
        """Number of distinct problems: ``(hi − lo + 1)² · |ops|``."""
        return (self.hi - self.lo + 1) ** 2 * len(set(self.ops))

    def _generate(self, rng):
        a, b, op = rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi), rng.choice(self.ops)
        val = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Problem(f"Compute {a} {op} {b}. {ANSWER_HINT}", val)

    def score(self, problem, final_message):
        return float(_last_int(extract_answer(final_message)) == problem.answer)


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

    def clear(b):
        return holding != b and all(v != b for v in on.values())

    for raw in plan.splitlines():
        line = re.sub(r"^\s*(?:\d+[.)]|[-*])\s*", "", raw.strip().lower()).rstrip(".")
        line = re.sub(r"^(?:plan|answer)\s*:\s*", "", line)
        if not line:
            continue
        for rx, name in _ACTION_RE:
            m = rx.match(line)
            if m:
                kind = name
                break
        else:
            continue
        args = m.groups()
        if any(a not in on and a != holding for a in args):
            return False, f"unknown block in {line!r}"
        x = args[0]
        if kind == "pickup":
            if holding or on.get(x) != "table" or not clear(x):
                return False, f"illegal: {line}"
            holding = x
            del on[x]
        elif kind == "putdown":
            if holding != x:
                return False, f"illegal: {line}"
            on[x], holding = "table", None
        elif kind == "stack":
            y = args[1]
            if holding != x or x == y or y not in on or not clear(y):
                return False, f"illegal: {line}"
            on[x], holding = y, None
        else:  # unstack
            y = args[1]
            if holding or on.get(x) != y or not clear(x):
                return False, f"illegal: {line}"
            holding = x
            del on[x]
    if holding is not None:
        return False, "still holding a block"
    ok = all(on.get(b) == w for b, w in goal.items())
    return ok, "goal reached" if ok else "goal not reached"


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


# ------------------------------------------------------------------------ user JSONL + math

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
    """Answers equal after normalisation: numerically (exact rationals, so ``0.5 == 1/2 ==
    \\frac{1}{2}``) when both parse as numbers, else as normalised strings."""
    a, b = _normalize_math(pred), _normalize_math(gold)
    na, nb = _as_number(a), _as_number(b)
    if na is not None and nb is not None:
        return na == nb
    return a.lower() == b.lower() and a != ""


class JsonlTask(Task):
    """A user's JSONL file of ``{"prompt", "answer"}`` objects; ``eval_fraction`` of the
    lines (seeded shuffle) form the eval split."""

    name = "jsonl"

    def __init__(self, path: str | None, eval_fraction: float = 0.2):
        if not path:
            raise InputError("task 'jsonl' needs a prompts file (--jsonl FILE.jsonl)")
        p = Path(path)
        if not p.is_file():
            raise InputError(f"prompts file not found: {path}")
        if not 0 < eval_fraction < 1:
            raise InputError(f"eval fraction must be in (0, 1), got {eval_fraction}")
        self.items: list[Problem] = []
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{path}:{i}: malformed JSON ({e.msg})") from None
            if not isinstance(obj, dict) or "prompt" not in obj or "answer" not in obj:
                raise InputError(f"{path}:{i}: each line must be an object with 'prompt' and 'answer'")
            self.items.append(Problem(str(obj["prompt"]).strip() + f" {ANSWER_HINT}", str(obj["answer"])))
        if len(self.items) < 2:
            raise InputError(f"{path}: need at least 2 prompt/answer lines, found {len(self.items)}")
        self.eval_fraction = eval_fraction

    def problems(self, split, n, seed=0, exclude=None):
        if split not in ("train", "eval"):
            raise InputError(f"split must be 'train' or 'eval', got {split!r}")
        order = list(range(len(self.items)))
        random.Random(seed).shuffle(order)
        n_eval = max(1, round(self.eval_fraction * len(order)))
        idx = order[:n_eval] if split == "eval" else order[n_eval:]
        return [self.items[i] for i in idx[:n]]

    def score(self, problem, final_message):
        return float(math_equal(extract_answer(final_message), problem.answer))


TASKS = {
    "arithmetic": "multi-digit arithmetic (a op b), exact integer answer",
    "countdown": "reach a target from given numbers with + - * /",
    "guess": "number guessing with bulls/cows feedback (multi-turn)",
    "blocksworld": "blocksworld plan generation with a plan validator",
    "copy": "repeat a random string (partial credit; sanity task for tiny models)",
    "jsonl": "your own JSONL of prompt/answer pairs (--prompts), math answer checker",
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


def make_task(name: str, prompts: str | None = None, **kw) -> Task:
    """The task called ``name`` (see :data:`TASKS`), or a user's ``package.module:Class``
    (a :class:`Task` subclass); unknown names or options -> InputError."""
    classes = {"arithmetic": ArithmeticTask, "countdown": CountdownTask, "guess": GuessTask,
               "blocksworld": BlocksworldTask, "copy": CopyTask}
    if name not in classes and name != "jsonl" and ":" not in name:
        raise InputError(f"unknown task {name!r}: choose one of {', '.join(TASKS)} "
                         "(or package.module:TaskClass)")
    try:
        if ":" in name:
            return _import_task(name, kw)
        return JsonlTask(prompts, **kw) if name == "jsonl" else classes[name](**kw)
    except TypeError as e:
        raise InputError(f"bad option for task {name!r}: {e}") from None
