"""Limits of what an LLM team can be handed: a prompt must fit the base model's context
together with ``max_new_tokens`` (``sat team``'s typed prompts and a ``--dataset``'s rows)."""

from __future__ import annotations

from sat_theory.errors import InputError

#: no tokenizer's token is longer than this many characters (the longest tokens of BPE
#: vocabularies are runs of ~128 spaces or dashes): a longer prompt is refused before it is
#: tokenized (a 200 MB line aborted inside the Rust tokenizer)
MAX_CHARS_PER_TOKEN = 256


def context_length(team) -> int | None:
    """The base model's context length in tokens (``max_position_embeddings``), if it has one."""
    n = getattr(getattr(team._model(0), "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def check_problems_fit(team, problems, labels=None) -> None:
    """Refuse the first problem whose first context — the chat template with the system
    prompt, the problem's prompt and the first agent's private view — plus
    ``max_new_tokens`` exceeds the model's context length (``labels[i]`` names problem i in
    the error; default its first characters). For typed prompts (:func:`check_context`) and
    a dataset's rows alike."""
    from .protocol import problem_views

    ctx = context_length(team)
    if ctx is None:
        return
    room, proto, tok = team.cfg.max_new_tokens, team.protocol, team.tokenizer(0)
    for i, problem in enumerate(problems):
        label = labels[i] if labels else f"prompt {problem.prompt[:40]!r}"
        if len(problem.prompt) > MAX_CHARS_PER_TOKEN * ctx:
            raise InputError(f"{label}: {len(problem.prompt)} characters cannot fit the "
                             f"model's context of {ctx} tokens")
        shared, private = problem_views(team.task, problem, proto.n_agents)
        n = len(proto.render(tok, shared, [], 0, proto.n_turns == 1,
                             None if private is None else private[0]))
        if n + room > ctx:
            raise InputError(f"{label}: {n} tokens in the chat template plus max_new_tokens "
                             f"{room} exceed the model's context length of {ctx} tokens")
