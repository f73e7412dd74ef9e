"""Finite discounted team MDPs with factorized (per-agent) actions (THEORY §1).

A team MDP has ``n`` agents with action sets ``A_j``, states ``S``, transitions
``P(s'|s,a)``, rewards ``R(s,a)``, discount ``gamma`` and start distribution ``rho0``, where
``a = (a_1..a_n)`` is the joint action. At each state a non-empty set ``active(s)`` of agents
acts; inactive agents take the no-op action ``0`` and ``P``/``R`` do not depend on it.

Internally every MDP is stored in *state/joint-action* form: ``K`` joint-action slots per
state, ``P`` of shape ``(S, K, S)`` (dense) or a CSR matrix of shape ``(S*K, S)`` (row
``s*K + k``), and ``R`` of shape ``(S, K)``. Two layouts of the slots exist:

- ``factored`` (simultaneous or masked): ``K = prod_j A_j`` and slot ``k`` is the C-order
  ravel of ``(a_1..a_n)``; slots with an inactive agent at a non-zero action are
  inadmissible (they get probability 0 under every team policy).
- ``turn`` (turn-taking, TeamTR §3.1): exactly one agent ``turn[s]`` acts at ``s``, every
  agent has ``A`` actions, ``K = A`` and slot ``k`` is the acting agent's action.

File formats (``.npz``), see :meth:`FactorizedMDP.load`:

- factored: ``P`` (S, A_1..A_n, S), ``R`` (S, A_1..A_n), ``rho0`` (S,), ``gamma``,
  optional ``active`` (S, n) bool;
- turn-taking: ``P`` (S, A, S), ``R`` (S, A), ``turn`` (S,) int, ``n_agents``, ``rho0``,
  ``gamma``;
- sparse turn-taking: as turn-taking with ``P`` given as CSR arrays ``P_data``,
  ``P_indices``, ``P_indptr`` of an ``(S*A, S)`` matrix.

Probability checks use the absolute tolerance :data:`sat_theory.errors.SUM_TOL`; rows that
pass are renormalised so that downstream sums are exact to machine precision.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.sparse as sp

from .errors import SUM_TOL, InputError

__all__ = ["FactorizedMDP", "check_distribution_rows"]

#: Rows already this close to summing to 1 (and non-negative) are kept as they are:
#: renormalising them again would only move entries by an ulp and break bit-exact round trips.
RENORM_TOL = 1e-12


def as_real(x, what: str) -> np.ndarray:
    """``x`` as a float64 array; :class:`InputError` unless it holds real numbers (bool, int or
    float: no strings, complex numbers or Python objects, which numpy would otherwise convert
    silently or fail on with an unrelated message)."""
    x = np.asarray(x)
    if x.dtype.kind not in "biuf":
        raise InputError(f"{what} must hold real numbers, got dtype {x.dtype}")
    return x.astype(np.float64, copy=False)


def _as_index(x, what: str) -> np.ndarray:
    """``x`` as an int64 array of integral values (integer dtype, or floats that are whole)."""
    x = np.asarray(x)
    if x.dtype.kind in "iu":
        return x  # kept as is: CSR index arrays stay int32 (half the memory at S=10⁶)
    if x.dtype.kind == "b":
        return x.astype(np.int64)
    if x.dtype.kind == "f" and np.all(np.isfinite(x)) and np.all(x == np.round(x)):
        return x.astype(np.int64)
    raise InputError(f"{what} must hold integers, got {x.dtype} values"
                     f"{'' if x.dtype.kind != 'f' else ' that are not whole numbers'}")


def check_distribution_rows(x: np.ndarray, what: str, axis: int = -1, *,
                            copy: bool = True) -> np.ndarray:
    """Validate that ``x`` holds probability vectors along ``axis``; return them renormalised.

    Raises :class:`InputError` naming ``what`` if an entry is NaN/inf or below ``-SUM_TOL``,
    or if a row sum differs from 1 by more than ``SUM_TOL``. Rows that pass are clipped at 0
    and divided by their sum, unless every entry is already ``>= 0`` and every row sum is
    within ``RENORM_TOL`` of 1: then ``x`` is returned unchanged (a copy unless
    ``copy=False``), so that a saved MDP or policy loads back bit for bit.
    """
    x = as_real(x, what)
    if x.size == 0:
        return x.copy() if copy else x
    # Two passes over x instead of one per check: NaN/inf propagate into the min and the sums.
    sums = x.sum(axis=axis, keepdims=True)
    lo = x.min()
    if not (np.isfinite(lo) and np.all(np.isfinite(sums))) and not np.all(np.isfinite(x)):
        raise InputError(f"{what} contains NaN or infinite entries")
    if lo < -SUM_TOL:
        idx = np.unravel_index(np.argmin(x), x.shape)
        raise InputError(f"{what} has a negative entry {x[idx]:.3g} at index {tuple(map(int, idx))}")
    dev = np.abs(sums - 1.0)
    if dev.max() > SUM_TOL:
        idx = np.unravel_index(np.argmax(dev), sums.shape)
        raise InputError(
            f"{what} does not sum to 1 along its last axis (sum {sums[idx]:.9g} at row "
            f"{tuple(int(i) for i, n in zip(idx, sums.shape, strict=True) if n > 1)}; tolerance {SUM_TOL:g})"
        )
    if lo >= 0.0 and dev.max() <= RENORM_TOL:
        return x.copy() if copy else x
    y = np.clip(x, 0.0, None)
    y /= y.sum(axis=axis, keepdims=True)
    return y


def _check_gamma(gamma) -> float:
    arr = np.asarray(gamma)
    if arr.dtype.kind not in "biuf" or arr.size != 1:
        raise InputError(f"gamma must be a number, got {gamma!r}")
    g = float(arr.reshape(()))
    if not (0.0 < g < 1.0):
        raise InputError(f"gamma must lie in (0, 1), got {g:g}")
    return g


def _check_finite(x: np.ndarray, what: str) -> np.ndarray:
    x = as_real(x, what)
    if not np.all(np.isfinite(x)):
        raise InputError(f"{what} contains NaN or infinite entries")
    return x


def _check_csr(P: sp.spmatrix, n_rows: int, n_states: int, what: str) -> sp.csr_matrix:
    P = sp.csr_matrix(P, dtype=np.float64)
    if P.shape != (n_rows, n_states):
        raise InputError(f"{what} has shape {P.shape}, expected {(n_rows, n_states)}")
    if not P.has_canonical_format:
        # sum_duplicates rewrites the index arrays in place, and csr_matrix(P) shares them
        # with the caller's matrix: canonicalise a copy, never the caller's P
        P = P.copy()
        P.sum_duplicates()
    if not np.all(np.isfinite(P.data)):
        raise InputError(f"{what} contains NaN or infinite entries")
    if P.data.size and P.data.min() < -SUM_TOL:
        raise InputError(f"{what} has a negative entry {P.data.min():.3g}")
    P.data = np.clip(P.data, 0.0, None)
    sums = np.asarray(P.sum(axis=1)).ravel()
    bad = np.flatnonzero(np.abs(sums - 1.0) > SUM_TOL)
    if bad.size:
        raise InputError(
            f"{what} row {int(bad[0])} sums to {sums[bad[0]]:.9g}, not 1 (tolerance {SUM_TOL:g})"
        )
    if np.abs(sums - 1.0).max(initial=0.0) <= RENORM_TOL:
        return P  # already normalised: keep bit-exact round trips
    P.data /= np.repeat(sums, np.diff(P.indptr))
    return P


def _factored_shape(P: np.ndarray, R: np.ndarray) -> tuple[int, tuple[int, ...]]:
    """``S`` and the action counts ``(A_1..A_n)`` of a factored ``P`` (S, A_1..A_n, S), with
    ``S ≥ 1``, every ``A_j ≥ 1`` and ``R`` of shape (S, A_1..A_n)."""
    if P.ndim < 3:
        raise InputError(f"P must have shape (S, A_1, ..., A_n, S), got ndim {P.ndim}")
    S = P.shape[0]
    if S == 0:
        raise InputError("the MDP has no states (P has shape with S = 0)")
    counts = tuple(int(a) for a in P.shape[1:-1])
    if P.shape[-1] != S:
        raise InputError(f"P has shape {P.shape}: first and last axes must both be S")
    if any(a < 1 for a in counts):
        raise InputError(f"every agent needs at least one action, got counts {counts}")
    if R.shape != P.shape[:-1]:
        raise InputError(f"R has shape {R.shape}, expected {P.shape[:-1]} (S, A_1, ..., A_n)")
    return S, counts


def _check_active(active, S: int, n: int) -> np.ndarray:
    """``active`` (S, n) as bool (default: every agent everywhere), each state's set non-empty."""
    if active is None:
        active = np.ones((S, n), dtype=bool)
    active = np.asarray(active)
    if active.shape != (S, n):
        raise InputError(f"active has shape {active.shape}, expected {(S, n)}")
    if active.dtype != bool:
        if not np.all(np.isin(active, (0, 1))):
            raise InputError("active must be boolean (0/1)")
        active = active.astype(bool)
    if not np.all(active.any(axis=1)):
        s = int(np.flatnonzero(~active.any(axis=1))[0])
        raise InputError(f"active: state {s} has no active agent")
    return active


