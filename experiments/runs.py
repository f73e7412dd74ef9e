"""Training runs shared by the run-log studies (training curves, KL distribution, certificate
tracking, certificate vs improvement, stale gap, ablations).

One *run set* = every (variant, seed) pair of a :class:`RunSet`, each trained with the shared
algorithm (:func:`sat_theory.runner.train`) on the tabular backend and written as a run
directory (``config.json`` + ``metrics.jsonl``) under ``OUT/runs/<name>/<variant>_s<seed>``.
The figures read only those files (:mod:`sat_theory.plotting`), exactly as ``sat plot`` does
for any run. A run set is reused when its directory already holds runs of the same
specification (``spec.json``), so the five run-log figures share one set of runs.

Matched rollout budget (TeamTR App. G.1: "we match the per-stage rollout budget by reducing
per-update batch sizes"): every method sees ``budget_groups × group_size`` episodes per stage.
Methods that resample before every agent update (``intermediate`` occupancy: sat, no-tr) draw
``budget_groups / n`` groups per rollout; methods that reuse one stage-start batch (naive,
joint, happo) draw all ``budget_groups`` at once.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd

from sat_theory.algorithm import TrainConfig
from sat_theory.envs import random_mdp
from sat_theory.errors import InputError
from sat_theory.executor import map_tasks
from sat_theory.metrics import RunWriter
from sat_theory.ownership import is_run_set
from sat_theory.plotting import load_runs
from sat_theory.policy import TeamPolicy
from sat_theory.runner import train
from sat_theory.tabular_team import TabularTeam

METHODS = ("sat", "naive", "joint", "no-tr", "happo")


@dataclass
class RunSet:
    """A family of tabular training runs (one random turn-taking MDP, several seeds)."""

    name: str = field(default="main", metadata={"help": "folder under OUT/runs"})
    variants: dict = field(default_factory=lambda: {m: {"method": m} for m in METHODS}, metadata={
        "help": "variant label -> TrainConfig overrides"})
    n_agents: int = field(default=3, metadata={"help": "agents (TeamTR default team: 3)"})
    states_per_agent: int = field(default=6, metadata={"help": "turn-taking states per agent"})
    n_actions: int = field(default=3, metadata={"help": "actions per agent"})
    gamma: float = field(default=0.9, metadata={"help": "discount γ"})
    mdp_seed: int = field(default=0, metadata={"help": "seed of the random MDP (fixed across runs)"})
    mode: str = field(default="sampled", metadata={"help": "tabular backend mode: sampled | exact"})
    stages: int = field(default=30, metadata={"help": "stages per run"})
    delta: float = field(default=0.01, metadata={"help": "per-agent radius δ (TeamTR: 0.01)"})
    budget_groups: int = field(default=24, metadata={"help": "groups (start states) per stage"})
    group_size: int = field(default=8, metadata={"help": "episodes per group G"})
    seeds: int = field(default=3, metadata={"help": "seeds (TeamTR: 3)"})

    def mdp(self):
        n = self.n_agents
        return random_mdp(self.states_per_agent * n, n, self.n_actions, layout="turn",
                          gamma=self.gamma, seed=self.mdp_seed, successors=3)

    def config(self, variant: str, seed: int) -> TrainConfig:
        over = dict(self.variants[variant])
        base = TrainConfig(method=over.get("method", "sat"))
        occupancy = over.get("occupancy", base.occupancy)
        per_rollout = self.budget_groups
        if occupancy == "intermediate":
            per_rollout = max(1, self.budget_groups // self.n_agents)
        elif occupancy == "resample-every-k":
            k = over.get("resample_k", base.resample_k)
            per_rollout = max(1, self.budget_groups * k // self.n_agents)
        kw = dict(stages=self.stages, delta=self.delta, n_groups=per_rollout,
                  group_size=self.group_size, seed=seed)
        kw.update(over)
        return TrainConfig(**kw)


def run_dir(out: Path, rs: RunSet, variant: str, seed: int) -> Path:
    return Path(out) / "runs" / rs.name / f"{variant}_s{seed}"


def ensure_runs(out: Path, rs: RunSet, *, quiet: bool = False, executor: str = "serial",
                workers: int | None = None, ray_address: str | None = None) -> list[Path]:
    """Train every (variant, seed) of ``rs`` unless the same spec's runs are already there.

    The runs are independent, so they go through :func:`sat_theory.executor.map_tasks`
    (serial, a process pool or Ray tasks); each run is a pure function of its (variant,
    seed), so every executor writes the same files.
    """
    root = Path(out) / "runs" / rs.name
    spec = json.dumps(asdict(rs), sort_keys=True, default=str)
    dirs = [run_dir(out, rs, v, s) for v in rs.variants for s in range(rs.seeds)]
    spec_path = root / "spec.json"
    if spec_path.exists() and spec_path.read_text() == spec and all(
            (d / "metrics.jsonl").exists() for d in dirs):
        return dirs
    if root.exists():
        if not is_run_set(root):  # --out may hold a user's folder of that name
            raise InputError(f"{root} exists and is not a run set sat figures wrote; move it away")
        shutil.rmtree(root)  # a stale run set of another spec
    root.mkdir(parents=True)
    jobs = [(str(out), rs, v, s) for v in rs.variants for s in range(rs.seeds)]
    summaries = map_tasks(_train_one, jobs, executor=executor, workers=workers,
                          ray_address=ray_address, ship_modules=(sys.modules[__name__],))
    if not quiet:
        for (_, _, v, s), summary in zip(jobs, summaries, strict=True):
            print(f"  run {rs.name}/{v} seed {s}: J {summary['J_start']:.3f} -> "
                  f"{summary['J_end']:.3f} ({summary['seconds']:.1f} s)", flush=True)
    spec_path.write_text(spec)
    return dirs


def _train_one(job: tuple) -> dict:
    """Train one (variant, seed) of a run set into its run directory; return the summary."""
    out, rs, v, s = job
    mdp = rs.mdp()
    cfg = rs.config(v, s)
    # every method starts from the same random team (per seed), so the seeds vary both the
    # start and the sampling
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 1000 + s), mode=rs.mode, seed=s)
    with RunWriter(run_dir(Path(out), rs, v, s)) as w:
        return train(team, cfg, writer=w, extra_config={
            "variant": v, "seed": s, "method": cfg.method, "delta": cfg.delta,
            "backend": {"name": "tabular", "mode": rs.mode, "mdp": mdp.name}})


def load(out: Path, rs: RunSet) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """``(steps, stages, swaps)`` of a run set; ``method`` holds the variant label."""
    dirs = [run_dir(out, rs, v, s) for v in rs.variants for s in range(rs.seeds)]
    labels = {str(run_dir(out, rs, v, s)): (v, s) for v in rs.variants for s in range(rs.seeds)}
    steps, stages = load_runs(dirs, labels)
    swaps = []
    for d in dirs:
        v, s = labels[str(d)]
        for line in (d / "metrics.jsonl").read_text().splitlines():
            if '"swap"' in line:
                rec = json.loads(line)
                if rec.get("kind") == "swap":
                    swaps.append({**rec, "method": v, "seed": s})
    return steps, stages, pd.DataFrame(swaps)


def trained(out: Path, rs: RunSet, **executor_kwargs) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """:func:`load` of the run set after :func:`ensure_runs` (training what is missing)."""
    ensure_runs(out, rs, **executor_kwargs)
    return load(out, rs)


def main_runset(quick: bool, seeds: int | None) -> RunSet:
    """The run set behind the run-log figures (quick: fewer stages and seeds)."""
    return RunSet(stages=8 if quick else 30, seeds=seeds or (2 if quick else 5))
