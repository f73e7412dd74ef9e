"""Does the LLM backend *train* a team? A learning study on CPU, side by side with peers.

Two SmolLM2-135M-Instruct agents (LoRA adapters on one frozen shared base) take turns on
small-integer arithmetic: agent 1 answers ``Compute a op b.``, agent 2 sees the exchange and
gives the team's final answer, which the task's verifier scores (the last integer after
``Answer:``). Operands are drawn from ``[0, 12]`` with ``+ - *`` (507 distinct problems):

- the untrained team scores inside the 15-60% band the study asks for (measured before the
  study: 35% greedy on 128 held-out problems, 12.5% of sampled τ = 0.7 episodes correct, 6 of
  16 groups of 4 with a non-zero advantage), so there is signal to learn from and room to
  improve;
- one-digit operands (243 problems) cannot give a held-out set of ≥ 200 disjoint from the
  training pool, and two-digit operands leave almost no sampled episode correct (0 of 32 with
  ``+`` only), so group-normalized advantages are zero and nothing can be learned.

Every method sees the same base, LoRA (rank 8, α 16, ``q_proj``/``v_proj``), prompts (the
canonical chat protocol), group size 4, 8 prompts per rollout, learning rate 1e-3, ≤ 16 new
tokens, τ = 0.7, and the same budget of generated training tokens: the stage counts below
give each method the same number of sampled messages (SAT resamples before every agent
update, so a 2-agent SAT stage draws two rollouts of 8 × 4 two-message episodes; naive and
joint draw one; the single agent's episodes have one message). The actual token counts are
logged and the curves are drawn against tokens and against wall time.

Methods (``--method``): ``sat`` (intermediate occupancy, exact token-KL trust region δ),
``sat-token`` (the same with TRL's per-token ratio, ``--ratio token``), ``naive`` (stale
stage-start batch), ``joint`` (all agents from one batch), ``single`` (our algorithm with
n = 1), ``trl`` (TRL's ``GRPOTrainer``, n = 1, via :mod:`experiments.peer_trl`).

Each run writes ``OUT/<method>_s<seed>/``: the run folder of ``sat train`` (``config.json``,
``metrics.jsonl``, ``eval_{k}.jsonl`` — per-problem held-out correctness after ``k`` stages,
greedy decoding, ``k = 0`` the untrained team) and ``study.json`` (wall seconds, finished).
``--resume`` continues a killed run exactly from its checkpoint (ours: ``sat train
--resume``; TRL and CoMLRL: from their last evaluation, :func:`run_study_trl`,
:func:`experiments.peer_comlrl.run_study_comlrl`); a finished run is skipped.
``--report`` reads every run under ``OUT``: paired-bootstrap 95% CIs of the held-out gain,
``summary.csv``/``summary.json`` and ``learning.png/.pdf`` (accuracy vs tokens and vs wall).

    python experiments/llm_team_learning.py --method sat --seed 0 [--resume]
    python experiments/llm_team_learning.py --report

**Scoring.** Every eval record carries ``lenient`` (= ``score``: the task's score, the last
integer of the last ``Answer:``'s line, else of the last line), ``strict`` (an ``Answer:
<int>`` line whose value is right) and ``format_ok``; ``--rescore`` re-scores saved runs from
their ``final`` messages (no retraining).

**The common-schedule study** (issue 21; ``OUT/v2/``, ``--run NAME``, ``--queue issue21``,
``--report-common``). Every method is evaluated on the same grid of the sampled-message
budget, every :data:`GRID_MESSAGES` = 128 messages (12 points; ours through ``sat train
--eval-every``, TRL from its callback, CoMLRL at the nearest prompt counts); headline metrics
in :mod:`experiments.study_metrics`. Methods: ``plain`` (ours, n = 1, β = 0, no trust region,
token ratio, no std normalisation: :data:`PLAIN_FLAGS`), ``trl-drgrpo`` (TRL with the loss
``plain`` equals: ``dr_grpo``, ``scale_rewards="none"``, clip scaled by
:func:`trl_drgrpo_clip`), ``sat`` (2 agents), ``trl`` (TRL's own loss and advantages) and
``comlrl``. Learning rates are chosen on :data:`N_VALIDATION` validation problems
(``tune/`` runs: the training pool's first 50 problems held out, training on the other 50;
the 200 held-out problems are never seen) by the best validation AUC (lenient) over
:data:`LR_GRID` (CoMLRL also at its default 5e-6).

Settings forced common, and why: the base model, LoRA rank/α/targets, the task, prompts and
the held-out problems (the comparison is of the training algorithm); group size 4, 8 prompts
per rollout, ≤ 16 new tokens and the budget of sampled messages (equal data); sampling at
τ = 0.7 with top-p 1 and no top-k (the behaviour policy is then exactly ``softmax(logits/τ)``
for every method; TRL's default τ is 1.0, CoMLRL's 0.6 with top-p 0.6 and top-k 50); a
constant learning rate without warm-up (TRL's default schedule is linear decay); the
learning rate itself is tuned per method. Each peer's own settings kept: TRL (1.16
``GRPOConfig`` defaults) ``loss_type="dapo"``, ``scale_rewards="group"`` (std + 1e-4), β = 0,
ε = 0.2, ``max_grad_norm=1.0``, weight decay 0, Adam ε 1e-8 (``trl``; ``trl-drgrpo`` changes
only the loss, the advantages' scale and the clip, to be our update); CoMLRL (1.4.3
``MAGRPOConfig`` and ``MAGRPOTrainer``) its REINFORCE loss with the group-mean baseline and
population-std advantage normalisation, no ratio and no clipping, log-probabilities of
temperature-1 logits in the loss, AdamW with torch's default weight decay 0.01, no gradient
clipping, rollout buffer 2. Ours: AdamW, weight decay 0, gradient clip 1.0.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import peer_runs  # noqa: E402
from sat_llm.config import ALGORITHM_DEFAULTS, LLMConfig  # noqa: E402
from sat_theory.metrics import write_json_atomic  # noqa: E402

#: method -> (sat train flags, stages at the common token budget per unit of ``--budget``)
METHODS = {
    "sat": (["--method", "sat", "--agents", "2"], 1),
    "sat-token": (["--method", "sat", "--agents", "2", "--ratio", "token"], 1),
    "naive": (["--method", "naive", "--agents", "2"], 2),
    "joint": (["--method", "joint", "--agents", "2"], 2),
    "single": (["--method", "sat", "--agents", "1"], 4),
}
PEERS = ("trl", "comlrl")
#: plug-and-play (TeamTR Fig. 6 with LLM agents): the trained SAT team of the same seed, its
#: agent 2 (the final answerer) replaced before stage 0 by the longer-trained single agent
SWAPS = {"swap-direct": "direct", "swap-stage0": "stage0", "swap-retrain": "retrain"}


def _f(default, help_):
    """A study setting of its own: ``default`` and ``help_`` (``--help`` and the flag)."""
    return field(default=default, metadata={"help": help_})


def _llm(name: str, help_):
    """A study setting that is ``sat train --backend llm``'s own: the default of
    :class:`~sat_llm.config.LLMConfig`'s field ``name`` (declared there once)."""
    return _f(getattr(LLMConfig, name), help_)


def _algo(name: str, help_):
    """A study setting that is an algorithm setting: the LLM backend's default of that
    :class:`~sat_theory.algorithm.TrainConfig` field
    (:data:`sat_llm.config.ALGORITHM_DEFAULTS`, what ``sat train --backend llm`` runs)."""
    return _f(ALGORITHM_DEFAULTS[name], help_)


