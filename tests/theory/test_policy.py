"""TeamPolicy: construction, joint form, divergences (THEORY §3), the factor lemma, and every
malformed policy file rejected with a one-line InputError.

``BAD_POLICY_CASES`` (``tests/bad_files.py``) is shared with ``tests/cli/test_cli_core.py``.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sat_theory import (
    InputError,
    TeamPolicy,
    evaluate,
    expected_advantage,
    factor_kl,
    factor_tv,
    joint_kl,
    joint_policy,
    joint_tv,
    kl_rows,
    marginal_advantage,
    random_mdp,
    tv_rows,
)
from sat_theory.policy import effective_factor
from tests.bad_files import BAD_POLICY_CASES, good_policy_arrays, policy_mdp


@pytest.mark.parametrize("name,mutate,pattern", BAD_POLICY_CASES, ids=[c[0] for c in BAD_POLICY_CASES])
def test_bad_policy_file(tmp_path, name, mutate, pattern):
    arrays = good_policy_arrays()
    mutate(arrays)
    np.savez(tmp_path / "pol.npz", **arrays)
    with pytest.raises(InputError, match=pattern) as e:
        TeamPolicy.load(tmp_path / "pol.npz", policy_mdp())
    assert "\n" not in str(e.value)


def test_missing_and_non_npz_policy_files(tmp_path):
    mdp = policy_mdp()
    with pytest.raises(InputError, match="not found"):
        TeamPolicy.load(tmp_path / "nope.npz", mdp)
    (tmp_path / "t.npz").write_text("hello")
    with pytest.raises(InputError, match="cannot read policy file"):
        TeamPolicy.load(tmp_path / "t.npz", mdp)
    np.save(tmp_path / "a.npy", np.ones(3))
    with pytest.raises(InputError, match="policy"):
        TeamPolicy.load(tmp_path / "a.npy", mdp)


def test_inactive_rows_are_ignored(tmp_path):
    """Rows where an agent does not act may hold anything, even NaN (issue 2 item 4)."""
    mdp = policy_mdp()
    arrays = good_policy_arrays()
    junk = np.array(arrays["pi_0"])
    junk[mdp.turn != 0] = np.nan
    arrays["pi_0"] = junk
    np.savez(tmp_path / "p.npz", **arrays)
    pol = TeamPolicy.load(tmp_path / "p.npz", mdp)
    ref = TeamPolicy.load(tmp_path / "p.npz", mdp)
    np.testing.assert_array_equal(pol.factors[0][mdp.turn != 0], [[1.0, 0.0]] * int((mdp.turn != 0).sum()))
    assert np.isfinite(evaluate(mdp, pol).J) and evaluate(mdp, pol).J == evaluate(mdp, ref).J


def test_from_factors_count():
    mdp = policy_mdp()
    with pytest.raises(InputError, match="2 factors, the MDP has 3 agents"):
        TeamPolicy.from_factors(TeamPolicy.uniform(mdp).factors[:2], mdp)


# ------------------------------------------------------------- joint form
def test_joint_policy_factored_is_outer_product():
    mdp = random_mdp(4, 3, (2, 3, 2), seed=1)
    pol = TeamPolicy.random(mdp, 5)
    pi = joint_policy(mdp, pol)
    f0, f1, f2 = pol.factors
    want = np.einsum("sa,sb,sc->sabc", f0, f1, f2).reshape(4, -1)
    np.testing.assert_allclose(pi, want, rtol=1e-15)
    np.testing.assert_allclose(pi.sum(1), 1.0, rtol=1e-14)


def test_joint_policy_masked_puts_mass_on_admissible_slots_only():
    mdp = random_mdp(10, 3, 2, layout="masked", seed=3)
    pi = joint_policy(mdp, TeamPolicy.random(mdp, 0))
    assert np.all(pi[~mdp.admissible] == 0)
    np.testing.assert_allclose(pi.sum(1), 1.0, rtol=1e-14)


def test_joint_policy_turn_is_acting_factor():
    mdp = policy_mdp()
    pol = TeamPolicy.random(mdp, 0)
    pi = joint_policy(mdp, pol)
    for s in range(mdp.n_states):
        np.testing.assert_array_equal(pi[s], pol.factors[mdp.turn[s]][s])


def test_logits_round_trip():
    mdp = random_mdp(4, 2, 3, seed=0)
    pol = TeamPolicy.random(mdp, 1, temperature=2.0)
    back = TeamPolicy.from_logits(pol.logits)
    for a, b in zip(pol.factors, back.factors, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-14)
    uni = TeamPolicy.random(mdp, 1, temperature=0.0)
    np.testing.assert_allclose(uni.factors[0], 1 / 3)


# ------------------------------------------------------------- divergences
probs = st.integers(2, 5).flatmap(lambda A: st.tuples(
    st.lists(st.floats(0.01, 1.0), min_size=A, max_size=A),
    st.lists(st.floats(0.01, 1.0), min_size=A, max_size=A)))


@given(probs)
def test_kl_tv_pinsker(pq):
    p, q = (np.array(x) / np.sum(x) for x in pq)
    kl, tv = kl_rows(p, q), tv_rows(p, q)
    assert kl >= -1e-15 and 0 <= tv <= 1
    assert tv <= np.sqrt(kl / 2) + 1e-12  # Pinsker (THEORY §3)
    assert abs(kl_rows(p, p)) < 1e-15


def test_kl_conventions():
    """0 log 0 = 0; +∞ where q = 0 < p (THEORY §3)."""
    assert kl_rows(np.array([0.0, 1.0]), np.array([0.5, 0.5])) == pytest.approx(np.log(2))
    assert kl_rows(np.array([0.5, 0.5]), np.array([0.0, 1.0])) == np.inf


@pytest.mark.parametrize("layout", ["simultaneous", "masked", "turn"])
def test_factor_lemma(layout):
    """π and π' differing only in agent j's factor: KL_s(π‖π') = KL_s(π^j‖π'^j) where j is
    active, 0 elsewhere (TeamTR Lemma 3.1); the same for TV."""
    mdp = random_mdp(12, 3, 2, layout=layout, seed=8)
    pol, other = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    for j in range(3):
        pol2 = pol.with_factor(j, other.factors[j])
        np.testing.assert_allclose(joint_kl(mdp, pol, pol2),
                                   factor_kl(mdp, pol.factors[j], other.factors[j], j), atol=1e-13)
        np.testing.assert_allclose(joint_tv(mdp, pol, pol2),
                                   factor_tv(mdp, pol.factors[j], other.factors[j], j), atol=1e-13)


@pytest.mark.parametrize("layout", ["simultaneous", "masked", "turn"])
def test_marginal_advantage(layout):
    """Σ_{a_j} π'^j(a_j|s) A_j(s,a_j) = E_{a∼π̂'} A(s,a) with π̂' = π with agent j's factor
    replaced; and E_{a_j∼π^j} A_j = 0 for π's own advantage."""
    mdp = random_mdp(9, 3, 2, layout=layout, seed=6)
    pol, other = TeamPolicy.random(mdp, 0), TeamPolicy.random(mdp, 1)
    A = evaluate(mdp, pol).A
    for j in range(3):
        Aj = marginal_advantage(mdp, pol, A, j)
        assert Aj.shape == (9, 2)
        new = pol.with_factor(j, other.factors[j])
        want = expected_advantage(joint_policy(mdp, new), A)
        got = np.einsum("sa,sa->s", effective_factor(mdp, new, j), Aj)
        np.testing.assert_allclose(got, want, atol=1e-12)
        own = np.einsum("sa,sa->s", effective_factor(mdp, pol, j), Aj)
        np.testing.assert_allclose(own, 0.0, atol=1e-12)
