"""``sat team RUN_DIR|EXPORT_DIR --prompt "…"``: play a trained team on your own prompts.

The team runs its turn-taking protocol (:mod:`sat_llm.protocol`, greedy decoding, as in the
held-out evaluation) and every agent's message is printed as ``agent k: …``, then the final
answer (the last agent's message, as the task extracts it) and, when an answer is known, the
task's score. On a terminal each message streams token by token.

A typed prompt is put in the form the team trained on (:meth:`Task.user_problem`: e.g. the
answer hint of ``arithmetic`` and dataset tasks appended) and a typed answer in the form the
task scores against (an integer for ``arithmetic``, the ``#### x`` rule for datasets).

Prompts: ``--prompt`` (repeatable), else one per line on stdin. A stdin line that is a JSON
object ``{"prompt": …, "answer": …}`` brings its answer along; ``--answer`` gives one for a
single ``--prompt``. Stdin must be UTF-8 text. Every prompt is checked against the base
model's context length before the team plays (:func:`check_context`): a prompt that, in its
chat template, leaves no room for ``max_new_tokens`` is refused naming its row (exit 2).
"""

from __future__ import annotations

import json
import sys

from sat_theory.errors import InputError

from .limits import MAX_CHARS_PER_TOKEN, check_problems_fit, context_length  # noqa: F401

__all__ = ["add_arguments", "run", "read_prompts", "play", "check_context",
           "check_problems_fit"]


def add_arguments(p) -> None:
    from .export import output_arguments, trust_arguments

    p.add_argument("team", metavar="RUN_DIR|EXPORT_DIR",
                   help="an LLM run folder (sat train --backend llm) or an export (sat export)")
    p.add_argument("--prompt", action="append", default=None,
                   help="a task prompt (repeatable; default: one prompt per line on stdin)")
    p.add_argument("--answer", default=None,
                   help="the expected answer of a single --prompt (then the score is printed)")
    p.add_argument("--stage", type=int, default=None, metavar="K",
                   help="a run folder's policies/stage{K} instead of its latest weights")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object per prompt instead of text")
    p.add_argument("--no-stream", action="store_true",
                   help="print each message when complete (default on a terminal: stream tokens)")
    output_arguments(p)
    trust_arguments(p)


def read_prompts(args, stdin=None) -> list[tuple[str, object]]:
    """``[(prompt, answer or None)]`` from ``--prompt``/``--answer`` or stdin lines."""
    if args.prompt:
        if args.answer is not None and len(args.prompt) != 1:
            raise InputError("--answer goes with a single --prompt")
        return [(p, args.answer if len(args.prompt) == 1 else None) for p in args.prompt]
    if args.answer is not None:
        raise InputError("--answer needs --prompt")
    stdin = stdin or sys.stdin
    if stdin.isatty():
        raise InputError("give --prompt TEXT or pipe prompts on stdin (one per line)")
    out = []
    for n, line in enumerate(getattr(stdin, "buffer", stdin), 1):
        if isinstance(line, bytes):
            try:
                line = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"stdin line {n} is not UTF-8 text (byte 0x{line[e.start]:02x} "
                                 f"at column {e.start + 1})") from None
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise InputError(f"stdin line {n} starts with '{{' but is not JSON") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str):
                raise InputError(f"stdin line {n}: a JSON line needs a string 'prompt'")
            out.append((rec["prompt"], rec.get("answer")))
        else:
            out.append((line, None))
    if not out:
        raise InputError("no prompts on stdin")
    return out


def check_context(team, prompts: list[tuple[str, object]]) -> None:
    """Refuse (naming the row, 1-based) a typed prompt that does not fit the model's context
    (:func:`check_problems_fit`), before anything is generated."""
    ctx = context_length(team)
    if ctx is None:
        return
    for i, (prompt, _) in enumerate(prompts, 1):
        if len(prompt) > MAX_CHARS_PER_TOKEN * ctx:  # never hand the tokenizer 200 MB
            raise InputError(f"prompt {i}: {len(prompt)} characters cannot fit the model's "
                             f"context of {ctx} tokens")
    problems = [team.task.user_problem(prompt, answer) for prompt, answer in prompts]
    check_problems_fit(team, problems, [f"prompt {i}" for i in range(1, len(prompts) + 1)])


def play(team, prompt: str, answer=None) -> dict:
    """One greedy episode of ``team`` on ``prompt``: ``{prompt, messages: [(speaker, text)],
    final, answer, score}`` (``score`` is ``None`` without an answer)."""
    from .tasks import extract_answer

    if answer is None and team.task.multi_turn:
        raise InputError(f"task {team.cfg.task!r} is interactive: its environment needs the "
                         "answer (--answer, or a JSON line with 'answer')")
    task = team.task
    problem = task.user_problem(prompt, answer)
    if answer is None:  # nothing to score against: the same episode, without the score
        team.task = _Unscored(task)
    try:
        (_, history, score), = team._run_episodes([problem], greedy=True)
    finally:
        team.task = task
    final = next((t for who, t in reversed(history) if who.startswith("agent")), "")
    return dict(prompt=prompt, messages=history, final=final,
                final_answer=extract_answer(final), answer=problem.answer,
                score=float(score) if answer is not None else None)


class _Unscored:
    """A task's protocol side (feedback) without its score, for prompts with no answer."""

    def __init__(self, task):
        self._task = task

    def __getattr__(self, name):
        return getattr(self._task, name)

    def score(self, problem, final_message):
        return float("nan")


class _Printer:
    """A streamer factory for :attr:`LLMTeam.streamer_for`: prints ``agent k: `` and then
    the tokens of that agent's message as they come."""

    def __init__(self, team):
        self.team = team

    def __call__(self, agent: int):
        from transformers import TextStreamer

        print(f"agent {agent + 1}: ", end="", flush=True)
        return TextStreamer(self.team.tokenizer(agent), skip_prompt=True,
                            skip_special_tokens=True)


def run(args) -> int:
    from sat_theory.progress import configure

    from .export import load_team

    configure(quiet=args.quiet, verbose=args.verbose)
    if args.stage is not None and args.stage < 0:
        raise InputError(f"--stage must be >= 0, got {args.stage}")
    prompts = read_prompts(args)
    team, _info = load_team(args.team, stage=args.stage)
    check_context(team, prompts)
    stream = not args.json and not args.no_stream and sys.stdout.isatty()
    if stream:
        team.streamer_for = _Printer(team)
    for prompt, answer in prompts:
        r = play(team, prompt, answer)
        if args.json:
            print(json.dumps(r, default=str))
            continue
        if not stream:
            for who, text in r["messages"]:
                print(f"{who}: {text}")
        print(f"final answer: {r['final_answer']}"
              + ("" if r["score"] is None else f"  (expected {answer}; score {r['score']:g})"))
    return 0
