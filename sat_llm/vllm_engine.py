"""A vLLM rollout engine with one LoRA adapter per agent version (GPU) — NOT EXERCISED.

This module has never been run: the machines this project was built and tested on have no
GPU and no vLLM (the GPU check, ``experiments/gpu_check.py``, runs it when ``vllm``
imports). It is written against vLLM's documented offline API (``vllm.LLM`` with
``enable_lora``, ``SamplingParams``, ``vllm.lora.request.LoRARequest``) and is imported only
when ``LLMConfig.engine == "vllm"``. Treat it as a starting point to be tested on a GPU.

Design (what keeps it consistent with the training model, and what the team checks):

- The base model is served from a Hugging Face directory written from the team's base, in
  the team's base dtype (a GGUF is converted and cached first by :mod:`sat_llm.models`;
  ``tiny-random`` is saved to a temporary directory).
- **Versions.** Every agent's adapter is written with peft's ``save_pretrained`` whenever
  its parameter version changed, and requested as ``LoRARequest(name, id, path)`` with an
  id unique to that version (vLLM caches adapters by id, so a reused id would serve stale
  weights). :meth:`VLLMEngine.generate` returns the version it served; the team raises
  :class:`~sat_llm.team.RolloutMismatchError` when it is not the agent's current version.
- **Log-probs.** vLLM is asked for the log-probability of each sampled token
  (``logprobs=0``) after temperature scaling (``logprobs_mode="processed_logprobs"`` where
  the installed vLLM has it; older versions report log-probs of the raw logits, which the
  check then flags at τ ≠ 1). The team recomputes them with its training model and raises
  beyond a dtype tolerance (:meth:`sat_llm.team.LLMTeam._check_logps`); the engine's are the
  behaviour log-probs. When vLLM reports none, the team's recomputation is used.
- Sampling: ``temperature=τ, top_p=1, top_k=-1`` (no truncation), ``stop_token_ids`` = the
  stop tokens. The stop token is part of the message (HF convention); should a vLLM version
  hold it back from ``token_ids``, it is appended (its log-prob is then unknown, and the
  team rescores that call's messages). Each call's seed is drawn from the host torch RNG, so a run
  is reproducible given the team's seed (vLLM's own sampler: not the HF draws).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sat_theory.errors import InputError

__all__ = ["VLLMEngine"]


class VLLMEngine:
    """Multi-LoRA generation for an :class:`~sat_llm.team.LLMTeam` (shared base only)."""

    def __init__(self, team, *, gpu_memory_utilization: float = 0.4):
        try:
            import torch
            import vllm  # noqa: F401
        except ImportError:
            raise InputError("engine 'vllm' needs vLLM on a GPU machine: pip install -e '.[gpu]'") from None
        if not torch.cuda.is_available():
            raise InputError("engine 'vllm' needs a CUDA GPU; use the default engine 'hf' on CPU")
        if len(team._bases) != 1:
            raise InputError("engine 'vllm' serves one shared base; heterogeneous teams use 'hf'")
        import inspect

        from vllm import LLM

        self.team = team
        self.dir = Path(tempfile.mkdtemp(prefix="sat_vllm_"))
        base_dir = self.dir / "base"
        peft_model, tok = next(iter(team._bases.values()))
        peft_model.get_base_model().save_pretrained(base_dir)
        tok.save_pretrained(base_dir)
        kw = dict(model=str(base_dir), enable_lora=True, max_loras=team.n_agents,
                  max_lora_rank=team.cfg.lora_r, dtype=str(team.dtypes[0]).removeprefix("torch."),
                  seed=team.cfg.seed, gpu_memory_utilization=gpu_memory_utilization)
        if "logprobs_mode" in inspect.signature(LLM.__init__).parameters or _engine_arg("logprobs_mode"):
            kw["logprobs_mode"] = "processed_logprobs"
        self.llm = LLM(**kw)
        self._saved: dict[int, tuple[int, object]] = {}
        self._next_id = 1

    def _lora(self, agent: int):
        """``(LoRARequest, version)`` of the agent's current adapter, written when its version
        changed (a new id per version: vLLM caches adapters by id)."""
        from vllm.lora.request import LoRARequest

        v = self.team._version[agent]
        if agent not in self._saved or self._saved[agent][0] != v:
            path = self.dir / f"agent{agent}_v{v}"
            self.team._model(agent).save_pretrained(path, selected_adapters=[f"agent{agent}"])
            sub = path / f"agent{agent}"  # peft writes non-default adapters into a subfolder
            req = LoRARequest(f"agent{agent}_v{v}", self._next_id, str(sub if sub.is_dir() else path))
            self._next_id += 1
            self._saved[agent] = (v, req)
        return self._saved[agent][1], self._saved[agent][0]

    def generate(self, agent: int, contexts, *, max_new_tokens: int, temperature: float,
                 stop_ids, greedy: bool = False):
        """``(messages, logps, version)``: one message per context (token ids, the stop token
        kept when one was emitted), vLLM's per-token log-probs of them (``None`` when it
        reported none) and the adapter version served."""
        import numpy as np
        import torch
        from vllm import SamplingParams

        seed = int(torch.randint(2**31 - 1, ()))  # host RNG: reproducible given the team seed
        sp = SamplingParams(temperature=0.0 if greedy else float(temperature), top_p=1.0, top_k=-1,
                            max_tokens=int(max_new_tokens), stop_token_ids=list(stop_ids),
                            seed=None if greedy else seed, logprobs=0)
        prompts = [{"prompt_token_ids": list(c)} for c in contexts]
        req, version = self._lora(agent)
        outs = self.llm.generate(prompts, sp, lora_request=req, use_tqdm=False)
        stops = set(int(s) for s in stop_ids)
        msgs, lps = [], []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lp = _token_logprobs(c)
            if c.finish_reason == "stop" and (not ids or ids[-1] not in stops):
                # the stop token was held back: its log-prob is not reported either
                stop = c.stop_reason if isinstance(c.stop_reason, int) else min(stops)
                ids.append(int(stop))
                lp = None
            msgs.append(ids[:max_new_tokens])
            lps.append(None if lp is None else np.asarray(lp[:max_new_tokens], dtype=np.float64))
        if any(lp is None or len(lp) != len(m) for lp, m in zip(lps, msgs, strict=True)):
            return msgs, None, version  # incomplete: the team rescores every message
        return msgs, lps, version


def _token_logprobs(completion):
    """The sampled tokens' log-probs of a vLLM completion (``logprobs=0``), or ``None``."""
    if not completion.logprobs:
        return None
    out = []
    for tok, step in zip(completion.token_ids, completion.logprobs, strict=False):
        entry = step.get(tok) if step else None
        if entry is None:
            return None
        out.append(float(entry.logprob))
    return out


def _engine_arg(name: str) -> bool:
    """Whether vLLM's engine arguments know ``name`` (``LLM`` passes keywords through)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return False
    return name in getattr(EngineArgs, "__dataclass_fields__", {})
