"""Search for the tightest single-step cases of the occupancy-shift penalty and save them.

For one agent, ``J(π') − J(π) ≥ L − c√δ`` (TeamTR Thm 3.4, expected KL; SAT Thm 4.2, max KL).
The share of the penalty a case actually needs, ``(L − ΔJ)/(c√δ)``, is maximized over
2-state MDPs (transitions, rewards, start distribution and both policies free) by
:func:`sat_theory.verify.stage_bounds.optimize_tight_case`. A share above 1/2 is a counterexample to
the bound with HALF the constant: the paper's ``c`` is within a factor 2 of sharp at small γ
(while at γ ≥ 0.8 the max-KL form provably survives halving; see single_step_bound_max_kl).

Saves ``sat_theory/data/tight_step_{expected,max}.npz`` (used by ``sat verify``'s
single-step and stage checks) and the shares found per γ to ``tight_single_step.json``.

Run: ``python experiments/counterexamples/tight_single_step.py [--seed 0] [--restarts 4]``.
"""

from __future__ import annotations

import argparse
import json
import os

from sat_theory.verify.saved import save_case
from sat_theory.verify.stage_bounds import optimize_tight_case, penalty_share, tight_case_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="search seed")
    ap.add_argument("--restarts", type=int, default=4, help="random starts per (γ, form)")
    ap.add_argument("--gammas", default="0.1,0.2,0.3,0.5,0.9,0.99", help="discounts to search")
    args = ap.parse_args(argv)
    table = []
    for form in ("expected", "max"):
        best = None
        for g in (float(x) for x in args.gammas.split(",")):
            c = optimize_tight_case(g, form, seed=args.seed, restarts=args.restarts)
            share = penalty_share(c.mdp, c.current, c.target, form)
            print(f"{form:8s} γ={g:<5g} max share of c√δ used: {share:.4f}")
            table.append(dict(form=form, gamma=g, share=share, halved_constant_fails=share > 0.5))
            if best is None or share > best[0]:
                best = (share, c)
        save_case(tight_case_path(form), best[1])
        print(f"saved {tight_case_path(form)} (share {best[0]:.4f})")
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tight_single_step.json")
    with open(out, "w") as fh:
        json.dump(dict(seed=args.seed, restarts=args.restarts, S=2, A=2, results=table), fh,
                  indent=1)
        fh.write("\n")
    print("saved", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
