"""The sequential trust-region algorithm (SAT / TeamTR), written once against :class:`Team`.

One *stage* updates every agent once, in an order ``σ`` (THEORY §4):

1. Occupancy. Before step ``i`` the algorithm decides which batch the step uses:
   ``intermediate`` — a fresh ``team.rollout`` under the partly updated team ``π̂^{i−1}``
   (SAT/TeamTR); ``stale`` — the stage-start batch of ``π̂^0`` for every step (naive
   sequential); ``resample-every-k`` — fresh every ``k`` steps; ``stale+IS`` — the
   stage-start batch with trajectory importance weights
   ``w(τ) = Π_{t: j_t updated} π̂^{i−1}(a_t|s_t)/π̂^0(a_t|s_t)`` (TeamTR App. G.6), whose
   ``ESS/B = (Σw)²/(B Σw²)`` is logged.
2. Advantages. Group-normalized, clipped ``Ã_g = clip((R_g − μ̂)/σ̂, −A_clip, A_clip)``
   (THEORY §6, :func:`sat_theory.estimators.group_advantages`) per episode, given to each of
   the agent's turns in that episode; switches turn off the std-normalization and the
   clipping. HAPPO multiplies in its M-factor (the product, over agents already updated in
   this stage and acting at the same step, of their new/old ratios; HARL
   ``on_policy_ha_runner.py``). Exact batches: the backend's exact advantages.
3. Trust region. ``team.update`` with penalty ``β``, then ``δ̂ = team.kl`` on the step's
   states. While ``δ̂ > δ_i``: restore the pre-update snapshot, multiply ``β`` by
   ``beta_growth``, shrink the step by ``step_shrink`` and retry (backtracking, at most
   ``max_backtracks`` times). A step still outside the region is rejected (snapshot
   restored) or kept and flagged (``on_violation``). After an accepted step, ``β`` relaxes
   (``÷ beta_growth``) when ``δ̂ < δ_i / 4``. Variants: per-agent ``δ_i``
   (``delta_per_agent``), adaptive δ (``trust_region="adaptive"``: the classical radius
   rule on the agreement ratio ``ρ = (team.evaluate() after − before)/L̂`` of the step:
   ``δ_i ← δ_i·delta_up`` when ``ρ ≥ 0.5``, ``δ_i·delta_down`` when ``ρ < 0.25`` or ``L̂ ≤ 0``,
   clipped to ``[delta_min, delta_max]``), none (``trust_region="none"``: one
   update at ``β``; clipping is the only control).
4. Order. ``fixed`` (``0..n−1`` or ``fixed_order``), ``reverse``, ``random`` (a fresh
   permutation per stage from the run's seed), ``greedy`` (data-dependent: at every step each
   remaining agent takes a trial step on the same batch; the one with the largest estimated
   surrogate ``L̂`` is kept, the others restored).

Logged per step: see :mod:`sat_theory.metrics`. The surrogate estimate (reward units) is

    L̂ = (1/N) Σ_episodes Σ_{turns of j} γ^t (r_t − 1) G_t,   r_t = π_now^j(a_t|s_t)/π_beh^j(a_t|s_t),

with ``G_t`` the discounted reward-to-go. It is unbiased for
``L_i = 1/(1−γ) E_{s∼d_batch} E_{a∼π̂^i} A^{batch}(s,a)`` (``E[(r−1)·b(s)] = 0`` removes any
baseline and ``E[G_t|s_t,a_t] = Q``), so no group-normalization or clipping bias enters it;
only the backend's horizon truncation does (``zeta_trunc``).

Stage bounds (THEORY §4, from the stage's own terms): with ``c = √2 γ A_max/(1−γ)²``,
``lower_bound = Σ L_i − c Σ √δ_i − Σ ζ_i/(1−γ)``; exact terms from the backend's
``exact_stage_terms`` where it has them (tabular), else the estimated ``L̂_i, δ̂_i, ζ̂_i`` with
``A_max = team.advantage_bound``. The empirical certificate (THEORY §6, TeamTR Thm E.10) is
logged for sampled batches.

Methods (presets of :class:`TrainConfig`): ``sat`` (intermediate + trust region), ``naive``
(stale + trust region), ``joint`` (one batch per stage, every agent updated from it; with a
fixed batch an agent's update does not depend on the others' new parameters, so this
coincides with ``naive`` up to the order, which ``joint`` fixes to ``0..n−1``), ``no-tr``
(intermediate, no trust region) and ``happo`` (stale + M-factor, clipping only, a random
order per stage as HARL's default ``fixed_order: False``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from .certificates import penalty_constant, stage_lower_bound
from .config_file import from_args, setting
from .errors import InputError, check_range
from .estimators import empirical_stage_bound, group_advantages, sat_finite_sample_term
from .team import (
    Batch,
    HasAdvantageBound,
    ReportsMetrics,
    Resettable,
    SupportsAlign,
    SupportsExactTerms,
    SupportsSwap,
    Team,
    Versioned,
)

__all__ = ["TrainConfig", "METHODS", "ORDERS", "OCCUPANCIES", "TRUST_REGIONS", "RunState",
           "run_stage", "sampled_surrogate", "stage_lower_bound",
           "empirical_certificate", "empirical_certificate_sat", "ess_fraction",
           "choose_order", "trajectory_log_weights", "happo_log_factors"]

#: Method presets: the TrainConfig fields each method sets (explicit settings override).
METHODS: dict[str, dict] = {
    "sat": dict(occupancy="intermediate", trust_region="fixed", correction="none"),
    "naive": dict(occupancy="stale", trust_region="fixed", correction="none"),
    "joint": dict(occupancy="stale", trust_region="fixed", correction="none", order="fixed"),
    "no-tr": dict(occupancy="intermediate", trust_region="none", correction="none"),
    # HARL's default (fixed_order: False) draws a fresh agent permutation per update
    "happo": dict(occupancy="stale", trust_region="none", correction="happo", order="random"),
}
ORDERS = ("fixed", "reverse", "random", "greedy")
OCCUPANCIES = ("intermediate", "stale", "resample-every-k", "stale+IS")
TRUST_REGIONS = ("fixed", "adaptive", "none")
CORRECTIONS = ("none", "happo")


@dataclass
class TrainConfig:
    """Configuration of the shared algorithm: each field is one setting (default, valid
    range, help, flag: :func:`sat_theory.config_file.setting`; ``sat train``'s algorithm
    flags, ``--config`` and ``--resume`` are generated from these fields). ``None`` for
    ``occupancy``/``trust_region``/``correction``/``order`` means "as the method preset
    says" (:data:`METHODS`)."""

    method: str = setting("sat", "method preset: sat | naive | joint | no-tr | happo")
    stages: int = setting(10, "number of stages K (each updates every agent once)",
                          range=("int", 0, None, True, False), resume=True)
    eval_every: int = setting(1, "held-out evaluation (team.evaluate(), eval_{k}.jsonl, "
                              "J_before/J_after of the stage records) before training, after "
                              "every eval_every-th stage and after the last; the other stage "
                              "records carry None there (1: after every stage)",
                              range=("int", 1, None, True, False))
    delta: float = setting(0.01, "trust-region radius δ_i for every agent (TeamTR §5: δ_i = "
                           "0.01)", range=("float", 0.0, None, False, False))
    delta_per_agent: tuple | None = setting(None, "comma-separated per-agent radii δ_j "
                                            "(overrides --delta) [each > 0]", item=float)
    trust_region: str | None = setting(None, "fixed | adaptive (adaptive δ) | none")
    occupancy: str | None = setting(None, "intermediate | stale | resample-every-k | stale+IS")
    resample_k: int = setting(2, "resample-every-k: steps per fresh batch",
                              range=("int", 1, None, True, False))
    correction: str | None = setting(None, "none | happo (HAPPO's M-factor on a stale batch)")
    order: str | None = setting(None, "update order: fixed | reverse | random | greedy "
                                "(default fixed), or a permutation like 2,0,1 (fixed order)")
    fixed_order: tuple | None = setting(None, "the permutation used by order=fixed, comma-"
                                        "separated (default 0..n-1)", item=int)
    n_groups: int = setting(8, "sampled mode: groups (start states / prompts) per rollout, B",
                            range=("int", 1, None, True, False), flag="groups")
    group_size: int = setting(8, "sampled mode: episodes per group, G",
                              range=("int", 1, None, True, False))
    normalize_std: bool = setting(True, "ablation: divide advantages by the group std σ̂",
                                  negate="no-std-norm")
    A_clip: float | None = setting(5.0, "advantage clip A_clip", flag="adv-clip",
                                   range=("float", 0.0, None, False, False),
                                   none_flag="no-adv-clip")
    eps_norm: float = setting(1e-6, "ε_norm in σ̂ = sqrt(mean (R−μ̂)² + ε_norm) (THEORY §6)",
                              range=("float", 0.0, None, False, False))
    eps_w: float = setting(0.2, "ratio-clip ε (PPO clip range; the ε_w of THEORY §6)",
                           range=("float", 0.0, 1.0, False, True))
    beta_init: float = setting(1.0, "initial KL penalty coefficient β (adapted per agent; 0 "
                               "only without a trust region, e.g. --method no-tr: plain GRPO)",
                               range=("float", 0.0, None, True, False), flag="beta")
    beta_min: float = setting(1e-4, "lower limit of the adaptive β",
                              range=("float", 0.0, None, False, False))
    beta_max: float = setting(1e8, "upper limit of the adaptive β",
                              range=("float", 0.0, None, False, False))
    beta_growth: float = setting(2.0, "β multiplier per backtrack (and divisor when δ̂ < δ/4)",
                                 range=("float", 1.0, None, False, False))
    step_shrink: float = setting(0.5, "step-size multiplier per backtrack",
                                 range=("float", 0.0, 1.0, False, True))
    max_backtracks: int = setting(12, "backtracks before a step counts as out of region",
                                  range=("int", 0, None, True, False))
    on_violation: str = setting("reject", "out-of-region step after all backtracks: reject | "
                                "flag")
    delta_up: float = setting(1.5, "adaptive δ: multiplier when the gain ratio ρ ≥ 0.5",
                              range=("float", 1.0, None, True, False))
    delta_down: float = setting(0.5, "adaptive δ: multiplier when ρ < 0.25",
                                range=("float", 0.0, 1.0, False, True))
    delta_min: float = setting(1e-5, "adaptive δ: lower limit",
                               range=("float", 0.0, None, False, False))
    delta_max: float = setting(0.5, "adaptive δ: upper limit",
                               range=("float", 0.0, None, False, False))
    delta_conf: float = setting(0.05, "confidence level δ_conf of the empirical certificate",
                                range=("float", 0.0, 1.0, False, False))
    seed: int = setting(0, "seed of rollouts and the algorithm",
                        range=("int", 0, None, True, False))
    # plug-and-play (THEORY §5)
    swap_stage: int | None = setting(None, "plug-and-play: replace an agent before this stage "
                                     "(< --stages)", range=("int", 0, None, True, False))
    swap_agent: int = setting(0, "plug-and-play: the agent replaced (< --agents)",
                              range=("int", 0, None, True, False))
    swap_kind: str = setting("stronger", "plug-and-play: the new agent: stronger | random")
    swap_strategy: str = setting("stage0", "plug-and-play: direct | stage0 | retrain")
    stage0_form: str = setting("distill", "Stage-0 form: distill (TeamTR) | project (SAT)")
    delta_align: float | None = setting(None, "Stage-0 radius δ_align (default: the agent's δ)",
                                        range=("float", 0.0, None, False, False))

    def __post_init__(self):
        if self.method not in METHODS:
            raise InputError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        preset = METHODS[self.method]
        if isinstance(self.order, str) and self.order not in ORDERS:
            self._order_permutation()
        for k in ("occupancy", "trust_region", "correction", "order"):
            if getattr(self, k) is None:
                setattr(self, k, preset.get(k, "fixed" if k == "order" else None))
        _choice("order", self.order, ORDERS)
        _choice("occupancy", self.occupancy, OCCUPANCIES)
        _choice("trust_region", self.trust_region, TRUST_REGIONS)
        _choice("correction", self.correction, CORRECTIONS)
        _choice("on_violation", self.on_violation, ("reject", "flag"))
        _choice("swap_kind", self.swap_kind, ("stronger", "random"))
        _choice("swap_strategy", self.swap_strategy, ("direct", "stage0", "retrain"))
        _choice("stage0_form", self.stage0_form, ("distill", "project"))
        for name, spec in RANGES.items():
            check_range(name, getattr(self, name), spec)
        if self.delta_per_agent is not None:
            self.delta_per_agent = tuple(self.delta_per_agent)
            for d in self.delta_per_agent:
                check_range("delta_per_agent", d, RANGES["delta"])
            self.delta_per_agent = tuple(float(d) for d in self.delta_per_agent)
        if self.beta_init == 0 and self.trust_region != "none":  # β = 0 could never grow
            raise InputError("beta 0 needs --trust-region none (e.g. --method no-tr); the trust "
                             "region adapts β by factors, so it must start above 0")
        if self.beta_min > self.beta_max:
            raise InputError(f"beta_min {self.beta_min} exceeds beta_max {self.beta_max}")
        if self.delta_min > self.delta_max:
            raise InputError(f"delta_min {self.delta_min} exceeds delta_max {self.delta_max}")
        if self.swap_stage is not None and self.swap_stage >= self.stages:
            raise InputError(f"swap_stage {self.swap_stage} is not a stage of this run "
                             f"(stages 0..{self.stages - 1}); the swap would never happen")
        if self.fixed_order is not None:
            self.fixed_order = tuple(int(x) for x in self.fixed_order)
        if self.eval_every > 1 and self.trust_region == "adaptive":
            raise InputError("eval_every > 1 cannot go with adaptive δ (trust_region adaptive "
                             "evaluates the team after every step)")

    def _order_permutation(self) -> None:
        """``order="2,0,1"`` (the ``--order`` flag's permutation form): a fixed order."""
        try:
            perm = tuple(int(x) for x in self.order.split(","))
        except ValueError:
            raise InputError(f"--order must be one of {', '.join(ORDERS)} or a permutation like "
                             f"2,0,1, got {self.order!r}") from None
        self.order, self.fixed_order = "fixed", perm

    def evaluates_at(self, k: int) -> bool:
        """Whether the held-out score is measured after ``k`` stages (``eval_every``)."""
        return k == 0 or k % self.eval_every == 0 or k == self.stages

    def to_dict(self) -> dict:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = list(v)
        return d

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in fields(cls)}

    @classmethod
    def from_args(cls, args, n_agents: int | None = None,
                  defaults: dict | None = None) -> TrainConfig:
        """The configuration of parsed settings ``args`` (anything with the flags' names as
        attributes, :func:`sat_theory.config_file.from_args`): a setting not given takes
        ``defaults`` (a backend's), else the field's default; with ``n_agents`` the
        team-size rules are checked too (:meth:`check_team`)."""
        cfg = cls(**from_args(cls, args, defaults=defaults))
        if n_agents is not None:
            cfg.check_team(n_agents)
        return cfg

    def check_team(self, n: int) -> None:
        """The rules that need the team size ``n``: the order is a permutation of the agents,
        one radius per agent, the swapped agent exists."""
        if self.fixed_order is not None and sorted(self.fixed_order) != list(range(n)):
            raise InputError(f"--order {','.join(map(str, self.fixed_order))} is not a "
                             f"permutation of the agents 0..{n - 1}")
        if self.delta_per_agent is not None and len(self.delta_per_agent) != n:
            raise InputError(f"--delta-per-agent has {len(self.delta_per_agent)} entries for "
                             f"{n} agents")
        if not self.swap_agent < n:
            raise InputError(f"--swap-agent {self.swap_agent} is not an agent index in "
                             f"[0, {n - 1}]")

    def radius(self, agent: int) -> float:
        if self.delta_per_agent is not None:
            if agent >= len(self.delta_per_agent):
                raise InputError(f"delta_per_agent has {len(self.delta_per_agent)} entries; "
                                 f"agent {agent} has none")
            return self.delta_per_agent[agent]
        return float(self.delta)


