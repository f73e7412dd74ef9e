"""Exact policy evaluation of a team policy in a finite MDP (THEORY §2).

With joint probabilities ``π(a|s)`` (see :func:`sat_theory.policy.joint_policy`):

- ``P_π(s,s') = Σ_a π(a|s) P(s'|s,a)``, ``r_π(s) = Σ_a π(a|s) R(s,a)``;
- ``V^π = (I − γ P_π)^{-1} r_π`` and ``Q^π(s,a) = R(s,a) + γ Σ_s' P(s'|s,a) V^π(s')``,
  ``A^π = Q^π − V^π``;
- ``J(π) = ρ0ᵀ V^π`` (unnormalized discounted return);
- ``d^π = (1−γ) ρ0ᵀ (I − γ P_π)^{-1}``, the normalized discounted occupancy (sums to 1).

Dense path: one LU factorization of ``M = I − γ P_π`` serves both ``V`` (``M V = r_π``)
and ``d`` (``Mᵀ d = (1−γ) ρ0``). The factorization is of ``Mᵀ`` held as the Fortran-ordered
view of the C-ordered ``M``, so LAPACK factors it in place without a copy. The policy is
never expanded to a joint ``(S·K)×S`` matrix beyond the input ``P``; ``P_π`` is one einsum
pass over ``P``. From :data:`MIXED_MIN_STATES` states on, the LU is computed in float32 and
both solves are refined with float64 residuals to float64 accuracy (LAPACK's DSGESV scheme,
see :class:`_MixedSolver`), with the float64 LU as fallback: the results are float64-exact,
the factorization twice as fast. Small systems run with one BLAS thread (:func:`_blas_limit`).

Sparse path (CSR ``P`` with at least :data:`SPARSE_MIN_STATES` states): ``P_π`` is formed in
O(nnz) by scaling ``P``'s data (no sparse product) and ``I − γP_π`` is applied, never built.
A direct sparse LU of a random transition graph fills in almost completely, so both systems
are solved iteratively. First by *deflated* value iteration (:func:`_macqueen` for ``V``, the
mass-conserving iteration :func:`_occupancy_sweeps` for ``d``): plain value iteration is slow
only because of the unit eigenvalue of ``P_π``, damped by ``γ`` per sweep; its eigenvectors
are known (the constant vector for ``V``, total mass for ``d``), so that mode is removed for
free and the rest converges at ``γ|λ₂(P_π)|`` per sweep (random graphs: ``|λ₂| ≈ 0.37``, about
20 products at γ=0.9 and at γ=0.99). The starts ``r_π/(1−γ)`` and ``b/(1−γ)`` already have no
component along that mode (``μᵀ(I − γP_π)⁻¹ = μᵀ/(1−γ)`` for the stationary ``μ``; the
d-iteration conserves mass); MacQueen's shift keeps it out for any start and against
roundoff. Both iterations are never slower than value iteration (their residual norms
contract by at least γ per sweep). When the observed contraction is slow (poorly mixing
chains, ``|λ₂|`` near 1) they hand their iterate to Jacobi-preconditioned BiCGSTAB (own
implementation, GMRES as the last resort), which copes with real spectra near 1.
Stopping rules are the guarantees callers need, scale-aware (:func:`residual_target`): ``V``
stops on the sup-norm Bellman residual ``‖r_π + γ P_π V − V‖∞ ≤ tol·max(‖r_π‖∞, (1−γ)‖V‖∞)``
(reported as ``Evaluation.residual``); ``d`` stops on the ℓ1 residual ``≤ tol·(1−γ)``, which
bounds ``‖d − d^π‖₁ ≤ tol``; either target is raised to the float64 roundoff of the residual
itself where that is larger (large ``‖V‖`` at γ near 1). Both are checked on the true
residual, otherwise :class:`ConvergenceError` is raised.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla
from scipy.linalg.blas import dgemv
from scipy.linalg.lapack import dgetrf, dgetrs, sgetrf, sgetrs

from .mdp import FactorizedMDP
from .policy import TeamPolicy, joint_policy

__all__ = ["Evaluation", "BatchEvaluation", "evaluate", "evaluate_many", "collapse",
           "bellman_residual", "ConvergenceError", "SPARSE_MIN_STATES"]

#: Sparse MDPs with fewer states are evaluated densely (a dense LU is exact and fast there).
SPARSE_MIN_STATES = 4096


class ConvergenceError(RuntimeError):
    """An iterative sparse solve did not reach the requested Bellman residual."""


def collapse(mdp: FactorizedMDP, pi_joint: np.ndarray):
    """``(P_π, r_π)`` for joint probabilities ``pi_joint`` (S, K).

    Dense ``P`` gives a dense (S, S) ``P_π`` (a fresh C-ordered array the caller may
    overwrite); sparse ``P`` gives CSR.
    """
    r_pi = np.einsum("sk,sk->s", pi_joint, mdp.R)
    if mdp.is_sparse:
        P_pi = _collapse_sparse(mdp.P, pi_joint)
        # canonical CSR for callers; it shares P's column indices and sum_duplicates works
        # in place, so give it its own index arrays (otherwise mdp.P would be corrupted)
        P_pi = sp.csr_matrix((P_pi.data, P_pi.indices.copy(), P_pi.indptr.copy()), shape=P_pi.shape)
        P_pi.sum_duplicates()
        return P_pi, r_pi
    return _collapse_dense(mdp.P, pi_joint), r_pi


def _collapse_dense(P: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``Σ_k w(s,k) P(s,k,·)`` in one pass over ``P``; a fresh C-ordered (S, S) array.

    ``einsum`` runs this as one single-threaded C loop: on the 2-core machine (S=2000, K=4)
    9 ms, against 32 ms for K scaled slice-adds (a temporary and a re-read of the output
    per slice) and about the same as a batched (1×K)@(K×S) ``matmul``, which would wake
    numpy's BLAS thread pool right before the LU runs in SciPy's (two OpenBLAS pools
    spinning on two cores slow each other down).
    """
    return np.einsum("sk,skt->st", weights, P)


