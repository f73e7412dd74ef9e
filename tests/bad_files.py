"""Malformed MDP and policy files, shared by the API tests (tests/theory/test_mdp.py,
tests/theory/test_policy.py) and the CLI tests (tests/cli/test_cli_core.py), which feed the
same files to ``sat eval``/``sat certify``.

Each case is ``(id, base, mutation, regex)`` (policy cases: ``(id, mutation, regex)``): the
mutation edits the arrays of a valid file in place, and the one-line error must match the
regex; the unmutated bases load (``test_every_base_file_is_valid``).
"""

import numpy as np

from sat_theory import TeamPolicy, random_mdp


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


# ------------------------------------------------------------- policy files
def policy_mdp():
    """The MDP the bad policy files are checked against: turn-taking, S=5, n=3, A=2."""
    return random_mdp(5, 3, 2, layout="turn", seed=2)


def good_policy_arrays():
    mdp = policy_mdp()
    return {f"pi_{j}": f for j, f in enumerate(TeamPolicy.random(mdp, 0).factors)}


def _edit(key, fn):
    def mutate(a):
        a[key] = fn(np.array(a[key]))
    return mutate


def _at_active(fn):
    """Apply ``fn`` to row 0 of pi_0 at a state where agent 0 acts."""
    def mutate(a):
        s = int(np.flatnonzero(policy_mdp().turn == 0)[0])
        x = np.array(a["pi_0"])
        x[s] = fn(x[s])
        a["pi_0"] = x
    return mutate


BAD_POLICY_CASES = [
    ("row-sum", _at_active(lambda r: r * 1.5), r"pi_0 does not sum to 1"),
    ("negative", _at_active(lambda r: np.array([-0.2, 1.2])), r"pi_0 has a negative entry"),
    ("nan", _at_active(lambda r: np.array([np.nan, 1.0])), r"pi_0 contains NaN"),
    ("inf", _at_active(lambda r: np.array([np.inf, 0.0])), r"pi_0 contains NaN or infinite"),
    ("wrong-states", _edit("pi_1", lambda x: x[:-1]), r"pi_1 has shape \(4, 2\), expected \(5, 2\)"),
    ("wrong-actions", _edit("pi_2", lambda x: np.full((5, 3), 1 / 3)), r"pi_2 has shape"),
    ("missing-factor", _drop("pi_1"), r"missing key\(s\) pi_1"),
    ("extra-factor", lambda a: a.update(pi_3=a["pi_0"]), r"factor\(s\) pi_3 but the MDP has 3 agents"),
    ("strings", _edit("pi_1", lambda x: x.astype(str)), r"pi_1 must hold real numbers"),
    ("complex", _edit("pi_2", lambda x: x.astype(complex)), r"pi_2 must hold real numbers"),
]
