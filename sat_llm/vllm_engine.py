"""A vLLM rollout engine with one LoRA adapter per agent (GPU) — NOT EXERCISED.

This module has never been run: the machines this project was built and tested on have no
GPU and no vLLM. It is written against vLLM's documented offline API (``vllm.LLM`` with
``enable_lora``, ``SamplingParams``, ``vllm.lora.request.LoRARequest``) and is imported only
when ``LLMConfig.engine == "vllm"``. Treat it as a starting point to be tested on a GPU.

Design (what keeps it consistent with the CPU path):

- The base model is served from a Hugging Face directory (a GGUF is converted and cached
  first by :mod:`sat_llm.models`; ``tiny-random`` is saved to a temporary directory).
- Every agent's adapter is written with peft's ``save_pretrained`` whenever its parameter
  version changed, and requested as ``LoRARequest(name, id, path)`` with an id unique to
  that version (vLLM caches adapters by id).
- Sampling: ``temperature=τ, top_p=1, top_k=-1`` (no truncation), ``stop_token_ids`` = the
  stop tokens; vLLM keeps the stop token out of ``token_ids`` unless asked, so
  ``include_stop_str_in_output`` and an explicit append restore the CPU convention (the
  stop token is part of the message).
- Behaviour log-probabilities are *not* taken from vLLM (its logprobs may be raw or
  processed depending on version and settings); the team recomputes them by teacher-forced
  scoring with the same float32 model it trains, so ratios start at exactly 1.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from sat_theory.errors import InputError

__all__ = ["VLLMEngine"]


class VLLMEngine:
    """Multi-LoRA generation for an :class:`~sat_llm.team.LLMTeam` (shared base only)."""

    def __init__(self, team, *, gpu_memory_utilization: float = 0.5):
        try:
            import torch
            import vllm  # noqa: F401
        except ImportError:
            raise InputError("engine 'vllm' needs vLLM on a GPU machine: pip install -e '.[gpu]'") from None
        if not torch.cuda.is_available():
            raise InputError("engine 'vllm' needs a CUDA GPU; use the default engine 'hf' on CPU")
        if len(team._bases) != 1:
            raise InputError("engine 'vllm' serves one shared base; heterogeneous teams use 'hf'")
        from vllm import LLM

        self.team = team
        self.dir = Path(tempfile.mkdtemp(prefix="sat_vllm_"))
        base_dir = self.dir / "base"
        peft_model, tok = next(iter(team._bases.values()))
        peft_model.get_base_model().save_pretrained(base_dir)
        tok.save_pretrained(base_dir)
        self.llm = LLM(model=str(base_dir), enable_lora=True, max_loras=team.n_agents,
                       max_lora_rank=team.cfg.lora_r, dtype="float32", seed=team.cfg.seed,
                       gpu_memory_utilization=gpu_memory_utilization)
        self._saved: dict[int, tuple[int, object]] = {}
        self._next_id = 1

    def _lora(self, agent: int):
        from vllm.lora.request import LoRARequest

        v = self.team._version[agent]
        if agent not in self._saved or self._saved[agent][0] != v:
            path = self.dir / f"agent{agent}_v{v}"
            self.team._model(agent).save_pretrained(path, selected_adapters=[f"agent{agent}"])
            sub = path / f"agent{agent}"  # peft writes non-default adapters into a subfolder
            req = LoRARequest(f"agent{agent}_v{v}", self._next_id, str(sub if sub.is_dir() else path))
            self._next_id += 1
            self._saved[agent] = (v, req)
        return self._saved[agent][1]

    def generate(self, agent: int, contexts, *, max_new_tokens: int, temperature: float,
                 stop_ids, greedy: bool = False) -> list[list[int]]:
        """One message per context (token ids, the stop token kept when one was emitted)."""
        from vllm import SamplingParams

        sp = SamplingParams(temperature=0.0 if greedy else float(temperature), top_p=1.0, top_k=-1,
                            max_tokens=int(max_new_tokens), stop_token_ids=list(stop_ids),
                            seed=None)
        prompts = [{"prompt_token_ids": list(c)} for c in contexts]
        outs = self.llm.generate(prompts, sp, lora_request=self._lora(agent), use_tqdm=False)
        stops = set(int(s) for s in stop_ids)
        msgs = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            if c.finish_reason == "stop" and (not ids or ids[-1] not in stops):
                stop = c.stop_reason if isinstance(c.stop_reason, int) else min(stops)
                ids.append(int(stop))
            msgs.append(ids[:max_new_tokens])
        return msgs
