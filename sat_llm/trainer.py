"""``SATTrainer``: train an LLM team from Python in the style of TRL's trainers.

    from datasets import Dataset
    from sat_llm.trainer import SATConfig, SATTrainer

    def exact(prompts, completions, answer, **kw):        # TRL-style reward function
        return [float(c.strip().endswith(a)) for c, a in zip(completions, answer)]

    trainer = SATTrainer(models=["tiny-random"], reward_funcs=exact,
                         args=SATConfig(output_dir="run", agents=2, stages=3),
                         train_dataset=Dataset.from_dict({"prompt": [...], "answer": [...]}))
    trainer.train()                              # trainer.train(resume_from_checkpoint=True)

- ``models``: one base model shared by ``args.agents`` agents, or one per agent: names or
  paths (as ``--model``/``--agent-models``), or loaded ``transformers`` models
  (``PreTrainedModel``, as TRL's ``GRPOTrainer`` takes) with their tokenizer as
  ``processing_class``. A loaded model is saved next to the run (``<output_dir>.models/
  model{j}``: safetensors weights, config, tokenizer) and the run uses that folder like a
  ``--model DIR``, so config.json names exact weights and the run resumes (and ``sat train
  --resume`` can continue it) without the object.
- ``reward_funcs``: a callable or a list, each called as TRL calls them,
  ``f(prompts=[...], completions=[...], answer=[...])`` → one float per completion, on the
  final message of each episode (``prompts`` are the problems as the team sees them, with the
  answer-format hint; ``answer`` is the gold column); several are summed with
  ``reward_weights``. Rewards in ``[0, 1]`` keep the team's advantage bound.
- ``train_dataset``/``eval_dataset``: HF ``datasets.Dataset`` with a prompt column (``prompt``,
  ``question`` or ``problem``) and an answer column (``answer`` or ``solution``); they are
  saved next to the run (``<output_dir>.dataset``, a ``save_to_disk`` folder with splits
  ``train`` and ``test``) so that the run's config.json names the exact rows. Without an
  eval dataset, ``eval_fraction`` of the training rows are held out (the dataset task's rule).
- ``args``: :class:`SATConfig`, the fields of :class:`~sat_theory.algorithm.TrainConfig` (with
  the LLM backend's defaults, :data:`sat_llm.config.ALGORITHM_DEFAULTS`) and of
  :class:`~sat_llm.config.LLMConfig` — the same fields ``sat train --backend llm`` makes its
  flags from — plus the run options ``output_dir``, ``overwrite``, ``save_policies``,
  ``report_to``, ``progress``.

It runs the same runner as ``sat train`` (:func:`sat_theory.runner.run_fresh`): the same run
folder, checkpoints, ``report_to`` trackers and ``sat export``. The saved configuration
records the reward functions by name; since code cannot be saved, such a run resumes only
through ``SATTrainer(...).train(resume_from_checkpoint=True)`` with the same functions
(``sat train --resume`` refuses it rather than score with something else).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import field, fields, make_dataclass
from pathlib import Path

from sat_theory.algorithm import TrainConfig
from sat_theory.config_file import setting
from sat_theory.errors import InputError

from .backend import LLMBackend
from .config import ALGORITHM_DEFAULTS, LLMConfig
from .tasks import DatasetTask

__all__ = ["SATConfig", "SATTrainer", "RewardTask"]

#: the run options of :class:`SATConfig` (``sat train``'s --out, --overwrite, ...)
_RUN_OPTIONS = [
    ("output_dir", "str | None", setting(None, "run folder (config.json, metrics.jsonl, "
                                         "checkpoint)")),
    ("overwrite", "bool", setting(False, "replace a run in output_dir")),
    ("save_policies", "bool", setting(False, "write policies/stage{k}.safetensors")),
    ("report_to", "str | None", setting(None, "trackers: none | tensorboard | wandb | mlflow "
                                        "(default: tensorboard when installed)")),
    ("progress", "bool", setting(True, "progress bars (on a terminal)")),
    ("eval_fraction", "float", setting(0.2, "held-out share of train_dataset when there is no "
                                       "eval_dataset", range=("float", 0.0, 1.0, False, False))),
]


def _copy(f, default):
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=f.metadata)
    return field(default=default, metadata=f.metadata)


def _sat_config_fields() -> list:
    """The fields of TrainConfig (LLM defaults) then LLMConfig's others, then the run options."""
    out, seen = [], set()
    for f in fields(TrainConfig):
        out.append((f.name, f.type, _copy(f, ALGORITHM_DEFAULTS.get(f.name, f.default))))
        seen.add(f.name)
    for f in fields(LLMConfig):
        if f.name not in seen:
            out.append((f.name, f.type, _copy(f, f.default)))
    return out + _RUN_OPTIONS


