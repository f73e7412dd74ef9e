"""Large sparse turn-taking MDPs: our sparse evaluation vs value iteration (issue 7 item 2).

Random turn-taking team MDPs (n=4 agents, A=4 actions, 5 random successors per
state-action, CSR transitions) with S ∈ {10⁴, 10⁵, 10⁶}, γ ∈ {0.9, 0.99}:

- **ours**: ``evaluate(mdp, policy, tol=1e-8).V`` (collapse included; deflated value
  iteration, BiCGSTAB only on slowly mixing chains), and ``.d`` after it;
- **VI**: value iteration ``V ← r_π + γ P_π V`` from ``V = 0`` (the textbook start, as in
  pymdptoolbox) on the already-collapsed canonical CSR ``P_π`` (handed to it untimed),
  stopped at the first iterate whose Bellman residual ``‖r_π + γP_πV − V‖∞`` is at most the
  residual ours reached (so both reach the same residual; each VI sweep's residual costs no
  extra product);
- **VI_warm**: the same from ``V = r_π/(1−γ)``. That start has no component along the slow
  unit-eigenvalue mode (``μᵀ(I−γP_π)⁻¹ = μᵀ/(1−γ)``), which is most of what ours gains over
  VI: it is reported so that the gain is not mistaken for more than it is.

Targets: S=10⁵ under 5 s to residual ≤ 1e-8 (issue 2), VI/ours ≥ 10 (issue 7).

**Ceiling** (rows with S ≤ ``spectrum_states``): ``ρ₂``, the second-largest eigenvalue modulus
of ``P_π`` (ARPACK), bounds what any method built from products with ``P_π`` can gain. The
unit eigenvalue's right eigenvector is the constant vector, known in advance, so its mode can
be removed for free; the rest of the spectrum of these random graphs fills a disc of radius
``ρ₂`` (circular law), on which no polynomial beats ``(γρ₂)^k`` (Zarantonello). Such a method
then needs about ``k* = log(res/res₀)/log(γρ₂)`` products to bring the residual from VI's
first one, ``res₀ = ‖r_π‖∞``, down to ``res``, against VI's measured sweeps, so
``VI_sweeps/k*`` estimates the best ratio of product counts (an estimate for these
non-normal matrices, not a proof; Krylov methods also pay vector work per product).
Run: ``python experiments/benchmarks/bench_sparse.py [--quick]`` (quick skips S=10⁶).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

import numpy as np
from _common import (
    fmt_table,
    interleaved,
    machine_info,
    print_targets,
    save_json,
    script_main,
    target_line,
    time_once,
)

from sat_theory import TeamPolicy, evaluate, joint_policy, random_mdp
from sat_theory.evaluate import bellman_residual, collapse


@dataclass
class SparseBenchConfig:
    states: tuple[int, ...] = field(default=(10_000, 100_000, 1_000_000),
                                    metadata={"help": "numbers of states S"})
    gammas: tuple[float, ...] = field(default=(0.9, 0.99), metadata={"help": "discounts"})
    n_agents: int = field(default=4, metadata={"help": "agents (turn-taking)"})
    n_actions: int = field(default=4, metadata={"help": "actions per agent"})
    successors: int = field(default=5, metadata={"help": "random successors per state-action"})
    tol: float = field(default=1e-8, metadata={"help": "Bellman residual asked of ours"})
    repeats: int = field(default=3, metadata={"help": "timed rounds for S < 10⁶ (min kept)"})
    seed: int = field(default=0, metadata={"help": "RNG seed"})
    spectrum_states: int = field(default=10_000, metadata={
        "help": "compute ρ₂ and the ceiling for S up to this (ARPACK: ~5 s at 10⁴)"})


QUICK = SparseBenchConfig(states=(10_000, 100_000), repeats=2)

#: tiny sizes to check that the script runs (numbers meaningless)
SMOKE = SparseBenchConfig(states=(500,), gammas=(0.9,), repeats=1)


def value_iteration(P_pi, r_pi: np.ndarray, gamma: float, target: float, V0=None,
                    max_iter: int = 100_000) -> tuple[np.ndarray, int, float]:
    """``V_{k+1} = r_π + γ P_π V_k`` from ``V0`` (default 0) until ``‖V_{k+1} − V_k‖∞ ≤
    target``; returns the iterate ``V_k`` whose Bellman residual that is, the number of sweeps
    and the residual."""
    V = np.zeros_like(r_pi) if V0 is None else V0.copy()
    for k in range(1, max_iter + 1):
        TV = r_pi + gamma * (P_pi @ V)
        res = float(np.abs(TV - V).max())
        if res <= target:
            return V, k, res
        V = TV
    return V, max_iter, res


def second_eigenvalue_modulus(P_pi) -> float:
    """``ρ₂ = |λ₂(P_π)|``: the largest eigenvalue modulus after the unit one (ARPACK)."""
    import scipy.sparse.linalg as spla

    vals = np.sort(np.abs(spla.eigs(P_pi, k=4, which="LM", return_eigenvectors=False,
                                    tol=1e-6)))[::-1]
    return float(vals[1])


def product_ceiling(rho2: float, gamma: float, res0: float, res: float, vi_sweeps: int) -> dict:
    """``k* = log(res/res₀)/log(γρ₂)`` products and the ratio ``VI_sweeps / k*`` (module doc)."""
    k_star = float(np.log(res / res0) / np.log(gamma * rho2))
    return {"rho2": rho2, "k_star": k_star, "ceiling": vi_sweeps / k_star}


def one(cfg: SparseBenchConfig, S: int, gamma: float) -> dict:
    t_gen, mdp = time_once(lambda: random_mdp(S, cfg.n_agents, cfg.n_actions, layout="turn",
                                              sparse=True, successors=cfg.successors,
                                              gamma=gamma, seed=cfg.seed))
    pol = TeamPolicy.random(mdp, cfg.seed + 1)
    ev = evaluate(mdp, pol, tol=cfg.tol)
    if S < 1_000_000:
        t = interleaved({"ours": lambda: (lambda: evaluate(mdp, pol, tol=cfg.tol).V)},
                        cfg.repeats, warmup=0)
        t_ours = t["ours"]["min"]
    else:  # one run: the 10⁶ case is about scale, not noise
        t_ours, ev = time_once(lambda: evaluate(mdp, pol, tol=cfg.tol))
    t_d, _ = time_once(lambda: ev.d)
    residual = bellman_residual(mdp, ev.pi, ev.V)
    P_pi, r_pi = collapse(mdp, joint_policy(mdp, pol))
    t_vi, (V_vi, sweeps, res_vi) = time_once(lambda: value_iteration(P_pi, r_pi, gamma, residual))
    t_warm, (_, sweeps_warm, _) = time_once(
        lambda: value_iteration(P_pi, r_pi, gamma, residual, V0=r_pi / (1 - gamma)))
    row = {"S": S, "gamma": gamma, "nnz_P": int(mdp.P.nnz), "generate_s": t_gen,
           "ours_V": t_ours, "ours_d": t_d, "residual": residual, "d_sum_minus_1": float(ev.d.sum() - 1),
           "VI": t_vi, "VI_sweeps": sweeps, "VI_residual": res_vi,
           "max_abs_V_diff": float(np.abs(V_vi - ev.V).max()), "VI/ours": t_vi / t_ours,
           "VI_warm": t_warm, "VI_warm_sweeps": sweeps_warm, "VI_warm/ours": t_warm / t_ours,
           "rho2": None, "k_star": None, "ceiling": None}
    if S <= cfg.spectrum_states:
        row.update(product_ceiling(second_eigenvalue_modulus(P_pi), gamma,
                                   float(np.abs(r_pi).max()), residual, sweeps))
    return row


def main(quick: bool = False, out: str | None = None, cfg: SparseBenchConfig | None = None,
         verbose: bool = True) -> dict:
    cfg = cfg or (QUICK if quick else SparseBenchConfig())
    info = machine_info()
    rows = []
    for S in cfg.states:
        for g in cfg.gammas:
            rows.append(one(cfg, S, g))
            if verbose:
                r = rows[-1]
                print(f"  S={S:>8} γ={g}: ours {r['ours_V']:.3g} s (res {r['residual']:.2g}), "
                      f"VI {r['VI']:.3g} s ({r['VI_sweeps']} sweeps), ratio {r['VI/ours']:.3g}; "
                      f"VI_warm {r['VI_warm']:.3g} s ({r['VI_warm_sweeps']} sweeps)",
                      flush=True)
    targets = []
    for r in rows:
        if r["S"] == 100_000:
            targets.append(target_line(f"S=1e5 γ={r['gamma']}: seconds to residual ≤ {cfg.tol:g}",
                                       r["ours_V"], 5.0, higher_is_better=False))
        targets.append(target_line(f"S={r['S']:g} γ={r['gamma']}: VI/ours", r["VI/ours"], 10.0))
    result = {"benchmark": "sparse", "quick": quick, "config": asdict(cfg), "machine": info,
              "rows": rows, "targets": targets,
              "loadavg_after": [round(x, 2) for x in os.getloadavg()]}
    path = save_json(result, "bench_sparse" + ("_quick" if quick else ""), out)
    if verbose:
        print("large sparse turn-taking MDPs, seconds")
        print(fmt_table(rows, ["S", "gamma", "ours_V", "ours_d", "residual", "VI", "VI_sweeps",
                               "VI/ours", "VI_warm", "VI_warm_sweeps", "VI_warm/ours", "rho2",
                               "k_star", "ceiling"]))
        print_targets(targets, path)
    return result


if __name__ == "__main__":
    script_main(main, __doc__, "bench_sparse", "skip S=10⁶")
