"""The Stage-0 / information-geometry / optimization checks of ``sat verify``
(sat_theory/verify/optimization.py), and the natural-gradient step they use.

Every check passes unmutated in quick mode and every declared mutation makes it report
violations. The natural step is tested against finite differences and a brute-force search.
"""

import math

import numpy as np
import pytest
from scipy.special import softmax

from sat_theory.verify import CHECKS, load_checks
from sat_theory.verify.optimization import B1_SQ, B2, natural_step

OPT_CHECKS = ["stage0_alignment", "information_geometric_gain", "oracle_envelope",
              "projected_gradient_convergence", "donsker_varadhan_envelope", "kl_allocation"]

load_checks()


@pytest.mark.parametrize("name", OPT_CHECKS)
def test_check_passes_unmutated(name):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=None)
    assert res.name == name and res.reference and res.section
    assert res.cases > 0 and res.violations == 0 and res.passed, res.findings[:2]
    assert res.findings


@pytest.mark.parametrize("name,mutation", [(n, m) for n in OPT_CHECKS for m in CHECKS[n].mutations])
def test_every_mutation_is_caught(name, mutation):
    res = CHECKS[name].fn(quick=True, seed=0, mutation=mutation)
    assert res.violations > 0 and not res.passed


def test_checks_are_deterministic():
    a = CHECKS["stage0_alignment"].fn(quick=True, seed=3, mutation=None)
    b = CHECKS["stage0_alignment"].fn(quick=True, seed=3, mutation=None)
    assert a.findings == b.findings and a.min_slack == b.min_slack


def _problem(seed, S=4, A=3):
    rng = np.random.default_rng(seed)
    pi = rng.dirichlet(np.ones(A), size=S)
    Aj = rng.normal(size=(S, A))
    Aj -= np.einsum("sa,sa->s", pi, Aj)[:, None]  # own advantage: centered under π
    d = rng.dirichlet(np.ones(S))
    active = np.array([True, True, False, True])[:S]
    return pi, Aj, d, active


def _L(theta, d, active, Aj, gamma):
    return float(np.einsum("s,sa,sa->", np.where(active, d, 0) / (1 - gamma), softmax(theta, axis=1), Aj))


def test_natural_step_gradient_matches_finite_differences():
    pi, Aj, d, active = _problem(0)
    st = natural_step(d, active, pi, Aj, 0.9, 0.01, 1e-3)
    th = np.log(pi)
    h = 1e-6
    fd = np.zeros_like(th)
    for idx in np.ndindex(th.shape):
        e = np.zeros_like(th)
        e[idx] = h
        fd[idx] = (_L(th + e, d, active, Aj, 0.9) - _L(th - e, d, active, Aj, 0.9)) / (2 * h)
    np.testing.assert_allclose(st["g"], fd, atol=1e-8)


def test_natural_step_maximizes_linear_gain_on_the_fisher_ellipsoid():
    pi, Aj, d, active = _problem(1)
    budget, eps = 0.02, 1e-3
    st = natural_step(d, active, pi, Aj, 0.8, budget, eps)
    assert st["quad"] == pytest.approx(budget, rel=1e-10)
    g = st["g"]
    assert float(np.sum(g * st["Delta"])) == pytest.approx(st["kappa"] * math.sqrt(budget), rel=1e-10)
    # Fisher = E_{s∼d, a∼π} ∇log π ∇log πᵀ, built from explicit score vectors
    S, A = pi.shape
    rng = np.random.default_rng(2)
    for _ in range(200):
        D = rng.normal(size=(S, A))
        quad = 0.0
        for s in range(S):
            if not active[s]:
                quad += 0.5 * eps * float(D[s] @ D[s])
                continue
            for a in range(A):
                score = np.eye(A)[a] - pi[s]
                quad += 0.5 * d[s] * pi[s, a] * float(score @ D[s]) ** 2
            quad += 0.5 * eps * float(D[s] @ D[s])
        D *= math.sqrt(budget / quad)
        assert float(np.sum(g * D)) <= st["kappa"] * math.sqrt(budget) * (1 + 1e-9)


def test_softmax_derivative_constants():
    """B_1² = sup ‖e_a − π‖² ≤ 2 and B_2 = sup λ_max(diag π − ππᵀ) ≤ ½ on random π."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = rng.dirichlet(np.full(int(rng.integers(2, 6)), rng.choice([0.1, 1.0])))
        assert max(float(np.sum((np.eye(p.size)[a] - p) ** 2)) for a in range(p.size)) <= B1_SQ
        assert np.linalg.eigvalsh(np.diag(p) - np.outer(p, p)).max() <= B2 + 1e-15


@pytest.mark.parametrize("layout", ["simultaneous", "masked", "turn"])
def test_natural_gradient_stage_agrees_with_the_stage_certificate(layout):
    """The surrogate gains and KL radii of the natural-gradient stage are the certificate's
    ``L_i^seq`` and ``δ_i`` for the resulting targets (an independent code path)."""
    from sat_theory.certificates import stage_certificate
    from sat_theory.envs import random_mdp
    from sat_theory.policy import TeamPolicy
    from sat_theory.verify.optimization import natural_gradient_stage

    mdp = random_mdp(5, 3, 2, layout=layout, gamma=0.9, seed=11)
    cur = TeamPolicy.random(mdp, 4)
    final, steps = natural_gradient_stage(mdp, cur, 0.05)
    cert = stage_certificate(mdp, cur, final, (0, 1, 2))
    for st, cs in zip(steps, cert.steps, strict=True):
        assert st["gain"] == pytest.approx(cs.L_seq, rel=1e-9, abs=1e-12)
        assert st["delta"] == pytest.approx(cs.delta, rel=1e-9, abs=1e-15)
        assert st["delta_max"] == pytest.approx(cs.delta_max, rel=1e-9, abs=1e-15)
