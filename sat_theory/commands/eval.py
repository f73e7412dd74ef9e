"""``sat eval MDP.npz --policy POL.npz [--json]``: exact J, V and d of a team policy."""

from __future__ import annotations

import numpy as np

from ..evaluate import evaluate
from ..fileio import dumps
from ..mdp import FactorizedMDP
from ..policy import TeamPolicy


def add_arguments(p):
    p.add_argument("mdp", help="MDP .npz file (factored, turn-taking or sparse turn-taking form)")
    p.add_argument("--policy", required=True, help="policy .npz with keys pi_0 ... pi_{n-1}")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run(args) -> int:
    mdp = FactorizedMDP.load(args.mdp)
    pi = TeamPolicy.load(args.policy, mdp)
    ev = evaluate(mdp, pi)
    if args.json:
        print(dumps({"J": ev.J, "V": ev.V, "d": ev.d}))
        return 0
    print(mdp.describe())
    print(f"J = {ev.J:.12g}")
    S = mdp.n_states
    shown = range(S) if S <= 20 else list(range(10)) + list(range(S - 5, S))
    print(f"{'state':>7}  {'V':>14}  {'d':>12}")
    for i, s in enumerate(shown):
        if S > 20 and i == 10:
            print(f"{'...':>7}")
        print(f"{s:>7}  {ev.V[s]:>14.8g}  {ev.d[s]:>12.6g}")
    print(f"sum(d) = {np.sum(ev.d):.12g}")
    return 0