@dataclass
class StudyConfig:
    """Settings shared by every method (the peers get the same ones). Those that are ``sat
    train --backend llm`` settings have its defaults (:func:`_llm`, :func:`_algo`) but
    ``threads``, which differs on purpose (its help says why)."""

    model: str = _llm("model", "base model of every agent")
    lo: int = _f(0, "smallest operand")
    hi: int = _f(9, "largest operand")
    ops: str = _f("+-*", "operations")
    budget: int = _f(12, "token budget in units of one 2-agent SAT stage (128 sampled messages "
                         "of <= max_new_tokens each); sat runs this many stages, naive/joint "
                         "twice as many, single four times")
    prompts: int = _algo("n_groups", "prompts (groups) per rollout")
    group_size: int = _algo("group_size", "episodes per prompt G")
    max_new_tokens: int = _llm("max_new_tokens", "tokens per message at most")
    temperature: float = _llm("temperature", "sampling temperature τ")
    delta: float = _algo("delta", "trust-region radius δ (exact token-sum KL per message)")
    lr: float = _llm("lr", "AdamW learning rate of the LoRA adapters")
    minibatch: int = _llm("minibatch", "turns per optimizer step")
    lora_r: int = _llm("lora_r", "LoRA rank (α = 2r)")
    n_train: int = _llm("n_train", "training problems in the pool (with n_eval: at most the task's 300)")
    n_eval: int = _llm("n_eval", "held-out problems, disjoint from the training pool")
    threads: int = _f(1, "torch threads per run (2 cores: at most two runs at once; sat train's "
                         "default 0, torch's own count, would oversubscribe two runs)")
    swap_stages: int = _f(4, "plug-and-play: stages trained after the swap")
    validation: int = _f(0, "problems of the training pool kept as a validation set (the "
                            "arithmetic task's validation option; 0: none)")
    heldout: str = _f("test", "what the held-out evaluation scores: test (the held-out set) | "
                              "validation (the validation set; choosing learning rates)")

    def task_options(self) -> dict:
        extra = dict(validation=self.validation, heldout=self.heldout) if self.validation else {}
        return dict(lo=self.lo, hi=self.hi, ops=self.ops, **extra)

    def llm_config(self, agents: int, seed: int):
        """The :class:`~sat_llm.team.LLMConfig` of a peer run's evaluation team: the same
        problems (same seed → same pools) and held-out evaluation as our runs."""
        return LLMConfig(model=self.model, task="arithmetic",
                         task_options=self.task_options(), agents=agents,
                         max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                         lora_r=self.lora_r, lora_alpha=2 * self.lora_r, lr=self.lr,
                         minibatch=self.minibatch, n_train=self.n_train, n_eval=self.n_eval,
                         seed=seed, threads=self.threads)

    def train_flags(self) -> list[str]:
        return ["--backend", "llm", "--model", self.model, "--task", "arithmetic",
                "--task-option", f"lo={self.lo}", "--task-option", f"hi={self.hi}",
                "--task-option", f"ops={json.dumps(self.ops)}",
                *(["--task-option", f"validation={self.validation}", "--task-option",
                   f"heldout={json.dumps(self.heldout)}"] if self.validation else []),
                "--prompts", str(self.prompts), "--group-size", str(self.group_size),
                "--max-new-tokens", str(self.max_new_tokens),
                "--temperature", str(self.temperature), "--delta", str(self.delta),
                "--llm-lr", str(self.lr), "--minibatch", str(self.minibatch),
                "--lora-r", str(self.lora_r), "--n-train", str(self.n_train),
                "--n-eval", str(self.n_eval), "--threads", str(self.threads)]


# ------------------------------------------------------------------ running one method
def run_dir(out: Path, method: str, seed: int) -> Path:
    return out / f"{method}_s{seed}"


def _has_checkpoint(d: Path) -> bool:
    return any(d.glob("checkpoint*"))


def final_team_file(d: Path) -> Path:
    """The last saved team file of a finished run (``policies/stage{K}.safetensors``)."""
    files = sorted(d.glob("policies/stage*.safetensors"),
                   key=lambda p: int(p.stem[5:]) if p.stem[5:].isdigit() else -1)
    if not files or not files[-1].stem[5:].isdigit():
        raise SystemExit(f"{d} has no saved policies: run it first (the study saves them)")
    return files[-1]


def swap_flags(cfg: StudyConfig, method: str, seed: int, out: Path) -> list[str]:
    """``sat train`` flags of a plug-and-play run (:data:`SWAPS`)."""
    team = final_team_file(run_dir(out, "sat", seed))
    strong = final_team_file(run_dir(out, "single", seed))
    return ["--method", "sat", "--agents", "2", "--init-from", str(team), "--swap-stage", "0",
            "--swap-agent", "1", "--swap-kind", "stronger", "--swap-from", f"{strong}:0",
            "--swap-strategy", SWAPS[method]]


def run_ours(cfg: StudyConfig, method: str, seed: int, out: Path, resume: bool,
             stages: int | None = None, *, d: Path | None = None, flags: list | None = None,
             meta_extra: dict | None = None) -> Path:
    """Train one of our methods through ``sat train`` (the same command a user runs).
    ``d``/``flags``/``meta_extra``: the run folder, the method's flags (then ``stages`` is
    required) and more fields for ``study.json`` (the common-schedule study, :func:`run_one`)."""
    from sat_theory.cli import main as sat

    d = d or run_dir(out, method, seed)
    if flags is not None:
        per_budget = 0
    elif method in SWAPS:
        flags, per_budget = swap_flags(cfg, method, seed, out), 0
        stages = stages or cfg.swap_stages
    else:
        flags, per_budget = METHODS[method]
    meta_path = d / "study.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    if meta.get("finished"):
        print(f"{d}: finished already")
        return d
    t0 = time.time()
    if resume and d.is_dir() and _has_checkpoint(d):
        rc = sat(["train", "--resume", str(d), "--quiet"])
    else:
        if d.exists():
            if not resume and any(d.iterdir()):
                raise SystemExit(f"{d} exists; pass --resume to continue it or remove it")
            shutil.rmtree(d)
        argv = ["train", *cfg.train_flags(), *flags,
                "--stages", str(stages or cfg.budget * per_budget), "--seed", str(seed),
                *([] if meta_extra else ["--save-policies"]), "--out", str(d), "--quiet"]
        rc = sat(argv)
    if rc != 0:
        raise SystemExit(f"sat train exited {rc} for {d}")
    meta = dict(method=method, seed=seed, finished=True,
                wall_seconds=meta.get("wall_seconds", 0.0) + time.time() - t0,
                study=asdict(cfg), **(meta_extra or {}))
    write_json_atomic(meta_path, meta)
    for p in d.glob("checkpoint*"):  # adapters stay out of git; the run is complete
        p.unlink() if p.is_file() else shutil.rmtree(p)
    return d


