"""Certificate tightening is term-wise: an earlier agent's upgrade can lower the stage bound.

TeamTR Prop 3.9 (and SAT §4.3): "If an upgraded agent achieves a higher surrogate value within
the same radius ... then the lower bound in Theorem 3.6 does not decrease." The bound
``Σ L_i − c Σ √δ_i`` is monotone in each term, but upgrading agent ``σ(1)`` also changes the
intermediate policies that every later ``L_i^seq``, ``δ_i`` and ``A_max`` are computed under.
This script searches seeded random stages for the largest drop of the whole bound after an
upgrade of the first agent that raises ``L_1^seq`` at exactly the same ``δ_1``
(:func:`sat_theory.verify.plug_and_play.earlier_upgrade`), verifies it exactly and saves it to
``experiments/counterexamples/tightening_earlier_agent.npz`` (MDP arrays, ``cur_j``,
``tar_j``, ``upgraded_j``, ``order``) with its facts in ``tightening_earlier_agent.json``.

Run: ``python experiments/counterexamples/tightening_earlier_agent.py [--seed 0] [--count 300]``.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from sat_theory.verify.cases import cases
from sat_theory.verify.plug_and_play import earlier_upgrade
from sat_theory.verify.saved import save_case

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="case seed")
    ap.add_argument("--count", type=int, default=300, help="random stages to try")
    args = ap.parse_args(argv)
    rng = np.random.default_rng([args.seed, 31])
    best = None
    for c in cases(args.seed, args.count, kinds=("small",)):
        if c.n < 2:
            continue
        order = tuple(int(x) for x in rng.permutation(c.n))
        up = earlier_upgrade(c.mdp, c.current, c.target, order)
        if up is None:
            continue
        base, new, tar2 = up
        drop = (base.lower_bound - new.lower_bound) / max(abs(base.lower_bound), 1e-300)
        if drop > 0 and (best is None or drop > best[0]):
            best = (drop, c, order, base, new, tar2)
    if best is None:
        print("no drop found")
        return 1
    drop, c, order, base, new, tar2 = best
    extra = {f"upgraded_{j}": tar2.factors[j] for j in range(c.n)}
    save_case(os.path.join(HERE, "tightening_earlier_agent.npz"), c,
              {**extra, "order": np.asarray(order)})
    facts = dict(
        case=c.label, order=list(order), relative_drop=drop,
        before=dict(L=[s.L_seq for s in base.steps], delta=[s.delta for s in base.steps],
                    A_max=base.A_max, lower_bound=base.lower_bound,
                    true_improvement=base.true_improvement),
        after=dict(L=[s.L_seq for s in new.steps], delta=[s.delta for s in new.steps],
                   A_max=new.A_max, lower_bound=new.lower_bound,
                   true_improvement=new.true_improvement),
    )
    with open(os.path.join(HERE, "tightening_earlier_agent.json"), "w") as fh:
        json.dump(facts, fh, indent=1)
        fh.write("\n")
    print(json.dumps(facts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
