"""The LLM flags of ``sat train`` (``--backend llm``), generated from the fields of
:class:`sat_llm.config.LLMConfig` (:func:`sat_theory.config_file.add_flags`). Imports nothing
heavy: ``sat train`` adds these flags even for the tabular backend.

The shared flags (``--agents --stages --delta --seed --group-size --groups --method --order
--beta --gamma --eps-w --out --quiet`` and the plug-and-play ones) come from
``sat_theory.commands.train``; these are the LLM-only ones, plus ``--prompts`` (another name
of ``--groups``) and the dataset task's options.
"""

from __future__ import annotations

from dataclasses import fields

from .config import ALGORITHM_DEFAULTS, DATASET_FLAGS, EVAL_FRACTION, LLMConfig

__all__ = ["add_arguments", "LLM_DEFAULTS", "DATASET_FLAGS"]

#: the LLM backend's defaults of shared flags (by flag dest; declared in sat_llm.config)
LLM_DEFAULTS = dict(
    agents=next(f.default for f in fields(LLMConfig) if f.name == "agents"),
    gamma=next(f.default for f in fields(LLMConfig) if f.name == "gamma"),
    groups=ALGORITHM_DEFAULTS["n_groups"], group_size=ALGORITHM_DEFAULTS["group_size"],
    delta=ALGORITHM_DEFAULTS["delta"])


def add_arguments(p) -> None:
    from sat_theory.config_file import add_flags, arg_type, with_range

    g = p.add_argument_group("llm backend (--backend llm; LLMConfig)")
    add_flags(g, LLMConfig)
    spec = ("int", 1, None, True, False)
    g.add_argument("--prompts", type=arg_type(spec), default=None,
                   help=with_range(f"prompts (groups) per rollout, B (default "
                                   f"{ALGORITHM_DEFAULTS['n_groups']}; another name of "
                                   "--groups)", spec))
    _dataset_arguments(p)




def _dataset_arguments(p) -> None:
    from sat_theory.config_file import arg_type, with_range

    g = p.add_argument_group("your own data (--dataset; task dataset)")  # --dataset: LLMConfig
    fraction = ("float", 0.0, 1.0, False, False)
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
                                   f"{EVAL_FRACTION})", fraction))
    g.add_argument("--checker", choices=("math-verify", "exact", "builtin"), default=None,
                   help="answer checker: math-verify (default; the math-verify package, plain "
                        "integers compared directly) | exact (the same string) | builtin (our "
                        "normaliser: \\boxed, $, commas, fractions and decimals as rationals)")
