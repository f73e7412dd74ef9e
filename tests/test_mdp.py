"""FactorizedMDP: construction, npz round trips of all three file forms, and every malformed
MDP file of issue 2 item 8 rejected with a one-line InputError naming the problem.

``BAD_MDP_CASES`` is shared with ``test_cli_core.py``, which feeds the same files to the CLI.
"""

import numpy as np
import pytest

from sat_theory import FactorizedMDP, InputError, TeamPolicy, evaluate, random_mdp
from sat_theory.errors import SUM_TOL


# ------------------------------------------------------------- valid files
def factored_arrays(masked=False):
    mdp = random_mdp(4, 2, (2, 3), layout="masked" if masked else "simultaneous", seed=1)
    S = mdp.n_states
    return dict(P=mdp.P.reshape(S, 2, 3, S), R=mdp.R.reshape(S, 2, 3), rho0=mdp.rho0,
                gamma=np.float64(0.9), active=mdp.active)


def turn_arrays():
    mdp = random_mdp(5, 3, 2, layout="turn", seed=2)
    return dict(P=mdp.P, R=mdp.R, turn=mdp.turn, n_agents=np.int64(3), rho0=mdp.rho0,
                gamma=np.float64(0.9))


def sparse_arrays():
    mdp = random_mdp(6, 2, 3, layout="turn", sparse=True, successors=2, seed=3)
    return dict(P_data=mdp.P.data, P_indices=mdp.P.indices, P_indptr=mdp.P.indptr, R=mdp.R,
                turn=mdp.turn, n_agents=np.int64(2), rho0=mdp.rho0, gamma=np.float64(0.9))


BASES = {"factored": factored_arrays, "masked": lambda: factored_arrays(True),
         "turn": turn_arrays, "sparse": sparse_arrays}


def _set(key, fn):
    def mutate(a):
        a[key] = fn(a)
    return mutate


def _drop(key):
    def mutate(a):
        del a[key]
    return mutate


def _scale_first_row(a):
    P = a["P"].copy()
    P.reshape(-1, P.shape[-1])[0] *= 1.1
    a["P"] = P


def _negative_P(a):
    P = a["P"].copy()
    flat = P.reshape(-1, P.shape[-1])
    flat[0, 1] += flat[0, 0] + 0.25  # the row still sums to 1
    flat[0, 0] = -0.25
    a["P"] = P


def _poke(key, value, index=0):
    def mutate(a):
        x = np.array(a[key], dtype=np.float64)
        x.reshape(-1)[index] = value
        a[key] = x
    return mutate


def _depends_on_inactive(what):
    def mutate(a):
        act = a["active"]
        s, j = map(int, np.argwhere(~act)[0])  # a state where agent j is inactive
        X = a[what].copy()
        sl = [s] + [slice(None)] * (X.ndim - 1)
        sl[1 + j] = 1  # agent j's action 1 now matters there
        if what == "P":
            S = X.shape[-1]
            X[tuple(sl)] = np.roll(X[tuple(sl)], 1, axis=-1) if S > 1 else X[tuple(sl)]
        else:
            X[tuple(sl)] += 1.0
        a[what] = X
    return mutate


def _no_active_agent(a):
    act = a["active"].copy()
    act[0] = False
    a["active"] = act


def _sparse_row_sum(a):
    d = a["P_data"].copy()
    d[0] *= 3.0
    a["P_data"] = d


def _sparse_bad_index(a):
    idx = a["P_indices"].copy()
    idx[0] = 10_000
    a["P_indices"] = idx