#: valid values of the numeric fields (from the fields' ``range``): (kind, low, high, low
#: included, high included); None fields (A_clip, swap_stage, delta_align) may also be None
RANGES: dict[str, tuple] = {f.name: f.metadata["range"] for f in fields(TrainConfig)
                            if f.metadata.get("range") is not None}


def _choice(name, value, allowed):
    if value not in allowed:
        raise InputError(f"unknown {name} {value!r}; choose one of {', '.join(allowed)}")


# ------------------------------------------------------------------ pure functions
def sampled_surrogate(gamma: float, t: np.ndarray, logp_now: np.ndarray, logp_beh: np.ndarray,
                      reward_to_go: np.ndarray, n_episodes: int,
                      weights: np.ndarray | None = None) -> float:
    """``L̂ = (1/N) Σ_turns w · γ^t (r_t − 1) G_t`` with ``r_t = exp(logp_now − logp_beh)``.

    Unbiased for ``L = 1/(1−γ) E_{s∼d_beh} E_{a∼π_now} A^{beh}(s,a)`` (up to horizon
    truncation): ``E[(r−1) b(s)] = 0`` for any baseline and ``E[G_t | s_t, a_t] = Q(s_t,a_t)``.
    ``weights`` (per turn, e.g. trajectory importance weights) default to 1. ``γ ≥ 1``: no
    discounting (episodic scores).
    """
    if n_episodes <= 0:
        return 0.0
    disc = np.ones_like(reward_to_go) if gamma >= 1 else np.power(gamma, t.astype(np.float64))
    terms = disc * np.expm1(logp_now - logp_beh) * reward_to_go
    if weights is not None:
        terms = terms * weights
    return float(terms.sum() / n_episodes)