def _check_no_op(P: np.ndarray, R: np.ndarray, active: np.ndarray) -> None:
    """Where agent ``j`` is inactive, ``P(·|s,a)`` and ``R(s,a)`` equal their ``a_j = 0`` values
    (to ``SUM_TOL``): an inactive agent's action must not matter."""
    for j in range(active.shape[1]):
        idle = ~active[:, j]
        if not idle.any():
            continue
        Pj = np.moveaxis(P[idle], 1 + j, 1)
        Rj = np.moveaxis(R[idle], 1 + j, 1)
        if np.abs(Pj - Pj[:, :1]).max() > SUM_TOL or np.abs(Rj - Rj[:, :1]).max() > SUM_TOL:
            s = int(np.flatnonzero(idle)[0])
            raise InputError(
                f"P or R depends on the action of agent {j} where it is inactive (e.g. state {s})"
            )


def _check_rho0(rho0, S: int) -> np.ndarray:
    """``ρ0`` as a probability vector over the ``S`` states."""
    rho0 = check_distribution_rows(rho0, "rho0")
    if rho0.shape != (S,):
        raise InputError(f"rho0 has shape {rho0.shape}, expected {(S,)}")
    return rho0


def _turn_shape(R: np.ndarray) -> tuple[int, int]:
    """``(S, A)`` of a turn-taking ``R`` (S, A), with ``S ≥ 1`` and ``A ≥ 1``."""
    if R.ndim != 2:
        raise InputError(f"R must have shape (S, A), got {R.shape}")
    S, A = R.shape
    if S == 0:
        raise InputError("the MDP has no states (R has shape with S = 0)")
    if A < 1:
        raise InputError("turn-taking MDP needs at least one action")
    return S, A