# (id, base, mutation, regex the one-line message must match)
BAD_MDP_CASES = [
    ("P-row-sum", "factored", _scale_first_row, r"P .*sum to 1"),
    ("P-row-sum-turn", "turn", _scale_first_row, r"P .*sum to 1"),
    ("P-row-sum-sparse", "sparse", _sparse_row_sum, r"P row 0 sums to"),
    ("P-negative", "factored", _negative_P, r"negative"),
    ("P-negative-turn", "turn", _negative_P, r"negative"),
    ("P-nan", "factored", _poke("P", np.nan), r"NaN"),
    ("P-nan-sparse", "sparse", _poke("P_data", np.nan), r"NaN"),
    ("R-nan", "turn", _poke("R", np.nan), r"R contains NaN"),
    ("R-inf", "factored", _poke("R", np.inf), r"R contains NaN or infinite"),
    ("rho0-sum", "turn", _set("rho0", lambda a: a["rho0"] * 2), r"rho0 .*sum to 1"),
    ("rho0-negative", "factored", _set("rho0", lambda a: np.r_[-0.5, 1.5, np.zeros(len(a["rho0"]) - 2)]),
     r"rho0 has a negative"),
    ("rho0-nan", "sparse", _poke("rho0", np.nan), r"rho0 contains NaN"),
    ("rho0-shape", "factored", _set("rho0", lambda a: np.r_[a["rho0"][:-1] * 0, 1.0][1:]),
     r"rho0 .*shape"),
    ("gamma-0", "factored", _set("gamma", lambda a: np.float64(0.0)), r"gamma must lie in \(0, 1\)"),
    ("gamma-1", "turn", _set("gamma", lambda a: np.float64(1.0)), r"gamma must lie in \(0, 1\)"),
    ("gamma-big", "sparse", _set("gamma", lambda a: np.float64(1.5)), r"gamma must lie in \(0, 1\)"),
    ("gamma-negative", "factored", _set("gamma", lambda a: np.float64(-0.1)), r"gamma"),
    ("gamma-nan", "turn", _set("gamma", lambda a: np.float64(np.nan)), r"gamma"),
    ("gamma-vector", "turn", _set("gamma", lambda a: np.array([0.9, 0.9])), r"gamma must be a number"),
    ("P-shape-last-axis", "factored", _set("P", lambda a: a["P"][..., :-1]), r"P has shape"),
    ("R-shape", "factored", _set("R", lambda a: a["R"][:, :1]), r"R has shape"),
    ("P-shape-turn", "turn", _set("P", lambda a: a["P"][:, :1]), r"P has shape"),
    ("R-shape-turn", "turn", _set("R", lambda a: a["R"][None]), r"R must have shape"),
    ("P-ndim", "factored", _set("P", lambda a: a["P"][0, 0, 0]), r"P must have shape"),
    ("turn-shape", "turn", _set("turn", lambda a: a["turn"][:-1]), r"turn has shape"),
    ("active-shape", "masked", _set("active", lambda a: a["active"][:, :1]), r"active has shape"),
    ("missing-P", "factored", _drop("P"), r"missing key\(s\) P"),
    ("missing-R", "turn", _drop("R"), r"missing key\(s\) R"),
    ("missing-rho0", "factored", _drop("rho0"), r"missing key\(s\) rho0"),
    ("missing-gamma", "sparse", _drop("gamma"), r"missing key\(s\) gamma"),
    ("missing-n_agents", "turn", _drop("n_agents"), r"missing key\(s\) n_agents"),
    ("missing-indptr", "sparse", _drop("P_indptr"), r"missing key\(s\) P_indptr"),
    ("turn-too-big", "turn", _set("turn", lambda a: np.r_[3, a["turn"][1:]]),
     r"turn\[0\] = 3 is not an agent index"),
    ("turn-negative", "sparse", _set("turn", lambda a: np.r_[a["turn"][:-1], -1]),
     r"is not an agent index"),
    ("turn-not-integer", "turn", _set("turn", lambda a: a["turn"] + 0.5), r"turn .*must hold integers"),
    ("n_agents-zero", "turn", _set("n_agents", lambda a: np.int64(0)), r"n_agents must be >= 1"),
    ("csr-index-out-of-range", "sparse", _sparse_bad_index, r"malformed CSR"),
    ("masked-P-depends-on-inactive", "masked", _depends_on_inactive("P"),
     r"depends on the action of agent \d where it is inactive"),
    ("masked-R-depends-on-inactive", "masked", _depends_on_inactive("R"),
     r"depends on the action of agent \d where it is inactive"),
    ("active-empty-state", "masked", _no_active_agent, r"state 0 has no active agent"),
    ("active-not-boolean", "masked", _set("active", lambda a: a["active"] * 2), r"active must be boolean"),
    # dtypes numpy would convert silently or fail on with an unrelated message
    ("P-strings", "turn", _set("P", lambda a: a["P"].astype(str)), r"P must hold real numbers"),
    ("R-strings", "factored", _set("R", lambda a: np.full(a["R"].shape, "x")), r"R must hold real numbers"),
    ("P-complex", "factored", _set("P", lambda a: a["P"].astype(complex)), r"P must hold real numbers"),
    ("gamma-string", "turn", _set("gamma", lambda a: np.array("0.9")), r"gamma"),
    ("rho0-strings", "sparse", _set("rho0", lambda a: a["rho0"].astype(str)), r"rho0 must hold real numbers"),
    ("turn-strings", "turn", _set("turn", lambda a: a["turn"].astype(str)), r"turn .*must hold integers"),
    ("n_agents-fraction", "turn", _set("n_agents", lambda a: np.float64(2.5)), r"n_agents must hold integers"),
    ("indptr-float", "sparse", _set("P_indptr", lambda a: a["P_indptr"] + 0.5), r"P_indptr must hold integers"),
    ("indices-float", "sparse", _set("P_indices", lambda a: a["P_indices"] * 1.0 + 0.25), r"P_indices must hold integers"),
    ("indptr-short", "sparse", _set("P_indptr", lambda a: a["P_indptr"][:-1]), r"malformed CSR"),
    ("no-states", "turn", lambda a: a.update(P=np.zeros((0, 2, 0)), R=np.zeros((0, 2)),
                                             turn=np.zeros(0, int), rho0=np.zeros(0)), r"no states"),
    ("no-states-factored", "factored", lambda a: a.update(P=np.zeros((0, 2, 3, 0)), R=np.zeros((0, 2, 3)),
                                                          rho0=np.zeros(0), active=np.zeros((0, 2), bool)),
     r"no states"),
]


