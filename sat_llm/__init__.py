"""LLM teams behind the shared :class:`sat_theory.team.Team` interface.

``sat_llm`` implements the ``Team`` protocol with real language models (transformers + peft
on CPU; a vLLM rollout engine for GPUs, imported lazily). The algorithm itself lives once in
:mod:`sat_theory.algorithm`; nothing of it is duplicated here.

This ``__init__`` imports nothing heavy: ``sat_llm.cli_args`` is imported by ``sat train``
even for the tabular backend, so torch/transformers/peft load only in the modules that use
them (``models``, ``rollout``, ``kl``, ``team``, ``train``).

Modules: ``models`` (named and file models), ``tasks`` (locally generated tasks with
verifiers), ``protocol`` (canonical shared-context turn-taking), ``rollout`` (batched CPU
generation), ``vllm_engine`` (GPU engine, not exercised here), ``kl`` (exact and sampled
token KL), ``loss`` (clipped surrogate + β·KL), ``team`` (``LLMTeam``), ``align`` (Stage-0),
``checkpoint`` (atomic save/resume), ``cli_args`` / ``train`` (``sat train --backend llm``).
"""

__all__: list[str] = []
