"""TRL's ``GRPOTrainer`` as a peer of our n = 1 (single-agent) LLM training, with our settings.

:func:`grpo_trainer` builds a TRL 1.16 ``GRPOTrainer`` that differs from ``LLMTeam`` with
``agents=1`` only in the algorithm's loss (``loss_type``) and in who samples:

- the same base model and tokenizer (loaded by :func:`sat_llm.models.load_model`: float32,
  pad token and chat template fixed the same way), LoRA rank / alpha / targets (dropout 0,
  no bias), learning rate (AdamW, weight decay 0, constant schedule, gradient-norm clip);
- the same prompts: each problem's chat messages are our canonical single-agent rendering
  (:meth:`sat_llm.protocol.Protocol.messages`, system + task), which TRL turns into token ids
  with the same chat template (:func:`prompt_ids` shows TRL's ids, to compare);
- the same group size ``G`` (``num_generations``), prompts per step ``B`` (one optimizer step
  on ``B × G`` completions, like one ``update`` with ``minibatch ≥ B·G``), max new tokens,
  temperature (plain sampling: top-p 1, no top-k), stop tokens (:func:`sat_llm.team.stop_ids`);
- the reward is our task's verifier on the cleaned completion, exactly what our rollout
  scores (``task.score(problem, protocol.clean(text))``);
- ``use_cpu=True``, ``beta=0.0`` (no reference model), ``report_to=[]``, float32 (no bf16),
  no gradient checkpointing, no checkpoints (the study saves them itself at its evaluations:
  :func:`experiments.llm_team_learning.run_study_trl`, resumed exactly with :func:`resumable`).

``loss_type``: TRL's default ``"dapo"`` (token-level ratios, normalised by the batch's token
count). ``loss_type="luspo"`` with ``importance_sampling_level="sequence"`` is the one whose
on-policy update (TRL's only case at ``num_iterations=1``) has *exactly* our gradient, and
``"dr_grpo"`` ours divided by ``max_new_tokens`` (``tests/llm/test_trl_oracle.py``). Advantages:
TRL's default ``scale_rewards="group"`` divides by the unbiased group std + 1e-4, ours by the
population std (``sat_theory.estimators.group_advantages``): a factor ``sqrt((G−1)/G)`` on every
group, which Adam's step normalisation all but cancels (pass ``scale_rewards="none"`` and our
``normalize_std=False`` for identical advantages). Any other ``GRPOConfig`` field can be passed
through ``**config``.

Usage (the learning study)::

    from sat_llm.models import hf_dir
    from sat_llm.tasks import make_task
    task = make_task("arithmetic", digits=1)
    tr = grpo_trainer(hf_dir("smollm2-135m"), task, task.problems("train", 160, 0),
                      lora_r=8, lora_alpha=16, lora_targets=("q_proj", "v_proj"), group_size=4,
                      prompts_per_step=4, lr=1e-3, max_new_tokens=16, temperature=0.7, seed=0,
                      out_dir="runs/trl", steps=50)
    tr.train()
    adapter_into(team, tr)   # evaluate TRL's adapter with our held-out evaluation

``trainer.state.log_history`` holds one record per step (``logging_steps=1``), with TRL's
``reward``, ``completions/mean_length`` (generated tokens per completion) and ``step_time``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["grpo_trainer", "prompt_ids", "adapter_into", "trl_available", "resumable"]


def trl_available() -> str | None:
    """``None`` if TRL imports; else the reason (one line)."""
    import importlib.util

    return None if importlib.util.find_spec("trl") else "needs trl (pip install -e '.[dev]')"


def grpo_trainer(model_dir, task, problems, *, lora_r: int = 8, lora_alpha: int = 16,
                 lora_targets=("q_proj", "v_proj"), group_size: int = 4, prompts_per_step: int = 4,
                 lr: float = 2e-4, max_new_tokens: int = 32, temperature: float = 1.0, seed: int = 0,
                 out_dir, steps: int = 1, grad_clip: float = 1.0, loss_type: str = "dapo",
                 **config):
    """A ``trl.GRPOTrainer`` on ``problems`` (:class:`sat_llm.tasks.Problem` s of ``task``)
    with our settings (module docstring); ``steps`` optimizer steps of ``prompts_per_step ×
    group_size`` completions each when ``.train()`` runs. ``model_dir``: a Hugging Face
    folder (:func:`sat_llm.models.hf_dir`) or any name :func:`sat_llm.models.load_model` takes.
    ``config``: further ``GRPOConfig`` fields (they override the ones set here)."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    from sat_llm.models import load_model
    from sat_llm.protocol import Protocol
    from sat_llm.team import stop_ids

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model, tok = load_model(str(model_dir), seed=seed)
    protocol = Protocol(1)
    problems = list(problems)

    def verifier(prompts, completions, problem, **kw):
        """Our task's score of each completion (index ``problem`` into ``problems``)."""
        return [float(task.score(problems[i], protocol.clean(c[0]["content"])))
                for i, c in zip(problem, completions, strict=True)]

    data = Dataset.from_list([{"prompt": protocol.messages(p.prompt, [], 0, True), "problem": i}
                              for i, p in enumerate(problems)])
    args = dict(output_dir=str(Path(out_dir)), use_cpu=True, bf16=False, report_to=[], beta=0.0,
                num_generations=group_size, per_device_train_batch_size=prompts_per_step * group_size,
                gradient_accumulation_steps=1, max_completion_length=max_new_tokens,
                temperature=temperature, top_p=1.0, top_k=0, learning_rate=lr,
                lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, optim="adamw_torch",
                max_grad_norm=grad_clip, loss_type=loss_type, max_steps=steps,
                gradient_checkpointing=False, save_strategy="no", logging_steps=1, seed=seed,
                data_seed=seed, generation_kwargs={"eos_token_id": stop_ids(tok)},
                disable_tqdm=True)
    args.update(config)
    lora = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0,
                      target_modules=list(lora_targets), bias="none")
    trainer = GRPOTrainer(model=model, reward_funcs=[verifier], args=GRPOConfig(**args),
                          train_dataset=data, processing_class=tok, peft_config=lora)
    trainer.remove_callback(PrinterCallback)  # quiet: every record is in state.log_history
    return trainer


