"""Every certificate term against its definition, recomputed from scratch (docs/theory.md §4).

:func:`reference_certificate` evaluates each policy with its own dense solves (``V``, ``d``
and ``Q`` by ``numpy.linalg.solve``, joint log-probabilities by explicit sums over the active
agents, radii from the *joint* KL of consecutive intermediate policies — the factor lemma
— rather than the factor KL), and assembles the five stage bounds from their formulas. It
shares no code with :mod:`sat_theory.certificates` or :mod:`sat_theory.evaluate`, so the
check :func:`certificate_definitions` catches a wrong formula there even where the bound it
feeds stays valid (the KL direction: Pinsker bounds TV by either orientation, so a
certificate with the flipped radius is still a valid bound, but not the one docs/theory.md defines).
"""

from __future__ import annotations

import math

import numpy as np

from ..certificates import BOUND_KEYS, stage_certificate
from .base import CheckResult, check
from .cases import cases
from .saved import adversarial_cases, missing_note
from .tally import Tally, case_order, check_mutation, count, trap_cases

__all__ = ["reference_certificate", "STEP_KEYS"]

#: every term equals its definition to this, relative (bounds: plus the roundoff √δ amplifies)
DEFINITION_TOL = 1e-9

#: per-step fields of StepCertificate compared with their definitions
STEP_KEYS = ("L_seq", "L_stale", "delta", "delta_max", "tv", "A_max", "f_inf", "zeta",
             "true_gain", "bound", "bound_max")


def _joint_log(mdp, pol) -> np.ndarray:
    """``log π(a|s) = Σ_{j active at s} log π^(j)(a_j|s)``, inactive agents at the no-op 0
    (``−inf`` elsewhere); (S, K). In logs: a product of factors can underflow to 0 where
    one factor is subnormal (an adversarial target's 5e-324), and ``log(p/0)`` would then
    make a finite KL infinite."""
    S, K = mdp.n_states, mdp.n_joint
    out = np.zeros((S, K))
    with np.errstate(divide="ignore"):
        for s in range(S):
            for k in range(K):
                if mdp.kind == "turn":
                    out[s, k] = np.log(pol.factors[mdp.turn[s]][s, k])
                    continue
                for j, a in enumerate(mdp.slot_actions[k]):
                    if mdp.active[s, j]:
                        out[s, k] += np.log(pol.factors[j][s, a])
                    elif a != 0:
                        out[s, k] = -np.inf
                        break
    return out


def _evaluate(mdp, P: np.ndarray, pol) -> dict:
    """``V = (I − γP_π)⁻¹ r_π``, ``d = (1−γ)ρ0ᵀ(I − γP_π)⁻¹``, ``A = R + γPV − V``, ``J = ρ0ᵀV``."""
    S, g = mdp.n_states, mdp.gamma
    logpi = _joint_log(mdp, pol)
    pi = np.exp(logpi)
    P_pi = np.einsum("sk,skt->st", pi, P)
    M = np.eye(S) - g * P_pi
    V = np.linalg.solve(M, (pi * mdp.R).sum(1))
    d = (1 - g) * np.linalg.solve(M.T, mdp.rho0)
    A = mdp.R + g * P @ V - V[:, None]
    return dict(pi=pi, logpi=logpi, d=d, A=A, J=float(mdp.rho0 @ V))


def _kl(logp: np.ndarray, logq: np.ndarray) -> np.ndarray:
    """Row-wise ``Σ_a p (log p − log q)`` from log-probabilities, with ``0 log 0 = 0``,
    clipped at 0 (Gibbs; roundoff of nearly equal rows would make ``√δ`` fail)."""
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isfinite(logp), np.exp(logp) * (logp - logq), 0.0)
    return np.maximum(terms.sum(1), 0.0)