def write_bad_mdp(tmp_path, base, mutate):
    arrays = BASES[base]()
    mutate(arrays)
    path = tmp_path / f"bad_{base}.npz"
    np.savez(path, **arrays)
    return path


def policy_for(tmp_path, base):
    """A valid uniform policy file for the (unmutated) base MDP ``base``."""
    a = BASES[base]()
    S = a["R"].shape[0]
    if base in ("factored", "masked"):
        counts = a["R"].shape[1:]
    else:
        counts = (a["R"].shape[1],) * int(a["n_agents"])
    path = tmp_path / f"pol_{base}.npz"
    np.savez(path, **{f"pi_{j}": np.full((S, c), 1.0 / c) for j, c in enumerate(counts)})
    return path


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


# ------------------------------------------------------- unreadable files
def bad_paths(tmp_path):
    text = tmp_path / "notes.npz"
    text.write_text("this is not an npz archive\n")
    npy = tmp_path / "array.npy"
    np.save(npy, np.ones((2, 2)))
    npy_named_npz = tmp_path / "array_as.npz"
    npy_named_npz.write_bytes(npy.read_bytes())
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    good = tmp_path / "good.npz"
    np.savez(good, **turn_arrays())
    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    return {
        "missing": (tmp_path / "nope.npz", r"not found"),
        "directory": (tmp_path, r"directory"),
        "text": (text, r"cannot read .* as \.npz"),
        "npy": (npy, r"bare \.npy array|cannot read"),
        "npy-named-npz": (npy_named_npz, r"bare \.npy array|cannot read"),
        "empty": (empty, r"cannot read"),
        "truncated": (truncated, r"cannot read"),
    }


BAD_PATH_IDS = ["missing", "directory", "text", "npy", "npy-named-npz", "empty", "truncated"]


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
