"""Exact identities: the performance difference lemma and the factor lemma (docs/theory.md §2–§3).

Checks: performance_difference, factor_lemma.
"""

from __future__ import annotations

import numpy as np

from ..evaluate import evaluate
from ..policy import (
    expected_advantage,
    factor_kl,
    factor_tv,
    joint_kl,
    joint_tv,
    kl_rows,
)
from .base import CheckResult, check
from .cases import (
    cases,
)
from .tally import (
    Tally,
    check_mutation,
    count,
    trap_cases,
)

#: identities hold to roundoff, relative to 1 + |a| + |b| (Tally.equal): the performance
#: difference lemma (two dense solves), joint vs factor KL, joint vs factor TV
PDL_TOL = 1e-9
FACTOR_KL_TOL = 1e-10
FACTOR_TV_TOL = 1e-12


# ------------------------------------------------------------------ §2 identities
@check("performance_difference",
       "SAT §3 (performance difference lemma); TeamTR App. C.1",
       "docs/theory.md §2 exact identities",
       mutations=("old_occupancy", "drop_horizon", "new_advantage"))
def performance_difference(*, quick: bool = False, seed: int = 0,
                           mutation: str | None = None) -> CheckResult:
    """``J(π') − J(π) = 1/(1−γ) · E_{s∼d^π', a∼π'} A^π(s,a)`` on every case (an identity).

    Mutations: ``old_occupancy`` (``d^π`` for ``d^π'``), ``drop_horizon`` (no ``1/(1−γ)``),
    ``new_advantage`` (``A^π'`` for ``A^π``; its expectation under ``π'`` is 0).
    """
    name = "performance_difference"
    check_mutation(mutation, name)
    T = Tally()
    for c in cases(seed, count(quick, 80, 300)) + trap_cases():
        ev, ev2 = evaluate(c.mdp, c.current), evaluate(c.mdp, c.target)
        A = ev2.A if mutation == "new_advantage" else ev.A
        d = ev.d if mutation == "old_occupancy" else ev2.d
        h = 1.0 if mutation == "drop_horizon" else 1.0 / (1 - c.mdp.gamma)
        rhs = h * float(d @ expected_advantage(ev2.pi, A))
        T.equal(ev2.J - ev.J, rhs, c.label, tol=PDL_TOL)
    return T.result(name, [f"max |J(π')−J(π) − PDL| = {-min(T.slacks):.3g} over {T.cases} "
                           "pairs (float64, dense LU)"], tightness=False)


@check("factor_lemma",
       "TeamTR Lemma 3.1 / B.2; SAT Lemma 4.3",
       "docs/theory.md §3 divergences",
       mutations=("flip_kl", "ignore_activity"))
def factor_lemma(*, quick: bool = False, seed: int = 0,
                 mutation: str | None = None) -> CheckResult:
    """If ``π, π'`` differ only in agent ``j``'s factor, ``KL_s(π‖π') = KL_s(π^(j)‖π'^(j))``
    where ``j`` is active at ``s`` and ``0`` elsewhere (joint KL computed on joint actions).

    Also ``TV_s`` of the joint equals the factor TV (same argument). Mutations: ``flip_kl``
    (compare with ``KL_s(π'^(j)‖π^(j))``), ``ignore_activity`` (factor KL at every state,
    including where ``j`` is inactive and plays the no-op).
    """
    name = "factor_lemma"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 14])
    T = Tally()
    worst = 0.0
    for c in cases(seed + 4, count(quick, 60, 300)):
        j = int(rng.integers(c.n))
        p2 = c.current.with_factor(j, c.target.factors[j])
        lhs = joint_kl(c.mdp, c.current, p2)
        if mutation == "flip_kl":
            rhs = factor_kl(c.mdp, c.target.factors[j], c.current.factors[j], j)
        elif mutation == "ignore_activity":
            rhs = kl_rows(c.current.factors[j], c.target.factors[j])
        else:
            rhs = factor_kl(c.mdp, c.current.factors[j], c.target.factors[j], j)
        tv_l = joint_tv(c.mdp, c.current, p2)
        tv_r = factor_tv(c.mdp, c.current.factors[j], c.target.factors[j], j)
        for s in range(c.mdp.n_states):
            ok = T.equal(float(lhs[s]), float(rhs[s]), f"{c.label} agent {j} state {s}", FACTOR_KL_TOL)
            if mutation is None:
                ok = ok and T.equal(float(tv_l[s]), float(tv_r[s]), f"{c.label} TV s={s}", FACTOR_TV_TOL)
            worst = max(worst, abs(float(lhs[s]) - float(rhs[s])))
    return T.result(name, [f"max |joint KL − factor KL| = {worst:.3g}; masked and turn-taking "
                           "layouts included (0 where the agent is inactive)"], tightness=False)