def prompt_ids(trainer) -> list[list[int]]:
    """TRL's token ids of every problem's prompt (its own chat-template tokenization), in the
    order of ``problems``."""
    ids, _, _ = trainer._tokenize_prompts([row["prompt"] for row in trainer.train_dataset])
    return [list(x) for x in ids]


def adapter_into(team, trainer, agent: int = 0) -> None:
    """Copy the trained LoRA weights of a peft model — a TRL trainer's ``.model``, or the
    model itself — into ``team``'s ``agent`` (same base and LoRA layout), e.g. to evaluate
    them with ``team.evaluate()``."""
    # a trainer holds its model; a peft model forwards unknown attributes (also `.model`)
    model = trainer.model if hasattr(trainer, "train_dataset") else trainer
    weights = {k.replace(".default.", "."): p.detach().clone()
               for k, p in model.named_parameters() if ".default." in k}
    team._set_weights(agent, weights)
    team._bump(agent)


def resumable(trainer) -> None:
    """Make ``trainer.train(resume_from_checkpoint=...)`` continue *exactly* where a run that
    was never stopped would be. Transformers restores the adapter, the optimizer, the LR
    scheduler, the RNG states and the global step, and skips the batches of the current epoch
    already trained; but TRL's ``RepeatSampler`` draws one permutation of the prompts per
    epoch from its own generator, seeded once, and a resumed trainer builds a new sampler,
    so without this it would order epoch ``e > 0`` as epoch 0. Here the new sampler's
    generator draws the ``e = global_step // steps per epoch`` permutations of the epochs
    already trained (at ``on_train_begin``, once the checkpoint's state is loaded) before
    its first epoch. Resume only from a checkpoint at a generation boundary (global step a
    multiple of ``steps_per_generation``): TRL keeps the buffered minibatches of a
    generation in memory only."""
    import torch
    from transformers import TrainerCallback

    samplers = []
    make = trainer._get_train_sampler

    def keep(dataset=None):
        s = make(dataset)
        samplers.append(s)
        return s

    trainer._get_train_sampler = keep

    class Advance(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kw):
            if not state.global_step or not samplers or not getattr(samplers[-1], "shuffle", False):
                return
            per_epoch = max(len(train_dataloader) // args.gradient_accumulation_steps, 1)
            if state.global_step % args.steps_per_generation:
                raise ValueError(f"resume at step {state.global_step}: not a generation boundary")
            s = samplers[-1]
            for _ in range(state.global_step // per_epoch):
                torch.randperm(s.num_samples, generator=s.generator)

    trainer.add_callback(Advance())
