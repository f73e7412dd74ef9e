"""FactorizedMDP: construction, npz round trips of all three file forms, and every malformed
MDP file of issue 2 item 8 rejected with a one-line InputError naming the problem.

The cases live in ``tests/bad_files.py``, shared with ``tests/cli/test_cli_core.py``, which
feeds the same files to the CLI.
"""

import numpy as np
import pytest

from sat_theory import FactorizedMDP, InputError, TeamPolicy, evaluate, random_mdp
from sat_theory.errors import SUM_TOL
from tests.bad_files import (
    BAD_MDP_CASES,
    BAD_PATH_IDS,
    BASES,
    bad_paths,
    turn_arrays,
    write_bad_mdp,
)


def assert_one_line(msg: str):
    assert msg and "\n" not in msg and "Traceback" not in msg


@pytest.mark.parametrize("name,base,mutate,pattern", BAD_MDP_CASES, ids=[c[0] for c in BAD_MDP_CASES])
def test_bad_mdp_file(tmp_path, name, base, mutate, pattern):
    path = write_bad_mdp(tmp_path, base, mutate)
    with pytest.raises(InputError, match=pattern) as e:
        FactorizedMDP.load(path)
    assert_one_line(str(e.value))


def test_every_base_file_is_valid(tmp_path):
    """The bad cases above differ from a file that loads: each error is caused by its mutation."""
    for base in BASES:
        path = tmp_path / f"{base}.npz"
        np.savez(path, **BASES[base]())
        mdp = FactorizedMDP.load(path)
        assert mdp.kind == ("factored" if base in ("factored", "masked") else "turn")
        assert mdp.is_sparse == (base == "sparse")




@pytest.mark.parametrize("which", BAD_PATH_IDS)
def test_unreadable_mdp_file(tmp_path, which):
    path, pattern = bad_paths(tmp_path)[which]
    with pytest.raises(InputError, match=pattern) as e:
        FactorizedMDP.load(path)
    assert_one_line(str(e.value))


# ------------------------------------------------------------ round trips
@pytest.mark.parametrize("layout,sparse", [("simultaneous", False), ("masked", False),
                                           ("turn", False), ("turn", True)])
def test_npz_round_trip(tmp_path, layout, sparse):
    mdp = random_mdp(9, 3, 2, layout=layout, sparse=sparse, successors=3 if sparse else None, seed=7)
    mdp.save(tmp_path / "m.npz")
    back = FactorizedMDP.load(tmp_path / "m.npz")
    assert (back.kind, back.is_sparse, back.action_counts) == (mdp.kind, mdp.is_sparse, mdp.action_counts)
    assert back.gamma == mdp.gamma
    np.testing.assert_array_equal(back.R, mdp.R)
    np.testing.assert_array_equal(back.rho0, mdp.rho0)
    np.testing.assert_array_equal(back.active, mdp.active)
    if sparse:
        np.testing.assert_array_equal(back.P.toarray(), mdp.P.toarray())
    else:
        np.testing.assert_array_equal(back.P, mdp.P)
    if layout == "turn":
        np.testing.assert_array_equal(back.turn, mdp.turn)
    pol = TeamPolicy.random(mdp, 1)
    pol.save(tmp_path / "p.npz")
    pol2 = TeamPolicy.load(tmp_path / "p.npz", back)
    np.testing.assert_array_equal(evaluate(back, pol2).V, evaluate(mdp, pol).V)


def test_save_is_atomic_and_leaves_no_temp(tmp_path):
    mdp = random_mdp(3, 2, 2, seed=0)
    mdp.save(tmp_path / "m.npz")
    mdp.save(tmp_path / "m.npz")  # overwrite
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.npz"]


def test_float32_file_within_tolerance_is_renormalised(tmp_path):
    """Rows that sum to 1 within SUM_TOL (e.g. written in float32) load, renormalised."""
    a = turn_arrays()
    a["P"] = a["P"].astype(np.float32)
    np.savez(tmp_path / "f32.npz", **a)
    mdp = FactorizedMDP.load(tmp_path / "f32.npz")
    assert np.abs(mdp.P.sum(-1) - 1).max() < 1e-15
    assert SUM_TOL == 1e-6  # documented tolerance (errors.py); change the docs with it