def reference_certificate(mdp, cur, tar, order, advantages=None, *, flip_kl: bool = False) -> dict:
    """Every per-step term (:data:`STEP_KEYS`) and every stage bound (``BOUND_KEYS``) of one
    stage, from the definitions of docs/theory.md §4 (``flip_kl``: radii from
    ``KL_s(π̂^i‖π̂^{i−1})`` — the check's mutation). ``advantages`` as in
    :func:`sat_theory.certificates.stage_certificate` (``ζ_i = max_s |f̂_i − f_i|``)."""
    g = mdp.gamma
    P = np.asarray(mdp.to_dense().P)
    pols = [cur]
    for j in order:
        fs = list(pols[-1].factors)
        fs[j] = tar.factors[j]
        pols.append(type(cur)(tuple(fs)))
    evs = [_evaluate(mdp, P, p) for p in pols]
    steps = []
    for i, j in enumerate(order, start=1):
        prev, nxt = evs[i - 1], evs[i]
        act = mdp.active[:, j]
        a, b = (nxt["logpi"], prev["logpi"]) if flip_kl else (prev["logpi"], nxt["logpi"])
        kl = _kl(a, b)  # joint KL of consecutive policies = factor KL where j acts (factor lemma)
        tv = 0.5 * np.abs(prev["pi"] - nxt["pi"]).sum(1)
        f = (nxt["pi"] * prev["A"]).sum(1)
        f_hat = f if advantages is None else (nxt["pi"] * advantages[i - 1]).sum(1)
        zeta = float(np.abs(f_hat - f).max())
        A_max = float(np.abs(prev["A"][mdp.admissible]).max())
        c_i = math.sqrt(2) * g * A_max / (1 - g) ** 2
        L = float(prev["d"] @ f_hat) / (1 - g)
        delta, delta_max = float(prev["d"] @ kl), float(kl[act].max()) if act.any() else 0.0
        steps.append(dict(
            L_seq=L, L_stale=float(evs[0]["d"] @ f_hat) / (1 - g), delta=delta,
            delta_max=delta_max, tv=float(prev["d"] @ tv), A_max=A_max,
            f_inf=float(np.abs(f).max()), zeta=zeta, true_gain=nxt["J"] - prev["J"],
            bound=L - c_i * math.sqrt(delta) - zeta / (1 - g),
            bound_max=L - c_i * math.sqrt(delta_max) - zeta / (1 - g)))
    A_max = max(s["A_max"] for s in steps)
    c = math.sqrt(2) * g * A_max / (1 - g) ** 2
    sq = [math.sqrt(s["delta"]) for s in steps]
    L = sum(s["L_seq"] for s in steps)
    Z = sum(s["zeta"] for s in steps) / (1 - g)
    stage = dict(
        lower_bound=L - c * sum(sq) - Z,
        lower_bound_max=L - c * sum(math.sqrt(s["delta_max"]) for s in steps) - Z,
        lower_bound_stale=(sum(s["L_stale"] for s in steps) - Z
                           - c * sum(sq[i] + sum(sq[:i]) for i in range(len(sq)))),
        lower_bound_fnorm=L - Z - sum(math.sqrt(2) * g * s["f_inf"] * r
                                      for s, r in zip(steps, sq, strict=True)) / (1 - g) ** 2,
        lower_bound_tv=L - Z - sum(2 * g * s["f_inf"] * s["tv"] for s in steps) / (1 - g) ** 2,
        A_max=A_max, c=c, true_improvement=evs[-1]["J"] - evs[0]["J"])
    return dict(steps=steps, stage=stage)


@check("certificate_definitions",
       "docs/theory.md §4.1 definitions (TeamTR Thm 3.4/3.6, Prop 3.3; SAT Thm 4.2/4.4)",
       "docs/theory.md §4.3 step and stage bounds",
       mutations=("flip_kl",))
def certificate_definitions(*, quick: bool = False, seed: int = 0,
                            mutation: str | None = None) -> CheckResult:
    """Every term ``stage_certificate`` prints — ``L_i^seq``, ``L_i^stale``, ``δ_i``, ``δ_i^max``,
    ``E TV_i``, ``A_max,i``, ``‖f_i‖∞``, ``ζ_i``, ``ΔJ_i``, both step bounds, ``A_max``, ``c``,
    ``ΔJ`` and the five stage bounds — equals its definition recomputed by
    :func:`reference_certificate` (to ``1e-9`` relative), with exact and with perturbed
    advantage estimates, on random cases of every layout and on the saved adversarial cases.
    Mutation: ``flip_kl`` (the reference measures radii by ``KL_s(π_tar‖π_cur)``)."""
    name = "certificate_definitions"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 31])
    T = Tally()
    pool = (cases(seed + 11, count(quick, 30, 150)) + trap_cases(gammas=(0.9,), ts=(0.02,))
            + adversarial_cases())
    worst = 0.0
    for k, c in enumerate(pool):
        order = case_order(rng, c)
        adv = None
        if k % 2:  # estimated advantages: exact ones plus noise (ζ_i > 0)
            from ..certificates import intermediate_policies
            from ..evaluate import evaluate

            pols = intermediate_policies(c.current, c.target, order)
            adv = [evaluate(c.mdp, p).A + 0.1 * rng.standard_normal((c.mdp.n_states, c.mdp.n_joint))
                   for p in pols[:-1]]
        cert = stage_certificate(c.mdp, c.current, c.target, order, advantages=adv)
        ref = reference_certificate(c.mdp, c.current, c.target, order, adv,
                                    flip_kl=mutation == "flip_kl")
        pairs = [(f"step {i + 1} {key}", getattr(st, key), want[key])
                 for i, (st, want) in enumerate(zip(cert.steps, ref["steps"], strict=True))
                 for key in STEP_KEYS]
        pairs += [(key, getattr(cert, key), ref["stage"][key])
                  for key in BOUND_KEYS + ("A_max", "c", "true_improvement")]
        # √δ amplifies the roundoff of a KL near 0 (two ways of summing p log(p/q) differ by
        # ~1e-16): a bound may differ by c·√(1e-15) without any formula being wrong
        root_tol = cert.c * len(order) * math.sqrt(1e-15)
        for what, got, want in pairs:
            is_bound = what.startswith("lower_bound") or what.endswith(("bound", "bound_max"))
            # equal infinities (an infinite KL where the target drops an action) agree
            err = 0.0 if got == want else abs(got - want) / (
                1.0 + abs(want) + (root_tol / DEFINITION_TOL if is_bound else 0.0))
            worst = max(worst, err)
            T.record(err <= DEFINITION_TOL, -err, None, f"{c.label} order={order}: {what} {got:.10g} != "
                     f"definition {want:.10g}")
    return T.result(name, [
        f"{T.cases} terms of {len(pool)} stages (half with noisy advantage estimates, ζ_i > 0): "
        f"largest relative difference from the definitions {worst:.2g} (bounds relative to "
        "their size plus c·n·√(1e-15), the roundoff √δ can amplify)",
    ] + missing_note(), tightness=False)