def _train_config(self) -> TrainConfig:
    """The algorithm's settings."""
    return TrainConfig(**{f.name: getattr(self, f.name) for f in fields(TrainConfig)})


def _llm_config(self, **overrides) -> LLMConfig:
    """The LLM backend's settings (``overrides``: the trainer's model, task, data)."""
    return LLMConfig(**{**{f.name: getattr(self, f.name) for f in fields(LLMConfig)}, **overrides})


def _post_init(self):
    self.train_config()  # every algorithm setting checked now, before any work


#: ``SATTrainer``'s settings: every field of TrainConfig and LLMConfig (the sources of ``sat
#: train --backend llm``'s flags, with that backend's defaults) and the run options
SATConfig = make_dataclass(
    "SATConfig", _sat_config_fields(),
    namespace=dict(train_config=_train_config, llm_config=_llm_config, __post_init__=_post_init,
                   __module__=__name__,
                   __doc__="Settings of :class:`SATTrainer` (module docstring)."))


class RewardTask(DatasetTask):
    """The dataset task scored by TRL-style reward functions instead of a checker: the score
    of a final message is ``Σ_k w_k f_k(prompts=[p], completions=[m], answer=[a])[0]``."""

    def __init__(self, path, reward_funcs: list[Callable], reward_weights: list[float],
                 **options):
        super().__init__(path, **options)
        self.reward_funcs, self.reward_weights = list(reward_funcs), list(reward_weights)

    def score(self, problem, final_message):
        return float(sum(w * float(f(prompts=[problem.prompt], completions=[final_message],
                                     answer=[problem.answer])[0])
                         for f, w in zip(self.reward_funcs, self.reward_weights, strict=True)))


def _is_model(m) -> bool:
    """A loaded ``transformers`` model (anything with ``save_pretrained`` and a ``config``)."""
    return hasattr(m, "save_pretrained") and hasattr(m, "config")


def _names(funcs) -> list[str]:
    return [f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}" for f in funcs]


class _RewardBackend(LLMBackend):
    """The LLM backend with the team's task scored by the trainer's reward functions."""

    def __init__(self, reward_funcs, reward_weights):
        super().__init__()
        self.reward_funcs, self.reward_weights = reward_funcs, reward_weights

    def make_team(self, config: dict, cfg, out):
        saved = config["backend"].get("reward_funcs")
        if saved is not None and saved != _names(self.reward_funcs):
            raise InputError(f"the run in {out} was scored by {saved}; resume it with the same "
                             f"reward functions, not {_names(self.reward_funcs)}")
        team = LLMBackend.make_team(self, {**config, "backend": {
            k: v for k, v in config["backend"].items() if k != "reward_funcs"}}, cfg, out)
        llm = config["backend"]["llm"]
        team.task = RewardTask(llm["prompts"], self.reward_funcs, self.reward_weights,
                               **llm["task_options"])
        return team


