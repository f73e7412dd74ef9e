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

``--method M --agents N --seed S`` (the study, issue #22 item 3; prepared, not yet run): the
methods of :data:`METHODS` through ``sat train`` on the relay task, with the settings of the
main learning study (:mod:`experiments.llm_team_learning`'s ``StudyConfig`` and ``run_ours``,
imported, not copied) and the budget in sampled messages; ``--report`` pairs the methods by
seed (paired bootstrap of the final held-out accuracy, strict and lenient).

    python experiments/llm_team_task.py --checks
    python experiments/llm_team_task.py --method sat --agents 2 --seed 0 [--resume]
    python experiments/llm_team_task.py --report
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

#: settings of the checks (the study's evaluation: greedy, ≤ 16 new tokens)
CHECK_SETTINGS = dict(model="smollm2-135m", lo=1, hi=9, ops="+-*", n_train=100, n_eval=120,
                      max_new_tokens=16, temperature=0.7, seed=0, threads=1)


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
    from sat_llm.team import LLMConfig

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
#: reference (relay with --agents 1 sees every part)
METHODS = {
    "sat": (["--method", "sat"], True),
    "naive": (["--method", "naive"], True),
    "joint": (["--method", "joint"], True),
    "no-tr": (["--method", "no-tr"], True),
    "single": (["--method", "sat"], False),
}
PEERS = ("comlrl",)
SEEDS = (0, 1, 2)


def messages_per_stage(method: str, n: int, episodes: int) -> int:
    """Sampled messages per stage: SAT resamples before each of its ``n`` updates (``n``
    rollouts of ``episodes`` ``n``-message episodes), naive/joint/no-tr draw one rollout, the
    single agent's episodes have one message."""
    if method == "single":
        return episodes
    return (n if method == "sat" else 1) * episodes * n


def study_schedule(method: str, n: int, episodes: int, budget: int) -> tuple[int, int]:
    """``(stages, eval_every)`` at ``budget`` units of one ``n``-agent SAT stage (``n² ·
    episodes`` messages), evaluated after every unit: every method sees the same sampled-
    message budget and is evaluated at the same message counts."""
    unit = n * n * episodes
    per = messages_per_stage(method, n, episodes)
    if unit % per:
        raise SystemExit(f"{method}: {per} messages per stage do not divide the unit {unit}")
    return budget * unit // per, unit // per


def study_config(**kw):
    """The main learning study's settings (:class:`experiments.llm_team_learning.StudyConfig`)
    on the relay task: its ``train_flags``/``llm_config`` with ``--task relay`` (relay takes
    the same ``lo``/``hi``/``ops`` and validation options as arithmetic)."""
    from dataclasses import dataclass

    from experiments.llm_team_learning import StudyConfig

    @dataclass
    class RelayStudyConfig(StudyConfig):
        def train_flags(self):
            return ["relay" if f == "arithmetic" else f for f in super().train_flags()]

        def llm_config(self, agents, seed):
            from dataclasses import replace

            return replace(super().llm_config(agents, seed), task="relay")

    base = dict(lo=CHECK_SETTINGS["lo"], hi=CHECK_SETTINGS["hi"], n_train=100, n_eval=120)
    return RelayStudyConfig(**{**base, **kw})


def run_study(method: str, n: int, seed: int, out: Path, resume: bool, budget: int,
              lr: float | None = None, **settings) -> Path:
    """One run of the study into ``out/n{n}/{method}_s{seed}`` through ``sat train``
    (:func:`experiments.llm_team_learning.run_ours`: resumable, ``study.json``), with drift
    logging for our methods; ``settings``: :func:`study_config` fields (e.g. a tiny model
    in the smoke test)."""
    from dataclasses import replace

    from experiments.llm_team_learning import run_ours

    cfg = study_config(**settings)
    if lr is not None:
        cfg = replace(cfg, lr=lr)
    episodes = cfg.prompts * cfg.group_size
    d = out / f"n{n}" / f"{method}_s{seed}"
    d.parent.mkdir(parents=True, exist_ok=True)
    if method in PEERS:  # experiments/peer_comlrl.py renders prompts without the views
        raise SystemExit("comlrl on relay needs experiments/peer_comlrl.py to render the "
                         "per-agent views (figures/llm_team_task/README.md)")
    flags, team = METHODS[method]
    stages, every = study_schedule(method, n, episodes, budget)
    install_drift_logging()
    return run_ours(cfg, method, seed, out, resume, stages, d=d,
                    flags=[*flags, "--agents", str(n if team else 1), "--eval-every", str(every)],
                    meta_extra=dict(n=n, budget=budget, schedule_every=every,
                                    load_start=os.getloadavg()))


def report(out: Path) -> dict:
    """Final held-out accuracy per method and n (strict and lenient, mean over seeds) and the
    paired-bootstrap difference SAT − each other method per seed
    (:func:`experiments.llm_team_learning.paired_bootstrap`); ``out/summary.json``."""
    from experiments.llm_team_learning import paired_bootstrap

    def final(d: Path, scoring: str) -> dict:
        files = sorted(d.glob("eval_*.jsonl"), key=lambda f: int(f.stem.split("_")[1]))
        recs = [json.loads(x) for x in files[-1].read_text().splitlines() if x.strip()]
        return {int(r["id"]): float(r[scoring if scoring == "strict" else "score"]) for r in recs}

    rows = []
    for nd in sorted(out.glob("n[0-9]*")):
        runs = {p.name: p for p in nd.iterdir() if (p / "study.json").is_file()}
        for name, d in sorted(runs.items()):
            method, seed = name.rsplit("_s", 1)
            row = dict(n=int(nd.name[1:]), method=method, seed=int(seed))
            for sc in ("lenient", "strict"):
                f = final(d, sc)
                row[sc] = sum(f.values()) / len(f)
                sat = runs.get(f"sat_s{seed}")
                if sat is not None and method != "sat":
                    row[f"sat_minus_{sc}"] = paired_bootstrap(f, final(sat, sc))
            steps = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
            drift = [r["stale_frac"] for r in steps if r.get("kind") == "step" and "stale_frac" in r]
            row["stale_frac_mean"] = sum(drift) / len(drift) if drift else None
            rows.append(row)
    (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    return dict(rows=rows)


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checks", action="store_true", help="the pre-study checks")
    ap.add_argument("--only", default=None, help="comma list of check names (default: all)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--n-eval", type=int, default=CHECK_SETTINGS["n_eval"])
    ap.add_argument("--method", choices=[*METHODS, *PEERS], default=None)
    ap.add_argument("--agents", type=int, choices=(2, 3), default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=12,
                    help="units of one n-agent SAT stage (n^2 x 32 sampled messages)")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: study's)")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args(argv)
    if args.checks:
        settings = dict(CHECK_SETTINGS, n_eval=args.n_eval)
        s = run_checks(args.out, settings, args.only.split(",") if args.only else None)
        for name, row in s["checks"].items():
            print(f"{name:8s} lenient {row['lenient']:.3f} strict {row['strict']:.3f}"
                  + (f" chance {row['chance']:.3f}" if "chance" in row else ""))
        return 0
    if args.method:
        run_study(args.method, args.agents, args.seed, args.out / "study", args.resume,
                  args.budget, args.lr)
        return 0
    if args.report:
        for r in report(args.out / "study")["rows"]:
            print(r)
        return 0
    ap.error("give --checks, --method or --report")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