def ess_fraction(weights: np.ndarray) -> float:
    """``ESS/B = (Σ w)² / (B Σ w²)`` of importance weights (1 when all are equal)."""
    w = np.asarray(weights, dtype=np.float64)
    if w.size == 0:
        return float("nan")
    s2 = float(w @ w)
    return float(w.sum() ** 2 / (w.size * s2)) if s2 > 0 else 0.0


def trajectory_log_weights(n_episodes: int, episode_idx: list[np.ndarray],
                           log_ratios: list[np.ndarray]) -> np.ndarray:
    """Per-episode ``log w(τ) = Σ_{updated agents k} Σ_{turns of k in τ} log(π_k^now/π_k^beh)``.

    ``episode_idx[m]``/``log_ratios[m]``: per-turn arrays of one updated agent.
    """
    out = np.zeros(n_episodes)
    for e, lr in zip(episode_idx, log_ratios, strict=True):
        np.add.at(out, e, lr)
    return out


def happo_log_factors(target_episode: np.ndarray, target_t: np.ndarray,
                      episode_idx: list[np.ndarray], t_idx: list[np.ndarray],
                      log_ratios: list[np.ndarray]) -> np.ndarray:
    """HAPPO's ``log M`` per turn of the agent being updated: the sum of the log-ratios
    ``log(π_k^now/π_k^beh)`` of the agents ``k`` already updated in this stage at the same
    (episode, step) — agents acting simultaneously with it (HARL's per-sample factor). In a
    turn-taking game no other agent acts at the same step, so ``M = 1``."""
    out = np.zeros(target_episode.shape[0])
    if out.size == 0 or not episode_idx:
        return out
    T = int(max([target_t.max(initial=0)] + [t.max(initial=0) for t in t_idx])) + 1
    key = target_episode * T + target_t
    table: dict[int, float] = {}
    for e, t, lr in zip(episode_idx, t_idx, log_ratios, strict=True):
        for k, v in zip((e * T + t).tolist(), lr.tolist(), strict=True):
            table[k] = table.get(k, 0.0) + v
    return np.array([table.get(k, 0.0) for k in key.tolist()])


