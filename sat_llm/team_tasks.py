"""Team tasks with private information: every agent sees a different part of the problem.

``relay`` (split-information arithmetic). A problem is ``x op y`` (operands uniform on
``[lo, hi]``, ``op`` uniform on ``ops``; the answer is its exact integer value). Its facts
are split into private parts, one per agent (:meth:`RelayTask.views`, the per-agent views of
:mod:`sat_llm.protocol`):

- 2 parts: agent 1 knows ``y``, agent 2 (the answerer) knows ``x`` and ``op``;
- 3 parts: agent 1 knows ``x``, agent 2 knows ``y``, agent 3 (the answerer) knows ``op``.

Every agent sees the same shared task message (what the team must do, no numbers), the
shared transcript and its own part; the agents speak in order and the last one must answer.
No agent can answer alone: the upstream agents must pass their facts on. The score is the
``arithmetic`` verifier's (the last integer after ``Answer:`` of the final message).

Options (``--task-option key=value``): ``lo``, ``hi``, ``ops`` as ``arithmetic``;
``parts`` (0: one part per agent, i.e. ``--agents``; 2 or 3); ``only`` (0: agent ``j`` sees
part ``j``; ``k``: every agent sees part ``k`` only, the one-view baseline). A one-agent team
(``--agents 1``) sees every part (the full-view upper bound) unless ``only`` is set.

**Chance** (:func:`chance_accuracy`). An agent that sees only part ``k`` can do no better than
the Bayes guess, the most likely answer given that part. Its expected accuracy over the
problem distribution, ``Σ_view P(view) · max_v P(answer = v | view)``, is computed exactly in
rationals by enumeration.
"""

from __future__ import annotations

import itertools
from collections import Counter
from fractions import Fraction

from sat_theory.errors import InputError

from .task_base import ANSWER_HINT, ArithmeticTask, Problem, _last_int, extract_answer

__all__ = ["RelayTask", "chance_accuracy", "split_facts"]

#: what each private part holds, by the number of parts (agent j knows part j). The answerer
#: (the last agent) gets the operation: an expression with a hole ("Compute 7 * y") is what an
#: untrained SmolLM2-135M can fill in from a teammate's message (5 of 40 held-out problems in
#: the wording below); a last agent that held a bare number and had to assemble the
#: expression scored 0-1 of 24 in each of the six wordings we tried
SPLITS = {1: (("x", "op", "y"),), 2: (("y",), ("x", "op")), 3: (("x",), ("y",), ("op",))}

#: the between-agent instruction of the relay protocol by team size (replaces the reviewer's)
RELAY_REVIEW = {1: "Your teammate wrote the message above.",
                2: "Agent 1 wrote the message above.",
                3: "Your teammate wrote the message above."}


def split_facts(x: int, op: str, y: int, parts: int) -> list[str]:
    """The facts of each private part as equations (``x = 7, op = *``)."""
    facts = {"x": f"x = {x}", "op": f"op = {op}", "y": f"y = {y}"}
    return [", ".join(facts[k] for k in part) for part in SPLITS[parts]]


def team_views(x: int, op: str, y: int, n: int) -> tuple[str, list[str]]:
    """The shared message and the private parts of an ``n``-agent team (``n`` = 2 or 3)."""
    if n == 2:
        return ("Two agents compute a product, sum or difference together.",
                [f"You are agent 1. Your number is {y}. Tell agent 2 your number.",
                 f"You are agent 2. Compute {x} {op} y, where y is agent 1's number above. "
                 f"{ANSWER_HINT}"])
    return ("Three agents compute a product, sum or difference together.",
            [f"You are agent 1. Your number is {x}. Tell agent 2 your number.",
             f"You are agent 2. Your number is {y}. Write agent 1's number and your number.",
             f"You are agent 3. Compute a {op} b, where a and b are the two numbers above. "
             f"{ANSWER_HINT}"])