def bellman_residual(mdp: FactorizedMDP, pi_joint: np.ndarray, V: np.ndarray) -> float:
    """``‖r_π + γ P_π V − V‖∞`` computed from ``P`` without forming ``P_π``."""
    S, K = pi_joint.shape
    PV = (mdp.P_rows() @ V).reshape(S, K)
    return float(np.abs(np.einsum("sk,sk->s", pi_joint, mdp.R + mdp.gamma * PV) - V).max())


@dataclass(eq=False)
class Evaluation:
    """Exact evaluation of one team policy. ``d``, ``Q`` and ``A`` are computed on first use,
    reusing the factorization (or sparse set-up) made for ``V``.

    Attributes: ``V`` (S,), ``J`` (float), ``d`` (S,), ``Q`` (S, K), ``A`` (S, K),
    ``pi`` (S, K) joint probabilities, ``r_pi`` (S,).
    """

    mdp: FactorizedMDP
    pi: np.ndarray
    r_pi: np.ndarray
    V: np.ndarray
    _solve_adjoint: object = field(repr=False)
    residual: float = 0.0  # Bellman residual of V (exact solves: not computed, 0)

    @property
    def J(self) -> float:
        """``J(π) = ρ0ᵀ V^π``."""
        return float(self.mdp.rho0 @ self.V)

    @cached_property
    def d(self) -> np.ndarray:
        """Normalized discounted occupancy ``d^π = (1−γ) ρ0ᵀ (I − γP_π)^{-1}``."""
        d = self._solve_adjoint((1.0 - self.mdp.gamma) * self.mdp.rho0)
        # the exact d is a distribution: clip roundoff negatives so it can weight expectations
        return np.clip(d, 0.0, None)

    @cached_property
    def Q(self) -> np.ndarray:
        """``Q^π(s,a) = R(s,a) + γ Σ_s' P(s'|s,a) V^π(s')`` for every joint slot, (S, K)."""
        S, K = self.pi.shape
        return self.mdp.R + self.mdp.gamma * (self.mdp.P_rows() @ self.V).reshape(S, K)

    @cached_property
    def A(self) -> np.ndarray:
        """``A^π = Q^π − V^π``, (S, K)."""
        return self.Q - self.V[:, None]

    @cached_property
    def A_max(self) -> float:
        """``max_{s, admissible a} |A^π(s,a)|``."""
        return float(np.abs(self.A[self.mdp.admissible]).max())