# ------------------------------------------------------------------ TRL's GRPOTrainer (n = 1)
def run_study_trl(cfg: StudyConfig, seed: int, d: Path, *, steps: int, eval_every: int = 4,
                  loss_type: str = "dapo", grad_clip: float = 1.0, meta_extra: dict | None = None,
                  trainer_seed: int | None = None, resume: bool = True, **grpo) -> Path:
    """TRL's ``GRPOTrainer`` with the study's settings (:func:`experiments.peer_trl.grpo_trainer`):
    the problems, prompts and held-out set of our single-agent team with the same seed, ``B =
    prompts`` prompts × ``G`` completions per generation, optimizer steps on minibatches of
    ``minibatch`` completions (``steps_per_generation = B·G/minibatch``, as our update's
    minibatches), ``steps`` generations (= our single-agent stages). After every
    ``eval_every``-th generation (and after the last) TRL's adapter is copied into our team
    and evaluated by the same greedy
    held-out evaluation (``eval_{k}.jsonl``, ``k`` = generations); ``metrics.jsonl`` gets one
    record per evaluation with the generated tokens and the training wall seconds (evaluation
    time excluded, as for our runs). ``trainer_seed`` (default ``seed``): TRL's own seed (its
    sampling, LoRA init and prompt order), the problems staying those of ``seed``.

    **Resumable, exactly.** After every evaluation but the last, TRL saves its checkpoint
    (``d/ckpt/checkpoint-N``, N = optimizer steps, a generation boundary: its buffer of
    ``steps_per_generation`` minibatches is used up): the LoRA adapter (safetensors), the
    AdamW and LR-scheduler states, the python/numpy/torch RNG states, the trainer state
    (global step); then :func:`experiments.peer_runs.write_peer_checkpoint` commits it with
    our counters (tokens, training and wall seconds). With ``resume`` and such a checkpoint
    the run continues from it (:func:`experiments.peer_runs.start_peer_run`: verified, files
    rewound) and ends with the same ``eval_*.jsonl`` bytes and ``metrics.jsonl`` records
    (timing aside) as a run never stopped (``tests/llm/test_peer_resume.py``); the prompt order is TRL's sampler advanced
    past the epochs already trained (:func:`experiments.peer_trl.resumable`). TRL loads
    its files with ``torch.load(weights_only=True)`` and safetensors only; the checkpoint is
    deleted when the run finishes."""
    from transformers import TrainerCallback

    from experiments.peer_trl import adapter_into, grpo_trainer, resumable
    from sat_llm.models import hf_dir
    from sat_llm.team import LLMTeam
    from sat_theory.metrics import RunWriter

    go, ck = peer_runs.start_peer_run(d, resume)
    if not go:
        return d
    t_start = time.time()
    llm = cfg.llm_config(1, seed)
    team = LLMTeam(llm)
    per_gen = cfg.prompts * cfg.group_size
    if per_gen % cfg.minibatch:
        raise SystemExit("prompts x group size must be a multiple of minibatch for TRL")
    spg = per_gen // cfg.minibatch
    tr = grpo_trainer(hf_dir(cfg.model), team.task, team.train_pool, lora_r=cfg.lora_r,
                      lora_alpha=2 * cfg.lora_r, lora_targets=llm.lora_targets,
                      group_size=cfg.group_size, prompts_per_step=cfg.prompts, lr=cfg.lr,
                      max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                      seed=seed if trainer_seed is None else trainer_seed,
                      out_dir=d / peer_runs.PEER_CKPT, steps=steps * spg, loss_type=loss_type,
                      grad_clip=grad_clip, per_device_train_batch_size=cfg.minibatch,
                      steps_per_generation=spg, **grpo)
    resumable(tr)
    state = dict(tokens_total=0, train_seconds=0.0, wall_seconds=0.0)
    if ck is not None:
        state.update(ck["state"])
    verifier = tr.reward_funcs[0]

    def counting(prompts, completions, completion_ids, **kw):  # generated tokens, as ours count them
        state["tokens_total"] += sum(len(x) for x in completion_ids)
        return verifier(prompts=prompts, completions=completions, completion_ids=completion_ids, **kw)

    counting.__name__ = getattr(verifier, "__name__", "verifier")
    tr.reward_funcs[0] = counting
    config = dict(peer="trl.GRPOTrainer", study=asdict(cfg), seed=seed,
                  trainer_seed=trainer_seed, grpo=tr.args.to_dict())
    peer_runs.resume_peer_config(d, ck, config, where=[("grpo", "output_dir")])
    writer = RunWriter(str(d), append=ck is not None)
    if ck is None:
        writer.write_config(config)
    clock = dict(last=time.perf_counter(), k=0)
    wall_before = state["wall_seconds"]

    def evaluate(k: int) -> None:
        peer_runs.log_peer_eval(d, team, writer, k, tokens_total=state["tokens_total"],
                                train_seconds=state["train_seconds"])

    class EvalEvery(TrainerCallback):
        """Our evaluation after every ``eval_every``-th generation; a checkpoint after it."""

        def on_step_end(self, args, state_, control, **kw):
            if state_.global_step % (eval_every * spg) == 0 or state_.global_step == steps * spg:
                state["train_seconds"] += time.perf_counter() - clock["last"]
                adapter_into(team, tr)
                clock["k"] = state_.global_step // spg
                evaluate(clock["k"])
                control.should_save = state_.global_step < steps * spg
                clock["last"] = time.perf_counter()

        def on_save(self, args, state_, control, **kw):
            name = f"checkpoint-{state_.global_step}"
            # a pickle of TrainingArguments; never loaded on resume, so not kept
            (d / peer_runs.PEER_CKPT / name / "training_args.bin").unlink(missing_ok=True)
            state["wall_seconds"] = wall_before + time.time() - t_start
            peer_runs.write_peer_checkpoint(d, name, clock["k"],
                                            dict(state, global_step=state_.global_step))
            clock["last"] = time.perf_counter()  # checkpointing is not training time

    if ck is None:
        evaluate(0)
    clock["last"] = time.perf_counter()
    tr.add_callback(EvalEvery())
    tr.train(resume_from_checkpoint=None if ck is None else str(ck["path"]))
    writer.close()
    peer_runs.finish_peer_run(d, "trl", seed, t_start, cfg, meta_extra, wall_before)
    return d


# ------------------------------------------------------------------ the common-schedule study
# (issue 21): every method evaluated at the same points of the sampled-message budget, learning
# rates chosen on a validation set, parity of our plain GRPO (n = 1) with TRL's loss it matches.
#: the common evaluation grid: a held-out evaluation every GRID_MESSAGES sampled training
#: messages (one 2-agent SAT stage: 2 rollouts x 8 prompts x 4 episodes x 2 messages)
GRID_MESSAGES = 128
#: the learning-rate grid of the tuning runs; CoMLRL also at its documented default
LR_GRID = (3e-4, 1e-3, 3e-3)
COMLRL_DEFAULT_LR = 5e-6
#: validation problems (the first of the 100-problem training pool; tuning runs train on the
#: other 50): disjoint from the 200 held-out problems and from the tuning runs' training pool
N_VALIDATION = 50
#: ours, plain: GRPO at n = 1 with β = 0 and no backtracking (no trust region), TRL's token
#: ratio and no std normalisation: the update of TRL's dr_grpo with scale_rewards="none"
#: (tests/llm/test_trl_oracle.py), up to the constant factor of :func:`trl_drgrpo_clip`. β:
#: ``sat train`` refuses ``--beta 0`` (TrainConfig needs β > 0, which the trust region's
#: doubling needs); 1e-300 is 0 in the float32 loss (``β · KL`` rounds to 0.0, and so does
#: its gradient), and with no trust region β is never adapted: exactly β = 0
PLAIN_FLAGS = ["--method", "no-tr", "--agents", "1", "--beta", "1e-300", "--ratio", "token",
               "--no-std-norm"]
#: "trl-rerun" / "plain-rerun": TRL dr_grpo / ours-plain again on the same seed's problems with
#: their own seed RERUN_SEED + s (sampling, LoRA init, prompt order; ours: ``--problem-seed s
#: --seed RERUN_SEED+s``): the noise floor of the parity test, of each side (two runs of one
#: algorithm differ by their random streams only)
#: "plain-epoch" / "plain-epoch-rerun": ours-plain and its rerun with TRL's prompt draws
#: (``--prompt-draw epoch``: one permutation of the pool per epoch): whether ours' larger run
#: noise (experiments/study_noise.py) comes from drawing each rollout's problems independently
STUDY_METHODS = ("plain", "plain-rerun", "trl-drgrpo", "trl-rerun", "sat", "trl", "comlrl",
                 "plain-epoch", "plain-epoch-rerun")
RERUN_SEED = 1000
#: the study's methods that run through ``sat train``
OURS_STUDY = ("plain", "plain-rerun", "sat", "plain-epoch", "plain-epoch-rerun")


def trl_drgrpo_clip(cfg: StudyConfig) -> float:
    """TRL's ``max_grad_norm`` equivalent to our gradient clip: a minibatch of ``mb`` of the
    ``M = B·G`` messages has our loss ``−Σ_mb Σ_u min(r_u A, …)/M`` and TRL dr_grpo's
    ``−Σ_mb Σ_u min(r_u A, …)/(mb·L_max)``, so our gradient is ``c = L_max·mb/M`` times
    TRL's and clipping ours at ``g`` is clipping TRL's at ``g/c``."""
    c = cfg.max_new_tokens * cfg.minibatch / (cfg.prompts * cfg.group_size)
    return LLMConfig().grad_clip / c


def messages_per_unit(cfg: StudyConfig, method: str) -> int:
    """Sampled messages per stage (ours), per generation (TRL), per prompt (CoMLRL)."""
    from experiments.peer_comlrl import messages_per_prompt

    episodes = cfg.prompts * cfg.group_size
    return {"sat": 2 * episodes * 2, "plain": episodes, "plain-rerun": episodes,
            "plain-epoch": episodes, "plain-epoch-rerun": episodes, "trl": episodes,
            "trl-drgrpo": episodes, "trl-rerun": episodes, "comlrl": messages_per_prompt(cfg.group_size)}[method]


def schedule(cfg: StudyConfig, method: str) -> tuple[int, list[int]]:
    """``(units, evaluated units)`` of a method at the study's budget (``budget`` grid steps
    of :data:`GRID_MESSAGES`): the units (stages / generations / prompts) to train and the
    unit counts after which the held-out evaluation runs, the nearest to every grid point."""
    per = messages_per_unit(cfg, method)
    units = max(1, round(cfg.budget * GRID_MESSAGES / per))
    at = sorted({min(units, max(1, round(j * GRID_MESSAGES / per))) for j in range(1, cfg.budget + 1)})
    return units, at