def _check_n_agents(n_agents, S: int) -> int:
    """``n ≥ 1`` agents whose per-agent tables fit the memory budget."""
    n_arr = np.asarray(n_agents)
    if n_arr.size != 1:
        raise InputError(f"n_agents must be an integer, got shape {n_arr.shape}")
    n = int(_as_index(n_arr.reshape(()), "n_agents"))
    if n < 1:
        raise InputError(f"n_agents must be >= 1, got {n}")
    # per agent: a states × agents activity table (9 B per cell with its index arrays)
    # and Python bookkeeping (action counts, factors: ~128 B)
    check_memory(n * (9 * S + 128), f"n_agents = {n} (per-agent tables and bookkeeping)")
    return n


def _check_turn(turn, S: int, n: int) -> np.ndarray:
    """``turn`` (S,) as int64 agent indices ``j(s) ∈ [0, n)``."""
    turn = np.asarray(turn)
    if turn.shape != (S,):
        raise InputError(f"turn has shape {turn.shape}, expected {(S,)}")
    turn = _as_index(turn, "turn (integer agent indices)").astype(np.int64, copy=False)
    if turn.min() < 0 or turn.max() >= n:
        bad = int(np.flatnonzero((turn < 0) | (turn >= n))[0])
        raise InputError(
            f"turn[{bad}] = {int(turn[bad])} is not an agent index in [0, {n - 1}]"
        )
    return turn


def _turn_transitions(P, S: int, A: int, copy: bool) -> np.ndarray | sp.csr_matrix:
    """Turn-taking ``P(·|s,a)``: CSR (S·A, S) if sparse, else a C-contiguous (S, A, S) array."""
    if sp.issparse(P):
        return _check_csr(P, S * A, S, "P")
    P = as_real(P, "P")
    if P.shape != (S, A, S):
        raise InputError(f"P has shape {P.shape}, expected {(S, A, S)} (S, A, S)")
    return np.ascontiguousarray(check_distribution_rows(P, "P", copy=copy))