def evaluate(mdp: FactorizedMDP, policy: TeamPolicy | np.ndarray, *, tol: float = 1e-10,
             method: str = "auto") -> Evaluation:
    """Exact ``V, Q, A, d, J`` of ``policy`` (a TeamPolicy or (S, K) joint probabilities).

    ``method``: ``"auto"`` (dense LU unless the MDP is sparse with at least
    ``SPARSE_MIN_STATES`` states), ``"dense"`` or ``"krylov"`` (the iterative sparse path:
    deflated value iteration, BiCGSTAB on slowly mixing chains; the name is kept for
    callers). ``tol`` is the Bellman residual the iterative path must reach, relative to
    ``max(‖r_π‖∞, (1−γ)‖V‖∞)`` and never below roundoff (:func:`residual_target`).
    """
    pi = joint_policy(mdp, policy) if isinstance(policy, TeamPolicy) else np.asarray(policy)
    if method == "auto":
        method = "krylov" if (mdp.is_sparse and mdp.n_states >= SPARSE_MIN_STATES) else "dense"
    if method == "dense":
        return _evaluate_dense(mdp.to_dense() if mdp.is_sparse else mdp, pi)
    if method == "krylov":
        return _evaluate_krylov(mdp if mdp.is_sparse else mdp.to_sparse(), pi, tol)
    raise ValueError(f"unknown evaluation method {method!r}")


#: Dense systems with fewer states are factored with one BLAS thread (see :func:`_blas_limit`).
SMALL_DENSE_STATES = 800

_controller = None


def _blas_limit(n_states: int):
    """One BLAS thread for small dense systems, else no change.

    Why: below ~800 states a second thread gains little, while on a loaded 2-core machine
    OpenBLAS threads spin against each other: measured LU of S=500 took 320 ms with 2
    threads and 13 ms with 1 (load average 6). Needs the optional ``threadpoolctl``; without
    it this is a no-op. Results do not depend on the thread count beyond roundoff.
    """
    global _controller
    # OpenBLAS's getrf already runs one thread below 10⁴ matrix entries: skip the switch
    if not (100 < n_states < SMALL_DENSE_STATES):
        return contextlib.nullcontext()
    if _controller is None:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:
            _controller = False
        else:
            _controller = ThreadpoolController()  # finds the loaded BLAS libraries once
    if not _controller:
        return contextlib.nullcontext()
    return _controller.limit(limits=1, user_api="blas")


#: Dense systems with at least this many states are solved by mixed-precision refinement.
#: Crossover measured with one BLAS thread (V and d): S=500 3.20 ms float64 vs 3.23 ms mixed,
#: S=700 10.9 vs 7.4 ms, S=900 14.7 vs 12.3 ms.
MIXED_MIN_STATES = 600

_EPS = float(np.finfo(np.float64).eps)


def _evaluate_dense(mdp: FactorizedMDP, pi: np.ndarray) -> Evaluation:
    S = mdp.n_states
    r_pi = np.einsum("sk,sk->s", pi, mdp.R)
    M = _collapse_dense(mdp.P, -mdp.gamma * pi)  # −γ P_π, with γ folded into the weights
    M.flat[:: S + 1] += 1.0  # M = I − γ P_π, C-ordered
    if S >= MIXED_MIN_STATES:
        solver = _MixedSolver(M, mdp.gamma)
        V = solver.solve(r_pi, trans=1)
        if V is not None:
            return Evaluation(mdp, pi, r_pi, V, lambda b: solver.solve(b, trans=0, fallback=True))
    return _lu64(mdp, pi, r_pi, M)