class RelayTask(ArithmeticTask):
    """``relay``: split-information arithmetic for 2 and 3 agents (module docstring)."""

    name = "relay"

    @staticmethod
    def review_prompt(n_agents: int) -> str:
        """The between-agent instruction (:func:`sat_llm.protocol.protocol_for`)."""
        return RELAY_REVIEW[n_agents]

    def __init__(self, lo: int = 1, hi: int = 9, ops: str = "+-*", parts: int = 0,
                 only: int = 0, **arithmetic):
        super().__init__(ops=ops, lo=lo, hi=hi, **arithmetic)  # e.g. a validation split
        if parts not in (0, 1, 2, 3):
            raise InputError(f"relay parts must be 0 (one per agent), 1, 2 or 3, got {parts!r}")
        if not isinstance(only, int) or only < 0 or (parts and only > parts):
            raise InputError(f"relay only must be 0 or a part 1..{parts or 3}, got {only!r}")
        self.parts, self.only = parts, only

    # ------------------------------------------------------------------ the team
    def n_parts(self, n_agents: int) -> int:
        return self.parts or n_agents

    def check_team(self, n_agents: int) -> None:
        """A team of ``n_agents`` can play: one part per agent, or a single agent (all parts,
        or part ``only``)."""
        p = self.n_parts(n_agents)
        if p not in SPLITS:
            raise InputError(f"relay splits a problem into 1, 2 or 3 parts, not {p} "
                             f"(--agents {n_agents}; set --task-option parts=2 or 3)")
        if n_agents != 1 and p != n_agents:
            raise InputError(f"relay with {p} parts needs {p} agents or 1, got {n_agents}")
        if self.only > p:
            raise InputError(f"relay only={self.only} but the problem has {p} parts")

    def views(self, problem: Problem, n_agents: int) -> tuple[str, list[str]]:
        """``(shared task message, [private part of agent j])`` (:mod:`sat_llm.protocol`).
        A single agent sees ``Compute x op y.`` (every part: exactly the arithmetic task's
        prompt, nothing private) or, with ``only = k``, the facts of part ``k`` alone."""
        self.check_team(n_agents)
        m = problem.meta
        x, op, y = m["x"], m["op"], m["y"]
        if n_agents > 1:
            return team_views(x, op, y, n_agents)
        if not self.only:  # nothing is private: the arithmetic task's prompt
            return f"Compute {x} {op} {y}. {ANSWER_HINT}", [None]
        fact = split_facts(x, op, y, self.n_parts(n_agents))[self.only - 1]
        return ("Compute x op y, where op is +, - or *.",
                [f"You know only this part of the problem: {fact}. {ANSWER_HINT}"])

    # ------------------------------------------------------------------ problems
    def _generate(self, rng):
        # the same draws as arithmetic (x, y, op), so every variant sees the same problems
        x, y, op = rng.randint(self.lo, self.hi), rng.randint(self.lo, self.hi), rng.choice(self.ops)
        val = {"+": x + y, "-": x - y, "*": x * y}[op]
        return Problem(f"Compute {x} {op} {y}.", val, dict(x=x, op=op, y=y))

    def score(self, problem, final_message):
        return float(_last_int(extract_answer(final_message)) == problem.answer)

    def user_problem(self, prompt, answer=None):
        """A typed ``x op y`` (e.g. ``Compute 7 * 8``): the team splits it as it trained."""
        import re

        m = re.search(r"(-?\d+)\s*([-+*])\s*(-?\d+)", prompt)
        if m is None:
            raise InputError(f"relay prompts look like 'x op y' (op one of + - *), got {prompt!r}")
        x, op, y = int(m.group(1)), m.group(2), int(m.group(3))
        value = None if answer is None else _last_int(str(answer))
        if answer is not None and value is None:
            raise InputError(f"relay answers are integers, got {answer!r}")
        return Problem(f"Compute {x} {op} {y}.", value, dict(x=x, op=op, y=y))


def chance_accuracy(lo: int, hi: int, ops: str, parts: int, part: int) -> Fraction:
    """Exact accuracy of the Bayes guess from part ``part`` (1-based) of a ``parts``-way split:
    ``Σ_view P(view) · max_v P(x op y = v | view)``, ``x, y`` uniform on ``[lo, hi]`` and ``op``
    uniform on ``ops`` (distinct), by enumeration in rationals."""
    ops = "".join(dict.fromkeys(ops))
    keys = SPLITS[parts][part - 1]
    by_view: dict[tuple, Counter] = {}
    for x, y, op in itertools.product(range(lo, hi + 1), range(lo, hi + 1), ops):
        val = {"+": x + y, "-": x - y, "*": x * y}[op]
        facts = dict(x=x, op=op, y=y)
        by_view.setdefault(tuple(facts[k] for k in keys), Counter())[val] += 1
    total = (hi - lo + 1) ** 2 * len(ops)
    return sum((Fraction(max(c.values()), total) for c in by_view.values()), Fraction(0))
