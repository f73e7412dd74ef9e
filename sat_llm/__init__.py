"""LLM teams behind the shared :class:`sat_theory.team.Team` interface.

``sat_llm`` implements the ``Team`` protocol with real language models (transformers + peft
on CPU; a vLLM rollout engine for GPUs, imported lazily). The algorithm itself lives once in
:mod:`sat_theory.algorithm`; nothing of it is duplicated here.

This ``__init__`` imports nothing heavy: ``sat_llm.cli_args`` is imported by ``sat train``
even for the tabular backend, so torch/transformers/peft load only in the modules that use
them (``models``, ``rollout``, ``kl``, ``team``, ``train``).

Modules: ``config`` (``LLMConfig``, every setting declared once), ``models`` (named and file
models), ``tasks`` / ``task_base`` / ``team_tasks`` (locally generated tasks with verifiers;
``relay``, the split-information team task), ``data`` (datasets as tasks), ``protocol``
(canonical shared-context turn-taking, per-agent views), ``rollout`` (batched CPU generation),
``vllm_engine`` (multi-LoRA vLLM engine), ``kl`` (exact and sampled token KL), ``loss``
(clipped surrogate + β·KL), ``team`` (``LLMTeam``, assembled from ``episodes`` (episodes,
rollouts, held-out evaluation), ``scoring`` (the model passes: generation, log-prob check,
scoring, reference pass), ``updates`` (the trust-region update, micro-batching, OOM retry),
``adapters`` (LoRA adapters, snapshots, state) and ``chunks``), ``ray_team`` (agents as Ray
actors), ``limits`` (context-length checks), ``align`` (Stage-0), ``checkpoint`` (atomic
save/resume), ``backend`` (the LLM backend of the runner), ``trainer`` (``SATTrainer``, TRL
style), ``export`` / ``play`` (``sat export``, ``sat team``), ``cli_args`` / ``train``
(``sat train --backend llm``).
"""

__all__: list[str] = []