def _lu64(mdp: FactorizedMDP, pi: np.ndarray, r_pi: np.ndarray, M: np.ndarray) -> Evaluation:
    """Float64 LU of ``Mᵀ`` in place (M.T is the F-contiguous view of the C-ordered M):
    ``(Mᵀ)ᵀ V = r_π`` is getrs with trans=1, ``Mᵀ d = (1−γ)ρ0`` with trans=0. Bare LAPACK:
    lu_factor/lu_solve add ~50 µs of checks, a third of the whole evaluation at S=100."""
    S = mdp.n_states
    with _blas_limit(S):
        lu, piv, info = dgetrf(M.T, overwrite_a=1)
        if info != 0:
            raise np.linalg.LinAlgError(f"I − γP_π is singular to working precision (getrf info {info})")
        V, _ = dgetrs(lu, piv, r_pi, trans=1)

    def solve_adjoint(b):
        with _blas_limit(S):
            return dgetrs(lu, piv, b, trans=0)[0]

    return Evaluation(mdp, pi, r_pi, V, solve_adjoint)


class _MixedSolver:
    """Solves ``M x = b`` and ``Mᵀ x = b`` to float64 accuracy from a float32 LU of ``Mᵀ``
    by iterative refinement with float64 residuals — LAPACK's DSGESV scheme (Langou et al.
    2006): ``x ← x + LU₃₂⁻¹(b − M x)`` until ``‖b − Mx‖∞ ≤ ‖x‖∞ ‖M‖∞ ε₆₄ √S``, the stopping
    rule of DSGESV, which makes the result as accurate as a float64 LU solve (its backward
    error is at roundoff level; measured residuals are smaller than the float64 LU's).
    Each refinement step contracts the error by about ``cond(M) ε₃₂``, and
    ``cond∞(I − γP_π) ≤ (1+γ)/(1−γ)``, so two steps suffice unless γ is within ~1e-6 of 1;
    if 10 steps do not converge the float64 LU is used instead.

    Why: float32 getrf runs at twice the flop rate: at S=2000 it is ~50 ms against ~90 ms
    for float64, and a refinement step (one float64 gemv, one float32 getrs) costs ~3 ms.
    """

    def __init__(self, M: np.ndarray, gamma: float):
        self.M = M  # float64, C-ordered, kept intact for the residuals
        self.MT = M.T  # F-contiguous view: gemv on it needs no copy
        self.bound = (1.0 + gamma) * _EPS * np.sqrt(M.shape[0])  # ‖M‖∞ ≤ 1+γ
        lu, piv, info = sgetrf(M.T.astype(np.float32), overwrite_a=1)
        self.lu, self.piv, self.ok = lu, piv, info == 0
        self._lu64 = None

    def solve(self, b: np.ndarray, trans: int, fallback: bool = False) -> np.ndarray | None:
        """``trans=1``: ``M x = b``; ``trans=0``: ``Mᵀ x = b``. None if refinement fails
        (or, with ``fallback``, the float64 LU's answer)."""
        if self.ok:
            x = sgetrs(self.lu, self.piv, b.astype(np.float32), trans=trans)[0].astype(np.float64)
            for step in range(11):
                res = b - dgemv(1.0, self.MT, x, trans=trans)
                if np.abs(res).max() <= self.bound * np.abs(x).max():
                    return x
                if step == 10 or not np.all(np.isfinite(res)):
                    break
                x += sgetrs(self.lu, self.piv, res.astype(np.float32), trans=trans)[0]
        if not fallback:
            return None
        if self._lu64 is None:
            self._lu64 = dgetrf(self.M.T.copy(order="F"), overwrite_a=1)
        lu, piv, _ = self._lu64
        return dgetrs(lu, piv, b, trans=trans)[0]


def _collapse_sparse(P: sp.csr_matrix, weights: np.ndarray) -> sp.csr_matrix:
    """``Σ_k w(s,k) P(s,k,·)`` for CSR ``P`` with S·K rows, without a sparse product.

    Row ``s`` of the result is the concatenation of the K slot rows ``s·K + k`` scaled by
    ``w(s,k)``: the same arrays as ``P`` with the data scaled and every K-th row pointer
    kept. Column indices may repeat within a row (not canonical CSR); matrix–vector
    products sum repeats, so this serves the iterative solvers as is. O(nnz), about 20× faster
    than the sparse product ``W @ P`` at S=10⁵.
    """
    S, K = weights.shape
    counts = np.diff(P.indptr)
    if len(counts) and np.all(counts == counts[0]):  # every slot row has c entries: no repeat
        data = (P.data.reshape(-1, int(counts[0])) * weights.reshape(-1, 1)).ravel()
    else:
        data = P.data * np.repeat(weights.ravel(), counts)
    return sp.csr_matrix((data, P.indices, P.indptr[::K]), shape=(S, P.shape[1]))


