"""No user file is ever unpickled: state files are safetensors + JSON, and crafted files run
nothing (they fail with one line, exit 2)."""

from __future__ import annotations

import pathlib
import pickle

import numpy as np
import pytest

from sat_theory.checkpoint import load_state, save_state
from sat_theory.cli import main
from sat_theory.errors import InputError
from sat_theory.policy import TeamPolicy
from sat_theory.team import Batch, Episode, Turn

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUN = ["train", "--env", "random-turn", "--agents", "2", "--states", "4", "--stages", "1",
       "--quiet"]


class _Payload:
    """Unpickling this runs ``open(marker, "w")``: the proof that a loader unpickled it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _one_line_error(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert pattern in err, err
    return err


def test_crafted_pickle_checkpoint_runs_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(RUN + ["--out", str(out)]) == 0
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    pickle.loads(evil)  # the payload works when unpickled ...
    assert marker.exists()
    marker.unlink()
    for name in ("checkpoint.safetensors", "checkpoint.pt"):
        (out / name).write_bytes(evil)
    rc = main(["train", "--resume", str(out), "--quiet"])
    _one_line_error(capsys, rc, "cannot read state file")
    assert not marker.exists()  # ... and the resume never unpickled it


def test_state_file_naming_an_unregistered_type_is_refused(tmp_path):
    """The JSON tree may name only registered dataclasses; anything else is refused without
    importing or calling it."""
    path = tmp_path / "s.safetensors"
    save_state(path, {"x": 1})
    import json

    from safetensors.numpy import save_file

    meta = {"format": "sat-state-1", "framework": "np", "numpy_keys": "[]",
            "state": json.dumps({"__obj__": "os.system", "fields": {"command": "true"}})}
    save_file({}, str(path), metadata=meta)
    with pytest.raises(InputError, match="unknown object type 'os.system'"):
        load_state(path)


def test_state_round_trip_keeps_every_value(tmp_path):
    rng = np.random.default_rng(3)
    pol = TeamPolicy((rng.random((3, 2)), rng.random((3, 4))))
    batch = Batch([Episode(0, [Turn(1, 2, 0, -0.5, 0, 1.25)], 2.5)], 7,
                  extra={"versions": (1, 2), "inf": float("inf")})
    tree = {"a": [1, 2.5, None, True, "s", float("nan"), -float("inf")], "t": (1, (2, 3)),
            "int_keys": {0: "zero", (1, 2): "pair"}, "arr": np.arange(6).reshape(2, 3),
            "bool": np.array([True, False]), "policy": pol, "batch": batch,
            "rng": np.random.default_rng(5).bit_generator.state, "__dunder": 1}
    path = tmp_path / "s.safetensors"
    save_state(path, tree)
    back = load_state(path)
    assert back["a"][:5] == [1, 2.5, None, True, "s"] and np.isnan(back["a"][5])
    assert back["a"][6] == -float("inf") and back["t"] == (1, (2, 3))
    assert back["int_keys"] == {0: "zero", (1, 2): "pair"} and back["__dunder"] == 1
    assert np.array_equal(back["arr"], tree["arr"]) and back["arr"].dtype == tree["arr"].dtype
    assert back["bool"].dtype == bool
    assert all(np.array_equal(x, y) for x, y in zip(back["policy"].factors, pol.factors,
                                                    strict=True))
    assert back["batch"].episodes == batch.episodes and back["batch"].extra["versions"] == (1, 2)
    assert back["rng"] == tree["rng"]
    assert not list(tmp_path.glob(".*tmp*"))


def test_torn_state_file_is_one_input_error(tmp_path):
    path = tmp_path / "s.safetensors"
    save_state(path, {"w": np.ones(1000)})
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(InputError, match="cannot read state file"):
        load_state(path)


def test_no_pickle_loader_on_any_user_file_path():
    """No ``pickle.load(s)``, ``torch.load`` without ``weights_only=True``, ``np.load`` with
    pickles allowed, in the package sources."""
    bad = []
    for path in list((ROOT / "sat_theory").rglob("*.py")) + list((ROOT / "sat_llm").rglob("*.py")):
        for k, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if ("pickle.load" in code or "weights_only=False" in code
                    or "allow_pickle=True" in code
                    or ("torch.load(" in code and "weights_only=True" not in code)):
                bad.append(f"{path.relative_to(ROOT)}:{k}: {line.strip()}")
    assert not bad, bad


# ------------------------------------------------------------------ resource limits
def _zip_bomb(path, shape=(100_000, 100_000)):
    """An .npz whose one member declares ``shape`` float64 (74.5 GiB) but holds 1 MiB of
    zeros, deflated to a few KB."""
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("P.npy", "w", force_zip64=True) as f:
            np.lib.format.write_array_header_1_0(
                f, {"descr": "<f8", "fortran_order": False, "shape": shape})
            f.write(b"\0" * (1 << 20))


def test_declared_sizes_are_checked_before_any_member_is_read(tmp_path, capsys):
    bomb = tmp_path / "bomb.npz"
    _zip_bomb(bomb)
    assert bomb.stat().st_size < 100_000
    err = _one_line_error(capsys, main(["eval", str(bomb), "--policy", str(bomb)]),
                          "would take 74.5 GiB, over the memory budget of 4.0 GiB")
    assert "--max-memory" in err


def test_scalar_sizes_are_checked_and_error_lines_are_short(tmp_path, capsys):
    f = tmp_path / "m.npz"
    np.savez(f, P=np.full((2, 1, 2), 0.5), R=np.zeros((2, 1)), turn=np.zeros(2, int),
             n_agents=np.array(10**8), rho0=np.array([1.0, 0.0]), gamma=np.array(0.9))
    err = _one_line_error(capsys, main(["eval", str(f), "--policy", str(f)]),
                          "n_agents = 100000000")
    assert len(err) < 400
    # a smaller team passes the budget; its missing factors are listed briefly
    np.savez(f, P=np.full((2, 1, 2), 0.5), R=np.zeros((2, 1)), turn=np.zeros(2, int),
             n_agents=np.array(1000), rho0=np.array([1.0, 0.0]), gamma=np.array(0.9))
    err = _one_line_error(capsys, main(["eval", str(f), "--policy", str(f)]), "and 995 more")
    assert len(err) < 400


def test_max_memory_flag_sets_the_budget(tmp_path, capsys):
    from sat_theory import mdp as mdp_module
    from sat_theory.envs import random_mdp

    f = tmp_path / "m.npz"
    random_mdp(50, 2, 2, layout="turn", seed=0).save(f)
    before = mdp_module.MAX_MEMORY
    try:
        _one_line_error(capsys, main(["--max-memory", "10K", "eval", str(f), "--policy", "p"]),
                        "over the memory budget of 10.0 KiB")
        assert main(["--max-memory", "junk", "eval", str(f), "--policy", "p"]) == 2
    finally:
        mdp_module.MAX_MEMORY = before


def test_a_file_that_is_not_npz_is_named_so(tmp_path, capsys):
    f = tmp_path / "m.npz"
    f.write_bytes(b"just some text\n" * 10)
    err = _one_line_error(capsys, main(["eval", str(f), "--policy", str(f)]),
                          "as .npz: not a zip archive")
    assert "pickle" not in err