def run_name(method: str, lr: float, seed: int, tune: bool = False) -> str:
    return f"{'tune/' if tune else ''}{method}_lr{lr:g}_s{seed}"


def parse_run(name: str) -> tuple[bool, str, float, int]:
    """``(tune, method, lr, seed)`` of a run name (:func:`run_name`)."""
    import re

    m = re.fullmatch(r"(tune/)?([a-z-]+)_lr([0-9.e+-]+)_s(\d+)", name)
    if not m or m.group(2) not in STUDY_METHODS:
        raise SystemExit(f"not a run of the common-schedule study: {name!r} (methods "
                         f"{', '.join(STUDY_METHODS)}; e.g. {run_name('plain', 1e-3, 0)})")
    return bool(m.group(1)), m.group(2), float(m.group(3)), int(m.group(4))


def run_one(cfg: StudyConfig, name: str, out: Path, resume: bool) -> Path:
    """Train one run of the common-schedule study into ``out/name`` (:func:`parse_run`):
    tuning runs (``tune/``) train on the pool's last 50 problems and are evaluated on the
    :data:`N_VALIDATION` validation problems; the others train on the whole pool and are
    evaluated on the held-out set. ``study.json`` records the load average at start and end
    and the training seconds (evaluation excluded), hence the evaluation share."""
    from dataclasses import replace

    tune, method, lr, seed = parse_run(name)
    cfg = replace(cfg, lr=lr)
    if tune:
        cfg = replace(cfg, validation=N_VALIDATION, heldout="validation",
                      n_train=cfg.n_train - N_VALIDATION, n_eval=N_VALIDATION)
    d = out / name
    d.parent.mkdir(parents=True, exist_ok=True)
    units, at = schedule(cfg, method)
    extra = dict(run=name, lr=lr, tune=tune, load_start=os.getloadavg(), schedule=at)
    # wall seconds over every session of a resumed run: a heartbeat file outside the run folder
    # (a run without a checkpoint starts again from zero; peers: their ckpt/ record)
    from experiments.study_queue import log_name, wall_clock

    wall_file = out / ".logs" / (log_name(name) + ".wall")
    record = d / peer_runs.PEER_CKPT / peer_runs.PEER_CKPT_RECORD
    resumed = wall_file.is_file() and (_has_checkpoint(d) if method in OURS_STUDY else
                                       record.is_file())
    with wall_clock(wall_file, resumed) as wall:
        _train_one(cfg, method, seed, d, out, resume, units, at, extra)
    meta = json.loads((d / "study.json").read_text())
    meta.update(load_end=os.getloadavg(), wall_seconds=wall())
    write_json_atomic(d / "study.json", meta)
    return d


def _train_one(cfg, method, seed, d, out, resume, units, at, extra) -> None:
    """:func:`run_one`'s training call of one method."""
    if method in OURS_STUDY:
        k = at[0]
        if any(b - a != k for a, b in zip([0, *at], at, strict=False)):
            raise SystemExit(f"{method}: the grid is not every {k} stages")
        flags = METHODS["sat"][0] if method == "sat" else PLAIN_FLAGS
        if method.startswith("plain-epoch"):
            flags = [*flags, "--prompt-draw", "epoch"]
        if method.endswith("-rerun"):
            flags, seed = [*flags, "--problem-seed", str(seed)], RERUN_SEED + seed
        run_ours(cfg, method, seed, out, resume, units, d=d,
                 flags=[*flags, "--eval-every", str(k)], meta_extra=extra)
    elif method in ("trl", "trl-drgrpo", "trl-rerun"):
        kw = (dict(loss_type="dr_grpo", scale_rewards="none", grad_clip=trl_drgrpo_clip(cfg))
              if method != "trl" else {})  # trl: TRL's own dapo, group std, clip 1
        if method == "trl-rerun":
            kw["trainer_seed"] = RERUN_SEED + seed
        run_study_trl(cfg, seed, d, steps=units, eval_every=at[0], meta_extra=extra,
                      resume=resume, **kw)
    else:
        from experiments.peer_comlrl import run_study_comlrl

        run_study_comlrl(cfg, seed, d, n_prompts=units, eval_at=set(at), meta_extra=extra,
                         resume=resume)


def chosen_lr(out: Path, method: str, scoring: str = "lenient") -> float | None:
    """The learning rate of ``method`` with the highest validation AUC (mean accuracy over the
    evaluations) among its finished tuning runs (seed 0; ties: the smaller rate); ``None``
    until every tuning run of the method has finished."""
    from experiments.study_metrics import curve_metrics

    lrs = (*LR_GRID, COMLRL_DEFAULT_LR) if method == "comlrl" else LR_GRID
    auc = {}
    for lr in lrs:
        d = out / run_name(method, lr, 0, tune=True)
        if not _finished(d):
            return None
        auc[lr] = curve_metrics(score_matrix(d, scoring)[1])["auc"]
    return max(sorted(auc), key=lambda lr: auc[lr])


def _finished(d: Path) -> bool:
    p = d / "study.json"
    return p.is_file() and bool(json.loads(p.read_text()).get("finished"))


def score_matrix(d: Path, scoring: str = "lenient"):
    """``(checkpoints, S)`` of a run: the evaluated unit counts and the (K, n) 0/1 matrix of
    ``eval_{k}.jsonl`` under ``scoring`` (problems in id order)."""
    import numpy as np

    ks = sorted(int(p.stem[5:]) for p in d.glob("eval_*.jsonl") if p.stem[5:].isdigit())
    rows = []
    for k in ks:
        sc = read_eval(d / f"eval_{k}.jsonl", scoring)
        rows.append([sc[i] for i in sorted(sc)])
    return ks, np.array(rows, dtype=np.float64)


#: the queue of the common-schedule study, in the order it runs: parity (ours-plain vs TRL
#: dr_grpo, three seeds, the same rate, and TRL dr_grpo rerun with its own other seed: the
#: noise floor), ours-plain with epoch prompt draws and its rerun (seeds 0, 2: what ours' run
#: noise comes from), the tuning grid on the validation set, the chosen
#: rates on three seeds, then 3x and 10x the chosen rates on two seeds ("@F" = F x chosen)
def queue_issue21() -> list[str]:
    q = []
    for s in range(3):
        q += [run_name("plain", 1e-3, s), run_name("trl-drgrpo", 1e-3, s)]
    q += [run_name("trl-rerun", 1e-3, s) for s in range(3)]
    q += [run_name("plain-rerun", 1e-3, s) for s in range(3)]
    q += [run_name(m, 1e-3, s) for s in (0, 2) for m in ("plain-epoch", "plain-epoch-rerun")]
    for lr in LR_GRID:
        q += [run_name(m, lr, 0, tune=True) for m in ("plain", "trl", "sat", "comlrl")]
    q.append(run_name("comlrl", COMLRL_DEFAULT_LR, 0, tune=True))
    for s in range(3):
        q += [f"{m}_lr@1_s{s}" for m in ("plain", "trl", "sat", "comlrl")]
    for f in (3, 10):
        for s in range(2):
            q += [f"{m}_lr@{f}_s{s}" for m in ("plain", "trl", "sat", "comlrl")]
    return q


QUEUES = {"issue21": queue_issue21}


def resolve(out: Path, entry: str) -> str | None:
    """A queue entry's run name: ``m_lr@F_sS`` becomes ``m_lr{F·chosen}_sS`` once the tuning
    runs of ``m`` have finished (``None`` before)."""
    if "_lr@" not in entry:
        return entry
    method, rest = entry.split("_lr@")
    factor, seed = rest.split("_s")
    lr = chosen_lr(out, method)
    return None if lr is None else run_name(method, float(factor) * lr, int(seed))


