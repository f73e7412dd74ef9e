"""A team task where the team matters: ``relay`` (split information) for 2 and 3 agents.

Every agent sees a private part of an arithmetic problem ``x op y`` (:mod:`sat_llm.team_tasks`;
the per-agent views of :mod:`sat_llm.protocol`): with 2 agents agent 1 knows ``y`` and agent 2
(the answerer) ``x`` and ``op``; with 3 agents agent 1 knows ``x``, agent 2 ``y`` and agent 3
(the answerer) ``op``. No single view determines the answer.

Two steps:

``--checks`` (before any study, issue #22): greedy held-out accuracy of untrained SmolLM2-135M
agents on the same ``n_eval`` held-out problems, one configuration after another:

- ``team2``, ``team3``: the untrained team (must score clearly above 0 and below 60 %);
- ``full``: one agent that sees every part (``Compute x op y.``): the upper bound;
- ``view2_k``, ``view3_k``: one agent that sees only part ``k`` of the 2- or 3-way split,
  next to its chance level, the exact accuracy of the Bayes guess from that part
  (:func:`sat_llm.team_tasks.chance_accuracy`) and the Bayes guess's accuracy on the same
  held-out problems.

Each configuration writes ``OUT/checks/<name>.jsonl`` (per-problem records: the prompt, every
agent's message, the final message, lenient and strict scores) and is skipped when its file
exists (resumable); ``OUT/checks.json`` collects the accuracies with Wilson 95% intervals and
the exact commands.

**The study** (issue #22 item 3; ``OUT/study/``), on the rules of the issue-21 common-schedule
study (:mod:`experiments.llm_team_learning`, whose ``StudyConfig``, ``run_ours``, learning-rate
grid and validation size it imports; the peers' run plumbing from :mod:`experiments.peer_runs`):
the methods of :data:`STUDY_METHODS` —
SAT, naive (stale batch), joint, ours-plain (``no-tr``), CoMLRL's MAGRPO
(:mod:`experiments.peer_comlrl`, one turn per agent, views kept private) — for n = 2 and 3,
and the full-view single agent as the reference (its ``n`` is the team size whose budget it
gets). Every run of a team size has the same budget of sampled messages, ``budget`` units of
one n-agent SAT stage (``n² · 32`` messages), and is evaluated after every unit
(:func:`schedule`; CoMLRL at the nearest prompt counts). Runs are named
``n{n}/[tune/]{method}_lr{lr}[_d{δ}]_s{seed}`` (:func:`run_name`; ``_d``: a trust-region radius
other than ``--delta``). Tuning runs (seed 0, every rate of
the grid; CoMLRL also at its default 5e-6) train on the training pool without its first 50
problems and are evaluated on those 50 validation problems; each method's rate is the one with
the best validation AUC (:func:`chosen_lr`), the held-out problems are never used to choose.
Then every method runs at its chosen rate on seeds 0-2. ``--queue`` runs it all, two runs at a
time, each its own process (``--run NAME --resume``, log in ``OUT/study/.logs/``), resumable;
our methods log the upstream drift of item 4 in every step record (:func:`drift_metrics`).
``--report`` writes ``OUT/study/study.md`` and ``summary.json`` (:func:`report`): the tuning
grid, AUC/final/best/drawdown with bootstrap CIs under both scorings, SAT − every other method
paired per seed and over seeds, and the drift-vs-gap relation; cells of missing runs read
"not yet run".

    python experiments/llm_team_task.py --checks
    python experiments/llm_team_task.py --queue                      # the whole study
    python experiments/llm_team_task.py --run n3/tune/naive_lr0.001_s0 --resume
    python experiments/llm_team_task.py --report
    python experiments/llm_team_task.py --method sat --agents 2 --seed 0   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sat_llm.config import LLMConfig  # noqa: E402
from sat_theory.algorithm import METHODS as _ALGO_METHODS  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "figures" / "llm_team_task"

#: pre-study check configurations: name -> (agents, relay task options)
CHECKS = {
    "team2": (2, {}),
    "team3": (3, {}),
    "full": (1, {}),
    "view2_1": (1, dict(parts=2, only=1)),
    "view2_2": (1, dict(parts=2, only=2)),
    "view3_1": (1, dict(parts=3, only=1)),
    "view3_2": (1, dict(parts=3, only=2)),
    "view3_3": (1, dict(parts=3, only=3)),
}

#: settings of the checks (the study's evaluation: greedy, ≤ 16 new tokens), and the study's
#: problems (:func:`study_config`): ``sat train --backend llm``'s defaults (LLMConfig) but
#: the relay task's own operands (``lo``/``hi``/``ops``: its defaults, 243 problems), 120
#: held-out problems (100 + 200 would need 300) and one torch thread (two runs on 2 cores)
CHECK_SETTINGS = dict(model=LLMConfig.model, lo=1, hi=9, ops="+-*", n_train=LLMConfig.n_train,
                      n_eval=120, max_new_tokens=LLMConfig.max_new_tokens,
                      temperature=LLMConfig.temperature, seed=LLMConfig.seed, threads=1)


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``k/n`` (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def bayes_guess(lo: int, hi: int, ops: str, parts: int, part: int):
    """``view -> answer`` of the Bayes guess from part ``part`` of a ``parts``-way split: the
    most frequent answer given the view (ties: the smallest answer)."""
    import itertools
    from collections import Counter

    from sat_llm.team_tasks import SPLITS

    keys = SPLITS[parts][part - 1]
    counts: dict[tuple, Counter] = {}
    for x, y, op in itertools.product(range(lo, hi + 1), range(lo, hi + 1), dict.fromkeys(ops)):
        f = dict(x=x, op=op, y=y)
        counts.setdefault(tuple(f[k] for k in keys), Counter())[{"+": x + y, "-": x - y,
                                                                  "*": x * y}[op]] += 1
    best = {v: min(c, key=lambda a: (-c[a], a)) for v, c in counts.items()}
    return lambda meta: best[tuple(meta[k] for k in keys)]


def check_config(name: str, settings: dict):
    """The :class:`~sat_llm.team.LLMConfig` of check ``name``."""
    agents, opts = CHECKS[name]
    s = settings
    return LLMConfig(model=s["model"], task="relay",
                     task_options=dict(lo=s["lo"], hi=s["hi"], ops=s["ops"], **opts),
                     agents=agents, n_train=s["n_train"], n_eval=s["n_eval"],
                     max_new_tokens=s["max_new_tokens"], temperature=s["temperature"],
                     seed=s["seed"], threads=s["threads"])


def episode_records(team) -> list[dict]:
    """Per-problem records of the team's latest evaluation: ``eval_records`` plus every
    agent's message and the lenient and strict scores."""
    task = team.task
    out = []
    for r, p, (hist, _score) in zip(team.eval_records(), team.eval_set, team.last_eval,
                                    strict=True):
        strict = getattr(task, "strict_score", None)
        out.append(dict(r, meta=p.meta, messages=[list(m) for m in hist],
                        lenient=float(task.score(p, r["final"])),
                        strict=float(strict(p, r["final"])) if strict else None))
    return out


