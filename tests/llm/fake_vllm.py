"""A stand-in for the parts of vLLM's offline API that :mod:`sat_llm.vllm_engine` uses, on
the CPU with transformers + peft — to test *our glue* (what we hand vLLM and how we read its
answers), not vLLM. It copies the vLLM behaviour that the glue depends on:

- ``LLM(model=DIR, dtype=..., enable_lora=True, max_lora_rank=R, ...)`` loads the base from
  ``DIR`` and, like vLLM's loaders, refuses a checkpoint whose tensor names are not the
  model's own (missing or unexpected names are an error, not a warning).
- ``LoRARequest(name, id, path)``: adapters are loaded once per **id** and cached by it
  (vLLM does; a reused id serves the first adapter loaded under it, whatever the path).
- ``SamplingParams.seed`` seeds each **request** separately (two requests with the same seed
  and prompt get the same completion). Unknown keyword arguments are a ``TypeError``.
- ``generate`` takes one ``SamplingParams`` or one per prompt; a completion's ``token_ids``
  include the stop token (vLLM V1) unless ``HOLD_BACK_STOP`` is set (older versions), with
  ``finish_reason`` ``"stop"``/``"length"`` and ``stop_reason`` the stop token id;
  ``logprobs=0`` reports each sampled token's log-probability, after temperature
  (``logprobs_mode="processed_logprobs"``); ``ignore_eos=False`` also stops at the model's eos.

:func:`install` puts it in ``sys.modules`` as ``vllm`` (with ``vllm.lora.request``).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field

import torch

#: older vLLM versions hold the stop token back from ``token_ids``
HOLD_BACK_STOP = False


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


_SP_FIELDS = ("temperature", "top_p", "top_k", "max_tokens", "stop_token_ids", "seed",
              "logprobs", "ignore_eos", "detokenize")


class SamplingParams:
    def __init__(self, **kw):
        unknown = set(kw) - set(_SP_FIELDS)
        if unknown:
            raise TypeError(f"SamplingParams got unexpected keyword arguments {sorted(unknown)}")
        defaults = dict(temperature=1.0, top_p=1.0, top_k=0, max_tokens=16, stop_token_ids=None,
                        seed=None, logprobs=None, ignore_eos=False, detokenize=True)
        for k, v in {**defaults, **kw}.items():
            setattr(self, k, v)


@dataclass
class CompletionOutput:
    token_ids: list
    logprobs: list | None
    finish_reason: str
    stop_reason: int | None = None
    index: int = 0
    text: str = ""


@dataclass
class RequestOutput:
    prompt_token_ids: list
    outputs: list = field(default_factory=list)


class LLM:
    #: every LLM built (tests look at what the glue asked for)
    instances: list = []

    def __init__(self, model: str, *, dtype: str = "auto", enable_lora: bool = False,
                 max_loras: int = 1, max_lora_rank: int = 16, seed: int = 0,
                 gpu_memory_utilization: float = 0.9, logprobs_mode: str = "raw_logprobs",
                 enable_prefix_caching: bool = True):
        from transformers import AutoModelForCausalLM

        self.kwargs = dict(model=model, dtype=dtype, enable_lora=enable_lora,
                           max_loras=max_loras, max_lora_rank=max_lora_rank, seed=seed,
                           logprobs_mode=logprobs_mode, enable_prefix_caching=enable_prefix_caching)
        self.base, info = AutoModelForCausalLM.from_pretrained(
            model, dtype=getattr(torch, dtype), local_files_only=True, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys")}
        if bad:  # vLLM's weight loaders look every name up: unknown or absent ones fail
            raise ValueError(f"checkpoint {model} does not match the model: {bad}")
        self.base.eval()
        self.eos = self.base.generation_config.eos_token_id
        self.eos = set(self.eos if isinstance(self.eos, list) else [self.eos])
        self.model = None  # the peft model once an adapter is loaded
        self.loaded: dict[int, str] = {}  # lora id -> path loaded under it
        self.requests: list = []  # (lora request, [SamplingParams]) of every call
        self._rng = torch.Generator().manual_seed(seed)
        LLM.instances.append(self)

    def _adapter(self, req: LoRARequest) -> None:
        from peft import PeftModel

        name = f"lora{req.lora_int_id}"
        if req.lora_int_id not in self.loaded:  # cached by id, never reloaded
            if self.model is None:
                self.model = PeftModel.from_pretrained(self.base, req.lora_path, adapter_name=name)
            else:
                self.model.load_adapter(req.lora_path, adapter_name=name)
            self.model.eval()
            self.loaded[req.lora_int_id] = req.lora_path
        self.model.set_adapter(name)

    @torch.no_grad()
    def generate(self, prompts, sampling_params, *, lora_request=None, use_tqdm=True):
        if not isinstance(sampling_params, (list, tuple)):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        self.requests.append((lora_request, list(sampling_params)))
        if lora_request is not None:
            self._adapter(lora_request)
            model = self.model
        else:
            model = self.base
        return [self._one(model, p["prompt_token_ids"], sp)
                for p, sp in zip(prompts, sampling_params, strict=True)]

    def _one(self, model, prompt: list, sp: SamplingParams) -> RequestOutput:
        gen = (torch.Generator().manual_seed(int(sp.seed)) if sp.seed is not None
               else self._rng)
        stops = set(sp.stop_token_ids or ()) | (set() if sp.ignore_eos else self.eos)
        ids, lps, finish, reason = list(prompt), [], "length", None
        for _ in range(int(sp.max_tokens)):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            if sp.temperature == 0:
                tok = int(logits.argmax())
                logp = torch.log_softmax(logits, -1)
            else:
                logp = torch.log_softmax(logits / sp.temperature, -1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
            ids.append(tok)
            lps.append({tok: Logprob(float(logp[tok]), rank=1)})
            if tok in stops:
                finish = "stop"
                reason = tok if tok in set(sp.stop_token_ids or ()) else None
                break
        out = ids[len(prompt):]
        if finish == "stop" and HOLD_BACK_STOP:
            out, lps = out[:-1], lps[:-1]
        return RequestOutput(prompt_token_ids=list(prompt), outputs=[CompletionOutput(
            token_ids=out, logprobs=lps if sp.logprobs is not None else None,
            finish_reason=finish, stop_reason=reason)])


def install(monkeypatch) -> types.ModuleType:
    """Put the stand-in in ``sys.modules`` as ``vllm`` for one test; returns it."""
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = LoRARequest
    lora.request = request
    vllm.lora = lora
    LLM.instances = []
    for name, mod in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, mod)
    return vllm
