"""Stage-0 alignment: TeamTR distillation and SAT's geometric projection (THEORY §5)."""

import numpy as np
import pytest
from scipy.optimize import minimize

from sat_theory.errors import InputError
from sat_theory.policy import kl_rows
from sat_theory.stage0 import (
    align_distill,
    geometric_path,
    probe_distribution,
    probe_kl,
    project_geometric,
)


def _factors(seed, S=5, A=4, n=3):
    rng = np.random.default_rng(seed)
    return [rng.dirichlet(np.ones(A), size=S) for _ in range(n)], rng.dirichlet(np.ones(S))


@pytest.mark.parametrize("seed", range(4))
def test_distill_stops_at_first_step_below_delta(seed):
    (old, init, _), nu = _factors(seed)
    delta = 0.01
    new, tr = align_distill(old, init, nu, delta)
    assert tr.converged and tr.steps == len(tr.kl) - 1
    assert tr.kl[-1] <= delta < tr.kl[-2]  # early stop: not one step later
    assert np.all(np.diff(tr.kl) < 0)  # lr = 1/ν_max is below 2/L: monotone descent
    assert probe_kl(old, new, nu) == pytest.approx(tr.kl[-1], rel=1e-12)


@pytest.mark.parametrize("old0,init0", [
    (6.8e-4, 5.8e-249),  # sat verify --seed 3: fixed steps were at 29 δ after 1e5 steps
    (1.25e-4, 1.5e-323),  # --seed 16: a subnormal init; softmax did not move under the steps
    (1e-3, 1e-100), (0.3, 1e-300)])
def test_distill_converges_from_a_near_deterministic_new_model(old0, init0):
    """Two actions, the new model all but certain of the one the old factor rarely leaves:
    the gradient is ~old0 per step against a logit gap of up to 744; the adaptive steps
    reach δ in few steps, decreasing D at every one, and stop on the boundary."""
    old = np.array([[old0, 1 - old0], [0.5, 0.5]])
    init = np.array([[init0, 1 - init0], [0.4, 0.6]])
    nu = np.array([0.7, 0.3])
    delta = 0.01
    new, tr = align_distill(old, init, nu, delta)
    assert tr.converged and tr.steps < 200, tr.steps
    assert np.all(np.diff(tr.kl) < 0)
    assert tr.kl[-1] == pytest.approx(delta, rel=1e-9)  # the crossing step cut back to δ
    assert probe_kl(old, new, nu) == pytest.approx(tr.kl[-1], rel=1e-9)


def test_distill_keeps_unprobed_rows_and_zero_steps_when_inside():
    (old, init, _), nu = _factors(7)
    nu[2] = 0.0
    new, tr = align_distill(old, init, nu, 0.001)
    np.testing.assert_allclose(new[2], init[2], rtol=1e-12)
    _, tr0 = align_distill(old, old, nu, 0.001)
    assert tr0.steps == 0 and tr0.kl[0] == pytest.approx(0.0, abs=1e-15)


def test_distill_rejects_bad_input():
    (old, init, _), nu = _factors(1)
    z = init.copy()
    z[0] = [1, 0, 0, 0]
    with pytest.raises(InputError):
        align_distill(old, z, nu, 0.01)
    with pytest.raises(InputError):
        align_distill(old, init, nu[:-1], 0.01)
    with pytest.raises(InputError):
        align_distill(old, init, nu, 0.0)


@pytest.mark.parametrize("seed", range(3))
def test_projection_is_the_constrained_optimum(seed):
    """Against a generic solver per state: min KL(π‖π_pre) s.t. KL(π‖π_cur) ≤ δ0."""
    (pre, cur, _), _ = _factors(seed, S=4, A=3)
    delta0 = 0.03
    res = project_geometric(pre, cur, delta0)
    for s in range(pre.shape[0]):
        def obj(z, s=s):
            p = np.exp(z - z.max())
            p /= p.sum()
            return kl_rows(p, pre[s])

        def con(z, s=s):
            p = np.exp(z - z.max())
            p /= p.sum()
            return delta0 - kl_rows(p, cur[s])

        best = minimize(obj, np.log(cur[s]), constraints=[{"type": "ineq", "fun": con}],
                        method="SLSQP", options={"ftol": 1e-13, "maxiter": 500})
        ours = kl_rows(res.pi[s], pre[s])
        assert res.kl_new_cur[s] <= delta0 + 1e-12
        assert ours <= best.fun + 1e-7


def test_projection_inside_ball_returns_pretrained_with_lambda_zero():
    (pre, _, _), _ = _factors(3)
    cur = 0.9 * pre + 0.1 / pre.shape[1]
    res = project_geometric(pre, cur, 10.0)
    np.testing.assert_allclose(res.pi, pre, rtol=1e-12)
    assert np.all(res.lam == 0)


def test_projection_active_constraint_and_closed_form():
    (pre, cur, _), _ = _factors(4)
    res = project_geometric(pre, cur, 0.02)
    np.testing.assert_allclose(res.kl_new_cur, 0.02, rtol=1e-8)
    lam = res.lam[:, None]
    closed = pre ** (1 / (1 + lam)) * cur ** (lam / (1 + lam))
    np.testing.assert_allclose(res.pi, closed / closed.sum(1, keepdims=True), rtol=1e-10)


def test_trust_region_variant_bounds_the_certificate_direction():
    (pre, cur, _), _ = _factors(5)
    res = project_geometric(pre, cur, 0.02, constraint="trust_region")
    assert np.all(res.kl_cur_new <= 0.02 + 1e-15)
    np.testing.assert_allclose(res.kl_cur_new, 0.02, rtol=1e-8)


def test_geometric_path_endpoints_and_zero_support():
    (pre, cur, _), _ = _factors(6)
    np.testing.assert_allclose(geometric_path(pre, cur, 0.0), cur, rtol=1e-12)
    np.testing.assert_allclose(geometric_path(pre, cur, 1.0), pre, rtol=1e-12)
    pre2 = pre.copy()
    pre2[:, 0] = 0
    pre2 /= pre2.sum(1, keepdims=True)
    assert np.all(geometric_path(pre2, cur, 0.5)[:, 0] == 0)
    # π_cur without support where π_pre has it: KL(π_t‖π_cur) finite only on the shared support
    res = project_geometric(cur, pre2, 0.05)
    assert np.all(np.isfinite(res.kl_new_cur)) and np.all(res.kl_new_cur <= 0.05 + 1e-15)


def test_probe_distribution_is_empirical_and_seeded():
    d = np.array([0.5, 0.3, 0.2])
    a, b = probe_distribution(d, 500, 0), probe_distribution(d, 500, 0)
    np.testing.assert_array_equal(a, b)
    assert a.sum() == pytest.approx(1.0) and np.all(a * 500 == np.round(a * 500))
