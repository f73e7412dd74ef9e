"""Exact counterexamples to three statements as the papers word them (THEORY §5–7).

1. SAT's finite-sample term ``A_max/(1−γ) √(log(2n/δ_conf)/(2N))`` is Hoeffding for a range of
   length ``B = A_max/(1−γ)``; the sampled surrogate ``A/(1−γ)`` spans ``[−B, B]``. On the sign
   bandit (one state, rewards ±1, uniform policy: ``A = ±1``) the deviation probability is
   computed exactly from the binomial law and exceeds ``δ_conf``.
2. SAT's Stage-0 projection bounds ``KL_s(π_new‖π_cur)``; the certificates need
   ``KL_s(π_cur‖π_new)``, which the projection can exceed.
3. TeamTR Lemma E.6 (``E_P|1 − Q/P| = 2TV``) is stated under "``P > 0 ⇒ Q > 0``" but needs
   ``Q ≪ P``.

Writes ``experiments/counterexamples/sat_constants.json``.
Run: ``python experiments/counterexamples/sat_constants.py``.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np

from sat_theory.fileio import dumps
from sat_theory.policy import kl_rows, tv_rows
from sat_theory.stage0 import project_geometric
from sat_theory.verify.estimators import sign_bandit_miss_probability


def main() -> int:
    delta_conf = 0.05
    hoeff = []
    for N in (10, 20, 100, 400, 1000, 10_000):
        sat = sign_bandit_miss_probability(N, math.sqrt(math.log(2 / delta_conf) / (2 * N)))
        tr = sign_bandit_miss_probability(N, math.sqrt(2 * math.log(2 / delta_conf) / N))
        hoeff.append(dict(N=N, miss_probability_sat_constant=sat, miss_probability_teamtr_constant=tr))
    pre = np.array([[0.83, 0.01, 0.16]])
    cur = np.array([[0.78, 0.09, 0.13]])
    proj = project_geometric(pre, cur, 0.05)
    P, Q = np.array([0.5, 0.5, 0.0]), np.array([0.4, 0.4, 0.2])
    facts = dict(
        sat_finite_sample_constant=dict(
            mdp="sign bandit: 1 state, 1 agent, R = (+1, -1), uniform policy, A = ±1, n = 1",
            delta_conf=delta_conf, table=hoeff,
            holds=all(h["miss_probability_sat_constant"] <= delta_conf for h in hoeff)),
        sat_projection_direction=dict(
            pi_pre=pre[0], pi_cur=cur[0], delta0=0.05, pi_new=proj.pi[0], lam=float(proj.lam[0]),
            kl_new_cur=float(proj.kl_new_cur[0]), kl_cur_new=float(proj.kl_cur_new[0])),
        lemma_e6_assumption=dict(
            P=P, Q=Q, lhs=float(P[:2] @ np.abs(1 - Q[:2] / P[:2])), two_tv=2 * float(tv_rows(P, Q)),
            kl_P_Q=float(kl_rows(P, Q))),
    )
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sat_constants.json")
    with open(out, "w") as fh:
        fh.write(json.dumps(json.loads(dumps(facts)), indent=1) + "\n")
    for h in hoeff:
        print(h)
    print("projection:", facts["sat_projection_direction"]["kl_new_cur"], facts["sat_projection_direction"]["kl_cur_new"])
    print("saved", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