def empirical_certificate(L_hat, delta_hat, zeta, N, gamma: float, A_max: float,
                          A_clip: float, eps_w: float, delta_conf: float) -> float | None:
    """TeamTR Thm E.10 (THEORY §6) via :func:`sat_theory.estimators.empirical_stage_bound`:
    ``Σ L̂_i − c Σ √δ_i − Σ ζ_i/(1−γ) − Σ (1+ε_w) A_clip/(1−γ) √(2 log(2n/δ_conf)/N_i)
    − Σ A_clip/(1−γ) √(2δ_i)``; ``None`` when ``γ ≥ 1``."""
    if gamma >= 1:
        return None
    return empirical_stage_bound(L_hat, np.maximum(delta_hat, 0.0), np.maximum(N, 1),
                                 gamma=gamma, A_max=A_max, A_clip=A_clip, eps_w=eps_w,
                                 delta_conf=delta_conf, zeta=zeta)


def empirical_certificate_sat(L_hat, delta_hat, zeta, N, gamma: float, A_max: float,
                              delta_conf: float) -> float | None:
    """The stage bound minus SAT's finite-sample term ``Σ A_max/(1−γ) √(log(2n/δ_conf)/(2N_i))``
    (:func:`sat_theory.estimators.sat_finite_sample_term`); ``None`` when ``γ ≥ 1``."""
    if gamma >= 1:
        return None
    return stage_lower_bound(L_hat, delta_hat, zeta, gamma, A_max) - sat_finite_sample_term(
        np.maximum(N, 1), gamma=gamma, A_max=A_max, delta_conf=delta_conf)


def choose_order(kind: str, n: int, rng: np.random.Generator, fixed: tuple | None = None) -> list[int]:
    """The stage's update order for the data-independent kinds (greedy is decided per step)."""
    base = list(fixed) if fixed is not None else list(range(n))
    if kind == "fixed":
        return base
    if kind == "reverse":
        return base[::-1]
    if kind == "random":
        return [int(x) for x in rng.permutation(n)]
    raise ValueError(kind)


# ------------------------------------------------------------------ run state
@dataclass
class RunState:
    """What the algorithm carries across stages (and what a resumable backend must save):
    per-agent ``beta`` and ``delta``, the order RNG, counters."""

    beta: list[float]
    delta: list[float]
    rng: np.random.Generator
    stage: int = 0
    rollouts: int = 0
    episodes: int = 0

    @classmethod
    def initial(cls, cfg: TrainConfig, n_agents: int) -> RunState:
        cfg.check_team(n_agents)
        return cls(beta=[float(cfg.beta_init)] * n_agents,
                   delta=[cfg.radius(j) for j in range(n_agents)],
                   rng=np.random.default_rng(cfg.seed))

    def to_dict(self) -> dict:
        """JSON-able form (the RNG as its bit-generator state) for checkpoints."""
        return dict(beta=list(self.beta), delta=list(self.delta), stage=self.stage,
                    rollouts=self.rollouts, episodes=self.episodes,
                    rng=self.rng.bit_generator.state)

    @classmethod
    def from_dict(cls, d: dict) -> RunState:
        rng = np.random.default_rng()
        rng.bit_generator.state = d["rng"]
        return cls(beta=list(d["beta"]), delta=list(d["delta"]), rng=rng, stage=d["stage"],
                   rollouts=d["rollouts"], episodes=d["episodes"])


@dataclass
class _Update:
    """One agent's trust-region update (:meth:`_Stage._trust_region_update`)."""

    beta: float
    scale: float = 1.0
    backtracks: int = 0
    rejected: bool = False
    out_of_region: bool = False
    upd: dict = field(default_factory=dict)
    klr: dict = field(default_factory=dict)
    kl: float = 0.0


@dataclass
class _StepResult:
    agent: int
    record: dict
    after: Any  # snapshot of the agent after the step
    beta: float
    logp: np.ndarray | None  # the agent's final per-turn log-probs on the batch


