"""The code paths between a file and a number (docs/theory.md §8, "Files and batched paths").

A certificate is only as good as the MDP and policies it was computed on. These checks run
the paths a user's data takes — ``.npz`` save and load (every layout), validation of what
is loaded, the ``sat eval`` command, and the batched evaluator — against the in-memory
objects and the unbatched :func:`sat_theory.evaluate.evaluate` the other checks rest on:

- ``file_round_trip``: save → load → evaluate equals in-memory evaluation, for dense
  simultaneous, masked (the saved ``active`` mask must survive), turn-taking, sparse CSR
  turn-taking and sparse factored MDPs, through the API and through ``sat eval --json``;
- ``input_validation``: an entry below ``−SUM_TOL`` is refused (``InputError``; exit 2 from
  ``sat eval``) in every probability array a file holds, even when its row sums to 1 —
  clipping it and renormalising would silently evaluate another MDP;
- ``batched_equals_loop``: :func:`sat_theory.evaluate.evaluate_many` (both input forms,
  dense and sparse MDPs) equals a loop of :func:`evaluate`.

Why in ``sat verify`` and not only in tests: ``sat verify`` is what a user runs to trust the
numbers on their machine and install; a loader or batched path that drifts fails it there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile

import numpy as np

from ..errors import SUM_TOL, InputError
from ..evaluate import evaluate, evaluate_many
from ..mdp import FactorizedMDP, save_npz_atomic
from ..policy import TeamPolicy
from .base import CheckResult, check
from .cases import LAYOUTS, random_mdps, random_policy
from .tally import Tally, check_mutation, count

__all__ = ["ROUND_TRIP_TOL", "BATCH_TOL", "layout_mdps", "evaluation_error", "negative_variants"]

SECTION = "docs/theory.md §8 files and batched paths"

#: a saved MDP and policy load back bit for bit (``check_distribution_rows`` keeps valid rows
#: as they are), so save → load → evaluate is the same computation: equal to roundoff of
#: one LU (relative, per entry of V, d, A and J)
ROUND_TRIP_TOL = 1e-12
#: batched LAPACK solves differ from one LU by roundoff: relative, per entry
BATCH_TOL = 1e-10


def layout_mdps(seed: int, per_layout: int) -> list[tuple[str, FactorizedMDP]]:
    """``per_layout`` random MDPs of each stored layout: ``simultaneous``, ``masked`` and
    ``turn`` (dense), ``turn-sparse`` (CSR turn-taking, saved as ``P_data/P_indices/P_indptr``)
    and ``factored-sparse`` (a CSR masked MDP, saved densely)."""
    out = []
    for k, m in enumerate(random_mdps(seed, per_layout * len(LAYOUTS), max_states=7)):
        kind = LAYOUTS[k % len(LAYOUTS)]
        out.append((kind, m))
        if kind == "turn":
            out.append(("turn-sparse", m.to_sparse()))
        elif kind == "masked":
            out.append(("factored-sparse", m.to_sparse()))
    return out


def evaluation_error(a, b) -> float:
    """Largest relative difference ``|x − y|/(1 + |x| + |y|)`` over ``V, d, A`` and ``J`` of two
    evaluations (objects with those attributes)."""
    worst = 0.0
    for key in ("V", "d", "A", "J"):
        x, y = np.asarray(getattr(a, key), dtype=np.float64), np.asarray(getattr(b, key), dtype=np.float64)
        if x.shape != y.shape:
            return float("inf")
        worst = max(worst, float((np.abs(x - y) / (1.0 + np.abs(x) + np.abs(y))).max(initial=0.0)))
    return worst


def _cli(argv: list[str]) -> tuple[int, str, str]:
    """``sat ARGV`` in this process: (exit status, stdout, stderr). The command is found as a
    shell finds it, through the installed ``sat`` console-script entry point: what these
    checks verify is the command a user runs, and the verify suite, below the command line,
    imports no command-line module (tests/cli/test_layering.py). Without an installed ``sat``
    (a bare source tree) the status is 127 and the check fails, saying so."""
    from importlib.metadata import entry_points

    found = list(entry_points(group="console_scripts", name="sat"))
    if not found:
        return 127, "", "the sat command is not installed (pip install -e .)"
    main = found[0].load()
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


@check("file_round_trip", "docs/theory.md §8 (file formats of docs/theory.md §1)", SECTION,
       mutations=("drop_mask", "perturb_loaded"))
def file_round_trip(*, quick: bool = False, seed: int = 0,
                    mutation: str | None = None) -> CheckResult:
    """For random MDPs of every layout (:func:`layout_mdps`) and a random team policy:
    ``FactorizedMDP.save`` → ``FactorizedMDP.load`` and ``TeamPolicy.save`` → ``TeamPolicy.load``
    give the same layout, activity mask and evaluation (``V, d, A, J`` to ``ROUND_TRIP_TOL``),
    and ``sat eval MDP --policy POL --json`` prints the same ``J, V, d``.

    Mutations: ``drop_mask`` loads the MDP without its ``active`` array (a masked MDP read as
    simultaneous); ``perturb_loaded`` compares with the in-memory MDP's rewards shifted by 1e-9
    relative (the tolerance must see a change that small)."""
    name = "file_round_trip"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 8101])
    T = Tally()
    worst, kinds = 0.0, {}
    with tempfile.TemporaryDirectory(prefix="sat-verify-") as tmp:
        mdp_path, pol_path = os.path.join(tmp, "mdp.npz"), os.path.join(tmp, "pol.npz")
        for kind, mdp in layout_mdps(seed + 21, count(quick, 2, 6)):
            pol = random_policy(mdp, rng)
            loaded, lpol = _save_and_load(mdp, pol, mdp_path, pol_path,
                                          drop_mask=mutation == "drop_mask")
            ref = _shift_rewards(mdp, 1e-9) if mutation == "perturb_loaded" else mdp
            ev, ev2 = evaluate(ref, pol), evaluate(loaded, lpol)
            same = (loaded.kind == mdp.kind and loaded.n_agents == mdp.n_agents
                    and np.array_equal(loaded.active, mdp.active))
            err = evaluation_error(ev, ev2) if same else float("inf")
            T.record(same and err <= ROUND_TRIP_TOL, 0.0 - err, None,  # 0.0 − 0.0 prints 0, not −0
                     f"{kind} {mdp.describe()}: layout/mask kept {same}, evaluation differs by {err:.3g}")
            worst = max(worst, err)
            kinds[kind] = kinds.get(kind, 0) + 1
            rc, out, errtxt = _cli(["eval", mdp_path, "--policy", pol_path, "--json"])
            if rc != 0:
                T.record(False, -np.inf, None, f"{kind}: sat eval exit {rc}: {errtxt.strip()}")
                continue
            cli_err = _cli_eval_error(json.loads(out), ev)
            T.record(cli_err <= ROUND_TRIP_TOL, 0.0 - cli_err, None,
                     f"{kind}: sat eval --json differs from the in-memory evaluation by {cli_err:.3g}")
    return T.result(name, [
        "layouts: " + ", ".join(f"{k} {v}" for k, v in kinds.items())
        + f"; largest relative difference after save → load → evaluate {worst:.2g} "
        f"(tolerance {ROUND_TRIP_TOL:g}); sat eval --json agrees",
    ], tightness=False)


def _save_and_load(mdp: FactorizedMDP, pol: TeamPolicy, mdp_path: str, pol_path: str, *,
                   drop_mask: bool = False) -> tuple[FactorizedMDP, TeamPolicy]:
    """``mdp`` and ``pol`` saved to the two paths and loaded back; ``drop_mask`` deletes the
    saved ``active`` array in between (the ``drop_mask`` mutation)."""
    mdp.save(mdp_path)
    pol.save(pol_path)
    if drop_mask:
        with np.load(mdp_path) as z:
            arrays = {k: z[k] for k in z.files if k != "active"}
        save_npz_atomic(mdp_path, arrays)
    loaded = FactorizedMDP.load(mdp_path)
    return loaded, TeamPolicy.load(pol_path, loaded)


def _shift_rewards(mdp: FactorizedMDP, rel: float) -> FactorizedMDP:
    """``mdp`` with rewards ``R·(1 + rel)`` (the ``perturb_loaded`` mutation)."""
    return FactorizedMDP(**{f: getattr(mdp, f) for f in mdp.__dataclass_fields__}
                         | {"R": mdp.R * (1 + rel)})


def _cli_eval_error(got: dict, ev) -> float:
    """Largest ``max|x − y|/(1 + max|y|)`` over ``J, V, d`` of ``sat eval --json``'s output
    ``got`` and the evaluation ``ev``."""
    return max(float(np.abs(np.asarray(got[k]) - getattr(ev, k)).max() /
                     (1 + np.abs(getattr(ev, k)).max())) for k in ("J", "V", "d"))


#: a row sum this far from 1 (far above SUM_TOL) must be refused
SUM_OFF = 1e-3


def negative_variants(mdp: FactorizedMDP, pol: TeamPolicy, rng, *,
                      sum_off: bool = False) -> list[tuple[str, dict, dict]]:
    """Files with one probability row made ``(…, p + u, …, q − u, …)`` with ``u = q + ¼`` (a
    negative entry ``−¼``, the row still summing to 1): ``(what, mdp arrays, policy arrays)``
    for ``P`` (dense or CSR data), ``rho0`` and a policy factor at an active state. With
    ``sum_off`` the row instead gets ``+SUM_OFF`` on one entry (no negative, sum 1 + SUM_OFF)."""
    base = _saved_arrays(mdp)
    pols = {f"pi_{j}": f.copy() for j, f in enumerate(pol.factors)}

    def unbalance(row):
        _unbalance(row, rng, sum_off)

    out = _transition_variants(base, pols, unbalance, rng)
    if mdp.n_states >= 2:
        rho = base["rho0"].copy()
        unbalance(rho)
        out.append(("rho0", base | {"rho0": rho}, pols))
    return out + _policy_variants(mdp, base, pols, unbalance, rng)


def _saved_arrays(mdp: FactorizedMDP) -> dict:
    """The arrays of ``mdp``'s ``.npz`` file, as ``FactorizedMDP.save`` writes them (so the
    variants are files a user could have written)."""
    with tempfile.TemporaryDirectory(prefix="sat-verify-") as tmp:
        p = os.path.join(tmp, "m.npz")
        mdp.save(p)
        with np.load(p) as z:
            return {k: z[k] for k in z.files}


def _unbalance(row: np.ndarray, rng, sum_off: bool) -> None:
    """In place, at two distinct entries ``i, k`` drawn from ``rng``: ``row_i += u`` and
    ``row_k −= u`` with ``u = row_k + ¼`` (``row_k = −¼``, the sum unchanged); with
    ``sum_off`` only ``row_i += SUM_OFF``."""
    i, k = rng.choice(row.size, size=2, replace=False)
    if sum_off:
        row[i] += SUM_OFF
        return
    u = row[k] + 0.25
    row[i] += u
    row[k] -= u  # = −0.25; the sum is unchanged


def _transition_variants(base: dict, pols: dict, unbalance, rng) -> list[tuple[str, dict, dict]]:
    """The ``P`` variant: one random row of a dense ``P`` (flattened over everything but the
    next state) or of a CSR ``P_data`` among the rows holding two entries or more;
    none when no row has two."""
    key = "P_data" if "P_data" in base else "P"
    arr = base[key].copy()
    if key == "P":
        flat = arr.reshape(-1, arr.shape[-1])
        if flat.shape[1] < 2:
            return []
        unbalance(flat[int(rng.integers(flat.shape[0]))])
        return [("P", base | {key: arr}, pols)]
    ptr = base["P_indptr"]
    rows = [r for r in range(len(ptr) - 1) if ptr[r + 1] - ptr[r] >= 2]
    if not rows:
        return []
    r = rows[int(rng.integers(len(rows)))]
    unbalance(arr[ptr[r]:ptr[r + 1]])
    return [("P_data (CSR)", base | {key: arr}, pols)]


def _policy_variants(mdp: FactorizedMDP, base: dict, pols: dict, unbalance,
                     rng) -> list[tuple[str, dict, dict]]:
    """The policy variant: the factor of a random agent that acts somewhere (one may act
    nowhere: masked, turn-taking), at a random state where it is active; none when its
    factor has one action."""
    acting = np.flatnonzero(mdp.active.any(axis=0))
    j = int(acting[int(rng.integers(acting.size))])
    s = int(rng.choice(np.flatnonzero(mdp.active[:, j])))
    f = pols[f"pi_{j}"].copy()
    if f.shape[1] < 2:
        return []
    unbalance(f[s])
    return [(f"policy pi_{j}", base, pols | {f"pi_{j}": f})]


@check("input_validation", "docs/theory.md §8 (distributions of docs/theory.md §1)", SECTION,
       mutations=("accept_clipped",))
def input_validation(*, quick: bool = False, seed: int = 0,
                     mutation: str | None = None) -> CheckResult:
    """A file whose ``P`` (dense or CSR), ``rho0`` or policy factor has an entry ``−¼`` in a
    row that still sums to 1 is refused: ``FactorizedMDP.load``/``TeamPolicy.load`` raise
    :class:`InputError` and ``sat eval`` exits with status 2 and one ``sat eval: error:`` line
    (no traceback); so is a row summing to ``1 + SUM_OFF``. Entries within ``−SUM_TOL``
    (float32 roundoff) are still accepted. Every layout of :func:`layout_mdps`.

    Mutation: ``accept_clipped`` counts loading the clipped, renormalised array as a pass
    (what a loader that clips negatives does)."""
    name = "input_validation"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 8102])
    T = Tally()
    seen, refusals, accepted = set(), 0, 0
    with tempfile.TemporaryDirectory(prefix="sat-verify-") as tmp:
        mp, pp = os.path.join(tmp, "bad_mdp.npz"), os.path.join(tmp, "bad_pol.npz")
        for kind, mdp in layout_mdps(seed + 22, count(quick, 1, 3)):
            pol = random_policy(mdp, rng)
            for (what, marr, parr), word, how in _invalid_files(mdp, pol, rng):
                save_npz_atomic(mp, marr)
                save_npz_atomic(pp, parr)
                refusal = _load_error(mp, pp)
                clipped = mutation == "accept_clipped"  # counts a load as a refusal
                refused = clipped if refusal is None else word in refusal and not clipped
                rc, out, err = _cli(["eval", mp, "--policy", pp])
                line = err.strip()
                cli_ok = (rc == 2 and line.count("\n") == 0 and line.startswith("sat eval: error:")
                          and word in line and "Traceback" not in err)
                T.record(refused and cli_ok, 0.0 if refused and cli_ok else -1.0, None,
                         f"{kind} {what} with {how}: API refused {refused}, "
                         f"sat eval exit {rc} {line[:120]!r}")
                seen.add(what.split()[0])
                refusals += refused and cli_ok
            ok = _roundoff_negative_accepted(mdp, pol, mp, pp)
            if ok is not None:
                T.record(ok, 0.0 if ok else -1.0, None,
                         f"{kind}: an entry −{0.1 * SUM_TOL:g} (within SUM_TOL) was not accepted")
                accepted += ok
    return T.result(name, [
        f"refused with InputError and `sat eval` exit 2: {refusals} files with an entry −0.25 "
        f"in a row summing to 1 or a row summing to 1 + {SUM_OFF:g} (arrays: "
        f"{', '.join(sorted(seen))}); {accepted} files with an "
        f"entry −{0.1 * SUM_TOL:g} (within SUM_TOL = {SUM_TOL:g}) accepted and clipped to 0",
    ], tightness=False)


def _invalid_files(mdp: FactorizedMDP, pol: TeamPolicy, rng) -> list[tuple[tuple, str, str]]:
    """``(variant, word, how)``: every :func:`negative_variants` file (the refusal must say
    ``"negative"``), then every ``sum_off`` one (it must say ``"sum"``)."""
    return ([(v, "negative", "an entry −0.25 (row sum 1)") for v in negative_variants(mdp, pol, rng)]
            + [(v, "sum", f"a row summing to 1 + {SUM_OFF:g}")
               for v in negative_variants(mdp, pol, rng, sum_off=True)])


def _load_error(mdp_path: str, pol_path: str) -> str | None:
    """The :class:`InputError` message of loading the MDP and policy files; ``None`` if they load."""
    try:
        TeamPolicy.load(pol_path, FactorizedMDP.load(mdp_path))
    except InputError as e:
        return str(e)
    return None


def _roundoff_negative_accepted(mdp: FactorizedMDP, pol: TeamPolicy, mdp_path: str,
                                pol_path: str) -> bool | None:
    """Whether a policy with one entry ``−0.1·SUM_TOL`` (float32 roundoff; its row still sums
    to 1) at agent 0's first active state loads, clipped to 0; ``None`` when agent 0 acts
    nowhere or its row there is constant."""
    tiny = {f"pi_{j}": f.copy() for j, f in enumerate(pol.factors)}
    act0 = np.flatnonzero(mdp.active[:, 0])
    s = int(act0[0]) if act0.size else 0
    hi, lo = int(np.argmax(tiny["pi_0"][s])), int(np.argmin(tiny["pi_0"][s]))
    if not (act0.size and hi != lo):
        return None
    tiny["pi_0"][s, hi] += tiny["pi_0"][s, lo] + 0.1 * SUM_TOL
    tiny["pi_0"][s, lo] = -0.1 * SUM_TOL
    save_npz_atomic(pol_path, tiny)
    mdp.save(mdp_path)
    try:
        return bool(TeamPolicy.load(pol_path, FactorizedMDP.load(mdp_path)).factors[0].min() >= 0)
    except InputError:
        return False


@check("batched_equals_loop", "docs/theory.md §8 (exact evaluation of docs/theory.md §2)", SECTION,
       mutations=("perturb_one",))
def batched_equals_loop(*, quick: bool = False, seed: int = 0,
                        mutation: str | None = None) -> CheckResult:
    """``evaluate_many(mdp, policies)`` — from TeamPolicies and from a ``(B, S, K)`` joint
    array — equals ``[evaluate(mdp, p) for p in policies]`` in ``pi, V, d, Q, A, J`` (to
    ``BATCH_TOL`` relative), on every layout of :func:`layout_mdps` (sparse ones take the
    dense batched path below ``SPARSE_MIN_STATES``), with the ``B = 1`` batch too.

    Mutation: ``perturb_one`` compares the batch with the loop over policies whose first factor
    is moved by 1e-8 (the comparison must see it)."""
    name = "batched_equals_loop"
    check_mutation(mutation, name)
    rng = np.random.default_rng([seed, 8103])
    T = Tally()
    worst = 0.0
    for kind, mdp in layout_mdps(seed + 23, count(quick, 2, 6)):
        pols = [random_policy(mdp, rng, temperature=float(rng.choice([0.5, 3.0])))
                for _ in range(int(rng.integers(1, 5)))]
        loop_pols = pols
        if mutation == "perturb_one":
            f = pols[0].factors[0].copy()
            f[:, 0] += 1e-8
            f /= f.sum(axis=1, keepdims=True)
            loop_pols = [pols[0].with_factor(0, f)] + pols[1:]
        loop = [evaluate(mdp, p) for p in loop_pols]
        for form, batch in (("policies", evaluate_many(mdp, pols)),
                            ("joint array", evaluate_many(mdp, np.stack([e.pi for e in loop])))):
            for b, ev in enumerate(loop):
                row = type("Row", (), {k: getattr(batch, k)[b] for k in ("V", "d", "A", "J")})
                err = max(evaluation_error(row, ev),
                          float(np.abs(batch.pi[b] - ev.pi).max()),
                          float((np.abs(batch.Q[b] - ev.Q) / (1 + np.abs(ev.Q))).max()))
                worst = max(worst, err)
                T.record(err <= BATCH_TOL, -err, None,
                         f"{kind} {mdp.describe()} batch of {len(pols)} ({form}) policy {b}: "
                         f"batched differs from evaluate by {err:.3g}")
    return T.result(name, [f"largest relative difference batched vs loop {worst:.2g} "
                           f"(tolerance {BATCH_TOL:g}) over {T.cases} policies of every layout"],
                    tightness=False)