def run_queue(out: Path, queue: str, jobs: int = 2, poll: float = 10.0) -> int:
    """Run the queue ``queue`` (:data:`QUEUES`) under ``out``, ``jobs`` runs at a time, each a
    separate process (``--run NAME --resume``, one torch thread; its log in
    ``out/.logs/``): finished runs are skipped, a killed run resumes exactly from its
    checkpoint (ours: ``sat train --resume``; TRL and CoMLRL: from their last evaluation,
    :func:`run_study_trl`, :func:`experiments.peer_comlrl.run_study_comlrl`), an entry that
    needs chosen rates waits for its tuning runs. Commits nothing. Returns 0 when every
    entry finished, else 1."""
    from experiments.study_queue import run_queue as run_entries

    def command(name: str) -> list[str]:
        return [sys.executable, str(Path(__file__).resolve()), "--out", str(out), "--run", name,
                "--resume"]

    return run_entries(QUEUES[queue](), lambda e: resolve(out, e), command,
                       lambda name: _finished(out / name), out / ".logs", jobs, poll)


# ------------------------------------------------------------------ the common-schedule report
def train_seconds(d: Path) -> float:
    """Training wall seconds of a run (evaluation excluded): ours, the sum of the step
    records' ``seconds``; a peer run, its last evaluation record's ``train_seconds``."""
    from sat_theory.metrics import read_metrics

    recs = list(read_metrics(d))
    peer = [r["train_seconds"] for r in recs if r["kind"] == "stage" and "train_seconds" in r]
    return float(peer[-1]) if peer else float(sum(r.get("seconds") or 0.0 for r in recs
                                                  if r["kind"] == "step"))


def kl_per_update(d: Path) -> float | None:
    """Mean exact token-sum KL of an update to the policy before it (ours: the step records'
    ``kl``); ``None`` for a peer run (its trainer does not measure it)."""
    from sat_theory.metrics import read_metrics

    kls = [r["kl"] for r in read_metrics(d) if r["kind"] == "step" and r.get("kl") is not None]
    return float(sum(kls) / len(kls)) if kls else None


def run_summary(d: Path, reps: int = 2000) -> dict:
    """One finished run of the common-schedule study: every curve metric under both scorings
    with its bootstrap 95% CI over problems (:func:`experiments.study_metrics.bootstrap`), the
    checkpoints, the wall and training minutes and the evaluation share (1 − training/wall:
    the held-out evaluations plus loading), the load averages and the KL per update."""
    from experiments.study_metrics import bootstrap

    meta = json.loads((d / "study.json").read_text())
    out = dict(run=meta["run"], method=meta["method"], lr=meta["lr"], seed=meta["seed"],
               tune=meta["tune"], wall_minutes=meta["wall_seconds"] / 60,
               train_minutes=train_seconds(d) / 60, load_start=meta.get("load_start"),
               load_end=meta.get("load_end"), kl_per_update=kl_per_update(d))
    out["eval_share"] = 1 - out["train_minutes"] / out["wall_minutes"]
    for scoring in SCORINGS:
        ks, S = score_matrix(d, scoring)
        out["checkpoints"] = ks
        out[scoring] = bootstrap(S, reps=reps)
    return out


def _cell(m: dict | None, key: str, pts: bool = True) -> str:
    if m is None:
        return "not yet run"
    v, lo, hi = m[key]
    f = 100 if pts else 1
    return f"{f * v:.1f} [{f * lo:.1f}, {f * hi:.1f}]" if pts else f"{v:.3f}"


def _paired_lenient(out: Path, runs: dict, a: str, b: str) -> dict | None:
    """The lenient paired differences a − b of two runs (e.g. a run and its rerun), once both
    finished."""
    return (paired_on_schedule(out / a, out / b)["lenient"]["diff"]
            if a in runs and b in runs else None)