def _advantage_stats(batch: Batch, cfg: TrainConfig) -> tuple[np.ndarray, dict]:
    """Per-episode training advantages and the ζ̂ proxies of THEORY §6 for them."""
    R, g = batch.returns, batch.groups
    adv = group_advantages(R, g, eps_norm=cfg.eps_norm, A_clip=cfg.A_clip,
                           normalize_std=cfg.normalize_std)
    raw = group_advantages(R, g, eps_norm=cfg.eps_norm, A_clip=None,
                           normalize_std=cfg.normalize_std)
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    mu = np.bincount(inv, weights=R) / counts
    stats = dict(
        reward_mean=float(R.mean()) if R.size else None,
        # Corollary E.2: the group-mean baseline biases R_g − μ̂ by (R_g − μ)/G; proxy |R_g − μ̂|/G
        zeta_norm=float(np.mean(np.abs(R - mu[inv]) / counts[inv])) if R.size else 0.0,
        # Lemma E.3: |E clip(Z) − E Z| ≤ E[|Z| 1{|Z| > A_clip}] (empirical moment)
        zeta_clip=(float(np.mean(np.abs(raw) * (np.abs(raw) > cfg.A_clip)))
                   if cfg.A_clip is not None and R.size else 0.0),
        adv_clip_frac=(float(np.mean(np.abs(raw) > cfg.A_clip))
                       if cfg.A_clip is not None and R.size else 0.0),
    )
    return adv, stats


