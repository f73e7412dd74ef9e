"""Saved cases of ``sat verify``: package data under ``sat_theory/data/``.

A saved case is one ``.npz``: the MDP arrays (loadable by ``FactorizedMDP.load``) plus the
factors ``cur_j`` (``π_cur``) and ``tar_j`` (``π_tar``) of every agent. Kinds:

- ``adv_{objective}_g{γ}.npz``: the best case per objective and discount found by
  ``experiments/adversarial_search.py`` (objectives: :data:`ADVERSARIAL_OBJECTIVES`, defined
  in that script's docstring); :func:`adversarial_cases` loads them for the checks (they
  supersede the earlier one-agent ``tight_step_*`` cases at γ = 0.1 and the stale
  compounding search, which are objectives of the same script now);
- ``naive_reuse.npz`` (own format, :mod:`sat_theory.verify.bounds`).

A missing file is not silently skipped: :func:`missing_note` names every missing file, and
the checks print it as a finding with the command that regenerates them.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ..mdp import FactorizedMDP
from ..policy import TeamPolicy
from .cases import Case

__all__ = ["DATA", "ADVERSARIAL_OBJECTIVES", "ADVERSARIAL_GAMMAS", "adversarial_path",
           "adversarial_cases", "save_case", "load_case", "missing_note"]

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")

#: objectives of experiments/adversarial_search.py whose best case per γ of
#: ADVERSARIAL_GAMMAS is shipped. Not ``stale_compounding``: its search (restarts 2, maxfev
#: 1000) found no case where the linear bound without the compounding term fails (best share
#: −0.30 at γ = 0.1 to −0.50 at γ = 0.99, experiments/counterexamples/adversarial_search.json),
#: so its cases would press nothing the ``stale`` cases do not
ADVERSARIAL_OBJECTIVES = ("step_expected", "step_max", "stage", "stage_fnorm", "stage_tv",
                          "stage_amax_min", "step_delta_stage_start", "stale", "chained")
ADVERSARIAL_GAMMAS = (0.1, 0.5, 0.9, 0.99)

#: the command that regenerates the adversarial cases (printed next to what they show)
REGENERATE = "python experiments/adversarial_search.py"


def adversarial_path(objective: str, gamma: float) -> str:
    return os.path.join(DATA, f"adv_{objective}_g{gamma:g}.npz")


def save_case(path: str, case: Case, extra: dict | None = None) -> None:
    """MDP arrays (FactorizedMDP.load-able) plus ``cur_j`` and ``tar_j`` factors and any
    ``extra`` arrays, written atomically."""
    from ..mdp import save_npz_atomic

    tmp = path + ".mdp.npz"
    case.mdp.save(tmp)
    with np.load(tmp) as z:
        arrays = {k: z[k] for k in z.files}
    os.remove(tmp)
    for j in range(case.n):
        arrays[f"cur_{j}"] = case.current.factors[j]
        arrays[f"tar_{j}"] = case.target.factors[j]
    arrays.update(extra or {})
    save_npz_atomic(path, arrays)


def load_case(path: str, label: str, kind: str = "optimized") -> Case:
    mdp = FactorizedMDP.load(path)
    with np.load(path) as z:
        cur = TeamPolicy(tuple(z[f"cur_{j}"] for j in range(mdp.n_agents)))
        tar = TeamPolicy(tuple(z[f"tar_{j}"] for j in range(mdp.n_agents)))
    return Case(mdp, cur, tar, kind, None, label)


@functools.cache
def _load_all() -> tuple[tuple[tuple[str, float, Case], ...], tuple[str, ...]]:
    found, missing = [], []
    for obj in ADVERSARIAL_OBJECTIVES:
        for g in ADVERSARIAL_GAMMAS:
            p = adversarial_path(obj, g)
            if os.path.exists(p):
                c = load_case(p, "")
                lab = (f"adversarial {obj} γ={g:g} ({c.mdp.describe().split(',')[0]}, "
                       f"S={c.mdp.n_states}, n={c.n})")
                found.append((obj, g, Case(c.mdp, c.current, c.target, "adversarial-saved", None, lab)))
            else:
                missing.append(os.path.basename(p))
    return tuple(found), tuple(missing)


def adversarial_cases(objectives=None, min_agents: int = 1) -> list[Case]:
    """Every saved adversarial case whose objective is in ``objectives`` (default all) and
    with at least ``min_agents`` agents. Each is a valid case of every bound, whichever
    objective it was optimized for."""
    found, _ = _load_all()
    return [c for o, _, c in found
            if (objectives is None or o in objectives) and c.n >= min_agents]


def missing_note(objectives=None) -> list[str]:
    """A finding naming the missing saved adversarial cases (empty when none is missing)."""
    _, missing = _load_all()
    miss = [m for m in missing if objectives is None
            or any(m.startswith(f"adv_{o}_g") for o in objectives)]
    if not miss:
        return []
    return [f"MISSING saved adversarial cases ({len(miss)}): {', '.join(miss)} — regenerate "
            f"with `{REGENERATE}`; the check ran without them and is weaker"]