def _dot(a: np.ndarray, b: np.ndarray) -> float:
    # einsum's own SIMD loop, not BLAS: a BLAS-1 call wakes a thread pool, which on a busy
    # 2-core machine cost ~20 ms per dot of 10⁵ entries (measured) instead of ~30 µs.
    return float(np.einsum("i,i->", a, b))


def _sup(x: np.ndarray) -> float:
    return float(np.abs(x).max(initial=0.0))


def _l1(x: np.ndarray) -> float:
    return float(np.abs(x).sum())


def _bicgstab(matvec, diag: np.ndarray, b: np.ndarray, tol: float, x0: np.ndarray,
              maxiter: int, norm=_sup) -> tuple[np.ndarray, bool]:
    """Jacobi-(right-)preconditioned BiCGSTAB (van der Vorst 1992) for ``M x = b``, stopping
    when ``norm`` of the recursively updated residual is ``≤ tol``. Returns ``(x, ok)``;
    ``ok`` is False on breakdown or when ``maxiter`` iterations did not suffice."""
    x = x0.copy()
    r = b - matvec(x)
    if norm(r) <= tol:
        return x, True
    r_hat = r.copy()
    rho = alpha = omega = 1.0
    v = np.zeros_like(b)
    p = np.zeros_like(b)
    for _ in range(maxiter):
        rho_new = _dot(r_hat, r)
        if rho_new == 0.0 or omega == 0.0:
            return x, False
        beta = (rho_new / rho) * (alpha / omega)
        p = r + beta * (p - omega * v)
        y = p / diag
        v = matvec(y)
        denom = _dot(r_hat, v)
        if denom == 0.0:
            return x, False
        alpha = rho_new / denom
        x += alpha * y
        r -= alpha * v  # r is now the intermediate residual s
        if norm(r) <= tol:
            return x, True
        z = r / diag
        t = matvec(z)
        tt = _dot(t, t)
        if tt == 0.0:
            return x, False
        omega = _dot(t, r) / tt
        x += omega * z
        r -= omega * t
        if norm(r) <= tol:
            return x, True
        rho = rho_new
    return x, False


