"""The iterative sparse path is scale-aware: large rewards and γ near 1 converge to the
direct sparse solve instead of failing an absolute 1e-10 residual."""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from sat_theory.envs import random_mdp
from sat_theory.evaluate import collapse, evaluate, residual_target
from sat_theory.policy import TeamPolicy, joint_policy


@pytest.mark.parametrize("scale,gamma", [(1.0, 0.9), (1e6, 0.9), (1e6, 0.9999), (1e-6, 0.9999)])
def test_large_rewards_and_gamma_near_one_match_a_direct_sparse_solve(scale, gamma):
    base = random_mdp(300, 2, 3, layout="turn", sparse=True, successors=4, gamma=gamma, seed=1)
    mdp = dataclasses.replace(base, R=base.R * scale)
    pol = TeamPolicy.random(mdp, 2)
    ev = evaluate(mdp, pol, method="krylov")
    P_pi, r_pi = collapse(mdp, joint_policy(mdp, pol))
    M = sp.identity(mdp.n_states, format="csc") - gamma * sp.csc_matrix(P_pi)
    V = spla.spsolve(M, r_pi)
    d = (1 - gamma) * spla.spsolve(M.T.tocsc(), mdp.rho0)
    assert np.abs(ev.V - V).max() <= 1e-8 * np.abs(V).max()
    assert np.abs(ev.d - d).sum() <= 1e-8
    # the residual reached is reported and inside the scale-aware target
    target = residual_target(1e-10, np.abs(r_pi).max(), np.abs(r_pi).max() / (1 - gamma), gamma)
    assert 0 <= ev.residual <= target


def test_target_is_relative_and_floored_at_roundoff():
    assert residual_target(1e-10, 1.0, 10.0, 0.9) == pytest.approx(1e-10)
    assert residual_target(1e-10, 1e6, 1e7, 0.9) == pytest.approx(1e-4)
    # γ = 0.9999, ‖V‖ = 1e10: the residual of float64 V cannot go below ~ε‖V‖
    floor = residual_target(1e-14, 1e6, 1e10, 0.9999)
    assert floor > 1e-14 * 1e6 and floor == pytest.approx(4 * 2.220446e-16 * (1e6 + 2e10))