class _Stage:
    """The mutable bookkeeping of one stage (kept together so greedy trials can share it)."""

    def __init__(self, team: Team, cfg: TrainConfig, state: RunState, stage: int):
        self.team, self.cfg, self.state, self.stage = team, cfg, state, stage
        self.n = team.n_agents
        self.start = [team.snapshot(j) for j in range(self.n)]
        self.batch: Batch | None = None
        self.expected_versions: tuple | None = None
        self.adv: np.ndarray | None = None
        self.adv_stats: dict = {}
        # agents updated since self.batch was drawn: agent -> (episode idx, t, log-ratio)
        self.updated: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def fresh(self):
        cfg = self.cfg
        # the parameter versions the batch must come from: the team's now (for intermediate
        # occupancy these are the updated predecessors); checked before every update on it
        self.expected_versions = self.team.version if isinstance(self.team, Versioned) else None
        self.batch = self.team.rollout(cfg.n_groups, cfg.group_size)
        self.state.rollouts += 1
        self.state.episodes += self.batch.n_episodes
        self.updated = {}
        if self.batch.exact:
            self.adv, self.adv_stats = None, {}
        else:
            self.adv, self.adv_stats = _advantage_stats(self.batch, cfg)

    def resume_from(self, position: dict) -> tuple:
        """Continue from ``run_stage``'s resume point ``position``: the stage-start
        snapshots, the batch in use and its weights' log-ratios, the adaptive-δ reference;
        returns ``(J_before, completed steps, order, their records)``."""
        self.start = list(position["start"])
        self.J_last = None if position["J_last"] is None else float(position["J_last"])
        if position["batch"] is not None:
            self.batch = position["batch"]
            self.adv, self.adv_stats = ((None, {}) if self.batch.exact
                                        else _advantage_stats(self.batch, self.cfg))
            self.updated = dict(position["updated"])
        J_before = None if position["J_before"] is None else float(position["J_before"])
        return J_before, int(position["step"]), list(position["order"]), list(position["steps"])

    def needs_fresh(self, i: int) -> bool:
        occ = self.cfg.occupancy
        if self.batch is None or occ == "intermediate":
            return True
        if occ == "resample-every-k":
            return i % self.cfg.resample_k == 0
        return False  # stale, stale+IS

    # -------------------------------------------------------------- one agent step
    def step(self, i: int, j: int) -> _StepResult:
        """Step ``i`` of the stage, for agent ``j``: weights, the trust-region update, the
        surrogate estimate, the record (module docstring, items 2–3)."""
        team, batch = self.team, self.batch
        ref = team.snapshot(j)
        adv, weights, correction, extra = self._step_weights(j)
        if isinstance(team, Versioned):  # LLM teams: stale/unsynced adapters
            team.check_batch(j, batch, ref, expected=self.expected_versions)
        u = self._trust_region_update(j, adv, ref, correction)
        L_hat, logp = self._surrogate(j, u, weights, extra)
        rec = self._step_record(i, j, u, L_hat, correction, extra)
        rec["_ref"] = ref  # popped in commit(): the pre-step snapshot for the exact terms
        return _StepResult(j, rec, team.snapshot(j), u.beta, logp)

    def _step_weights(self, j: int) -> tuple:
        """``(advantages, weights, correction, extra)`` of agent ``j``'s turns: the episode
        advantages times the importance weights of the agents updated since the batch was
        drawn — trajectory weights ``w(τ)`` (stale+IS, with ESS/B and the self-normalized
        weights' max and quantiles in ``extra``) or HAPPO's ``M`` — and, for exact batches,
        the backend's correction (``trajectory`` / ``step``) instead."""
        cfg, batch = self.cfg, self.batch
        extra: dict = {}
        if batch.exact:
            correction = "none"
            if self.updated and cfg.occupancy == "stale+IS":
                correction = "trajectory"
            elif self.updated and cfg.correction == "happo":
                correction = "step"
            return None, None, correction, extra
        ta = batch.arrays(j)
        adv, weights = self.adv[ta.episode], None
        done = list(self.updated.values())  # (episode idx, t, log-ratio) per updated agent
        if done and cfg.occupancy == "stale+IS":
            w_ep = np.exp(trajectory_log_weights(batch.n_episodes, [u[0] for u in done],
                                                 [u[2] for u in done]))
            extra["ess"] = ess_fraction(w_ep)
            wn = w_ep / max(w_ep.mean(), 1e-300)  # self-normalized weights
            extra["w_max"] = float(wn.max())
            extra["w_p95"], extra["w_p99"] = (float(q) for q in np.quantile(wn, [0.95, 0.99]))
            weights = w_ep[ta.episode]
        elif done and cfg.correction == "happo":
            weights = np.exp(happo_log_factors(ta.episode, ta.t, [u[0] for u in done],
                                               [u[1] for u in done], [u[2] for u in done]))
            extra["m_factor_mean"] = float(weights.mean()) if weights.size else 1.0
        if weights is not None:
            adv = adv * weights
        return adv, weights, "none", extra

    def _trust_region_update(self, j: int, adv, ref, correction: str) -> _Update:
        """``team.update`` at penalty ``β``, then ``δ̂ = team.kl``; while ``δ̂ > δ_j``:
        restore, ``β ← min(β·beta_growth, beta_max)``, step ``× step_shrink`` (at most
        ``max_backtracks`` times; then out of region: rejected or flagged). After a step well
        inside (``δ̂ < δ_j/4``) ``β`` relaxes (``÷ beta_growth``, at least ``beta_min``)."""
        team, cfg, batch = self.team, self.cfg, self.batch
        delta_i = self.state.delta[j]
        u = _Update(beta=self.state.beta[j])
        while True:
            u.upd = team.update(j, batch, adv, u.beta, ref, step_scale=u.scale,
                                correction=correction)
            u.klr = team.kl(j, batch, ref)
            u.kl = float(u.klr["kl"])
            if cfg.trust_region == "none" or u.kl <= delta_i:
                break
            if u.backtracks >= cfg.max_backtracks:
                u.out_of_region = True
                break
            team.restore(j, ref)
            u.backtracks += 1
            u.beta = min(u.beta * cfg.beta_growth, cfg.beta_max)
            u.scale *= cfg.step_shrink
        if u.out_of_region and cfg.on_violation == "reject":
            team.restore(j, ref)
            u.rejected = True
            u.klr = team.kl(j, batch, ref)
            u.kl = float(u.klr["kl"])
        if cfg.trust_region != "none" and not u.out_of_region and u.kl < delta_i / 4:
            u.beta = max(u.beta / cfg.beta_growth, cfg.beta_min)
        return u

    def _surrogate(self, j: int, u: _Update, weights, extra: dict) -> tuple:
        """``(L̂, logp)``: the exact surrogate of an exact batch, else :func:`sampled_surrogate`
        of the agent's current log-probs ``logp``; in ``extra`` the ratio-clip fraction and
        ``ζ_ratio = A_clip √(2 δ̂)`` (Lemma E.6: the ratio-clipping bias)."""
        cfg, batch = self.cfg, self.batch
        if batch.exact:
            return float(u.klr["surrogate"]), None
        logp = np.asarray(u.klr["logp"], dtype=np.float64)
        ta = batch.arrays(j)
        L_hat = sampled_surrogate(float(self.team.gamma), ta.t, logp, ta.logp, ta.reward_to_go,
                                  batch.n_episodes, weights=weights)
        lr = logp - ta.logp
        extra["ratio_clip_frac"] = u.upd.get(
            "ratio_clip_frac", float(np.mean(np.abs(np.expm1(lr)) > cfg.eps_w)) if lr.size else 0.0)
        extra["zeta_ratio"] = (cfg.A_clip if cfg.A_clip is not None else 1.0) * math.sqrt(
            2 * max(u.kl, 0.0))
        return L_hat, logp

    def _step_record(self, i: int, j: int, u: _Update, L_hat: float, correction: str,
                     extra: dict) -> dict:
        """The ``"step"`` record (:mod:`sat_theory.metrics`); exact terms are added in
        :meth:`commit`, backend fields here (:class:`~sat_theory.team.ReportsMetrics`)."""
        batch, gamma, st = self.batch, float(self.team.gamma), self.adv_stats
        zeta_trunc = float(batch.extra.get("truncation_bias", 0.0)) if not batch.exact else 0.0
        rec = dict(
            kind="step", stage=self.stage, step=i + 1, agent=j, rollout_id=batch.rollout_id,
            beta=u.beta, delta_i=self.state.delta[j], kl=u.kl,
            kl_max=float(u.klr.get("kl_max", float("nan"))),
            surrogate=L_hat, backtracks=u.backtracks, rejected=u.rejected,
            out_of_region=bool(u.out_of_region and not u.rejected), step_scale=u.scale,
            correction=correction, n_episodes=None if batch.exact else batch.n_episodes,
            reward_mean=st.get("reward_mean"), adv_clip_frac=st.get("adv_clip_frac"),
            ratio_clip_frac=extra.get("ratio_clip_frac", u.upd.get("ratio_clip_frac")),
            zeta_norm=st.get("zeta_norm"), zeta_clip=st.get("zeta_clip"),
            zeta_ratio=extra.get("zeta_ratio"), zeta_trunc=zeta_trunc,
            # L̂ is unbiased but for the horizon truncation (module docstring)
            zeta=zeta_trunc * (1 - gamma) if gamma < 1 else 0.0,
            ess=extra.get("ess", u.upd.get("ess")), w_max=extra.get("w_max"),
            w_p95=extra.get("w_p95"), w_p99=extra.get("w_p99"),
            m_factor_mean=extra.get("m_factor_mean"),
        )
        for k in ("L_seq", "L_stale", "delta", "delta_max", "tv", "A_max", "f_inf", "true_gain"):
            rec[k] = None
        if isinstance(self.team, ReportsMetrics):  # backend fields (e.g. LLM tokens, loss)
            rec.update(self.team.step_metrics(j, batch, u.upd, u.klr))
        return rec

    def commit(self, res: _StepResult):
        """Bookkeeping after the kept step of agent ``res.agent``."""
        j, batch = res.agent, self.batch
        self.state.beta[j] = res.beta
        if not batch.exact and res.logp is not None:
            ta = batch.arrays(j)
            self.updated[j] = (ta.episode, ta.t, res.logp - ta.logp)
        elif batch.exact:
            self.updated[j] = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        if isinstance(self.team, SupportsExactTerms):
            ref = res.record.pop("_ref")
            res.record.update(self.team.exact_step_terms(j, ref, self.start,
                                                         delta_i=res.record["delta_i"]))
        else:
            res.record.pop("_ref", None)
        if self.cfg.trust_region == "adaptive":
            self._adapt_delta(res)

    def _adapt_delta(self, res: _StepResult) -> None:
        """Classical trust-region radius update from the agreement ratio
        ``ρ = (score after − score before) / L̂`` (one ``team.evaluate()`` per step):
        ``ρ ≥ 0.5`` → ``δ·delta_up``; ``ρ < 0.25`` or ``L̂ ≤ 0`` → ``δ·delta_down``."""
        r, j, cfg = res.record, res.agent, self.cfg
        J_now = float(self.team.evaluate())
        actual = J_now - self.J_last
        self.J_last = J_now
        if r["rejected"]:
            return
        rho = actual / r["surrogate"] if r["surrogate"] > 0 else -math.inf
        r["rho"] = rho if math.isfinite(rho) else None
        f = cfg.delta_up if rho >= 0.5 else (cfg.delta_down if rho < 0.25 else 1.0)
        self.state.delta[j] = float(min(max(self.state.delta[j] * f, cfg.delta_min),
                                        cfg.delta_max))



