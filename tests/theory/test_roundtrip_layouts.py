"""Save → load → evaluate equals in-memory evaluation for every layout; negative entries are
refused (InputError from the API, exit 2 from the CLI) even when the row sums to 1; the
activity mask survives a save (issue 25). ``sat verify`` runs the same statements
(file_round_trip, input_validation); these tests pin them in CI at unit level and run the
installed ``sat`` executable once."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from sat_theory import FactorizedMDP, TeamPolicy, evaluate, evaluate_many
from sat_theory.cli import main
from sat_theory.errors import InputError
from sat_theory.mdp import save_npz_atomic
from sat_theory.verify.cases import random_policy
from sat_theory.verify.pipeline import evaluation_error, layout_mdps, negative_variants

LAYOUTS = layout_mdps(5, 2)


@pytest.mark.parametrize("kind,mdp", LAYOUTS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(LAYOUTS)])
def test_save_load_evaluate_equals_in_memory(tmp_path, kind, mdp):
    pol = random_policy(mdp, np.random.default_rng(1))
    mdp.save(tmp_path / "m.npz")
    pol.save(tmp_path / "p.npz")
    back = FactorizedMDP.load(tmp_path / "m.npz")
    assert back.kind == mdp.kind
    np.testing.assert_array_equal(back.active, mdp.active)
    assert evaluation_error(evaluate(mdp, pol), evaluate(back, TeamPolicy.load(tmp_path / "p.npz", back))) == 0.0


def test_a_saved_mask_survives_load(tmp_path):
    kind, mdp = next((k, m) for k, m in LAYOUTS if k == "masked" and not m.active.all())
    mdp.save(tmp_path / "m.npz")
    with np.load(tmp_path / "m.npz") as z:
        np.testing.assert_array_equal(z["active"], mdp.active)
    assert not FactorizedMDP.load(tmp_path / "m.npz").active.all()


@pytest.mark.parametrize("kind,mdp", LAYOUTS[:5], ids=[k for k, _ in LAYOUTS[:5]])
def test_negative_entries_are_refused_even_when_the_row_sums_to_one(tmp_path, kind, mdp):
    rng = np.random.default_rng(2)
    variants = negative_variants(mdp, random_policy(mdp, rng), rng)
    assert variants
    for what, marr, parr in variants:
        save_npz_atomic(tmp_path / "m.npz", marr)
        save_npz_atomic(tmp_path / "p.npz", parr)
        with pytest.raises(InputError, match="negative"):
            TeamPolicy.load(tmp_path / "p.npz", FactorizedMDP.load(tmp_path / "m.npz"))
        assert main(["eval", str(tmp_path / "m.npz"), "--policy", str(tmp_path / "p.npz")]) == 2, what


def test_the_sat_executable_exits_2_on_a_negative_probability(tmp_path):
    kind, mdp = LAYOUTS[0]
    rng = np.random.default_rng(4)
    what, marr, parr = negative_variants(mdp, random_policy(mdp, rng), rng)[0]
    save_npz_atomic(tmp_path / "m.npz", marr)
    save_npz_atomic(tmp_path / "p.npz", parr)
    r = subprocess.run([sys.executable, "-m", "sat_theory.cli", "eval", str(tmp_path / "m.npz"),
                        "--policy", str(tmp_path / "p.npz")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.startswith("sat eval: error:") and "negative" in r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1


@pytest.mark.parametrize("kind,mdp", LAYOUTS, ids=[f"{k}-{i}" for i, (k, _) in enumerate(LAYOUTS)])
def test_evaluate_many_equals_the_loop_on_every_layout(kind, mdp):
    rng = np.random.default_rng(6)
    pols = [random_policy(mdp, rng) for _ in range(3)]
    batch = evaluate_many(mdp, pols)
    for b, p in enumerate(pols):
        ev = evaluate(mdp, p)
        for key in ("V", "d", "A", "Q"):
            np.testing.assert_allclose(getattr(batch, key)[b], getattr(ev, key), rtol=1e-10, atol=1e-12)
        assert batch.J[b] == pytest.approx(ev.J, rel=1e-10, abs=1e-12)
