"""The canonical shared-context turn-taking protocol (TeamTR §3.1, App. G.7).

The state of the team MDP is the shared textual context: the task prompt plus every earlier
message (agents' messages and, for interactive tasks, the environment's feedback) and the
active agent's id chosen by a fixed router. At each turn exactly one agent speaks; its
message is appended to the context. The last message's answer is scored.

Everything out-of-band is fixed once and identical for every agent (TeamTR App. G.7): one
explicit system prompt (never a model's default), one rendering of the transcript into chat
messages (task = user, agent messages = assistant, feedback = user, one fixed review
instruction between agents), the active agent's id shown or not for all, the reasoning-tag mode
(``reasoning_tags=False`` strips ``<think>…</think>`` blocks before a message enters the shared
context, so no agent sees another's hidden reasoning), and each agent's own chat template
for the markup.

**Per-agent views** (team tasks with private information, e.g. ``relay`` in
:mod:`sat_llm.team_tasks`). A task may split a problem into a shared part and one private part
per agent: ``task.views(problem, n_agents) -> (shared, [private_0, …, private_{n−1}])``. Agent
``j`` then sees the shared part as the task message, the shared transcript, and its own
private part ``private_j`` appended to the last user message (the instruction it acts on); it
never sees another agent's private part. The views are a fixed function of the problem, i.e.
of the initial state, so the context agent ``j`` conditions on is a fixed function ``f_j`` of
the shared state and the team policy stays factorized over that state (``docs/theory.md``
§1). A task with views may also bring its own between-agent instruction (``review_prompt``)
and refuse a team size it cannot split for (``check_team(n_agents)``): :func:`protocol_for`.
A task without ``views`` renders exactly as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from sat_theory.errors import InputError

__all__ = ["Protocol", "SYSTEM_PROMPT", "REVIEW_PROMPT", "ROUTERS", "protocol_for",
           "problem_views", "has_views", "views_record"]

SYSTEM_PROMPT = "You are a careful assistant. Answer briefly."
REVIEW_PROMPT = ("Check the answer above. If it is wrong, correct it. End with a line "
                 "'Answer: <answer>'.")

ROUTERS = ("round-robin", "random")


@dataclass
class Protocol:
    """Turn-taking protocol of an ``n_agents`` team (see module docstring)."""

    n_agents: int = field(metadata={"help": "agents in the team"})
    router: str = field(default="round-robin", metadata={
        "help": "which agent speaks at turn t: round-robin (t mod n) or random (uniform, seeded)"})
    turns: int = field(default=0, metadata={
        "help": "turns per episode (0: one per agent, i.e. n_agents); interactive tasks may end earlier"})
    system_prompt: str = field(default=SYSTEM_PROMPT, metadata={"help": "the canonical system prompt"})
    review_prompt: str = field(default=REVIEW_PROMPT, metadata={
        "help": "the canonical instruction after an agent's message, before the next agent speaks"})
    show_agent_id: bool = field(default=False, metadata={
        "help": "name the active agent in the context (TeamTR §3.1 allows either)"})
    reasoning_tags: bool = field(default=False, metadata={
        "help": "keep <think> blocks in the shared context (default: strip them, TeamTR G.7)"})

    def __post_init__(self):
        if self.n_agents < 1:
            raise InputError(f"a team needs at least 1 agent, got {self.n_agents}")
        if self.router not in ROUTERS:
            raise InputError(f"unknown router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.turns < 0:
            raise InputError(f"turns must be >= 0, got {self.turns}")

    @property
    def n_turns(self) -> int:
        return self.turns or self.n_agents

    def schedule(self, rng: np.random.Generator) -> list[int]:
        """The speaking agent of every turn of one episode."""
        if self.router == "round-robin":
            return [t % self.n_agents for t in range(self.n_turns)]
        return [int(a) for a in rng.integers(0, self.n_agents, size=self.n_turns)]

    def clean(self, message: str) -> str:
        """What of a message enters the shared context."""
        if not self.reasoning_tags:
            message = re.sub(r"<think>.*?(</think>|$)", "", message, flags=re.DOTALL)
        return message.strip()

    def messages(self, prompt: str, history: list[tuple[str, str]], agent: int, last: bool,
                 view: str | None = None) -> list[dict]:
        """Chat messages for ``agent`` speaking after ``history`` (``(speaker, text)`` pairs,
        speaker ``"agent k"`` or ``"environment"``): the task as the first user message, each
        agent message as an assistant message, environment feedback as a user message, and
        the canonical review instruction between two consecutive agent messages (chat
        templates need alternating roles). The active agent's id is shown only with
        ``show_agent_id`` (small models tend to parrot it). ``view``: the agent's private
        part of the problem (module docstring), appended to the last user message after a
        blank line; ``None`` (tasks without views) adds nothing."""
        msgs = [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": prompt}]
        for k, (who, text) in enumerate(history):
            if who == "environment":
                msgs.append({"role": "user", "content": text})
                continue
            msgs.append({"role": "assistant", "content": text})
            if k + 1 == len(history) or history[k + 1][0] != "environment":
                msgs.append({"role": "user", "content": self.review_prompt})
        if view is not None:
            msgs[-1]["content"] += f"\n\n{view}"
        if self.show_agent_id:
            role = "the final answer of the team" if last else "your contribution"
            msgs[-1]["content"] += f"\n(You are agent {agent + 1} of {self.n_agents}; write {role}.)"
        return msgs

    def render(self, tokenizer, prompt: str, history, agent: int, last: bool,
               view: str | None = None) -> list[int]:
        """Token ids of the context (chat template with the generation prompt)."""
        text = tokenizer.apply_chat_template(self.messages(prompt, history, agent, last, view),
                                             add_generation_prompt=True, tokenize=False)
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def has_views(task) -> bool:
    """Does ``task`` split its problems into per-agent views (module docstring)?"""
    return callable(getattr(task, "views", None))


def problem_views(task, problem, n_agents: int) -> tuple[str, list | None]:
    """``(shared prompt, private parts per agent or None)`` of ``problem``: the task's
    :meth:`views` for a task with views (an agent's part may be ``None``: nothing private),
    else ``(problem.prompt, None)`` (every agent sees the whole prompt, nothing private)."""
    if not has_views(task):
        return problem.prompt, None
    shared, private = task.views(problem, n_agents)
    if len(private) != n_agents:
        raise InputError(f"task {getattr(task, 'name', task)!r} gave {len(private)} private "
                         f"views for {n_agents} agents")
    return shared, [None if v is None else str(v) for v in private]


def protocol_for(task, n_agents: int, **kw) -> Protocol:
    """The canonical protocol of an ``n_agents`` team on ``task``: ``Protocol(n_agents,
    **kw)``, with the task's own between-agent instruction where it has one
    (``task.review_prompt``: a string, or a function of the team size), after the task has accepted the team size
    (``task.check_team(n_agents)``, which raises :class:`InputError`)."""
    check = getattr(task, "check_team", None)
    if callable(check):
        check(n_agents)
    review = getattr(task, "review_prompt", None)
    if callable(review):  # one instruction per team size
        review = review(n_agents)
    if review is not None and "review_prompt" not in kw:
        kw["review_prompt"] = str(review)
    return Protocol(n_agents, **kw)


def views_record(task, protocol: Protocol, problems) -> dict | None:
    """What ``team.json`` says about the per-agent views (``None``: a task without views,
    every agent sees the whole prompt): where the private part goes, the function that makes
    the views, and the views of the first problem of ``problems`` as an example."""
    if not has_views(task):
        return None
    cls = type(task)
    rec = dict(placement="agent j's private part is appended, after a blank line, to the last "
                         "user message of its context; the shared part is the task message",
               function=f"{cls.__module__}.{cls.__qualname__}.views",
               n_agents=protocol.n_agents)
    if problems:
        shared, private = problem_views(task, problems[0], protocol.n_agents)
        rec["example"] = dict(problem=problems[0].prompt, shared=shared, private=private)
    return rec