def run_checks(out: Path, settings: dict, names=None) -> dict:
    from sat_llm.team import LLMTeam
    from sat_llm.team_tasks import chance_accuracy

    d = out / "checks"
    d.mkdir(parents=True, exist_ok=True)
    summary = dict(settings=settings, checks={})
    for name in names or CHECKS:
        path = d / f"{name}.jsonl"
        if not path.is_file():
            t0 = time.time()
            team = LLMTeam(check_config(name, settings))
            team.evaluate()
            recs = episode_records(team)
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in recs))
            os.replace(tmp, path)
            print(f"{name}: {time.time() - t0:.0f} s", flush=True)
            del team
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        agents, opts = CHECKS[name]
        row = dict(agents=agents, task_options=opts, n=len(recs), command=command(name, settings))
        for sc in ("lenient", "strict"):
            k = sum(r[sc] == 1.0 for r in recs if r[sc] is not None)
            row[sc] = k / len(recs)
            row[f"{sc}_ci95"] = wilson(k, len(recs))
        if opts.get("only"):
            P, part = opts["parts"], opts["only"]
            ch = chance_accuracy(settings["lo"], settings["hi"], settings["ops"], P, part)
            guess = bayes_guess(settings["lo"], settings["hi"], settings["ops"], P, part)
            row["chance"] = float(ch)
            row["chance_exact"] = str(ch)
            row["bayes_guess_on_these"] = sum(guess(r["meta"]) == r["answer"] for r in recs) / len(recs)
        summary["checks"][name] = row
    (out / "checks.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def command(name: str, settings: dict) -> str:
    """A ``sat train`` command whose stage-0 evaluation (``eval_0.jsonl``) is this check."""
    agents, opts = CHECKS[name]
    s = settings
    flags = [f"--task-option {k}={v}" for k, v in
             dict(lo=s["lo"], hi=s["hi"], ops=json.dumps(s["ops"]), **opts).items()]
    return (f"sat train --backend llm --model {s['model']} --task relay --agents {agents} "
            + " ".join(flags) + f" --n-train {s['n_train']} --n-eval {s['n_eval']} "
            f"--max-new-tokens {s['max_new_tokens']} --temperature {s['temperature']} "
            f"--seed {s['seed']} --threads {s['threads']} --stages 0 --out RUN")


# ------------------------------------------------------------------ drift (issue 22 item 4)
def drift_metrics(team, agent: int, batch, stage_start: list, threshold: float) -> dict:
    """How far the upstream agents of ``agent`` moved within the stage, on ``batch``:

    - ``drift_kl``: per agent ``k`` speaking before ``agent`` (``None`` for the others), the
      mean exact token-sum KL (:mod:`sat_llm.kl`) from ``k``'s stage-start adapter to its
      current one on ``k``'s messages and contexts in ``batch``;
    - ``stale_frac``: the fraction of ``agent``'s training contexts with ``w < threshold``,
      ``w`` the probability ratio of their upstream messages under the current upstream
      agents vs the agents that generated them (:func:`sat_llm.kl.context_log_weights`;
      ``w = 1`` on a fresh batch), and ``stale_logw_mean``, the mean ``log w``.

    Pure measurement: no parameter, optimizer or RNG state changes (the team's KL caches and
    ``last_kl`` are put back)."""
    import numpy as np

    from sat_llm.kl import context_log_weights, upstream_agents
    from sat_llm.team import AgentSnapshot

    up = upstream_agents(batch, agent)
    saved = (team._ref_cache, dict(team.last_kl))
    kls: list = [None] * team.n_agents
    now = {}
    try:
        for k in up:
            ref = AgentSnapshot(k, team._agent_base[k], stage_start[k], None, -1)
            kls[k] = float(team.kl(k, batch, ref)["kl"])
            turns = [t for _, t in batch.turns_of(k)]
            now[k] = [float(np.sum(x)) for x in team._score(k, [t.context.ids for t in turns],
                                                             [t.action for t in turns])]
    finally:
        team._ref_cache, team.last_kl = saved
    logw = context_log_weights(batch, agent, now)
    return dict(drift_kl=kls, drift_upstream=up, stale_threshold=threshold,
                stale_frac=float(np.mean(logw < np.log(threshold))) if logw.size else 0.0,
                stale_logw_mean=float(logw.mean()) if logw.size else 0.0)


def drift_team_class():
    """:class:`sat_llm.team.LLMTeam` with :func:`drift_metrics` in every step record. The
    stage-start adapters are the weights at the first rollout after a stage ended (SAT's
    first rollout of a stage, naive's only one), kept in the checkpoint (``drift_start``) so
    a resumed run logs the same."""
    from sat_llm.kl import STALE_WEIGHT
    from sat_llm.team import LLMTeam

    class DriftTeam(LLMTeam):
        drift_threshold = STALE_WEIGHT

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self._drift_start = None

        def rollout(self, n_groups, group_size):
            if self._drift_start is None:
                self._drift_start = [self._get_weights(j) for j in range(self.n_agents)]
            return super().rollout(n_groups, group_size)

        def stage_metrics(self, record):
            self._drift_start = None  # the next rollout starts the next stage
            return super().stage_metrics(record)

        def step_metrics(self, agent, batch, update, kl):
            rec = super().step_metrics(agent, batch, update, kl)
            rec.update(drift_metrics(self, agent, batch, self._drift_start, self.drift_threshold))
            return rec

        def state_dict(self):
            return dict(super().state_dict(), drift_start=self._drift_start)

        def load_state_dict(self, d):
            super().load_state_dict(d)
            self._drift_start = d.get("drift_start")

    return DriftTeam


def install_drift_logging() -> None:
    """Make ``sat train`` (in this process) build :func:`drift_team_class` teams: the LLM
    backend imports ``LLMTeam`` from :mod:`sat_llm.team` when it builds a team. A study-only
    instrument (two extra scoring passes per upstream agent and step); a run resumed by a
    plain ``sat train --resume`` continues without the drift fields."""
    import sat_llm.team as team_mod

    if not getattr(team_mod.LLMTeam, "_drift_logging", False):
        cls = drift_team_class()
        cls._drift_logging = True
        team_mod.LLMTeam = cls


# ------------------------------------------------------------------ the study (item 3)
#: method -> (sat train flags, runs a team of n agents?); the full-view single agent is the
#: reference (relay with --agents 1 sees every part); comlrl is CoMLRL's MAGRPOTrainer
#: (:mod:`experiments.peer_comlrl`, n agents, n turns)
METHODS = {
    "sat": (["--method", "sat"], True),
    "naive": (["--method", "naive"], True),
    "joint": (["--method", "joint"], True),
    "no-tr": (["--method", "no-tr"], True),
    "single": (["--method", "sat"], False),
}
PEERS = ("comlrl",)
#: the methods with a trust region (its radius δ can be set per run: ``_d{δ}`` in the name)
TRUST_REGION_METHODS = tuple(m for m, (flags, _) in METHODS.items()
                             if _ALGO_METHODS[flags[1]]["trust_region"] != "none")
#: every method of the study, in the order of the tables; the team sizes; the seeds
STUDY_METHODS = ("sat", "naive", "joint", "no-tr", "comlrl", "single")
TEAM_SIZES = (2, 3)
SEEDS = (0, 1, 2)
#: the study's budget per team size, in units of one n-agent SAT stage (n² · 32 sampled
#: messages): what fits issue 22's 30 minutes a run with two runs in parallel, one thread each.
#: From the cost probe (figures/llm_team_task/README.md): an n = 3 unit trained in 780 s at
#: about half a core, so ~400 s on a whole one, plus ~60 s per evaluation of 120 problems;
#: a 2-agent SAT stage of the issue-21 study trained in ~190 s at a load like the study's.
#: n = 3: 3 units ≈ 3·400 + 4·60 s ≈ 24 min; n = 2: 6 units ≈ 6·190 + 7·40 s ≈ 24 min.
STUDY_BUDGETS = {2: 6, 3: 3}
#: the comparisons of the report: SAT − each other method, the first two the issue's
OTHERS = ("naive", "joint", "no-tr", "comlrl", "single")
SCORINGS = ("lenient", "strict")


def messages_per_stage(method: str, n: int, episodes: int) -> int:
    """Sampled messages per stage: a method of intermediate occupancy (SAT, no-tr:
    :data:`sat_theory.algorithm.METHODS`) resamples before each of its ``n`` updates (``n``
    rollouts of ``episodes`` ``n``-message episodes), the stale ones (naive, joint) draw one
    rollout, the single agent's episodes have one message."""
    from sat_theory.algorithm import METHODS

    if method == "single":
        return episodes
    return (n if METHODS[method]["occupancy"] == "intermediate" else 1) * episodes * n


def messages_per_unit(method: str, n: int, cfg) -> int:
    """Sampled messages per stage (ours) or per training prompt (CoMLRL: the tree of
    :func:`experiments.peer_comlrl.messages_per_prompt`)."""
    from experiments.peer_comlrl import messages_per_prompt

    if method == "comlrl":
        return messages_per_prompt(cfg.group_size, n)
    return messages_per_stage(method, n, cfg.prompts * cfg.group_size)


def study_schedule(method: str, n: int, episodes: int, budget: int) -> tuple[int, int]:
    """``(stages, eval_every)`` at ``budget`` units of one ``n``-agent SAT stage (``n² ·
    episodes`` messages), evaluated after every unit: every method sees the same sampled-
    message budget and is evaluated at the same message counts."""
    unit = n * n * episodes
    per = messages_per_stage(method, n, episodes)
    if unit % per:
        raise SystemExit(f"{method}: {per} messages per stage do not divide the unit {unit}")
    return budget * unit // per, unit // per


def with_budget(cfg, n: int):
    """``cfg`` with its budget resolved for team size ``n``: ``cfg.budget``, or the study's
    :data:`STUDY_BUDGETS` ``[n]`` when it is 0 (the default)."""
    from dataclasses import replace

    return cfg if cfg.budget else replace(cfg, budget=STUDY_BUDGETS[n])


def schedule(method: str, n: int, cfg) -> tuple[int, list[int]]:
    """``(units, evaluated units)`` of a run: the stages (ours) or prompts (CoMLRL) at
    ``cfg.budget`` units of ``n² · episodes`` sampled messages, and after which of them the
    held-out evaluation runs: after every unit for ours (:func:`study_schedule`), at the prompt
    count nearest to every unit for CoMLRL (as the issue-21 study's grid)."""
    cfg = with_budget(cfg, n)
    if method != "comlrl":
        stages, every = study_schedule(method, n, cfg.prompts * cfg.group_size, cfg.budget)
        return stages, list(range(every, stages + 1, every))
    unit, per = n * n * cfg.prompts * cfg.group_size, messages_per_unit(method, n, cfg)
    units = max(1, round(cfg.budget * unit / per))
    return units, sorted({min(units, max(1, round(j * unit / per)))
                          for j in range(1, cfg.budget + 1)})


def study_config(**kw):
    """The main learning study's settings (:class:`experiments.llm_team_learning.StudyConfig`)
    on the relay task: its ``train_flags``/``llm_config`` with ``--task relay`` (relay takes
    the same ``lo``/``hi``/``ops`` and validation options as arithmetic)."""
    from dataclasses import dataclass

    from experiments.llm_team_learning import StudyConfig, _f

    @dataclass
    class RelayStudyConfig(StudyConfig):
        budget: int = _f(0, "budget in units of one n-agent SAT stage (n² · prompts · G sampled "
                            "messages); sat and no-tr run this many stages, naive/joint n times as "
                            "many, single n² times; 0: the study's budget of the team size "
                            f"({', '.join(f'n = {k}: {v}' for k, v in STUDY_BUDGETS.items())})")

        def train_flags(self):
            return ["relay" if f == "arithmetic" else f for f in super().train_flags()]

        def llm_config(self, agents, seed):
            from dataclasses import replace

            return replace(super().llm_config(agents, seed), task="relay")

    base = {k: CHECK_SETTINGS[k] for k in ("lo", "hi", "n_train", "n_eval")}
    return RelayStudyConfig(**{**base, **kw})


# ------------------------------------------------------------------ runs, names, the queue
def run_name(n: int, method: str, lr: float, seed: int, tune: bool = False,
             delta: float | None = None) -> str:
    """``n{n}/[tune/]{method}_lr{lr}[_d{δ}]_s{seed}`` (the issue-21 study's names under
    ``n{n}/``; the single agent's ``n`` is the team size whose budget it gets). ``_d{δ}``:
    a trust-region method (:data:`TRUST_REGION_METHODS`) at radius δ instead of the study's
    ``delta``."""
    from experiments.llm_team_learning import run_name as name21

    name = f"n{n}/{name21(method, lr, seed, tune)}"
    if delta is None:
        return name
    head, s = name.rsplit("_s", 1)
    return f"{head}_d{delta:g}_s{s}"


def _number(name: str, what: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SystemExit(f"not a {what} in {name!r}: {text!r}") from None


def _parse(name: str) -> tuple[int, bool, str, float, float | None, int]:
    """``(n, tune, method, lr, δ or None, seed)`` of a run name (:func:`run_name`), or a
    one-line SystemExit."""
    import re

    m = re.fullmatch(r"n([23])/(tune/)?([a-z-]+)_lr([0-9.e+-]+)(?:_d([0-9.e+-]+))?_s(\d+)", name)
    if not m or m.group(3) not in STUDY_METHODS:
        raise SystemExit(f"not a run of the relay study: {name!r} (methods "
                         f"{', '.join(STUDY_METHODS)}, n 2 or 3; e.g. {run_name(2, 'sat', 1e-3, 0)})")
    lr, delta = _number(name, "learning rate", m.group(4)), None
    if m.group(5) is not None:
        if m.group(3) not in TRUST_REGION_METHODS:
            raise SystemExit(f"not a trust-region method in {name!r}: only "
                             f"{', '.join(TRUST_REGION_METHODS)} take a radius _d")
        delta = _number(name, "trust-region radius", m.group(5))
        if not delta > 0:
            raise SystemExit(f"not a trust-region radius in {name!r}: δ must be > 0")
    return int(m.group(1)), bool(m.group(2)), m.group(3), lr, delta, int(m.group(6))


def parse_run(name: str) -> tuple[int, bool, str, float, int]:
    """``(n, tune, method, lr, seed)`` of a run name (:func:`run_name`; its δ:
    :func:`run_delta`)."""
    n, tune, method, lr, _, seed = _parse(name)
    return n, tune, method, lr, seed


def run_delta(name: str) -> float | None:
    """The trust-region radius δ a run name sets (``_d{δ}``), ``None`` when it sets none."""
    return _parse(name)[4]


def _finished(d: Path) -> bool:
    from experiments.llm_team_learning import _finished as finished21

    return finished21(d)


def _train(cfg, method: str, n: int, seed: int, d: Path, resume: bool, extra: dict) -> Path:
    """One run into ``d``: ours through ``sat train`` with drift logging
    (:func:`experiments.llm_team_learning.run_ours`: resumable), CoMLRL through
    :func:`experiments.peer_comlrl.run_study_comlrl` (resumable from its last evaluation), both on
    :func:`schedule`; ``study.json`` gets ``extra``, the schedule and ``n``."""
    from experiments.llm_team_learning import run_ours

    cfg = with_budget(cfg, n)  # the run's study.json and sat train flags get the real budget
    units, at = schedule(method, n, cfg)
    extra = dict(extra, n=n, budget=cfg.budget, schedule=at, load_start=os.getloadavg())
    d.parent.mkdir(parents=True, exist_ok=True)
    if method in PEERS:
        from experiments.peer_comlrl import run_study_comlrl

        return run_study_comlrl(cfg, seed, d, n_prompts=units, eval_at=set(at),
                                meta_extra=extra, n_agents=n)
    flags, team = METHODS[method]
    install_drift_logging()
    return run_ours(cfg, method, seed, d.parent, resume, units, d=d,
                    flags=[*flags, "--agents", str(n if team else 1),
                           "--eval-every", str(at[0])],
                    meta_extra=dict(extra, schedule_every=at[0]))


def run_one(cfg, name: str, root: Path, resume: bool, n_validation: int | None = None) -> Path:
    """One run of the relay study into ``root/name`` (:func:`parse_run`). Tuning runs
    (``tune/``) hold the training pool's first ``n_validation`` problems out
    (:data:`experiments.llm_team_learning.N_VALIDATION` = 50 by default), train on the rest
    and are evaluated on those validation problems; the others train on the whole pool and
    are evaluated on the held-out set, which no tuning run sees. ``study.json`` records the
    load average at start and end and the wall seconds over every session."""
    from dataclasses import replace

    from experiments.llm_team_learning import N_VALIDATION
    from experiments.study_queue import log_name, wall_clock
    from sat_theory.metrics import write_json_atomic

    n, tune, method, lr, delta, seed = _parse(name)
    cfg = replace(cfg, lr=lr, **({} if delta is None else {"delta": delta}))
    if tune:
        v = n_validation or N_VALIDATION
        if cfg.n_train <= v:
            raise SystemExit(f"tuning needs more than {v} training problems, got {cfg.n_train}")
        cfg = replace(cfg, validation=v, heldout="validation", n_train=cfg.n_train - v, n_eval=v)
    d = root / name
    if _finished(d):  # its wall clock and load stay those of the sessions that trained it
        print(f"{d}: finished already")
        return d
    # ours resume from a checkpoint, CoMLRL from its ckpt/ record; a run without one starts again
    from experiments.peer_runs import PEER_CKPT, PEER_CKPT_RECORD

    resumed = ((d / PEER_CKPT / PEER_CKPT_RECORD).is_file() if method in PEERS
               else any(d.glob("checkpoint*")))
    with wall_clock(root / ".logs" / (log_name(name) + ".wall"), resumed) as wall:
        _train(cfg, method, n, seed, d, resume, dict(run=name, lr=lr, tune=tune))
        meta = json.loads((d / "study.json").read_text())
        meta.update(load_end=os.getloadavg(), wall_seconds=wall())
        write_json_atomic(d / "study.json", meta)
    return d


def run_study(method: str, n: int, seed: int, out: Path, resume: bool, budget: int,
              lr: float | None = None, **settings) -> Path:
    """One run into ``out/n{n}/{method}_s{seed}`` at the study's (or the given) learning rate,
    outside the tuning protocol (a quick look; the study itself is :func:`run_one` through
    ``--queue``); ``settings``: :func:`study_config` fields (e.g. a tiny model)."""
    from dataclasses import replace

    cfg = replace(study_config(**settings), budget=budget)
    if lr is not None:
        cfg = replace(cfg, lr=lr)
    return _train(cfg, method, n, seed, out / f"n{n}" / f"{method}_s{seed}", resume,
                  dict(lr=cfg.lr, tune=False))


def chosen_lr(root: Path, n: int, method: str, grid=None, scoring: str = "lenient"):
    """The learning rate of ``method`` at team size ``n`` with the highest validation AUC
    (lenient: the mean accuracy over the evaluations on the validation problems) among its
    seed-0 tuning runs over ``grid`` (default :data:`experiments.llm_team_learning.LR_GRID`;
    CoMLRL also at its default 5e-6; ties: the smaller rate); ``None`` until every one of
    them has finished. Held-out problems are never used."""
    from experiments.llm_team_learning import COMLRL_DEFAULT_LR, LR_GRID, score_matrix
    from experiments.study_metrics import curve_metrics

    grid = tuple(grid or LR_GRID)
    lrs = (*grid, COMLRL_DEFAULT_LR) if method == "comlrl" else grid
    auc = {}
    for lr in lrs:
        d = root / run_name(n, method, lr, 0, tune=True)
        if not _finished(d):
            return None
        auc[lr] = curve_metrics(score_matrix(d, scoring)[1])["auc"]
    return max(sorted(auc), key=lambda lr: auc[lr])


def queue_relay(ns=TEAM_SIZES, seeds=SEEDS, grid=None) -> list[str]:
    """The relay study's queue, in the order it runs: the tuning runs (seed 0, every rate of
    ``grid`` for every method and n; CoMLRL also at its default), then every method at its
    chosen rate on every seed (``n{n}/{m}_lr@_s{s}``: resolved once its tuning runs finished)."""
    from experiments.llm_team_learning import COMLRL_DEFAULT_LR, LR_GRID

    q = []
    for n in ns:
        for lr in grid or LR_GRID:
            q += [run_name(n, m, lr, 0, tune=True) for m in STUDY_METHODS]
        q.append(run_name(n, "comlrl", COMLRL_DEFAULT_LR, 0, tune=True))
    for s in seeds:
        for n in ns:
            q += [f"n{n}/{m}_lr@_s{s}" for m in STUDY_METHODS]
    return q


def resolve(root: Path, entry: str, grid=None) -> str | None:
    """A queue entry's run name: ``n{n}/{m}_lr@_s{s}`` becomes the run at the chosen rate
    once the tuning runs of ``m`` at ``n`` have finished (``None`` before)."""
    if "_lr@_s" not in entry:
        return entry
    head, seed = entry.split("_lr@_s")
    nd, method = head.split("/")
    lr = chosen_lr(root, int(nd[1:]), method, grid)
    return None if lr is None else run_name(int(nd[1:]), method, lr, int(seed))


def settings_argv(cfg) -> list[str]:
    """The command-line flags that give a run process the study settings ``cfg``."""
    from dataclasses import asdict

    return [x for k, v in asdict(cfg).items() for x in (f"--{k.replace('_', '-')}", str(v))]


def queue_command(cfg, root: Path, name: str, n_validation: int | None = None, nice: int = 0,
                  budgets: dict | None = None) -> list[str]:
    """The argv of one queued run: ``--run NAME --resume`` with the settings ``cfg`` (its
    ``budget`` replaced by ``budgets[n]`` for a run of team size ``n`` when given), under
    ``nice -n nice`` if ``nice``."""
    from dataclasses import replace

    n = parse_run(name)[0]
    if budgets and n in budgets:
        cfg = replace(cfg, budget=budgets[n])
    return [*(["nice", "-n", str(nice)] if nice else []), sys.executable,
            str(Path(__file__).resolve()), "--study-dir", str(root), "--run", name,
            "--resume", *settings_argv(cfg),
            *(["--n-validation", str(n_validation)] if n_validation else [])]


def run_relay_queue(cfg, root: Path, jobs: int = 2, ns=TEAM_SIZES, seeds=SEEDS, grid=None,
                    n_validation: int | None = None, poll: float = 10.0, nice: int = 0,
                    budgets: dict | None = None) -> int:
    """The whole study (:func:`queue_relay`), ``jobs`` runs at a time, each its own process
    (:func:`queue_command`: one torch thread, the budget of its team size) with its log in
    ``root/.logs/`` (:func:`experiments.study_queue.run_queue`): finished runs are skipped, a
    killed run resumes (ours from its checkpoint, CoMLRL from its last evaluation), a chosen-rate run
    waits for its tuning runs. Returns 0 when every run finished."""
    from experiments.study_queue import run_queue

    return run_queue(queue_relay(ns, seeds, grid), lambda e: resolve(root, e, grid),
                     lambda name: queue_command(cfg, root, name, n_validation, nice, budgets),
                     lambda name: _finished(root / name), root / ".logs", jobs, poll)


# ------------------------------------------------------------------ the report
def run_meta(d: Path) -> dict:
    return json.loads((d / "study.json").read_text())


def _cfg_of(meta: dict):
    from experiments.llm_team_learning import StudyConfig

    st = meta["study"]
    return study_config(**{k: v for k, v in st.items() if k in StudyConfig.__dataclass_fields__})


def budgets(d: Path) -> dict[int, float]:
    """``{checkpoint k: sampled training messages after it}`` of a run's eval files (``k``
    stages, or prompts for CoMLRL, times :func:`messages_per_unit`)."""
    from experiments.llm_team_learning import score_matrix

    meta = run_meta(d)
    per = messages_per_unit(meta["method"], int(meta["n"]), _cfg_of(meta))
    return {k: float(k * per) for k in score_matrix(d)[0]}


def unit_messages(d: Path) -> int:
    """One budget unit of a run's team size: ``n² · episodes`` sampled messages."""
    meta = run_meta(d)
    cfg = _cfg_of(meta)
    return int(meta["n"]) ** 2 * cfg.prompts * cfg.group_size


def paired(da: Path, db: Path, reps: int = 10000) -> dict:
    """Run ``a`` against run ``b`` (same team size, same seed: the same held-out problems —
    checked) on the checkpoints both have on the unit grid
    (:func:`experiments.study_metrics.common_checkpoints`), under both scorings:
    ``{scoring: compare_runs(...)}`` (AUC/final/best/drawdown… of ``a − b`` with paired
    bootstrap CIs, McNemar of the finals; ``matrices``: the two aligned score matrices) and
    ``checkpoints``."""
    import numpy as np

    from experiments.llm_team_learning import score_matrix
    from experiments.study_metrics import common_checkpoints, compare_runs

    prompts = [[json.loads(x)["prompt"] for x in (d / "eval_0.jsonl").read_text().splitlines()
                if x.strip()] for d in (da, db)]
    if prompts[0] != prompts[1]:
        raise ValueError(f"{da} and {db} are not scored on the same problems")
    rows = common_checkpoints([budgets(da), budgets(db)], unit_messages(da))
    out = dict(checkpoints=rows)
    for sc in SCORINGS:
        (ka, Sa), (kb, Sb) = score_matrix(da, sc), score_matrix(db, sc)
        ia = np.array([ka.index(r[0]) for r in rows])
        ib = np.array([kb.index(r[1]) for r in rows])
        out[sc] = dict(compare_runs(Sa[ia], Sb[ib], reps=reps), matrices=(Sa[ia], Sb[ib]))
    return out


def drift_summary(d: Path, n: int) -> dict:
    """A run's drift (item 4) from its step records: ``stale_frac[i]``, the mean fraction of
    agent ``i``'s training contexts that the current upstream agents give < 1/2 of their
    generating probability (``i = 1 … n−1``, 0-based successor positions), and
    ``drift_kl[k]``, the mean exact KL of upstream agent ``k`` (``k = 0 … n−2``) from its
    stage-start adapter, measured at the last agent's updates (whose contexts hold every
    upstream message)."""
    import numpy as np

    from sat_theory.metrics import read_metrics

    steps = [r for r in read_metrics(d) if r["kind"] == "step" and "stale_frac" in r]
    stale = {i: [r["stale_frac"] for r in steps if r["agent"] == i] for i in range(1, n)}
    kl = {k: [r["drift_kl"][k] for r in steps if r["agent"] == n - 1
              and r["drift_kl"][k] is not None] for k in range(n - 1)}
    return dict(stale_frac={i: float(np.mean(v)) if v else None for i, v in stale.items()},
                drift_kl={k: float(np.mean(v)) if v else None for k, v in kl.items()},
                steps=len(steps))


def _ci(t) -> str:
    """``+v [lo, hi]`` of a ``(value, lo, hi)`` difference, in points (× 100)."""
    return f"{100 * t[0]:+.1f} [{100 * t[1]:+.1f}, {100 * t[2]:+.1f}]"


def _acc(t) -> str:
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


NYR = "not yet run"
HEADLINE = ("auc", "final", "best", "drawdown")


def report(out: Path, grid=None, reps: int = 10000) -> dict:
    """The relay study's tables from the run folders under ``out`` (``--report``), written to
    ``out/study.md`` and ``out/summary.json``; a cell whose run has not finished reads "not
    yet run":

    - **tuning**: validation AUC (lenient / strict, bootstrap CI) per method, n and rate; the
      chosen rate (:func:`chosen_lr`);
    - **main**: per n, method and seed at the chosen rate: AUC, final, best and drawdown
      under both scorings with bootstrap 95% CIs over the held-out problems;
    - **SAT − other** per n (naive and joint first, then no-tr, CoMLRL and the single agent):
      the same metrics as paired differences per seed on the common checkpoints
      (:func:`paired`; McNemar p of the finals) and their mean over the seeds both have
      (stratified paired bootstrap, :func:`experiments.study_metrics.bootstrap_pooled`);
    - **drift vs gap** (item 4): per n and seed, naive's and SAT's ``stale_frac`` per successor
      position and ``drift_kl`` per upstream position (:func:`drift_summary`) next to the
      SAT − naive AUC and final gaps (lenient); over the (n, seed) points, Pearson's r of the
      gap with naive's last-agent ``stale_frac``.

    ``rows``: one per finished non-tuning run (final accuracies; SAT − it at the final, against
    the SAT run of the same n, seed and rate)."""
    import numpy as np

    from experiments.llm_team_learning import COMLRL_DEFAULT_LR, LR_GRID, score_matrix
    from experiments.study_metrics import bootstrap, bootstrap_pooled
    from sat_theory.metrics import write_json_atomic

    grid = tuple(grid or LR_GRID)
    runs = {}
    for meta_path in sorted(out.rglob("study.json")):
        d = meta_path.parent
        if _finished(d) and "n" in (meta := run_meta(d)):
            runs[d.relative_to(out).as_posix()] = meta
    chosen = {(n, m): chosen_lr(out, n, m, grid) for n in TEAM_SIZES for m in STUDY_METHODS}

    def main_run(n, m, s) -> Path | None:
        lr = chosen[(n, m)]
        name = None if lr is None else run_name(n, m, lr, s)
        return out / name if name in runs else None

    md = ["# relay study (issue 22 item 3)", "",
          "Generated by `experiments/llm_team_task.py --report` from the run folders here.", ""]
    data = dict(chosen={}, tuning={}, main={}, diff={}, drift={}, rows=[])
    # tuning
    md += ["## Learning rates chosen on the validation problems (seed 0)", "",
           "Validation AUC, lenient / strict (accuracy, bootstrap 95% CI over the validation "
           "problems); the chosen rate has the highest lenient validation AUC.", ""]
    lrs = (*grid, COMLRL_DEFAULT_LR)
    for n in TEAM_SIZES:
        md += [f"**n = {n}**", "", "| method | " + " | ".join(f"lr {lr:g}" for lr in lrs)
               + " | chosen |", "|---|" + "---|" * (len(lrs) + 1)]
        for m in STUDY_METHODS:
            cells = []
            for lr in lrs:
                if lr == COMLRL_DEFAULT_LR and m != "comlrl":
                    cells.append("—")
                    continue
                name = run_name(n, m, lr, 0, tune=True)
                if name not in runs:
                    cells.append(NYR)
                    continue
                auc = {sc: bootstrap(score_matrix(out / name, sc)[1], reps=reps)["auc"]
                       for sc in SCORINGS}
                data["tuning"][name] = auc
                cells.append(f"{_acc(auc['lenient'])} / {_acc(auc['strict'])}")
            c = chosen[(n, m)]
            data["chosen"][f"n{n}/{m}"] = c
            md.append(f"| {m} | " + " | ".join(cells) + " | "
                      + ("not yet (tuning runs missing)" if c is None else f"{c:g}") + " |")
        md.append("")
    # main runs
    md += ["## Held-out curves at the chosen rates", "",
           "Accuracy on the held-out problems (bootstrap 95% CI over problems) on the common "
           "schedule: an evaluation after every unit of n² · 32 sampled messages.", ""]
    head = ("| method | lr | seed | "
            + " | ".join(f"{h} {sc}" for sc in SCORINGS for h in HEADLINE) + " |")
    for n in TEAM_SIZES:
        md += [f"**n = {n}**", "", head, "|---|---|---|" + "---|" * 8]
        for m in STUDY_METHODS:
            for s in SEEDS:
                d, lr = main_run(n, m, s), chosen[(n, m)]
                if d is None:
                    md.append(f"| {m} | {'?' if lr is None else f'{lr:g}'} | {s} | "
                              + " | ".join([NYR] * 8) + " |")
                    continue
                b = {sc: bootstrap(score_matrix(d, sc)[1], reps=reps) for sc in SCORINGS}
                data["main"][f"n{n}/{m}/s{s}"] = b
                md.append(f"| {m} | {lr:g} | {s} | " + " | ".join(
                    _acc(b[sc][h]) for sc in SCORINGS for h in HEADLINE) + " |")
        md.append("")
    # SAT − other
    md += ["## SAT − other method, paired on the same held-out problems", "",
           "Points, paired bootstrap 95% CI over problems on the checkpoints both runs share; "
           "McNemar's exact p of the finals; 'mean' is over the seeds both have (stratified "
           "paired bootstrap).", ""]
    dhead = ("| SAT − | seed | " + " | ".join(f"{h} {sc}" for sc in SCORINGS for h in HEADLINE)
             + " | McNemar p (lenient / strict) |")
    for n in TEAM_SIZES:
        md += [f"**n = {n}**", "", dhead, "|---|---|" + "---|" * 9]
        for m in OTHERS:
            pairs = {sc: [] for sc in SCORINGS}
            for s in SEEDS:
                da, db = main_run(n, "sat", s), main_run(n, m, s)
                if da is None or db is None:
                    md.append(f"| {m} | {s} | " + " | ".join([NYR] * 9) + " |")
                    continue
                ps = paired(da, db, reps=reps)
                for sc in SCORINGS:
                    pairs[sc].append(ps[sc].pop("matrices"))
                data["diff"][f"n{n}/{m}/s{s}"] = ps
                md.append(f"| {m} | {s} | " + " | ".join(
                    _ci(ps[sc]["diff"][h]) for sc in SCORINGS for h in HEADLINE)
                    + f" | {ps['lenient']['mcnemar_p']:.2g} / {ps['strict']['mcnemar_p']:.2g} |")
            if pairs["lenient"]:
                pooled = {sc: bootstrap_pooled(pairs[sc], reps=reps) for sc in SCORINGS}
                data["diff"][f"n{n}/{m}/mean"] = pooled
                md.append(f"| {m} | mean of {len(pairs['lenient'])} | " + " | ".join(
                    _ci(pooled[sc][h]) for sc in SCORINGS for h in HEADLINE) + " | |")
            else:
                md.append(f"| {m} | mean | " + " | ".join([NYR] * 8) + " | |")
        md.append("")
    # drift vs gap
    md += ["## Drift of the upstream agents vs the SAT − naive gap (item 4)", "",
           "`stale_frac[i]`: mean fraction of agent i's training contexts (0-based, i ≥ 1) whose "
           "upstream messages the current upstream agents give < 1/2 of their generating "
           "probability (0 for SAT's fresh batches); `drift_kl[k]`: mean exact KL of upstream "
           "agent k from its stage-start adapter at the last agent's updates. Gap: SAT − naive, "
           "lenient, points [paired 95% CI].", ""]
    points = []
    for n in TEAM_SIZES:
        cols = ([f"naive stale_frac[{i}]" for i in range(1, n)]
                + [f"{m} drift_kl[{k}]" for m in ("naive", "sat") for k in range(n - 1)])
        md += [f"**n = {n}**", "", "| seed | " + " | ".join(cols) + " | gap AUC | gap final |",
               "|---|" + "---|" * (len(cols) + 2)]
        for s in SEEDS:
            dn, ds = main_run(n, "naive", s), main_run(n, "sat", s)
            if dn is None or ds is None:
                md.append(f"| {s} | " + " | ".join([NYR] * (len(cols) + 2)) + " |")
                continue
            fn, fs = drift_summary(dn, n), drift_summary(ds, n)
            gap = data["diff"][f"n{n}/naive/s{s}"]["lenient"]["diff"]
            data["drift"][f"n{n}/s{s}"] = dict(naive=fn, sat=fs, gap_auc=gap["auc"],
                                                gap_final=gap["final"])
            vals = ([fn["stale_frac"][i] for i in range(1, n)]
                    + [f["drift_kl"][k] for f in (fn, fs) for k in range(n - 1)])
            md.append(f"| {s} | " + " | ".join("—" if v is None else f"{v:.3g}" for v in vals)
                      + f" | {_ci(gap['auc'])} | {_ci(gap['final'])} |")
            if fn["stale_frac"][n - 1] is not None:
                points.append((n, s, fn["stale_frac"][n - 1], gap["auc"][0], gap["final"][0]))
        md.append("")
    if len(points) >= 3 and len({p[2] for p in points}) > 1:
        x = np.array([p[2] for p in points])
        r_auc = float(np.corrcoef(x, [p[3] for p in points])[0, 1])
        r_fin = float(np.corrcoef(x, [p[4] for p in points])[0, 1])
        data["relation"] = dict(points=points, pearson_auc=r_auc, pearson_final=r_fin)
        md.append(f"Over {len(points)} (n, seed) points, Pearson's r of naive's last-agent "
                  f"stale_frac with the SAT − naive gap: {r_auc:+.2f} (AUC), {r_fin:+.2f} (final).")
    else:
        data["relation"] = None
        md.append("Relation over the (n, seed) points: not yet run (needs at least 3 pairs).")
    # timing: every finished run (the issue asks for <= 30 min a run, 2 in parallel)
    from experiments.llm_team_learning import train_seconds

    md += ["", "## Run time", "", "| run | wall min | training min (evaluation excluded) | "
           "evaluations | load avg (1 min) start → end |", "|---|---|---|---|---|"]
    for name, meta in sorted(runs.items()):
        d = out / name
        load = [meta.get("load_start"), meta.get("load_end")]
        md.append(f"| {name} | {meta['wall_seconds'] / 60:.1f} | {train_seconds(d) / 60:.1f} | "
                  f"{len(score_matrix(d)[0])} | " + " → ".join(
                      "?" if x is None else f"{x[0]:.1f}" for x in load) + " |")
    # rows: every finished non-tuning run
    for name, meta in sorted(runs.items()):
        if meta.get("tune"):
            continue
        d, n, s = out / name, int(meta["n"]), int(meta["seed"])
        row = dict(run=name, n=n, method=meta["method"], seed=s, lr=meta.get("lr"))
        for sc in SCORINGS:
            row[sc] = float(score_matrix(d, sc)[1][-1].mean())
        sat = [out / k for k, v in runs.items() if v["method"] == "sat" and not v.get("tune")
               and int(v["n"]) == n and int(v["seed"]) == s and v.get("lr") == meta.get("lr")]
        if meta["method"] != "sat" and len(sat) == 1:
            ps = paired(sat[0], d, reps=reps)
            for sc in SCORINGS:
                row[f"sat_minus_{sc}"] = ps[sc]["diff"]["final"]
        st = drift_summary(d, n)["stale_frac"] if meta["method"] in METHODS else {}
        vals = [v for v in st.values() if v is not None]
        row["stale_frac_mean"] = float(np.mean(vals)) if vals else None
        data["rows"].append(row)
    (out / "study.md").write_text("\n".join(md) + "\n")
    write_json_atomic(out / "summary.json", data)
    return data


def _csv(kind):
    def parse(text: str):
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma list of {kind.__name__}: {text!r}") from None
    return parse


def _budgets(text: str) -> dict[int, int]:
    try:
        out = {int(k): int(v) for k, v in (x.split("=") for x in text.split(",") if x.strip())}
    except ValueError:
        raise argparse.ArgumentTypeError(f"not N=B pairs: {text!r}") from None
    if any(k not in TEAM_SIZES or v < 1 for k, v in out.items()):
        raise argparse.ArgumentTypeError(f"team sizes 2, 3 and budgets >= 1, got {text!r}")
    return out


def main(argv=None) -> int:
    from dataclasses import asdict, fields

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checks", action="store_true", help="the pre-study checks")
    ap.add_argument("--only", default=None, help="comma list of check names (default: all)")
    ap.add_argument("--out", type=Path, default=OUT, help="the checks' folder")
    ap.add_argument("--study-dir", type=Path, default=None,
                    help="the study's folder (default: OUT/study)")
    ap.add_argument("--run", default=None, metavar="NAME",
                    help="one run of the study, e.g. n2/sat_lr0.001_s0 or n3/tune/comlrl_lr5e-06_s0")
    ap.add_argument("--queue", action="store_true",
                    help="the whole study: tuning runs first, then every method at its chosen "
                         "rate on every seed, --jobs at a time, resumable")
    ap.add_argument("--jobs", type=int, default=2, help="--queue: runs at a time")
    ap.add_argument("--nice", type=int, default=0, help="--queue: niceness of each run process")
    ap.add_argument("--poll", type=float, default=10.0, help="--queue: seconds between checks")
    ap.add_argument("--ns", type=_csv(int), default=TEAM_SIZES, help="--queue: team sizes")
    ap.add_argument("--seeds", type=_csv(int), default=SEEDS, help="--queue: seeds")
    ap.add_argument("--lr-grid", type=_csv(float), default=None,
                    help="--queue/--report: tuning rates (default: the issue-21 grid)")
    ap.add_argument("--budgets", type=_budgets, default=None, metavar="N=B,...",
                    help="--queue: budget units per team size, e.g. 2=8,3=4 (default: --budget, "
                         "whose default 0 means the study's budgets "
                         f"{','.join(f'{k}={v}' for k, v in STUDY_BUDGETS.items())})")
    ap.add_argument("--n-validation", type=int, default=None,
                    help="validation problems of a tuning run (default 50)")
    ap.add_argument("--method", choices=[*METHODS, *PEERS], default=None,
                    help="one run outside the tuning protocol (a quick look)")
    ap.add_argument("--agents", type=int, choices=(2, 3), default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", action="store_true")
    base = study_config()
    for f in fields(base):
        v = getattr(base, f.name)
        ap.add_argument(f"--{f.name.replace('_', '-')}", type=type(v), default=v,
                        help=f.metadata.get("help"))
    args = ap.parse_args(argv)
    cfg = study_config(**{f.name: getattr(args, f.name) for f in fields(base)})
    root = args.study_dir or args.out / "study"
    if args.checks:
        settings = dict(CHECK_SETTINGS, n_eval=args.n_eval)
        s = run_checks(args.out, settings, args.only.split(",") if args.only else None)
        for name, row in s["checks"].items():
            print(f"{name:8s} lenient {row['lenient']:.3f} strict {row['strict']:.3f}"
                  + (f" chance {row['chance']:.3f}" if "chance" in row else ""))
        return 0
    if bad := [n for n in args.ns if n not in TEAM_SIZES]:
        ap.error(f"--ns: team sizes are 2 and 3, got {bad}")
    if args.queue:
        return run_relay_queue(cfg, root, args.jobs, args.ns, args.seeds, args.lr_grid,
                               args.n_validation, poll=args.poll, nice=args.nice,
                               budgets=args.budgets)
    if args.run:
        try:
            parse_run(args.run)
        except SystemExit as e:
            ap.error(str(e))
        run_one(cfg, args.run, root, args.resume, args.n_validation)
        return 0
    if args.method:
        run_study(args.method, args.agents, args.seed, root, args.resume, cfg.budget,
                  **{k: v for k, v in asdict(cfg).items() if k != "budget"})
        return 0
    if args.report:
        data = report(root, args.lr_grid)
        print((root / "study.md").read_text())
        return 0 if data["rows"] else 1
    ap.error("give --checks, --run, --queue, --method or --report")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