@dataclass(frozen=True, eq=False)
class FactorizedMDP:
    """A finite discounted team MDP in state/joint-action form (see module docstring).

    Build one with :meth:`factored`, :meth:`turn_taking` or :meth:`load`; the constructor
    itself performs no validation and is for internal use.
    """

    kind: str  # "factored" or "turn"
    P: np.ndarray | sp.csr_matrix  # (S, K, S) dense, or CSR (S*K, S)
    R: np.ndarray  # (S, K)
    rho0: np.ndarray  # (S,)
    gamma: float
    action_counts: tuple[int, ...]  # (A_1..A_n)
    active: np.ndarray  # (S, n) bool
    turn: np.ndarray | None = None  # (S,) int, turn-taking only
    name: str = ""

    # ----------------------------------------------------------------- shapes
    @property
    def n_states(self) -> int:
        return self.R.shape[0]

    @property
    def n_agents(self) -> int:
        return len(self.action_counts)

    @property
    def n_joint(self) -> int:
        """K, the number of joint-action slots per state."""
        return self.R.shape[1]

    @property
    def is_sparse(self) -> bool:
        return sp.issparse(self.P)

    @cached_property
    def admissible(self) -> np.ndarray:
        """(S, K) bool: slot k is a joint action with every inactive agent at action 0."""
        if self.kind == "turn":
            return np.ones((self.n_states, self.n_joint), dtype=bool)
        acts = self.slot_actions  # (K, n)
        inactive = ~self.active  # (S, n)
        # inadmissible iff some inactive agent takes a non-zero action
        bad = (inactive[:, None, :] & (acts[None, :, :] != 0)).any(axis=2)
        return ~bad

    @cached_property
    def slot_actions(self) -> np.ndarray:
        """(K, n) int: per-agent actions of each joint slot (factored layout only)."""
        if self.kind != "factored":
            raise AttributeError("slot_actions exists only for factored MDPs")
        grids = np.unravel_index(np.arange(self.n_joint), self.action_counts)
        return np.stack(grids, axis=1)

    # ----------------------------------------------------------- constructors
    @classmethod
    def factored(cls, P, R, rho0, gamma, active=None, *, name: str = "",
                 copy: bool = True) -> FactorizedMDP:
        """Validated factored team MDP from ``P`` (S, A_1..A_n, S) and ``R`` (S, A_1..A_n).

        ``active`` (S, n) bool defaults to all agents active everywhere (a simultaneous
        factorized team). Inactive agents take action 0; ``P`` and ``R`` must not depend on
        their action (checked to ``SUM_TOL``). ``copy=False`` lets the MDP keep a valid
        float64 ``P`` as given instead of copying it (for arrays nobody else holds).
        """
        P = as_real(P, "P")
        R = _check_finite(R, "R")
        S, counts = _factored_shape(P, R)
        P = check_distribution_rows(P, "P", copy=copy)
        active = _check_active(active, S, len(counts))
        _check_no_op(P, R, active)
        rho0 = _check_rho0(rho0, S)
        K = int(np.prod(counts))
        return cls(
            kind="factored",
            P=np.ascontiguousarray(P.reshape(S, K, S)),
            R=np.ascontiguousarray(R.reshape(S, K)),
            rho0=rho0,
            gamma=_check_gamma(gamma),
            action_counts=counts,
            active=active,
            name=name,
        )

    @classmethod
    def turn_taking(cls, P, R, turn, n_agents, rho0, gamma, *, name: str = "",
                    copy: bool = True) -> FactorizedMDP:
        """Validated turn-taking team MDP: agent ``turn[s]`` chooses among A actions at ``s``.

        ``P`` is (S, A, S) dense or any scipy sparse matrix of shape (S*A, S) (row s*A + a).
        ``copy=False`` lets the MDP keep a valid float64 dense ``P`` as given.
        """
        R = _check_finite(R, "R")
        S, A = _turn_shape(R)
        n = _check_n_agents(n_agents, S)
        turn = _check_turn(turn, S, n)
        P = _turn_transitions(P, S, A, copy)
        rho0 = _check_rho0(rho0, S)
        active = np.zeros((S, n), dtype=bool)
        active[np.arange(S), turn] = True
        return cls(
            kind="turn",
            P=P,
            R=R,
            rho0=rho0,
            gamma=_check_gamma(gamma),
            action_counts=(A,) * n,
            active=active,
            turn=turn,
            name=name,
        )

    # -------------------------------------------------------------------- I/O
    @classmethod
    def load(cls, path: str | os.PathLike) -> FactorizedMDP:
        """Load an MDP ``.npz`` in factored, turn-taking or sparse turn-taking form."""
        data = _load_npz(path, "MDP")
        keys = set(data)
        name = os.path.splitext(os.path.basename(os.fspath(path)))[0]
        need = {"R", "rho0", "gamma"}
        if "turn" in keys or "P_data" in keys:
            need |= {"turn", "n_agents"}
            need |= {"P_data", "P_indices", "P_indptr"} if "P_data" in keys else {"P"}
        else:
            need |= {"P"}
        missing = sorted(need - keys)
        if missing:
            raise InputError(f"MDP file {path} is missing key(s) {', '.join(missing)}")
        if "turn" not in keys:
            return cls.factored(
                data["P"], data["R"], data["rho0"], data["gamma"], data.get("active"), name=name,
                copy=False,  # freshly read: nobody else holds these arrays
            )
        R = np.asarray(data["R"])
        if "P_data" in keys:
            if R.ndim != 2:
                raise InputError(f"R must have shape (S, A), got {R.shape}")
            S, A = R.shape
            P_data = as_real(data["P_data"], "P_data")
            P_indices = _as_index(data["P_indices"], "P_indices")
            P_indptr = _as_index(data["P_indptr"], "P_indptr")
            try:
                P = sp.csr_matrix((P_data, P_indices, P_indptr), shape=(S * A, S))
                P.check_format(full_check=True)
            except (ValueError, TypeError, IndexError) as e:
                raise InputError(f"malformed CSR arrays P_data/P_indices/P_indptr: {e}") from None
        else:
            P = data["P"]
        return cls.turn_taking(P, R, data["turn"], data["n_agents"], data["rho0"], data["gamma"],
                               name=name, copy=False)

    def save(self, path: str | os.PathLike) -> None:
        """Write this MDP as ``.npz`` in the form matching its layout (atomic replace)."""
        S = self.n_states
        if self.kind == "factored":
            arrays = dict(
                # no sparse factored file format: a CSR factored P is written densely
                # (np.asarray of a CSR matrix is a 0-d object array, not its entries)
                P=(self.P.toarray() if self.is_sparse else np.asarray(self.P)).reshape(
                    (S, *self.action_counts, S)),
                R=self.R.reshape((S, *self.action_counts)),
                rho0=self.rho0,
                gamma=self.gamma,
                active=self.active,
            )
        else:
            arrays = dict(R=self.R, turn=self.turn, n_agents=self.n_agents, rho0=self.rho0, gamma=self.gamma)
            if self.is_sparse:
                arrays.update(P_data=self.P.data, P_indices=self.P.indices, P_indptr=self.P.indptr)
            else:
                arrays["P"] = self.P
        save_npz_atomic(path, arrays)

    # ---------------------------------------------------------------- helpers
    def P_rows(self) -> sp.csr_matrix | np.ndarray:
        """P as an (S*K, S) matrix (CSR if sparse, a dense view otherwise)."""
        if self.is_sparse:
            return self.P
        return self.P.reshape(self.n_states * self.n_joint, self.n_states)

    def to_dense(self) -> FactorizedMDP:
        """The same MDP with a dense (S, K, S) transition array."""
        if not self.is_sparse:
            return self
        dense = self.P.toarray().reshape(self.n_states, self.n_joint, self.n_states)
        return _replace(self, P=dense)

    def to_sparse(self) -> FactorizedMDP:
        """The same MDP with a CSR (S*K, S) transition matrix."""
        if self.is_sparse:
            return self
        return _replace(self, P=sp.csr_matrix(self.P_rows()))

    def describe(self) -> str:
        layout = "turn-taking" if self.kind == "turn" else (
            "simultaneous" if self.active.all() else "masked")
        return (f"{self.name or 'mdp'}: {layout}, S={self.n_states}, n={self.n_agents}, "
                f"A={list(self.action_counts)}, gamma={self.gamma:g}"
                f"{', sparse' if self.is_sparse else ''}")


