"""Find, verify and save the naive-reuse counterexample (SAT §1; TeamTR Prop 3.3).

Naive sequential updates that each improve their stale-occupancy surrogate (``L_i^stale > 0``
for every step) lower ``J``, while intermediate-occupancy updates with the same per-step
max-KL radii do not. The search (:func:`sat_theory.verify.naive_reuse.find_naive_reuse`) is
seeded; the result is written to ``sat_theory/data/naive_reuse.npz`` (loadable as
``named_mdp("naive_reuse")`` and by :func:`sat_theory.verify.naive_reuse.load_naive_reuse`) and its
exact facts to ``experiments/counterexamples/naive_reuse.json``.

Run: ``python experiments/counterexamples/naive_reuse.py [--seed 0] [--tries 2000]``.
"""

from __future__ import annotations

import argparse
import json
import os

from sat_theory.fileio import dumps
from sat_theory.verify.naive_reuse import find_naive_reuse, naive_reuse_path, save_naive_reuse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="search seed")
    ap.add_argument("--tries", type=int, default=2000, help="random-search candidates")
    args = ap.parse_args(argv)
    found = find_naive_reuse(args.seed, tries=args.tries)
    if found is None:
        print("no counterexample found")
        return 1
    mdp, cur, naive, seq, order, facts = found
    save_naive_reuse(naive_reuse_path(), mdp, cur, naive, seq, order)
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "naive_reuse.json")
    with open(out, "w") as fh:
        fh.write(json.dumps(json.loads(dumps(dict(mdp=mdp.describe(), order=list(order),
                                                  seed=args.seed, tries=args.tries, **facts))),
                            indent=1) + "\n")
    print(mdp.describe(), "order", order)
    for k, v in facts.items():
        print(f"  {k}: {v}")
    print("saved", naive_reuse_path(), "and", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