def _krylov(matvec, diag: np.ndarray, b: np.ndarray, tol: float, x0: np.ndarray,
            norm=_sup) -> np.ndarray:
    """Solve ``M x = b`` (M applied by ``matvec``) to residual ``norm(b − Mx) ≤ tol``.

    BiCGSTAB, restarted from its iterate (fresh true residual) when the recursively updated
    residual has drifted from the true one; SciPy's GMRES as a last resort.
    """
    n = len(b)
    x = x0
    for _ in range(4):
        x, ok = _bicgstab(matvec, diag, b, tol, x, maxiter=max(100, n), norm=norm)
        if ok and norm(b - matvec(x)) <= tol:
            return x
        if not np.all(np.isfinite(x)):
            x = x0
            break
    M = spla.LinearOperator((n, n), matvec=matvec, dtype=np.float64)
    prec = spla.LinearOperator((n, n), matvec=lambda y: y / diag, dtype=np.float64)
    # GMRES stops on the 2-norm; the ℓ1 norm is at most √n times larger
    atol = tol if norm is _sup else tol / np.sqrt(n)
    x, _ = spla.gmres(M, b, x0=x, rtol=0.0, atol=atol, M=prec, restart=100,
                      maxiter=max(50, n // 100))
    return x


#: Sweeps of deflated value iteration at most, and the budget its observed contraction
#: rate must promise, before the iterate is handed to BiCGSTAB.
MAX_SWEEPS = 60


def _slow(history: list[float], tol: float) -> bool:
    """Whether the residual norms so far predict more than :data:`MAX_SWEEPS` sweeps in all:
    the rate ``q`` per sweep over the last 4 sweeps extrapolated to ``tol``."""
    k = len(history)
    if k >= MAX_SWEEPS:
        return True
    if k < 8 or tol <= 0:
        return False
    q = (history[-1] / history[-5]) ** 0.25
    return q >= 1.0 or k + np.log(tol / history[-1]) / np.log(q) > MAX_SWEEPS


def _macqueen(P_pi, r_pi: np.ndarray, g: float, x: np.ndarray, tol: float):
    """Value iteration with MacQueen's (1966) midpoint shift: with ``ρ = Tx − x``,
    ``x ← Tx + γ/(1−γ) · (max ρ + min ρ)/2``. Returns ``(x, ‖Tx − x‖∞, converged)``.

    The next residual is ``γ(P_π ρ − mid ρ)``, whose sup norm is at most ``γ span(ρ)/2 ≤
    γ‖ρ‖∞``: never slower than value iteration, and the constant mode (the unit eigenvalue's
    right eigenvector, which value iteration damps only by ``γ``) is removed at every sweep.
    Stops on the true residual of the returned ``x``, or when :func:`_slow`.
    """
    history = []
    while True:
        Tx = r_pi + g * (P_pi @ x)
        rho = Tx - x
        hi, lo = float(rho.max()), float(rho.min())
        res = max(hi, -lo)
        if res <= tol:
            return x, res, True
        history.append(res)
        if _slow(history, tol):
            return x, res, False
        Tx += (g / (1.0 - g)) * 0.5 * (hi + lo)
        x = Tx


def _occupancy_sweeps(PT, b: np.ndarray, g: float, tol: float):
    """``x ← b + γ P_πᵀ x`` from ``x₀ = b/(1−γ)``; returns ``(x, ‖b + γP_πᵀx − x‖₁, converged)``.

    Mass is conserved: ``1ᵀP_πᵀ = 1ᵀ`` makes the first residual sum to 0 and keeps every later
    one (``ρ_{k+1} = γ P_πᵀ ρ_k``) in the zero-sum subspace, which excludes the slow unit mode:
    the iteration runs at ``γ|λ₂|`` without any correction (and ``‖ρ_{k+1}‖₁ ≤ γ‖ρ_k‖₁``).
    """
    x = b / (1.0 - g)
    history = []
    while True:
        Tx = b + g * (PT @ x)
        res = _l1(Tx - x)
        if res <= tol:
            return x, res, True
        history.append(res)
        if _slow(history, tol):
            return x, res, False
        x = Tx


def residual_target(tol: float, b_norm: float, x_norm: float, g: float) -> float:
    """The residual the sparse path must reach for ``M x = b`` (``M = I − γP_π`` or its
    transpose), ``x`` of size about ``x_norm``: scale-aware,

        max( tol · max(‖b‖, (1−γ)‖x‖),  4 ε (‖b‖ + 2‖x‖) ),

    the first term a relative tolerance (rewards of any size), the second the roundoff of
    evaluating the residual ``b + γPx − x`` itself in float64 (``ε`` = 2.2e-16; a few units
    per entry), which no solver can go below (it decides for γ near 1, where
    ``‖x‖ ≈ ‖b‖/(1−γ)`` is large; it does not grow with the number of states: each entry's
    roundoff is relative to that entry's terms)."""
    eps = np.finfo(np.float64).eps
    return max(tol * max(b_norm, (1.0 - g) * x_norm), 4.0 * eps * (b_norm + 2.0 * x_norm))


def _evaluate_krylov(mdp: FactorizedMDP, pi: np.ndarray, tol: float) -> Evaluation:
    g = mdp.gamma
    r_pi = np.einsum("sk,sk->s", pi, mdp.R)
    P_pi = _collapse_sparse(mdp.P, pi)
    # M = I − γP_π is applied, never built: building it as CSR cost more than the solve.
    diag = None  # of M, for BiCGSTAB's Jacobi preconditioner: only built if it runs

    def jacobi():
        nonlocal diag
        if diag is None:
            diag = 1.0 - g * P_pi.diagonal()  # diagonal() sums repeated entries
        return diag

    x0 = r_pi / (1.0 - g)
    tol_V = residual_target(tol, _sup(r_pi), _sup(x0), g)
    V, res, ok = _macqueen(P_pi, r_pi, g, x0, tol_V)
    if not ok:
        V = _krylov(lambda x: x - g * (P_pi @ x), jacobi(), r_pi, tol_V, x0=V)
        res = float(np.abs(r_pi + g * (P_pi @ V) - V).max())
    if not res <= tol_V:
        raise ConvergenceError(f"sparse policy evaluation stopped at Bellman residual {res:.3g} "
                               f"> {tol_V:.3g} (tol {tol:g} relative to the size of r_π and V)")

    def solve_adjoint(b):
        # ‖Mᵀe‖₁ ≤ res gives ‖e‖₁ ≤ res/(1−γ) since ‖M^{-1}‖_∞ = 1/(1−γ); for d (‖b‖₁ = 1−γ,
        # ‖d‖₁ = 1) the target is tol·(1−γ), i.e. ‖d − d^π‖₁ ≤ tol, unless roundoff is larger
        tol_d = residual_target(tol, _l1(b), _l1(b) / (1.0 - g), g)
        # the CSC view, no copy (a CSR copy's faster products do not repay its O(nnz) build)
        PT = P_pi.T
        x, res_d, ok = _occupancy_sweeps(PT, b, g, tol_d)
        if not ok:
            x = _krylov(lambda y: y - g * (PT @ y), jacobi(), b, tol_d, x0=x, norm=_l1)
            res_d = _l1(b + g * (PT @ x) - x)
        if not res_d <= tol_d:
            raise ConvergenceError(
                f"sparse occupancy solve stopped at l1 residual {res_d:.3g} > {tol_d:.3g}")
        return x

    return Evaluation(mdp, pi, r_pi, V, solve_adjoint, residual=res)


@dataclass(eq=False)
class BatchEvaluation:
    """Exact evaluation of B policies at once: ``V`` (B, S), ``d`` (B, S), ``Q``/``A`` (B, S, K),
    ``J`` (B,), ``pi`` (B, S, K)."""

    pi: np.ndarray
    V: np.ndarray
    d: np.ndarray
    Q: np.ndarray
    J: np.ndarray

    @property
    def A(self) -> np.ndarray:
        return self.Q - self.V[..., None]


def evaluate_many(mdp: FactorizedMDP, policies) -> BatchEvaluation:
    """Evaluate a sequence of TeamPolicies (or a (B, S, K) joint array) in one batched solve.

    Dense MDPs use one batched LAPACK call per system; sparse MDPs loop over :func:`evaluate`.
    """
    if isinstance(policies, np.ndarray) and policies.ndim == 3:
        pis = policies
    else:
        pis = np.stack([joint_policy(mdp, p) for p in policies])
    B, S, K = pis.shape
    if mdp.is_sparse and S >= SPARSE_MIN_STATES:
        evs = [evaluate(mdp, p) for p in pis]
        return BatchEvaluation(pis, np.stack([e.V for e in evs]), np.stack([e.d for e in evs]),
                               np.stack([e.Q for e in evs]), np.array([e.J for e in evs]))
    dense = mdp.to_dense() if mdp.is_sparse else mdp
    P_pi = np.einsum("bsk,skt->bst", pis, dense.P)
    r_pi = np.einsum("bsk,sk->bs", pis, dense.R)
    M = np.eye(S)[None] - dense.gamma * P_pi
    rhs = np.broadcast_to((1.0 - dense.gamma) * dense.rho0, (B, S))[..., None]
    with _blas_limit(S):
        V = np.linalg.solve(M, r_pi[..., None])[..., 0]
        d = np.clip(np.linalg.solve(np.swapaxes(M, 1, 2), rhs)[..., 0], 0.0, None)
    Q = dense.R[None] + dense.gamma * np.einsum("skt,bt->bsk", dense.P, V)
    return BatchEvaluation(pis, V, d, Q, V @ dense.rho0)