def _replace(mdp: FactorizedMDP, **changes) -> FactorizedMDP:
    fields = {f: getattr(mdp, f) for f in mdp.__dataclass_fields__}
    fields.update(changes)
    return FactorizedMDP(**fields)


#: Memory budget (bytes) for what a user file may make us allocate: the arrays an ``.npz``
#: declares, and tables sized by its scalars (e.g. ``n_agents``). ``sat --max-memory`` sets it.
MAX_MEMORY = 4 << 30


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def check_memory(nbytes: int, what: str) -> None:
    """:class:`InputError` when ``nbytes`` exceeds the budget :data:`MAX_MEMORY`."""
    if nbytes > MAX_MEMORY:
        raise InputError(f"{what} would take {format_bytes(nbytes)}, over the memory budget of "
                         f"{format_bytes(MAX_MEMORY)} (raise it with sat --max-memory SIZE)")


def _declared_bytes(z, path: str) -> int:
    """Total size of the arrays an open ``NpzFile`` declares, from the ``.npy`` headers only
    (a compressed member is inflated just far enough to read its header)."""
    fmt = np.lib.format
    total = 0
    for name in z.zip.namelist():
        with z.zip.open(name) as f:
            version = fmt.read_magic(f)
            shape, _, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                               else fmt.read_array_header_2_0(f))
        if dtype.hasobject:
            raise InputError(f"array {name} of {path} holds Python objects (not allowed)")
        total += int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    return total


