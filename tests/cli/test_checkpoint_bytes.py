"""State files are byte-stable: the same state saved by two fresh processes is the same bytes
(safetensors writes several metadata keys in a random order per process, so the header is one
key); files in the earlier four-key layout (``sat-state-1``) still load; a corrupt header of
the current layout is one :class:`InputError`."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from sat_theory.checkpoint import FORMAT, encode, load_state, save_state
from sat_theory.errors import InputError
from sat_theory.policy import TeamPolicy
from sat_theory.team import Batch, Episode, Turn

ROOT = pathlib.Path(__file__).resolve().parents[2]
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _trees() -> dict:
    """Name -> state: a numpy-side state with every JSON tag and registered type, and (where
    torch is installed) a torch-side one with numpy arrays among its tensors."""
    rng = np.random.default_rng(3)
    trees = {"np": {
        "a": [1, 2.5, None, True, "s", float("nan"), -float("inf")], "t": (1, (2, 3)),
        "int_keys": {0: "zero", (1, 2): "pair"}, "arr": np.arange(6).reshape(2, 3),
        "bool": np.array([True, False]), "__dunder": 1, "z": 0, "b": 1,
        "policy": TeamPolicy((rng.random((3, 2)), rng.random((3, 4)))),
        "batch": Batch([Episode(0, [Turn(1, 2, 0, -0.5, 0, 1.25)], 2.5)], 7,
                       extra={"versions": (1, 2), "inf": float("inf")}),
        "rng": np.random.default_rng(5).bit_generator.state}}
    if HAS_TORCH:
        import torch

        g = torch.Generator().manual_seed(0)
        trees["pt"] = {"w": torch.randn(3, 4, generator=g), "h": torch.randn(5, generator=g).half(),
                       "i": torch.arange(3), "np": np.ones((2, 2), np.float32),
                       "opt": {0: {"step": torch.tensor(3.0)}}, "x": 1}
    return trees


def _save_all(folder) -> None:
    """Save every state of :func:`_trees` to ``folder/NAME.safetensors`` (run in a child)."""
    for name, tree in _trees().items():
        save_state(pathlib.Path(folder) / f"{name}.safetensors", tree)


def _same(x, y) -> bool:
    """``x`` and ``y`` are the same tree: same types, dtypes, shapes and values (NaN = NaN)."""
    if type(x) is not type(y):
        return False
    if isinstance(x, np.ndarray):
        return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
    if type(x).__module__.startswith("torch"):
        import torch

        return x.dtype == y.dtype and x.shape == y.shape and bool(torch.equal(x, y))
    if isinstance(x, dict):
        return list(x) == list(y) and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list | tuple):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y, strict=True))
    if hasattr(x, "__dataclass_fields__"):  # the stored fields (``_`` ones are caches)
        return all(_same(getattr(x, f), getattr(y, f)) for f in x.__dataclass_fields__
                   if not f.startswith("_"))
    return x == y or (x != x and y != y)


def _metadata(path) -> dict:
    """The ``__metadata__`` object of the safetensors header of ``path``, read raw."""
    data = pathlib.Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n])["__metadata__"]


def _save_format_1(path, tree) -> None:
    """Write ``tree`` as ``save_state`` did before the one-key header: ``format`` /
    ``framework`` / ``numpy_keys`` / ``state`` as four metadata keys."""
    meta_tree, tensors = encode(tree)
    torch_side = any(not isinstance(t, np.ndarray) for t in tensors.values())
    meta = {"format": "sat-state-1", "framework": "pt" if torch_side else "np",
            "numpy_keys": json.dumps(sorted(k for k, t in tensors.items()
                                            if isinstance(t, np.ndarray))),
            "state": json.dumps(meta_tree, allow_nan=False)}
    if torch_side:
        import torch
        from safetensors.torch import save_file

        tensors = {k: torch.from_numpy(t.copy()) if isinstance(t, np.ndarray) else t
                   for k, t in tensors.items()}
    else:
        from safetensors.numpy import save_file
    save_file(tensors, str(path), metadata=meta)


def test_fresh_processes_save_the_same_state_as_the_same_bytes(tmp_path):
    """Three interpreters: with the four-key header they agreed only by chance (the key order
    is drawn per process)."""
    folders = [tmp_path / str(k) for k in range(3)]
    for folder in folders:
        folder.mkdir()
        subprocess.run([sys.executable, "-c", "import sys; from tests.cli.test_checkpoint_bytes"
                        " import _save_all; _save_all(sys.argv[1])", str(folder)],
                       cwd=ROOT, check=True, timeout=600)
    names = sorted(p.name for p in folders[0].iterdir())
    assert names == sorted(f"{n}.safetensors" for n in _trees())
    for name in names:
        first = (folders[0] / name).read_bytes()
        assert all((f / name).read_bytes() == first for f in folders[1:]), name
        assert list(_metadata(folders[0] / name)) == ["sat_state"]
        assert json.loads(_metadata(folders[0] / name)["sat_state"])["format"] == FORMAT
        assert _same(load_state(folders[0] / name), _trees()[name.split(".")[0]])


@pytest.mark.parametrize("name", ["np", "pt"])
def test_a_file_in_the_four_key_layout_loads_to_the_same_tree(tmp_path, name):
    if name == "pt" and not HAS_TORCH:
        pytest.skip("torch is not installed")
    tree = _trees()[name]
    path = tmp_path / "old.safetensors"
    _save_format_1(path, tree)
    assert set(_metadata(path)) == {"format", "framework", "numpy_keys", "state"}
    assert _same(load_state(path), tree)


def _corrupt_header(path, change) -> None:
    """Rewrite the ``sat_state`` JSON text of ``path`` (a ``save_state`` file) as
    ``change(text)``, tensors kept."""
    from safetensors.numpy import load_file, save_file

    text = _metadata(path)["sat_state"]
    save_file(load_file(str(path)), str(path), metadata={"sat_state": change(text)})


@pytest.mark.parametrize("change, pattern", [
    (lambda s: s[:-1], "JSONDecodeError"),
    (lambda s: "[]", "not a state file"),
    (lambda s: s.replace(FORMAT, "sat-state-9"), "not a state file"),
    (lambda s: s.replace('"framework":"np"', '"framework":"evil"'), "cannot read state file"),
    (lambda s: s.replace('"framework":"np",', ""), "KeyError"),
    (lambda s: s.replace('"numpy_keys":["a0"]', '"numpy_keys":7'), "TypeError"),
    (lambda s: s.replace('"a0"', '"a9"'), "missing tensor 'a9'"),
])
def test_a_corrupt_header_is_one_input_error(tmp_path, change, pattern):
    path = tmp_path / "s.safetensors"
    save_state(path, {"x": np.arange(3), "n": 1})
    _corrupt_header(path, change)
    with pytest.raises(InputError, match=pattern):
        load_state(path)


def test_bytes_corrupted_inside_the_header_are_one_input_error(tmp_path):
    """A same-length change of the header bytes on disk: safetensors still parses the file, the
    state JSON inside does not."""
    path = tmp_path / "s.safetensors"
    save_state(path, {"x": np.arange(3), "n": 1})
    data = path.read_bytes()
    assert data.count(b'\\"state\\":{') == 1
    path.write_bytes(data.replace(b'\\"state\\":{', b'\\"state\\"#{'))
    with pytest.raises(InputError, match="cannot read state file .*JSONDecodeError"):
        load_state(path)
