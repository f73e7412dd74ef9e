"""The tiny LLM team the LLM and CLI tests share: a task whose scores vary even for a random
model, and the settings of a tiny-random team on one thread.

:class:`LowercaseTask` is loaded through ``make_task``'s ``module:Class`` form
(:data:`LOWERCASE_TASK`); Ray's agent actors import it by that name too, so their
``PYTHONPATH`` holds the repository root (tests/llm/test_ray_team.py).
"""

from __future__ import annotations

from sat_llm.tasks import Problem, Task


class LowercaseTask(Task):
    """Score: the fraction of lowercase letters in the final message (varies inside a group
    even for a random character model, so the advantages — hence the updates — are not
    zero)."""

    name = "lowercase"

    def _generate(self, rng):
        return Problem(f"Write lowercase letters. #{rng.randrange(10**6)}", None)

    def score(self, problem, final_message):
        return sum(c.islower() for c in final_message) / max(len(final_message), 1)


#: the ``--task`` / ``LLMConfig.task`` value naming :class:`LowercaseTask`
LOWERCASE_TASK = f"{__name__}:LowercaseTask"


def make_team(agents=2, device="cpu", **kw):
    """An ``LLMTeam`` of ``agents`` tiny-random agents on ``device``, in float32 on every
    device (auto would pick bfloat16 on CUDA): the same tolerances hold."""
    from sat_llm.team import LLMConfig, LLMTeam

    base = dict(model="tiny-random", task=LOWERCASE_TASK, agents=agents, max_new_tokens=4, n_train=16,
                n_eval=2, minibatch=8, lr=1e-2, seed=0, threads=1, device=device, dtype="float32")
    base.update(kw)
    return LLMTeam(LLMConfig(**base))


def llm_cfg(**kw):
    """The ``LLMConfig`` of the Ray tests' two-agent team. The CPU in both worlds (actors
    without ``--agent-gpus`` run there; on a GPU machine 'auto' would put the in-process team
    on CUDA in bfloat16)."""
    from sat_llm.team import LLMConfig

    base = dict(model="tiny-random", task=LOWERCASE_TASK, agents=2,
                max_new_tokens=4, n_train=16, n_eval=2, minibatch=8, lr=1e-2, seed=0, threads=1,
                device="cpu")
    base.update(kw)
    return LLMConfig(**base)


def arithmetic_eval_team(tmp_path_factory):
    """The one-agent tiny-random arithmetic team of the evaluation tests (12 held-out
    problems in chunks of 5), its model cache in a temporary folder; a generator for a
    module-scoped fixture."""
    import pytest

    from sat_llm.team import LLMConfig, LLMTeam

    mp = pytest.MonkeyPatch()
    mp.setenv("SAT_LLM_CACHE", str(tmp_path_factory.mktemp("cache")))
    try:
        yield LLMTeam(LLMConfig(model="tiny-random", agents=1, max_new_tokens=6, n_train=8,
                                n_eval=12, eval_batch=5, seed=0))
    finally:
        mp.undo()
