"""SAT Fig. 1c: how often the per-state KL exceeds δ when a step is constrained only in
expectation, as a function of δ.

SAT's Theorem 4.2 uses the max-KL radius ``δ^max = max_s KL_s``; TeamTR (and any practical
trust region) constrains the *expected* KL ``E_{s∼d} KL_s = δ``. SAT Fig. 1c reports that the
fraction of states whose per-state KL exceeds δ grows about like ``√δ``.

What is measured: every agent step of an exact SAT run (intermediate occupancy, the exact
trust-region step of :func:`experiments.common.tr_factor_step` with ``E_{d^{π̂^{i−1}}} KL = δ``)
gives a per-state ``KL_s(π_cur^j‖π_new^j)`` at the states where agent j acts. We record

- ``states``: the fraction of those states with ``KL_s > δ`` (SAT's "fraction of states"),
- ``occupancy``: their mass under ``d^{π̂^{i−1}}`` normalized by the agent's active mass,

averaged over the steps of a run (agents × stages), then mean ± std over seeds (random
masked-activation MDPs). Fits: ``c·√δ`` (one parameter, least squares on the means) and a
free power law ``C·δ^α``.

Why the rate need not scale like √δ: to first order in the step size, the exponentiated step
has ``KL_s ≈ ½η² Var_{π(·|s)} A_j(s,·)``, and fixing ``E_d KL_s = δ`` fixes ``η² ∝ δ``; the ratio
``KL_s/δ ≈ Var_s / E_d Var`` is then independent of δ, so the fraction of states above δ
tends to a constant as δ → 0. Growth with δ appears only where the step leaves this
quadratic regime.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from experiments.common import (
    Options,
    exact_stage,
    fit_power_law,
    run_study,
    write_csv,
    write_json,
)
from sat_theory.envs import random_mdp
from sat_theory.plotting import paper_style, plot_violation_rate, save_figure
from sat_theory.policy import TeamPolicy, factor_kl

NAME = "fig_violation_rate"


@dataclass
class Config:
    deltas: tuple[float, ...] = field(default=tuple(np.geomspace(1e-3, 0.3, 9).round(6)),
                                      metadata={"help": "radii δ (nats)"})
    n_states: int = field(default=20, metadata={"help": "states per MDP"})
    n_agents: int = field(default=3, metadata={"help": "agents (SAT: 3)"})
    n_actions: int = field(default=3, metadata={"help": "actions per agent"})
    layout: str = field(default="masked", metadata={"help": "SAT's masked activation"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ"})
    stages: int = field(default=4, metadata={"help": "stages per run"})
    seeds: int = field(default=6, metadata={"help": "seeds (random MDPs)"})


def config_for(opts: Options) -> Config:
    return Config(stages=2 if opts.quick else 6, seeds=opts.n_seeds(2, 8))


def violation_fractions(mdp, cert, evs, current, target) -> list[dict]:
    """Per step: fraction (by count and by occupancy) of the agent's states with KL_s > δ_i."""
    out = []
    for i, st in enumerate(cert.steps):
        j, d = st.agent, evs[i].d
        act = mdp.active[:, j]
        kl = factor_kl(mdp, current.factors[j], target.factors[j], j)[act]
        over = kl > st.delta
        out.append(dict(states=float(over.mean()),
                        occupancy=float(d[act][over].sum() / max(d[act].sum(), 1e-300))))
    return out


def simulate(cfg: Config) -> pd.DataFrame:
    rows = []
    for seed in range(cfg.seeds):
        mdp = random_mdp(cfg.n_states, cfg.n_agents, cfg.n_actions, layout=cfg.layout,
                         gamma=cfg.gamma, seed=seed, successors=4)
        start = TeamPolicy.random(mdp, seed)
        for delta in cfg.deltas:
            cur = start
            for k in range(cfg.stages):
                tar, cert, evs = exact_stage(mdp, cur, list(range(cfg.n_agents)), delta)
                for st, fr in zip(cert.steps, violation_fractions(mdp, cert, evs, cur, tar), strict=True):
                    for w, v in fr.items():
                        rows.append(dict(seed=seed, delta=delta, stage=k, agent=st.agent,
                                         weighting=w, value=v, delta_realized=st.delta))
                cur = tar
    return pd.DataFrame(rows)


def summarize(raw: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    per_seed = raw.groupby(["weighting", "delta", "seed"], as_index=False)["value"].mean()
    agg = per_seed.groupby(["weighting", "delta"], as_index=False)["value"].agg(
        mean="mean", std="std", n_seeds="count")
    agg["std"] = agg["std"].fillna(0.0)
    fits = {}
    for w, g in agg.groupby("weighting"):
        x, y = g.delta.to_numpy(), g["mean"].to_numpy()
        c = float((np.sqrt(x) @ y) / (np.sqrt(x) @ np.sqrt(x)))  # argmin_c Σ (y − c√δ)²
        resid = y - c * np.sqrt(x)
        r2 = 1 - float(resid @ resid) / float(((y - y.mean()) ** 2).sum() or np.nan)
        a, C = fit_power_law(x, y)
        fits[w] = dict(c_sqrt=c, r2_sqrt=r2, exponent=a, prefactor=C)
    return agg, fits


def run(opts: Options) -> list[Path]:
    cfg = config_for(opts)
    raw = simulate(cfg)
    agg, fits = summarize(raw)
    for w, f in fits.items():
        for k, v in f.items():
            agg.loc[agg.weighting == w, k] = v
    return [write_csv(agg, opts.out, NAME), write_json(fits, opts.out, NAME + "_fit")] + plot(opts.out)


def plot(out: Path | str) -> list[Path]:
    """Draw the figure from the saved ``fig_violation_rate.csv`` and ``_fit.json`` in ``out``
    (layout and n in the title are :class:`Config`'s, which ``--quick`` does not change)."""
    out, cfg = Path(out), Config()
    agg = pd.read_csv(out / f"{NAME}.csv")
    fits = json.loads((out / f"{NAME}_fit.json").read_text())
    with paper_style():
        fig = plot_violation_rate(agg, fits)
        fig.axes[0].set_title(f"Per-state KL violations under an expected-KL step\n"
                              f"({cfg.layout} MDPs, $n$ = {cfg.n_agents}, {int(agg.n_seeds.max())} seeds)",
                              fontsize=10)
        return save_figure(fig, out, NAME)


def main(argv=None) -> int:
    return run_study(run, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