# --------------------------------------------------------- constructors
def test_conversions_preserve_the_mdp():
    mdp = random_mdp(8, 2, 3, layout="turn", sparse=True, successors=2, seed=1)
    dense = mdp.to_dense()
    assert not dense.is_sparse and dense.to_dense() is dense
    np.testing.assert_array_equal(dense.to_sparse().P.toarray(), mdp.P.toarray())
    assert mdp.to_sparse() is mdp
    np.testing.assert_array_equal(dense.P_rows(), mdp.P.toarray())


def test_masked_admissible_and_slots():
    mdp = random_mdp(6, 3, 2, layout="masked", seed=4)
    acts = mdp.slot_actions
    assert acts.shape == (8, 3)
    np.testing.assert_array_equal(acts[5], [1, 0, 1])  # C-order ravel of (a1, a2, a3)
    for s in range(6):
        for k in range(8):
            want = all(mdp.active[s, j] or acts[k, j] == 0 for j in range(3))
            assert mdp.admissible[s, k] == want


def test_turn_taking_active_and_describe():
    mdp = random_mdp(7, 3, 2, layout="turn", seed=0)
    np.testing.assert_array_equal(mdp.active.sum(1), np.ones(7))
    np.testing.assert_array_equal(np.argmax(mdp.active, 1), mdp.turn)
    assert mdp.admissible.all()
    assert "turn-taking" in mdp.describe()
    with pytest.raises(AttributeError):
        mdp.slot_actions  # noqa: B018


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(layout="diagonal"), "unknown layout"),
    (dict(layout="simultaneous", sparse=True), "sparse random MDPs are turn-taking only"),
    (dict(layout="turn", n_actions=(2, 3)), "same number of actions"),
])
def test_random_mdp_bad_arguments(kwargs, pattern):
    args = dict(n_actions=2) | kwargs
    with pytest.raises(InputError, match=pattern):
        random_mdp(4, 2, **args)


# ------------------------------------------------ large members read directly
def test_large_member_direct_read_round_trip(tmp_path):
    """P above 1 MB takes the direct-read path of the loader: bit-exact, Fortran order too."""
    mdp = random_mdp(200, 2, 4, layout="turn", seed=1)  # P is 200*4*200*8 B = 1.28 MB
    mdp.save(tmp_path / "m.npz")
    back = FactorizedMDP.load(tmp_path / "m.npz")
    np.testing.assert_array_equal(back.P, mdp.P)
    a = dict(P=np.asfortranarray(mdp.P), R=mdp.R, turn=mdp.turn, n_agents=2, rho0=mdp.rho0,
             gamma=mdp.gamma)
    np.savez(tmp_path / "f.npz", **a)
    np.testing.assert_array_equal(FactorizedMDP.load(tmp_path / "f.npz").P, mdp.P)
    raw = (tmp_path / "m.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match="cannot read MDP file"):
        FactorizedMDP.load(tmp_path / "cut.npz")


def test_copy_false_keeps_valid_arrays_copy_true_does_not():
    mdp = random_mdp(5, 2, 2, layout="turn", seed=0)
    P = mdp.P.copy()
    kept = FactorizedMDP.turn_taking(P, mdp.R, mdp.turn, 2, mdp.rho0, 0.9, copy=False)
    fresh = FactorizedMDP.turn_taking(P, mdp.R, mdp.turn, 2, mdp.rho0, 0.9)
    assert np.shares_memory(kept.P, P) and not np.shares_memory(fresh.P, P)


def test_sparse_P_with_duplicate_entries_is_summed_without_touching_the_callers_matrix():
    """A CSR ``P`` with repeated (row, column) entries means their sum; canonicalising it must
    not rewrite the caller's arrays (csr_matrix(P) shares them)."""
    import scipy.sparse as sp

    data = np.array([0.5, 0.5, 1.0, 1.0, 1.0])
    indices = np.array([1, 1, 0, 1, 0])
    indptr = np.array([0, 2, 3, 4, 5])
    P = sp.csr_matrix((data, indices, indptr), shape=(4, 2))  # rows s·A + a, S = A = 2
    kept = [a.copy() for a in (P.data, P.indices, P.indptr)]
    mdp = FactorizedMDP.turn_taking(P, np.zeros((2, 2)), np.zeros(2, dtype=int), 1,
                                    np.array([0.5, 0.5]), 0.9)
    for a, b in zip((P.data, P.indices, P.indptr), kept, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(mdp.P.toarray(), [[0, 1], [1, 0], [0, 1], [1, 0]])