class SATTrainer:
    """Sequential trust-region training of an LLM team (module docstring)."""

    def __init__(self, models, reward_funcs, args=None, train_dataset=None, eval_dataset=None,
                 reward_weights=None, processing_class=None):
        self.args = args if args is not None else SATConfig()
        if self.args.output_dir is None:
            raise InputError("SATConfig(output_dir=...) is required (the run folder)")
        one = isinstance(models, (str, os.PathLike)) or _is_model(models)
        models = [models] if one else list(models)
        if not models or not all(isinstance(m, (str, os.PathLike)) or _is_model(m) for m in models):
            raise InputError("models: give model names, paths or loaded transformers models "
                             "(PreTrainedModel)")
        #: the loaded models by agent, saved at train() to model_dir / f"model{j}"
        self.loaded = {j: m for j, m in enumerate(models) if _is_model(m)}
        if self.loaded and processing_class is None:
            raise InputError("models: a loaded model needs its tokenizer as processing_class=... "
                             "(it is saved with the model)")
        self.processing_class = processing_class
        self.models = [os.fspath(self.model_dir / f"model{j}") if j in self.loaded
                       else os.fspath(m) for j, m in enumerate(models)]
        self.reward_funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) \
            else [reward_funcs]
        if not self.reward_funcs or not all(callable(f) for f in self.reward_funcs):
            raise InputError("reward_funcs: give a callable or a list of callables")
        self.reward_weights = [1.0] * len(self.reward_funcs) if reward_weights is None \
            else [float(w) for w in reward_weights]
        if len(self.reward_weights) != len(self.reward_funcs):
            raise InputError(f"{len(self.reward_weights)} reward_weights for "
                             f"{len(self.reward_funcs)} reward_funcs")
        if train_dataset is None:
            raise InputError("train_dataset is required")
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset
        self.backend = _RewardBackend(self.reward_funcs, self.reward_weights)

    @property
    def data_dir(self) -> Path:
        """Where the datasets are saved (``<output_dir>.dataset``)."""
        return Path(os.fspath(self.args.output_dir) + ".dataset")

    @property
    def model_dir(self) -> Path:
        """Where loaded models are saved (``<output_dir>.models``)."""
        return Path(os.fspath(self.args.output_dir) + ".models")

    def _replace_owned(self, d: Path, marker: str, what: str, write: Callable[[Path], None]):
        """``write(tmp)`` then ``tmp`` renamed to ``d``; an existing ``d`` is replaced only
        when it carries this trainer's ``marker`` and ``overwrite`` is set — a folder this
        trainer did not write is refused, never deleted."""
        if d.exists():
            if not (d / marker).is_file():
                raise InputError(f"{d} exists and was not written by SATTrainer; move it away")
            if not self.args.overwrite:
                raise InputError(f"{d} holds the {what} of a run already; use "
                                 "overwrite=True to replace it or train(resume_from_checkpoint=True)")
            shutil.rmtree(d)
        tmp = d.with_name(d.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        (tmp / marker).write_text("written by sat_llm.trainer.SATTrainer\n")
        tmp.rename(d)

    def _save_datasets(self) -> None:
        """``save_to_disk`` the datasets as splits ``train`` (and ``test``)."""
        from datasets import DatasetDict

        splits = {"train": self.train_dataset}
        if self.eval_dataset is not None:
            splits["test"] = self.eval_dataset
        self._replace_owned(self.data_dir, ".sat-trainer-data", "data",
                            lambda tmp: DatasetDict(splits).save_to_disk(str(tmp)))

    def _save_models(self) -> None:
        """Every loaded model with ``processing_class`` as ``model_dir/model{j}``
        (safetensors), the folders ``--model DIR`` loads."""
        def write(tmp: Path) -> None:
            for j, model in self.loaded.items():
                model.save_pretrained(str(tmp / f"model{j}"), safe_serialization=True)
                self.processing_class.save_pretrained(str(tmp / f"model{j}"))

        if self.loaded:
            self._replace_owned(self.model_dir, ".sat-trainer-models", "models", write)

    def _llm_config(self) -> LLMConfig:
        a = self.args
        task_options = dict(a.task_options or {}, split="train", checker="exact")
        if self.eval_dataset is not None:
            task_options["eval_split"] = "test"
        else:
            task_options["eval_fraction"] = a.eval_fraction
        many = len(self.models) > 1
        return a.llm_config(model=self.models[0], agent_models=tuple(self.models) if many else None,
                            agents=len(self.models) if many else a.agents, task="dataset",
                            prompts=str(self.data_dir), task_options=task_options)

    def train(self, resume_from_checkpoint: bool = False) -> dict:
        """Run (or with ``resume_from_checkpoint`` continue) the training; the summary
        (``J_start``/``J_end``: held-out score before and after, counts)."""
        from sat_theory.runner import RunOptions, run_fresh, run_resume

        a = self.args
        if resume_from_checkpoint:
            summary, _, _ = run_resume(a.output_dir, stages=a.stages, report_to=a.report_to,
                                       backend=self.backend, progress=a.progress)
            return summary
        self._save_datasets()
        self._save_models()
        llm_cfg = self._llm_config()
        cfg = a.train_config()
        cfg.check_team(llm_cfg.agents)
        config = self.backend.config_of(llm_cfg)
        config["backend"]["reward_funcs"] = _names(self.reward_funcs)
        return run_fresh(self.backend, cfg, config, RunOptions(
            out=a.output_dir, overwrite=a.overwrite, save_policies=a.save_policies,
            report_to=a.report_to, progress=a.progress))