def report_common(out: Path) -> dict:
    """The tables of the common-schedule study from the run folders under ``out``
    (``--report-common``): ``parity.md`` (ours-plain vs TRL dr_grpo per seed, on the shared
    grid), ``tuning.md`` (validation AUC per method and rate; the chosen rate), ``main.md``
    (chosen rates, 3 seeds), ``stability.md`` (3x and 10x the chosen rates) and
    ``timing.md``; every run's numbers in ``runs.json``. A table cell of a run that has not
    finished reads "not yet run". Returns the tables' data."""
    runs = {}
    for meta in sorted(out.rglob("study.json")):
        if _finished(meta.parent):
            s = run_summary(meta.parent)
            runs[s["run"]] = s
    write_json_atomic(out / "runs.json", runs)
    tables = {}
    # parity
    lines = ["| seed | plain final | TRL dr_grpo final | AUC plain − TRL, lenient [95% CI] | AUC "
             "plain − TRL, strict | final plain − TRL, lenient (McNemar p) | final, strict "
             "(McNemar p) | CI of the lenient AUC difference includes 0 | noise floor: AUC "
             "TRL − TRL rerun, lenient | noise floor: AUC plain − plain rerun, lenient |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    parity = []
    for s in range(3):
        a, b = run_name("plain", 1e-3, s), run_name("trl-drgrpo", 1e-3, s)
        floor, floor_plain = (_paired_lenient(out, runs, x, run_name(f"{m}-rerun", 1e-3, s))
                              for x, m in ((b, "trl"), (a, "plain")))
        if a in runs and b in runs:
            ps = paired_on_schedule(out / a, out / b)
            d = {sc: ps[sc]["diff"] for sc in SCORINGS}
            inc = d["lenient"]["auc"][1] <= 0 <= d["lenient"]["auc"][2]
            parity.append(dict(seed=s, includes_0=inc, noise_floor_auc=floor and floor["auc"],
                               noise_floor_plain_auc=floor_plain and floor_plain["auc"],
                               plain_rerun_minus_trl_auc=(d_rerun := _paired_lenient(
                                   out, runs, run_name("plain-rerun", 1e-3, s), b)) and d_rerun["auc"],
                               **{f"{sc}_{k}": v for sc in SCORINGS for k, v in d[sc].items()}))
            lines.append(f"| {s} | {ps['lenient']['a']['final']:.3f} | {ps['lenient']['b']['final']:.3f} | "
                         f"{_cell(d['lenient'], 'auc')} | {_cell(d['strict'], 'auc')} | "
                         f"{_cell(d['lenient'], 'final')} ({ps['lenient']['mcnemar_p']:.2g}) | "
                         f"{_cell(d['strict'], 'final')} ({ps['strict']['mcnemar_p']:.2g}) | "
                         f"{'yes' if inc else 'no'} | {_cell(floor, 'auc')} | "
                         f"{_cell(floor_plain, 'auc')} |")
        else:
            lines.append(f"| {s} | {'done' if a in runs else 'not yet run'} | "
                         f"{'done' if b in runs else 'not yet run'} | not yet run | not yet run "
                         f"| not yet run | not yet run | — | {_cell(floor, 'auc')} | "
                         f"{_cell(floor_plain, 'auc')} |")
    lines += ["", "Lenient AUC of every finished run (the seed-to-seed spread of one method; each "
              "seed has its own problems, so these are not paired):", ""]
    lines += [f"- {m}: " + (", ".join(f"seed {s} {100 * runs[n]['lenient']['auc'][0]:.1f}"
                                      for s in range(3) if (n := run_name(m, 1e-3, s)) in runs)
                            or "not yet run") for m in ("plain", "plain-rerun", "trl-drgrpo",
                                                        "trl-rerun")]
    tables["parity"] = parity
    (out / "parity.md").write_text("\n".join(lines) + "\n")
    # tuning grid
    lines = ["| method | " + " | ".join(f"lr {lr:g}" for lr in (*LR_GRID, COMLRL_DEFAULT_LR))
             + " | chosen |", "|---|" + "---|" * (len(LR_GRID) + 2)]
    chosen = {}
    for m in ("plain", "trl", "sat", "comlrl"):
        cells = []
        for lr in (*LR_GRID, COMLRL_DEFAULT_LR):
            if lr == COMLRL_DEFAULT_LR and m != "comlrl":
                cells.append("—")
                continue
            r = runs.get(run_name(m, lr, 0, tune=True))
            cells.append("not yet run" if r is None else
                         f"{_cell(r['lenient'], 'auc')} / {_cell(r['strict'], 'auc')}")
        chosen[m] = chosen_lr(out, m)
        lines.append(f"| {m} | " + " | ".join(cells) + " | "
                     + ("not yet (tuning runs missing)" if chosen[m] is None else f"{chosen[m]:g}")
                     + " |")
    tables["chosen"] = chosen
    (out / "tuning.md").write_text("\n".join(lines) + "\n")
    # main runs and stability
    def block(factor, seeds):
        rows = ["| method | lr | seed | AUC lenient | AUC strict | final lenient | final strict | "
                "best lenient | drawdown lenient | worst drop lenient | below untrained | KL per "
                "update |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for m in ("plain", "trl", "sat", "comlrl"):
            for s in seeds:
                lr = None if chosen[m] is None else factor * chosen[m]
                r = None if lr is None else runs.get(run_name(m, lr, s))
                if r is None:
                    rows.append(f"| {m} | {'?' if lr is None else f'{lr:g}'} | {s} | "
                                + " | ".join(["not yet run"] * 9) + " |")
                    continue
                L, S_ = r["lenient"], r["strict"]
                kl = "not measured (peer)" if r["kl_per_update"] is None else f"{r['kl_per_update']:.3g}"
                rows.append(f"| {m} | {lr:g} | {s} | {_cell(L, 'auc')} | {_cell(S_, 'auc')} | "
                            f"{_cell(L, 'final')} | {_cell(S_, 'final')} | {_cell(L, 'best')} | "
                            f"{_cell(L, 'drawdown')} | {_cell(L, 'worst_drop')} | "
                            f"{100 * L['below_untrained'][0]:.0f}% | {kl} |")
        return rows
    (out / "main.md").write_text("\n".join(block(1, range(3))) + "\n")
    (out / "stability.md").write_text("\n".join(
        ["**3× the chosen rate**", "", *block(3, range(2)), "", "**10× the chosen rate**", "",
         *block(10, range(2))]) + "\n")
    lines = ["| run | wall min | training min | evaluation share | evaluations | load avg "
             "(1 min) start → end |", "|---|---|---|---|---|---|"]
    for name, r in sorted(runs.items()):
        # training seconds come from every segment's records; a segment killed without its
        # heartbeat lost its wall clock, so wall < training: no share can be given then
        measured = r["wall_minutes"] >= r["train_minutes"]
        wall = f"{r['wall_minutes']:.1f}" if measured else "not measured (a killed segment's wall clock was lost)"
        share = f"{100 * r['eval_share']:.0f}%" if measured else "—"
        lines.append(f"| {name} | {wall} | {r['train_minutes']:.1f} | {share} | "
                     f"{len(r['checkpoints'])} | {r['load_start'][0]:.1f} → {r['load_end'][0]:.1f} |")
    (out / "timing.md").write_text("\n".join(lines) + "\n")
    tables["runs"] = runs
    if any(not r["tune"] for r in runs.values()):
        plot_common(out, {n: r for n, r in runs.items() if not r["tune"]})
    return tables


def plot_common(out: Path, runs: dict) -> None:
    """Held-out accuracy against sampled training messages, lenient and strict scoring, one
    line per run (``learning_common.png/.pdf``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sat_theory.plotting import legend_outside, paper_style, save_figure

    colors = {"plain": "#CC79A7", "trl-drgrpo": "#E69F00", "trl": "#D55E00", "sat": "#0072B2",
              "comlrl": "#009E73"}
    with paper_style():
        fig, ax = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
        for name, r in sorted(runs.items()):
            b = budgets(out / name)
            for i, scoring in enumerate(SCORINGS):
                ks, S = score_matrix(out / name, scoring)
                ax[i].plot([b[k] for k in ks], S.mean(1), marker="o", ms=3,
                           color=colors.get(r["method"], "k"),
                           ls=["-", "--", ":"][r["seed"] % 3], label=name)
        for i, scoring in enumerate(SCORINGS):
            ax[i].set_xlabel("sampled training messages")
            ax[i].set_title(f"held-out accuracy (greedy), {scoring} scoring", fontsize=10)
        ax[0].set_ylabel("accuracy")
        legend_outside(ax[1], fontsize=7)
        fig.tight_layout()
        for p in save_figure(fig, out, "learning_common"):
            print(p)


# ------------------------------------------------------------------ report
#: the two scorings of every held-out record (sat_llm.tasks.Task.score / strict_score)
SCORINGS = ("lenient", "strict")


def read_eval(path: Path, scoring: str = "lenient") -> dict[int, float]:
    """``{problem id: score}`` of one ``eval_{k}.jsonl`` under ``scoring`` (:data:`SCORINGS`:
    ``lenient`` is the task's score, the record's ``score``; ``strict`` needs an ``Answer:
    <value>`` line whose value is right — files from before it was recorded need
    :func:`rescore` first)."""
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if scoring == "strict" and "strict" not in r:
                raise SystemExit(f"{path} has no strict scores: run --rescore first")
            out[int(r["id"])] = float(r["score" if scoring == "lenient" else "strict"])
    return out


def _task_of(d: Path):
    """The task of a run folder, from its ``study.json`` (the study's arithmetic settings)."""
    from sat_llm.tasks import make_task

    st = json.loads((d / "study.json").read_text())["study"]
    return make_task("arithmetic", lo=st["lo"], hi=st["hi"], ops=st["ops"])


def rescore_record(task, r: dict) -> dict:
    """One held-out record scored again from its saved final message: ``score``/``correct``/
    ``lenient`` (the task's score with today's parser), ``strict`` and ``format_ok``."""
    from sat_llm.tasks import Problem

    p, final = Problem(r["prompt"], r["answer"]), r["final"]
    score = float(task.score(p, final))
    return {**r, "score": score, "correct": score == 1.0, "lenient": score,
            "strict": float(task.strict_score(p, final)), "format_ok": task.format_ok(final)}


def rescore(out: Path) -> dict:
    """Re-score every ``eval_*.jsonl`` of every run under ``out`` (recursively) from the
    saved final messages, no retraining: each record gets ``lenient``/``strict``/
    ``format_ok`` and its ``score`` recomputed (files rewritten atomically). Returns counts:
    files, records, and records whose lenient score changed (the parser fix of
    :func:`sat_llm.tasks.answer_value`)."""
    counts = dict(files=0, records=0, lenient_changed=0)
    for meta in sorted(out.rglob("study.json")):
        d = meta.parent
        task = _task_of(d)
        for f in sorted(d.glob("eval_*.jsonl")):
            recs = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
            new = [rescore_record(task, r) for r in recs]
            counts["files"] += 1
            counts["records"] += len(new)
            counts["lenient_changed"] += sum(a["score"] != b["score"] for a, b in zip(recs, new, strict=True))
            tmp = f.with_name(f".{f.name}.tmp")
            tmp.write_text("".join(json.dumps(r, default=str) + "\n" for r in new))
            os.replace(tmp, f)
    return counts


def paired_bootstrap(before: dict, after: dict, *, reps: int = 10000, seed: int = 0):
    """Gain ``mean(after) − mean(before)`` on the same problems and its paired-bootstrap 95%
    percentile interval: problems are resampled with replacement, both scores of a problem
    move together (the pairing removes the problem-difficulty variance)."""
    import numpy as np

    ids = sorted(set(before) & set(after))
    if len(ids) != len(before) or len(ids) != len(after):
        raise ValueError("before and after must score the same problems")
    diff = np.array([after[i] - before[i] for i in ids])
    rng = np.random.default_rng(seed)
    boots = diff[rng.integers(0, len(diff), size=(reps, len(diff)))].mean(axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    return float(diff.mean()), float(lo), float(hi)


def curve(d: Path):
    """``(tokens, seconds, accuracy)`` at every held-out evaluation of one run: cumulative
    generated training tokens, cumulative *training* wall seconds (rollouts, updates and KL
    monitor — the held-out evaluations excluded, they are the study's, not the method's) and
    the accuracy of ``eval_{k}.jsonl`` (``k`` = stages done; 0 = untrained). Our runs log
    ``tokens``/``seconds`` per step; the TRL run logs ``tokens_total``/``train_seconds`` per
    evaluation."""
    from sat_theory.metrics import read_metrics

    points = {0: (0.0, 0.0)}
    tok = sec = 0.0
    seen = set()  # a stale batch serves several steps: count each rollout's tokens once
    for rec in read_metrics(d):
        if rec["kind"] == "step":
            if rec.get("rollout_id") not in seen:
                seen.add(rec.get("rollout_id"))
                tok += float(rec.get("tokens") or 0)
            sec += float(rec.get("seconds") or 0.0)
        elif rec["kind"] == "stage":
            k = int(rec["stage"]) + 1
            points[k] = (float(rec.get("tokens_total", tok)), float(rec.get("train_seconds", sec)))
    tokens, secs, acc = [], [], []
    for k in sorted(points):
        p = d / f"eval_{k}.jsonl"
        if p.is_file():
            sc = read_eval(p)
            tokens.append(points[k][0])
            secs.append(points[k][1])
            acc.append(sum(sc.values()) / len(sc))
    return tokens, secs, acc


def format_rate(path: Path) -> float:
    """Fraction of one eval file's final messages that follow the answer format."""
    recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return sum(bool(r.get("format_ok")) for r in recs) / len(recs)


#: sampled training messages per stage / generation / prompt of the first study's methods
#: (study.json's method; the common-schedule study uses :func:`messages_per_unit`)
OLD_MESSAGES = {"sat": 128, "sat-token": 128, "naive": 64, "joint": 64, "single": 32, "trl": 32,
                "comlrl": 40}


def budgets(d: Path) -> dict[int, float]:
    """``{checkpoint k: sampled training messages after it}`` of a run's eval files."""
    meta = json.loads((d / "study.json").read_text())
    per = (messages_per_unit(StudyConfig(**{k: v for k, v in meta["study"].items()
                                            if k in StudyConfig.__dataclass_fields__}),
                             meta["method"]) if "run" in meta else OLD_MESSAGES[meta["method"]])
    ks = sorted(int(p.stem[5:]) for p in d.glob("eval_*.jsonl") if p.stem[5:].isdigit())
    return {k: float(k * per) for k in ks}


def paired_on_schedule(da: Path, db: Path, *, reps: int = 10000) -> dict:
    """Run ``a`` against run ``b`` on their common checkpoints of the message grid
    (:data:`GRID_MESSAGES`, :func:`experiments.study_metrics.common_checkpoints`), under both
    scorings: ``{scoring: compare_runs(...)}`` plus ``checkpoints`` (the grid points' k of
    each run). Requires the same held-out problems (same prompts)."""
    import numpy as np

    from experiments.study_metrics import common_checkpoints, compare_runs

    rows = common_checkpoints([budgets(da), budgets(db)], GRID_MESSAGES)
    pa = [json.loads(x)["prompt"] for x in (da / "eval_0.jsonl").read_text().splitlines() if x.strip()]
    pb = [json.loads(x)["prompt"] for x in (db / "eval_0.jsonl").read_text().splitlines() if x.strip()]
    if pa != pb:
        raise ValueError(f"{da} and {db} are not scored on the same problems")
    out = dict(checkpoints=rows)
    for scoring in SCORINGS:
        (ka, Sa), (kb, Sb) = score_matrix(da, scoring), score_matrix(db, scoring)
        ia = np.array([ka.index(r[0]) for r in rows])
        ib = np.array([kb.index(r[1]) for r in rows])
        out[scoring] = compare_runs(Sa[ia], Sb[ib], reps=reps)
    return out


def report(out: Path) -> int:
    import pandas as pd

    rows, curves, swaps = [], {}, {}
    for d in sorted(p for p in out.iterdir() if (p / "study.json").is_file()):
        meta = json.loads((d / "study.json").read_text())
        evals = sorted((p for p in d.glob("eval_*.jsonl") if p.stem[5:].isdigit()),
                       key=lambda p: int(p.stem[5:]))
        if not meta.get("finished") or len(evals) < 2:
            continue
        before, after = read_eval(evals[0]), read_eval(evals[-1])
        gain, lo, hi = paired_bootstrap(before, after)
        tokens, secs, acc = curve(d)
        extra = {}
        if (d / "eval_0_swap.jsonl").is_file():  # plug-and-play: shock and recovery
            swapped = read_eval(d / "eval_0_swap.jsonl")
            for name, (x, y) in dict(shock=(before, swapped), recovery=(swapped, after)).items():
                g, g_lo, g_hi = paired_bootstrap(x, y)
                extra.update({name: g, f"{name}_ci_lo": g_lo, f"{name}_ci_hi": g_hi})
            swaps[d.name] = [acc[0], sum(swapped.values()) / len(swapped), *acc[1:]]
        else:
            curves[d.name] = (meta["method"], tokens, secs, acc)
        sb, sa = read_eval(evals[0], "strict"), read_eval(evals[-1], "strict")
        g_s, lo_s, hi_s = paired_bootstrap(sb, sa)
        extra.update(acc_untrained_strict=sum(sb.values()) / len(sb),
                     acc_final_strict=sum(sa.values()) / len(sa), gain_strict=g_s,
                     gain_strict_ci_lo=lo_s, gain_strict_ci_hi=hi_s,
                     format_final=format_rate(evals[-1]))
        rows.append(dict(run=d.name, method=meta["method"], seed=meta["seed"], **extra,
                         n_eval=len(before), stages=len(evals) - 1,
                         acc_untrained=sum(before.values()) / len(before),
                         acc_final=sum(after.values()) / len(after),
                         gain=gain, gain_ci_lo=lo, gain_ci_hi=hi,
                         ci_excludes_0=bool(lo > 0), best_acc=max(acc),
                         tokens=tokens[-1] if tokens else None,
                         train_minutes=secs[-1] / 60 if secs else None,
                         wall_minutes=meta["wall_seconds"] / 60))
    if not rows:
        print(f"no finished runs under {out}")
        return 1
    df = pd.DataFrame(rows)
    df.to_csv(out / "summary.csv", index=False)
    write_json_atomic(out / "summary.json", rows)
    (out / "summary.md").write_text(markdown_table(rows) + "\n")
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(df.round(3).to_string(index=False))
    comp = comparisons(out, rows)
    if comp:
        pd.DataFrame(comp).to_csv(out / "comparisons.csv", index=False)
        (out / "comparisons.md").write_text(comparisons_table(comp) + "\n")
        print(pd.DataFrame(comp).round(3).to_string(index=False))
    if curves:
        plot(curves, out)
    if swaps:
        plot_swaps(swaps, out)
    return 0


#: final-accuracy comparisons (a, b): every method against SAT of the same seed, and our
#: single agent against TRL's (the two n = 1 runs)
def _pairs(methods: set) -> list[tuple[str, str]]:
    out = [(m, "sat") for m in sorted(methods) if m not in ("sat", *SWAPS) and "sat" in methods]
    if {"single", "trl"} <= methods:
        out.append(("single", "trl"))
    return out


def _last_eval(d: Path) -> Path:
    return max((p for p in d.glob("eval_*.jsonl") if p.stem[5:].isdigit()),
               key=lambda p: int(p.stem[5:]))


def comparisons(out: Path, rows: list[dict]) -> list[dict]:
    """Final held-out accuracy of run a minus run b (same seed, hence the same held-out
    problems — checked), with the paired-bootstrap 95% CI over problems."""
    by = {(r["method"], r["seed"]): r for r in rows}
    res = []
    for a, b in _pairs({m for m, _ in by}):
        for seed in sorted({s for m, s in by if m == a}):
            if (b, seed) not in by:
                continue
            fa, fb = (_last_eval(out / by[(m, seed)]["run"]) for m in (a, b))
            prompts = [[json.loads(x)["prompt"] for x in f.read_text().splitlines() if x.strip()]
                       for f in (fa, fb)]
            if prompts[0] != prompts[1]:
                continue  # not the same held-out problems: no paired comparison
            diff, lo, hi = paired_bootstrap(read_eval(fb), read_eval(fa))
            ps = paired_on_schedule(out / by[(a, seed)]["run"], out / by[(b, seed)]["run"])
            sched = {f"{name}_{sc}{suffix}": v for sc in SCORINGS
                     for name in ("auc", "final", "drawdown")
                     for suffix, v in zip(("", "_ci_lo", "_ci_hi"), ps[sc]["diff"][name],
                                          strict=True)}
            res.append(dict(a=by[(a, seed)]["run"], b=by[(b, seed)]["run"], seed=seed,
                            acc_a=by[(a, seed)]["acc_final"], acc_b=by[(b, seed)]["acc_final"],
                            diff=diff, diff_ci_lo=lo, diff_ci_hi=hi,
                            common_checkpoints=len(ps["checkpoints"]),
                            mcnemar_p=ps["lenient"]["mcnemar_p"],
                            mcnemar_p_strict=ps["strict"]["mcnemar_p"], **sched,
                            tokens_a=by[(a, seed)]["tokens"], tokens_b=by[(b, seed)]["tokens"],
                            train_minutes_a=by[(a, seed)]["train_minutes"],
                            train_minutes_b=by[(b, seed)]["train_minutes"]))
    return res


def _ci(c: dict, key: str) -> str:
    """``+x.x [lo, hi]`` in points of ``c[key]`` and its ``_ci_lo``/``_ci_hi``."""
    return (f"{100 * c[key]:+.1f} [{100 * c[key + '_ci_lo']:+.1f}, "
            f"{100 * c[key + '_ci_hi']:+.1f}]")


def comparisons_table(comp: list[dict]) -> str:
    """Final accuracy a − b (lenient and strict, McNemar p) and, on the checkpoints both runs
    share on the message grid, AUC a − b under both scorings (points, paired 95% CIs)."""
    head = ("| a | b | final a | final b | final a − b, lenient [95% CI] (McNemar p) | final a − b, "
            "strict | shared checkpoints | AUC a − b, lenient | AUC a − b, strict | tokens a / b | "
            "training min a / b |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [f"| {c['a']} | {c['b']} | {c['acc_a']:.3f} | {c['acc_b']:.3f} | "
             f"{_ci(c, 'diff')} ({c['mcnemar_p']:.2g}) | {_ci(c, 'final_strict')} "
             f"({c['mcnemar_p_strict']:.2g}) | {c['common_checkpoints']} | {_ci(c, 'auc_lenient')} | "
             f"{_ci(c, 'auc_strict')} | {c['tokens_a']:.0f} / {c['tokens_b']:.0f} | "
             f"{c['train_minutes_a']:.1f} / {c['train_minutes_b']:.1f} |" for c in comp]
    return "\n".join([head, *lines])


def plot_swaps(swaps: dict, out: Path) -> None:
    """Held-out accuracy of the plug-and-play runs: before the swap, right after it, and
    after each following stage (TeamTR Fig. 6 with LLM agents)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sat_theory.plotting import (
        method_color,
        method_label,
        note_overlaps,
        paper_style,
        save_figure,
    )

    with paper_style():
        fig, ax = plt.subplots(figsize=(6, 3.8))
        for name, acc in sorted(swaps.items()):
            x = [-1, 0, *range(1, len(acc) - 1)]
            method, _, seed = name.rpartition("_s")  # run names are <method>_s<seed>
            strategy = SWAPS.get(method, name)
            ax.plot(x, acc, marker="o", ms=3, color=method_color(strategy),
                    label=f"{method_label(strategy)}, seed {seed}")
        ax.axvline(-0.5, color="k", lw=0.8, ls=":", label="swap")
        n = len(max(swaps.values(), key=len)) - 1
        ax.set_xticks([-1, *range(n)], ["before", *map(str, range(n))])
        ax.set_xlabel("stages after the swap")
        ax.set_ylabel("held-out accuracy (greedy)")
        ax.set_title("replacing agent 2 by a longer-trained single agent", fontsize=10)
        note_overlaps(ax)
        ax.legend(frameon=False, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2))
        fig.tight_layout()
        for p in save_figure(fig, out, "plug_and_play"):
            print(p)


def markdown_table(rows: list[dict]) -> str:
    """The summary as a Markdown table (accuracies and gains in points)."""
    head = ("| run | untrained | final | gain (points) [95% CI] | best | strict: untrained → "
            "final | strict gain [95% CI] | final format followed | tokens | training min "
            "| total min |\n|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        lines.append(f"| {r['run']} | {r['acc_untrained']:.3f} | {r['acc_final']:.3f} | "
                     f"{100 * r['gain']:+.1f} [{100 * r['gain_ci_lo']:+.1f}, "
                     f"{100 * r['gain_ci_hi']:+.1f}] | {r['best_acc']:.3f} | "
                     f"{r['acc_untrained_strict']:.3f} → {r['acc_final_strict']:.3f} | "
                     f"{_ci(r, 'gain_strict')} | {100 * r['format_final']:.0f}% | "
                     f"{r['tokens']:.0f} | {r['train_minutes']:.1f} | {r['wall_minutes']:.1f} |")
    return "\n".join(lines)


def plot(curves: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sat_theory.plotting import (
        legend_outside,
        method_color,
        method_label,
        note_overlaps,
        paper_style,
        save_figure,
    )

    names = {"trl": "TRL GRPO (n = 1)", "comlrl": "CoMLRL MAGRPO", "single": "single agent (n = 1)",
             "sat-token": "SAT, token-level ratio"}
    styles = ["-", "--", ":", "-."]  # one line style per seed, one color per method
    with paper_style():
        fig, ax = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
        for name, (method, tokens, secs, acc) in sorted(curves.items()):
            seed = name.rsplit("_s", 1)[-1]
            style = dict(color=method_color(method), marker="o", ms=3,
                         ls=styles[int(seed) % len(styles)] if seed.isdigit() else "-")
            label = f"{names.get(method, method_label(method))}, seed {seed}"
            ax[0].plot([t / 1000 for t in tokens], acc, label=label, **style)
            ax[1].plot([s / 60 for s in secs], acc, label=label, **style)
        ax[0].set_xlabel("generated training tokens (thousands)")
        ax[0].set_ylabel("held-out accuracy (greedy)")
        ax[0].set_title("accuracy vs tokens", fontsize=10)
        ax[1].set_xlabel("training wall time (minutes, 1 thread; evaluation excluded)")
        ax[1].set_title("accuracy vs wall time", fontsize=10)
        note_overlaps(ax[0])
        legend_outside(ax[1], fontsize=8)
        fig.tight_layout()
        for p in save_figure(fig, out, "learning"):
            print(p)


# ------------------------------------------------------------------ command line
def main(argv=None) -> int:
    cfg = StudyConfig()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--method", choices=[*METHODS, *PEERS, *SWAPS], help="method to run")
    p.add_argument("--seed", type=int, default=0, help="seed (≥ 0)")
    p.add_argument("--resume", action="store_true", help="continue a killed run")
    p.add_argument("--report", action="store_true", help="summarise every finished run in --out")
    p.add_argument("--run", default=None, metavar="NAME",
                   help="one run of the common-schedule study, e.g. plain_lr0.001_s0 or "
                        "tune/trl_lr0.003_s0 (methods: " + ", ".join(STUDY_METHODS) + ")")
    p.add_argument("--queue", choices=sorted(QUEUES), default=None,
                   help="run a queue of the common-schedule study, two runs at a time")
    p.add_argument("--jobs", type=int, default=2, help="--queue: runs at a time")
    p.add_argument("--report-common", action="store_true",
                   help="the common-schedule study's tables from the runs under --out")
    p.add_argument("--rescore", action="store_true",
                   help="re-score every run's eval files under --out from their saved final "
                        "messages (strict, lenient, format_ok)")
    p.add_argument("--stages", type=int, default=None,
                   help="override the method's stage count (smoke tests)")
    p.add_argument("--out", default="figures/llm_team_learning", help="study folder")
    for k, v in asdict(cfg).items():
        p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v,
                       help=StudyConfig.__dataclass_fields__[k].metadata["help"])
    a = p.parse_args(argv)
    cfg = StudyConfig(**{k: getattr(a, k) for k in asdict(cfg)})
    if a.seed < 0:
        p.error("--seed must be >= 0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.queue:
        return run_queue(out, a.queue, a.jobs)
    if a.run:
        run_one(cfg, a.run, out, a.resume)
        return 0
    if a.report_common:
        report_common(out)
        return 0
    if a.rescore:
        print(json.dumps(rescore(out)))
        return 0
    if a.report:
        return report(out)
    if a.method is None:
        p.error("give --method M (or --report)")
    if a.method == "trl":
        run_study_trl(cfg, a.seed, run_dir(out, "trl", a.seed), steps=a.stages or cfg.budget * 4,
                      resume=a.resume)
    elif a.method == "comlrl":
        from experiments.peer_comlrl import messages_per_prompt, run_study_comlrl

        # one SAT stage samples 2 rollouts x B prompts x G episodes x 2 messages
        budget = cfg.budget * 2 * cfg.prompts * cfg.group_size * 2
        n_prompts = a.stages or max(1, round(budget / messages_per_prompt(cfg.group_size)))
        run_study_comlrl(cfg, a.seed, run_dir(out, "comlrl", a.seed), n_prompts=n_prompts,
                         eval_every=max(1, n_prompts // cfg.budget), resume=a.resume)
    else:
        run_ours(cfg, a.method, a.seed, out, a.resume, a.stages)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
