"""Algebraic identities of THEORY §6–7 proven symbolically with sympy.

- TeamTR Lemma E.1: ``E[R_g − μ̂ | R_g] = (1 − 1/G)(R_g − μ)`` for i.i.d. returns with a
  symbolic finite law (symbolic values and probabilities), and for symbolic ``G``.
- TeamTR Lemma E.6: ``E_P|1 − Q/P| = 2 TV(P, Q)`` on symbolic positive finite distributions.
- TeamTR F.5: ``n Σ δ_i − (Σ √δ_i)² = Σ_{i<j} (√δ_i − √δ_j)²`` (Cauchy–Schwarz with its
  equality case ``δ_i = Δ/n``).
- Hoeffding constants: range ``2B`` gives ``2 exp(−Nε²/(2B²))``, and SAT's range-``B`` term is
  exactly half of the resulting ``ε``.
"""

import itertools

import pytest
import sympy as sp


@pytest.mark.parametrize("K,G", [(2, 2), (2, 3), (3, 2), (3, 3), (2, 4)])
def test_group_mean_shrinkage_on_symbolic_law(K, G):
    v = sp.symbols(f"v0:{K}", real=True)
    p = sp.symbols(f"p0:{K}", positive=True)
    mu = sum(pi * vi for pi, vi in zip(p, v, strict=True))
    for r in range(K):
        cond = 0
        for others in itertools.product(range(K), repeat=G - 1):
            weight = sp.Mul(*[p[k] for k in others])
            mean = (v[r] + sum(v[k] for k in others)) / G
            cond += weight * (v[r] - mean)
        # conditional expectation given R_g = v_r; the law's total mass is Σp = 1
        expr = (cond - sp.Rational(G - 1, G) * (v[r] - mu)).subs(p[-1], 1 - sum(p[:-1]))
        assert sp.expand(expr) == 0
        # and the factor is not 1: the self-included mean shrinks the advantage
        wrong = (cond - (v[r] - mu)).subs(p[-1], 1 - sum(p[:-1]))
        assert sp.expand(wrong) != 0


def test_group_mean_shrinkage_symbolic_G():
    G, R, mu = sp.symbols("G R mu", positive=True)
    # E[μ̂ | R_g = R] = R/G + (G−1)/G · μ by linearity and independence
    cond = R - (R + (G - 1) * mu) / G
    assert sp.simplify(cond - (1 - 1 / G) * (R - mu)) == 0
    # Cor. E.2: |E[R_g − μ̂ | R_g] − A_ret| = |A_ret|/G
    A = sp.symbols("A", real=True)
    assert sp.simplify(sp.Abs((1 - 1 / G) * A - A) - sp.Abs(A) / G) == 0


@pytest.mark.parametrize("K", [2, 3, 4])
def test_tv_ratio_identity_symbolic(K):
    p = sp.symbols(f"p0:{K}", positive=True)
    q = sp.symbols(f"q0:{K}", positive=True)
    lhs = sum(pi * sp.Abs(1 - qi / pi) for pi, qi in zip(p, q, strict=True))
    two_tv = sum(sp.Abs(pi - qi) for pi, qi in zip(p, q, strict=True))
    assert sp.simplify(lhs - two_tv) == 0


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_kl_allocation_cauchy_schwarz(n):
    x = sp.symbols(f"x0:{n}", nonnegative=True)  # x_i = √δ_i
    Delta = sum(xi ** 2 for xi in x)
    gap = n * Delta - sum(x) ** 2
    sos = sum((x[i] - x[j]) ** 2 for i in range(n) for j in range(i + 1, n))
    assert sp.expand(gap - sos) == 0  # so Σ√δ_i ≤ √(nΔ)
    t = sp.symbols("t", positive=True)
    assert sp.simplify(gap.subs({xi: t for xi in x})) == 0  # equality at δ_i = Δ/n


def test_hoeffding_range_constants():
    N, eps, B, eta = sp.symbols("N epsilon B eta", positive=True)
    # Hoeffding for a mean of N values in [a, b]: 2 exp(−2Nε²/(b−a)²); here b − a = 2B
    assert sp.simplify(-2 * N * eps ** 2 / (2 * B) ** 2 + N * eps ** 2 / (2 * B ** 2)) == 0
    eps_teamtr = B * sp.sqrt(2 * sp.log(2 / eta) / N)
    assert sp.simplify(2 * sp.exp(-N * eps_teamtr ** 2 / (2 * B ** 2)) - eta) == 0
    eps_sat = B * sp.sqrt(sp.log(2 / eta) / (2 * N))
    assert sp.simplify(eps_sat / eps_teamtr - sp.Rational(1, 2)) == 0
