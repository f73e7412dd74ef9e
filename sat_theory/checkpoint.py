"""Safe state files: tensors in safetensors, everything else JSON — no pickle anywhere.

A *state* is a tree of dicts, lists, tuples, ``str``/``int``/``float``/``bool``/``None``,
numpy arrays, torch tensors and instances of the dataclasses registered with
:func:`register_state_type` (the snapshots, batches and episodes of the backends). One state
is one file: a safetensors file whose tensors are the tree's arrays and whose header metadata
holds the rest of the tree as JSON, with every array replaced by a reference to its tensor.

The metadata is one key, ``sat_state``, whose value is the JSON object ``{"format",
"framework", "numpy_keys", "state"}``: safetensors writes metadata keys in a random order per
process (a Rust ``HashMap``), so one key is what makes the same state the same bytes (files
compare with ``cmp`` / SHA-256). Files written before (``sat-state-1``: the four fields as
four metadata keys) still load.

Reading such a file only parses JSON and copies raw tensor bytes: no object is ever built
from a name found in the file except the registered dataclasses, which are constructed from
their declared fields (so a crafted file can at worst fail to load, with one line). Fields
whose name starts with ``_`` are caches and are not stored.

JSON tags (objects with one key starting ``__``) keep what JSON alone would lose:
``{"__array__": k}`` / ``{"__tensor__": k}`` (numpy array / torch tensor ``k`` of the file),
``{"__tuple__": [...]}``, ``{"__items__": [[key, value], ...]}`` (dicts whose keys are not
all strings, e.g. torch optimizer states and evaluation caches keyed by version tuples),
``{"__float__": "inf" | "-inf" | "nan"}`` and ``{"__obj__": name, "fields": {...}}``.

Files are written atomically (temporary file in the same folder, ``fsync``, ``os.replace``),
so a reader sees either the previous state or the new one, never a torn file.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np

from .errors import InputError

__all__ = ["register_state_type", "save_state", "load_state", "encode", "decode",
           "write_atomic", "FORMAT"]

FORMAT = "sat-state-2"
#: the layout before ``FORMAT``: the header's four fields as four metadata keys (read only)
_FORMAT_1 = "sat-state-1"
#: the one metadata key of a ``FORMAT`` file
_HEADER_KEY = "sat_state"

#: registered dataclasses: name -> class (the only classes a state file can instantiate)
_TYPES: dict[str, type] = {}


def register_state_type(cls: type) -> type:
    """Allow instances of the dataclass ``cls`` in state files (usable as a decorator)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    _TYPES[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return cls


def _register_core_types() -> None:
    """The core's state types: batches of episodes and turns, and team policies."""
    from .policy import TeamPolicy
    from .team import Batch, Episode, Turn

    for cls in (Batch, Episode, Turn, TeamPolicy):
        register_state_type(cls)


def _is_torch_tensor(x) -> bool:
    mod = type(x).__module__
    return mod.startswith("torch") and type(x).__name__ in ("Tensor", "Parameter")


# ------------------------------------------------------------------ encode / decode
def encode(tree) -> tuple[object, dict]:
    """``(json_tree, tensors)``: the JSON-able form of ``tree`` and its arrays by key."""
    tensors: dict = {}

    def enc(x):
        if x is None or isinstance(x, bool | str):
            return x
        if isinstance(x, int | np.integer):
            return int(x)
        if isinstance(x, float | np.floating):
            x = float(x)
            if math.isfinite(x):
                return x
            return {"__float__": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, np.bool_):
            return bool(x)
        if isinstance(x, np.ndarray):
            if x.dtype == object:
                return {"__tuple__": [enc(v) for v in x.tolist()], "__objarray__": True}
            key = f"a{len(tensors)}"
            tensors[key] = np.ascontiguousarray(x)
            return {"__array__": key}
        if _is_torch_tensor(x):
            key = f"t{len(tensors)}"
            tensors[key] = x.detach().cpu().contiguous().clone()
            return {"__tensor__": key}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) and not k.startswith("__") for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"__items__": [[enc(k), enc(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            name = f"{type(x).__module__}.{type(x).__qualname__}"
            if name not in _TYPES:
                raise TypeError(f"{name} is not a registered state type")
            return {"__obj__": name,
                    "fields": {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x)
                               if f.init and not f.name.startswith("_")}}
        raise TypeError(f"cannot store a {type(x).__name__} in a state file")

    return enc(tree), tensors


def decode(obj, tensors: dict):
    """Inverse of :func:`encode` (``tensors``: the arrays by key)."""

    def dec(x):
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__array__" in x or "__tensor__" in x:
            key = x.get("__array__", x.get("__tensor__"))
            if key not in tensors:
                raise InputError(f"state file refers to a missing tensor {key!r}")
            return tensors[key]
        if "__tuple__" in x:
            items = [dec(v) for v in x["__tuple__"]]
            if x.get("__objarray__"):
                arr = np.empty(len(items), dtype=object)
                arr[:] = items
                return arr
            return tuple(items)
        if "__items__" in x:
            return {_hashable(dec(k)): dec(v) for k, v in x["__items__"]}
        if "__float__" in x:
            return float(x["__float__"])
        if "__obj__" in x:
            cls = _TYPES.get(x["__obj__"])
            if cls is None:
                raise InputError(f"state file holds an unknown object type {x['__obj__']!r}")
            return cls(**{k: dec(v) for k, v in x["fields"].items()})
        return {k: dec(v) for k, v in x.items()}

    return dec(obj)


def _hashable(k):
    return tuple(_hashable(v) for v in k) if isinstance(k, list | tuple) else k


# ------------------------------------------------------------------ files
def write_atomic(path, write) -> None:
    """``write(tmp_path)`` then fsync and rename onto ``path`` (same folder); the temporary
    file is removed if writing fails or is interrupted."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def save_state(path, tree) -> None:
    """Write ``tree`` (module docstring) atomically to the safetensors file ``path``."""
    meta_tree, tensors = encode(tree)
    torch_side = any(_is_torch_tensor(t) for t in tensors.values())
    header = {"format": FORMAT, "framework": "pt" if torch_side else "np",
              "numpy_keys": sorted(k for k, t in tensors.items() if isinstance(t, np.ndarray)),
              "state": meta_tree}
    # one key: safetensors would write several in a random order (module docstring)
    meta = {_HEADER_KEY: json.dumps(header, allow_nan=False, separators=(",", ":"))}
    if torch_side:
        import torch
        from safetensors.torch import save_file

        arrays = {k: torch.from_numpy(t.copy()) if isinstance(t, np.ndarray) else t
                  for k, t in tensors.items()}
    else:
        from safetensors.numpy import save_file

        arrays = tensors
    write_atomic(path, lambda tmp: save_file(arrays, str(tmp), metadata=meta))


def _header(meta: dict) -> dict:
    """The header ``{"format", "framework", "numpy_keys", "state"}`` of a state file from its
    safetensors metadata ``meta``: the JSON object under ``sat_state``, or, in a
    ``sat-state-1`` file, the four keys themselves (``numpy_keys`` and ``state`` as JSON text).
    Raises ``ValueError`` for a file that is neither."""
    if meta.get("format") == _FORMAT_1:
        return {"format": _FORMAT_1, "framework": meta["framework"],
                "numpy_keys": json.loads(meta["numpy_keys"]), "state": json.loads(meta["state"])}
    header = json.loads(meta[_HEADER_KEY]) if _HEADER_KEY in meta else None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError("not a state file of this project")
    return header


def load_state(path):
    """Read a state written by :func:`save_state`; any problem is one :class:`InputError`."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"state file not found: {path}")
    try:
        from safetensors import safe_open

        with safe_open(str(path), framework="np") as f:
            header = _header(f.metadata() or {})
        framework = header["framework"]
        numpy_keys = set(header["numpy_keys"])
        if framework == "pt":
            import torch  # noqa: F401  (a torch-side state belongs to a torch backend)
        with safe_open(str(path), framework=framework) as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        if framework == "pt":
            tensors = {k: t.numpy() if k in numpy_keys else t for k, t in tensors.items()}
        tree = header["state"]
    except InputError:
        raise
    except Exception as e:  # torn, foreign or crafted file
        raise InputError(f"cannot read state file {path}: {type(e).__name__}: "
                         f"{str(e)[:200]}") from None
    return decode(tree, tensors)


_register_core_types()