def _load_npz(path, what: str) -> dict:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise InputError(f"{what} file not found: {path}")
    if os.path.isdir(path):
        raise InputError(f"{what} path is a directory, not an .npz file: {path}")
    from .ownership import regular_file

    regular_file(path, f"{what} file")  # a FIFO or /dev/zero would block or never end
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        raise InputError(f"{what} file {path} is a bare .npy array, not an .npz archive")
    if magic[:4] != b"PK\x03\x04":
        raise InputError(f"cannot read {what} file {path} as .npz: not a zip archive")
    try:
        with np.load(path, allow_pickle=False) as z:
            check_memory(_declared_bytes(z, path), f"the arrays of {what} file {path}")
            return {k: _read_member(z, path, k) for k in z.files}
    except InputError:
        raise
    except (OSError, ValueError, EOFError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise InputError(f"cannot read {what} file {path} as .npz: {msg}") from None
    except Exception as e:  # zipfile.BadZipFile and friends
        raise InputError(f"cannot read {what} file {path} as .npz: {type(e).__name__}") from None


#: Stored (uncompressed) .npz members larger than this are read straight from the file.
_DIRECT_READ_BYTES = 1 << 20


def _read_member(z, path: str, key: str) -> np.ndarray:
    """One array of an open ``NpzFile``.

    Large members stored without compression (what ``np.savez`` writes) are read with one
    ``np.fromfile`` at their offset in the archive: ``NpzFile.__getitem__`` reads through
    ``zipfile`` in chunks, copies twice and checks a CRC, about 4x slower on a 128 MB ``P``
    (the CRC alone costs as much as the read). Corruption that keeps the values valid is then
    not detected by a checksum; every value is still validated by the loaders.
    """
    import struct
    import zipfile

    info = z.zip.getinfo(key + ".npy") if key + ".npy" in z.zip.namelist() else None
    if info is None or info.compress_type != zipfile.ZIP_STORED or info.file_size < _DIRECT_READ_BYTES:
        return z[key]
    fmt = np.lib.format
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        head = f.read(30)
        if len(head) != 30 or head[:4] != b"PK\x03\x04":
            raise ValueError(f"corrupt zip entry {key}")
        n_name, n_extra = struct.unpack("<HH", head[26:30])
        start = info.header_offset + 30 + n_name + n_extra
        f.seek(start)
        version = fmt.read_magic(f)
        shape, fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0)
                                 else fmt.read_array_header_2_0(f))
        if dtype.hasobject:
            raise ValueError(f"array {key} holds Python objects (not allowed)")
        count = int(np.prod(shape, dtype=np.int64))
        if f.tell() - start + count * dtype.itemsize != info.file_size:
            raise ValueError(f"array {key} does not match its zip entry size")
        arr = np.fromfile(f, dtype=dtype, count=count)
    if arr.size != count:
        raise ValueError(f"array {key} is truncated")
    return arr.reshape(shape, order="F" if fortran else "C")


def save_npz_atomic(path, arrays: dict) -> None:
    """``np.savez`` to a temporary file in the same folder, then rename over ``path``."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}.npz")
    try:
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
