"""Stage-0 alignment of a replacement agent (THEORY §5; TeamTR §3.5 and App. D.1).

Before agent ``j`` (``π_old``) is replaced by a new agent ``π_θ``, the new agent is distilled
toward the old one by reverse-KL on probe contexts ``ν`` drawn from the current team's
rollouts (the old agent's own turns, so ``m ∼ π_old``):

    min_θ E_{s∼ν, m∼π_old(·|s)} Σ_u KL(π_old(·|s,x_<u) ‖ π_θ(·|s,x_<u))      (App. D.1)

and stopped as soon as the monitored token KL on the probe set is ``≤ δ_align``. The
objective is exactly the backend's update with zero advantages and ``β = 1`` against the old
agent's snapshot, so the same loss code serves both. Both monitors are logged: the exact
token KL (the stopping statistic) and the sampled eq. 18 estimate the paper stops on.

SAT's closed-form projection (``form="project"``) needs the per-state distribution over
whole messages, which a language model does not give in closed form; it is tabular-only.
"""

from __future__ import annotations

import numpy as np

from sat_theory.errors import InputError

__all__ = ["stage0_align"]


def stage0_align(team, agent: int, new, delta_align: float, form: str = "distill", *,
                 probe_groups: int = 4, probe_group_size: int = 4, max_steps: int = 50):
    """Distill ``new`` (an :class:`~sat_llm.team.AgentSnapshot` on the agent's base) toward
    the current agent ``agent`` (see module docstring). Returns ``(aligned snapshot, info)``;
    the team is left exactly as it was (the old agent still in place)."""
    if form != "distill":
        raise InputError(f"Stage-0 form {form!r} is tabular-only; the LLM backend implements "
                         "'distill' (TeamTR App. D.1)")
    if not delta_align > 0:
        raise InputError(f"delta_align must be > 0, got {delta_align}")
    old = team.snapshot(agent)
    probe = team.rollout(probe_groups, probe_group_size)  # ν: the current team's occupancy
    n_turns = len(probe.turns_of(agent))
    if n_turns == 0:
        raise InputError(f"agent {agent} takes no turn in the probe rollouts")
    zeros = np.zeros(n_turns)
    team.replace(agent, new)  # new weights, fresh optimizer state
    history = []
    try:
        klr = team.kl(agent, probe, old)
        history.append((float(klr["kl"]), float(klr["kl_sampled"])))
        steps = 0
        while klr["kl"] > delta_align and steps < max_steps:
            team.update(agent, probe, zeros, 1.0, old)
            klr = team.kl(agent, probe, old)
            history.append((float(klr["kl"]), float(klr["kl_sampled"])))
            steps += 1
        aligned = team.snapshot(agent)
        aligned.optim = None
    finally:
        team.restore(agent, old)
    info = dict(kl_start=history[0][0], kl_end=history[-1][0], kl_sampled_start=history[0][1],
                kl_sampled_end=history[-1][1], steps=steps, reached=bool(history[-1][0] <= delta_align),
                probe_turns=n_turns, probe_rollout_id=probe.rollout_id)
    return aligned, info