#: ``run_stage(J_before=MEASURE)``: the stage measures its own starting score
MEASURE = object()


def run_stage(team: Team, cfg: TrainConfig, state: RunState, *,
              log: Callable[[dict], None] | None = None,
              on_step: Callable[[dict, dict], None] | None = None,
              resume: dict | None = None, J_before: float | None | object = MEASURE,
              evaluate_after: bool = True) -> dict:
    """One stage: every agent updated once (module docstring). Returns the stage record.

    ``log(record)`` receives every step record and then the stage record (the caller writes
    them). ``on_step(record, position)`` is called after each agent step (after ``log``)
    with the stage's resume point: ``position`` holds the completed ``step`` count, the
    ``order`` so far (plus the planned rest for data-independent orders), the completed
    ``steps``' records, the stage-start snapshots ``start``, the ``batch`` in use (``None``
    when the next step draws a fresh one), the importance-weight log-ratios ``updated`` of
    the agents updated since that batch was drawn, ``J_before`` and the adaptive-δ reference
    score ``J_last``. ``resume=position`` continues the stage from there; with the team
    restored to the same state the rest of the stage is exactly the uninterrupted one's.
    ``state.stage`` numbers the stage and is incremented at the end.

    ``J_before``: the held-out score the stage starts from when the caller knows it (the
    runner: the previous stage's ``J_after``; ``None``: not measured, ``eval_every``);
    default: ``team.evaluate()`` now. ``evaluate_after=False`` skips the stage's closing
    ``team.evaluate()``: the record's ``J_after`` is then ``None``.
    """
    log = log or (lambda r: None)
    n = team.n_agents
    st = _Stage(team, cfg, state, state.stage)
    J_before, first, order, steps = _stage_start(st, resume, J_before)
    done: list[int] = list(order[:first])
    for i in range(first, n):
        if st.needs_fresh(i):
            st.fresh()
        if cfg.order == "greedy":
            res = _greedy_step(st, i, [j for j in range(n) if j not in done])
            order = done + [res.agent]
        else:
            res = st.step(i, order[i])
        st.commit(res)
        done.append(res.agent)
        steps.append(res.record)
        log(res.record)
        if on_step is not None:
            on_step(res.record, _position(st, i + 1, order, steps, J_before))
    rec = _stage_record(st, order[:n], steps, J_before, evaluate_after)
    log(rec)
    state.stage += 1
    return rec


def _stage_start(st: _Stage, resume: dict | None, J_before) -> tuple:
    """``(J_before, first step, order, step records so far)`` of a stage. Fresh: ``J_before``
    is measured (``team.evaluate()``) when the caller did not pass it, or passed ``None``
    with adaptive δ (which compares every step with it); the order is drawn now unless
    greedy (chosen step by step); nothing done yet. Resumed: the saved position
    (:meth:`_Stage.resume_from`)."""
    cfg, n = st.cfg, st.team.n_agents
    if resume is not None:
        return st.resume_from(resume)
    if J_before is MEASURE or (J_before is None and cfg.trust_region == "adaptive"):
        J_before = float(st.team.evaluate())
    order: list[int] = ([] if cfg.order == "greedy"
                        else choose_order(cfg.order, n, st.state.rng, cfg.fixed_order))
    st.J_last = J_before
    return J_before, 0, order, []


def _position(st: _Stage, step: int, order, steps, J_before) -> dict:
    """The resume point after ``step`` completed agent steps (``run_stage``'s ``on_step``):
    the batch and the log-ratios of the agents updated since it was drawn are kept only
    when the next step reuses them (not with ``occupancy="intermediate"``, not after the
    last agent)."""
    keep = st.cfg.occupancy != "intermediate" and step < st.team.n_agents
    return dict(step=step, order=list(order), steps=list(steps), start=st.start,
                batch=st.batch if keep else None, updated=dict(st.updated) if keep else {},
                J_before=J_before, J_last=st.J_last)


def _greedy_step(st: _Stage, i: int, remaining: list[int]) -> _StepResult:
    """Trial step of every remaining agent on the same batch; keep the largest ``L̂``."""
    team = st.team
    best: _StepResult | None = None
    betas = list(st.state.beta)
    for j in remaining:
        ref = team.snapshot(j)
        res = st.step(i, j)
        team.restore(j, ref)
        st.state.beta[:] = betas
        if best is None or res.record["surrogate"] > best.record["surrogate"]:
            best = res
    team.restore(best.agent, best.after)
    best.record["greedy_candidates"] = list(remaining)
    return best


def _stage_record(st: _Stage, order: list[int], steps: list[dict], J_before: float | None,
                  evaluate_after: bool = True) -> dict:
    """The ``"stage"`` record (:mod:`sat_theory.metrics`): scores before and after, the
    stage bound (exact or estimated), the empirical certificates, counts, backend fields."""
    team, cfg = st.team, st.cfg
    J_after = float(team.evaluate()) if evaluate_after else None
    rec: dict = dict(kind="stage", stage=st.stage, order=list(order), method=cfg.method,
                     J_before=J_before, J_after=J_after)
    L_hat = [s["surrogate"] for s in steps]
    d_hat = [s["kl"] for s in steps]
    z_hat = [s["zeta"] or 0.0 for s in steps]
    if isinstance(team, SupportsExactTerms):
        A_max = _exact_bound(rec, team.exact_stage_terms(st.start, order))
    else:
        A_max = _estimated_bound(rec, team, L_hat, d_hat, z_hat)
    rec["surrogate_sum"] = float(np.sum(L_hat))
    rec["kl_sum_sqrt"] = float(np.sum(np.sqrt(np.maximum(d_hat, 0.0))))
    _empirical_terms(rec, cfg, steps, L_hat, d_hat, z_hat, float(team.gamma), A_max)
    rec["rejected_steps"] = int(sum(bool(s["rejected"]) for s in steps))
    rec["out_of_region_steps"] = int(sum(bool(s["out_of_region"]) for s in steps))
    rec["rollouts"] = st.state.rollouts
    rec["episodes"] = st.state.episodes
    if isinstance(team, ReportsMetrics):  # backend fields (e.g. LLM eval_accuracy)
        rec.update(team.stage_metrics(rec))
    return rec


def _exact_bound(rec: dict, exact: dict) -> float:
    """The backend's exact stage certificate into ``rec``; returns its ``A_max``."""
    rec.update(true_improvement=exact["true_improvement"], lower_bound=exact["lower_bound"],
               lower_bound_source="exact", A_max=exact["A_max"], c=exact["c"],
               lower_bound_max=exact["lower_bound_max"],
               lower_bound_stale=exact["lower_bound_stale"],
               lower_bound_fnorm=exact["lower_bound_fnorm"],
               lower_bound_tv=exact["lower_bound_tv"], holds=exact["holds"],
               violated=exact["violated"])
    return exact["A_max"]


def _estimated_bound(rec: dict, team, L_hat, d_hat, z_hat) -> float | None:
    """THEORY §4's bound ``Σ L̂_i − c Σ √δ̂_i − Σ ζ̂_i/(1−γ)`` from the stage's own estimates
    with ``A_max = team.advantage_bound`` (``None`` without one or for ``γ ≥ 1``), and
    whether the measured ``J_after − J_before`` clears it; returns ``A_max``."""
    gamma = float(team.gamma)
    A_max = team.advantage_bound if isinstance(team, HasAdvantageBound) else None
    bounded = A_max is not None and gamma < 1
    J_before, J_after = rec["J_before"], rec["J_after"]
    measured = J_after is not None and J_before is not None
    rec.update(true_improvement=J_after - J_before if measured else None,
               lower_bound_source="estimated", A_max=A_max,
               c=penalty_constant(gamma, A_max) if bounded else None,
               lower_bound=stage_lower_bound(L_hat, d_hat, z_hat, gamma, A_max) if bounded else None)
    for k in ("lower_bound_max", "lower_bound_stale", "lower_bound_fnorm", "lower_bound_tv"):
        rec[k] = None
    lb = rec["lower_bound"]
    rec["holds"] = None if lb is None or not math.isfinite(lb) or not measured else bool(
        rec["true_improvement"] >= lb - 1e-9 * (1 + abs(lb)))
    rec["violated"] = [] if rec["holds"] in (None, True) else ["lower_bound"]
    return A_max


def _empirical_terms(rec: dict, cfg: TrainConfig, steps, L_hat, d_hat, z_hat, gamma: float,
                     A_max) -> None:
    """The empirical certificates of sampled stages (THEORY §6; ``None`` otherwise)."""
    sampled = any(s["n_episodes"] is not None for s in steps)
    if not (sampled and A_max is not None and gamma < 1):
        rec["empirical_certificate"] = rec["empirical_certificate_sat"] = None
        rec["lower_bound_estimated"] = rec["empirical_holds"] = None
        return
    N = [s["n_episodes"] or 1 for s in steps]
    A_clip = A_max  # advantages of the certificate's L̂ live in reward units (module doc)
    rec["empirical_certificate"] = empirical_certificate(
        L_hat, d_hat, z_hat, N, gamma, A_max, A_clip, cfg.eps_w, cfg.delta_conf)
    rec["empirical_certificate_sat"] = empirical_certificate_sat(
        L_hat, d_hat, z_hat, N, gamma, A_max, cfg.delta_conf)
    rec["lower_bound_estimated"] = stage_lower_bound(L_hat, d_hat, z_hat, gamma, A_max)
    emp = rec["empirical_certificate"]
    # coverage of the high-probability certificate (meaningful where the improvement is
    # exact, i.e. the tabular world)
    rec["empirical_holds"] = None if emp is None or rec["lower_bound_source"] != "exact" \
        else bool(rec["true_improvement"] >= emp)


# ------------------------------------------------------------------ plug-and-play
def swap_agent(team: Team, cfg: TrainConfig, state: RunState, *, initial: list | None = None) -> dict:
    """Replace ``cfg.swap_agent`` by a new agent (``team.new_agent``) with the configured
    strategy: ``direct`` (swap and go on), ``stage0`` (align the new agent to the old one
    first — THEORY §5, form ``cfg.stage0_form`` — then swap), ``retrain`` (swap, then reset
    every other agent to its initial parameters). Returns the ``"swap"`` record."""
    j = cfg.swap_agent
    if not (0 <= j < team.n_agents):
        raise InputError(f"swap_agent {j} is not an agent index in [0, {team.n_agents - 1}]")
    if not isinstance(team, SupportsSwap):
        raise InputError("this backend cannot build replacement agents (no new_agent)")
    J0 = float(team.evaluate())
    new = team.new_agent(j, cfg.swap_kind, cfg.seed + 7919 * (state.stage + 1))
    rec = dict(kind="swap", stage=state.stage, agent=j, strategy=cfg.swap_strategy,
               swap_kind=cfg.swap_kind, form=cfg.stage0_form if cfg.swap_strategy == "stage0" else None,
               J_before_swap=J0)
    if cfg.swap_strategy == "stage0":
        if not isinstance(team, SupportsAlign):
            raise InputError("this backend has no Stage-0 alignment (no align)")
        d_align = cfg.delta_align if cfg.delta_align is not None else state.delta[j]
        new, info = team.align(j, new, d_align, cfg.stage0_form)
        rec.update({f"align_{k}": v for k, v in info.items()}, delta_align=d_align)
    team.replace(j, new)
    if cfg.swap_strategy == "retrain":
        if not isinstance(team, Resettable):
            raise InputError("this backend cannot reset agents (no reset)")
        team.reset([k for k in range(team.n_agents) if k != j])
        state.beta[:] = [float(cfg.beta_init)] * team.n_agents
    rec["J_after_swap"] = float(team.evaluate())
    rec["swap_shock"] = rec["J_after_swap"] - J0
    return rec
