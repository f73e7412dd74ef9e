"""Mutation testing of the mathematics through ``sat verify`` itself (issue 14).

Each :class:`Mutation` is a real edit of the formula code — one string replaced in the source
of one function (``penalty_constant``, ``stage_certificate``, ``Evaluation.d``, …) — applied by
recompiling that function from its edited source and swapping it in everywhere it is bound
(the defining module and every ``from … import`` of it). With the mutant in place the checks
listed in ``catchers`` run through the ordinary check code (:func:`sat_theory.verify.run_checks`,
quick mode, the cases ``sat verify --quick`` uses), and each must report a violation without
crashing: so ``sat verify --quick`` fails under every mutation. Only the catchers run, to keep
CI fast (the whole quick suite per mutation would cost ~15× as much).

The catchers are the checks whose *statement* the mutant breaks on the saved adversarial
cases (docs/theory.md §8). A mutation whose bound stays valid — so that no bound check can
catch it — names only ``certificate_definitions`` (every term against its definition) and
says why in ``why``. If the edited string no longer occurs in the source, the test fails:
the mutation must follow the code, not silently test nothing.
"""

from __future__ import annotations
import __future__

import functools
import importlib
import inspect
import sys
import textwrap
from dataclasses import dataclass

import pytest

from sat_theory.verify import load_checks, run_checks

# import every check module now: a module first imported while a mutant is in place would
# bind the mutant by `from … import` and keep it after the test restores the original
load_checks()


@dataclass(frozen=True)
class Mutation:
    name: str
    module: str
    qualname: str  # "func" or "Class.attr"
    old: str
    new: str
    catchers: tuple[str, ...]
    why: str = ""


MUTATIONS = [
    Mutation("delta_under_stage_start_occupancy", "sat_theory.certificates", "stage_certificate",
             "delta = _expect(prev.d, kl)", "delta = _expect(ev0.d, kl)",
             ("single_step_bound",)),
    Mutation("stage_A_max_min", "sat_theory.certificates", "_assemble",
             "A_max = max(s.A_max for s in steps)", "A_max = min(s.A_max for s in steps)",
             ("certificate_definitions",),
             why="not caught by a bound check: the adversarial search (objective stage_amax_min) "
                 "found at most 0.90 of the min-A_max penalty used (γ = 0.5), so no saved case "
                 "violates it; the definitions check catches it"),
    Mutation("penalty_one_minus_gamma", "sat_theory.certificates", "penalty_constant",
             "(1.0 - gamma) ** 2", "(1.0 - gamma)", ("single_step_bound", "joint_stage_bound_all_orders")),
    Mutation("penalty_missing_sqrt2", "sat_theory.certificates", "penalty_constant",
             "math.sqrt(2.0) * gamma", "gamma", ("single_step_bound",)),
    Mutation("tv_rung_half_penalty", "sat_theory.certificates", "_assemble",
             "2 * g * s.f_inf * s.tv", "g * s.f_inf * s.tv", ("joint_stage_bound_all_orders",)),
    Mutation("fnorm_rung_missing_sqrt2", "sat_theory.certificates", "_assemble",
             "math.sqrt(2) * g * s.f_inf", "g * s.f_inf", ("joint_stage_bound_all_orders",)),
    Mutation("kl_direction_swapped", "sat_theory.certificates", "stage_certificate",
             "kl = factor_kl(mdp, current.factors[j], target.factors[j], j)",
             "kl = factor_kl(mdp, target.factors[j], current.factors[j], j)",
             ("certificate_definitions", "certificate_tightening"),
             why="harmless for validity: Pinsker bounds TV_s by √(KL_s/2) in either direction, "
                 "so the certificate with the forward KL is still a valid bound (no step or "
                 "stage check reports it); the definitions check catches the wrong radius, and "
                 "the tightening check, whose upgrades at equal reverse-KL radius then lower "
                 "the bound"),
    Mutation("occupancy_unnormalized", "sat_theory.evaluate", "Evaluation.d",
             "(1.0 - self.mdp.gamma) * self.mdp.rho0", "self.mdp.rho0",
             ("performance_difference", "single_step_bound")),
    Mutation("stale_compounding_dropped", "sat_theory.certificates", "_assemble",
             "chained = sum(sq[i] + sq[:i].sum() for i in range(len(steps)))",
             "chained = sum(sq[i] for i in range(len(steps)))", ("certificate_definitions",),
             why="not caught by a bound check: no case needed the compounding term (largest "
                 "need (Σ L_stale − cΣ√δ_i − ΔJ)/(c Σ_i Σ_{k<i}√δ_k) is negative at every γ, see "
                 "stale_stage_bound's findings); it is the proven bound, its necessity is open"),
    Mutation("f_under_previous_policy", "sat_theory.certificates", "stage_certificate",
             "f_exact = [expected_advantage(evaluations[i].pi, evaluations[i - 1].A)",
             "f_exact = [expected_advantage(evaluations[i - 1].pi, evaluations[i - 1].A)",
             ("single_step_bound", "joint_stage_bound_all_orders")),
    Mutation("surrogate_missing_horizon", "sat_theory.certificates", "stage_certificate",
             "L_seq = float(prev.d @ f) / (1 - g)", "L_seq = float(prev.d @ f)",
             ("single_step_bound", "joint_stage_bound_all_orders")),
    Mutation("zeta_missing_horizon", "sat_theory.certificates", "stage_lower_bound",
             "- zeta.sum() / (1.0 - gamma)", "- zeta.sum()", ("estimated_advantage_bound",)),
    Mutation("sqrt_of_sum", "sat_theory.certificates", "stage_lower_bound",
             "np.sqrt(np.maximum(delta, 0.0)).sum()", "np.sqrt(np.maximum(delta, 0.0).sum())",
             ("certificate_definitions",),
             why="no bound check reports it (measured): √Σδ_i ≥ Σ√δ_i/√n, so the stage penalty "
                 "shrinks by at most √n, and the n ≥ 2 cases leave more of it unused"),
    Mutation("step_zeta_dropped", "sat_theory.certificates", "stage_certificate",
             "bound=L_seq - c_i * math.sqrt(delta) - zeta[i - 1] / (1 - g),",
             "bound=L_seq - c_i * math.sqrt(delta),", ("estimated_advantage_bound",)),
]


def _target(mod, qualname):
    """(owner, attribute name, the plain function whose source is edited)."""
    owner = mod
    *path, attr = qualname.split(".")
    for p in path:
        owner = getattr(owner, p)
    obj = inspect.getattr_static(owner, attr)
    fn = (obj.func if isinstance(obj, functools.cached_property)
          else obj.fget if isinstance(obj, property) else obj)
    return owner, attr, obj, fn


def apply_mutation(monkeypatch, m: Mutation) -> None:
    """Recompile ``m.qualname`` from its edited source and bind the mutant everywhere."""
    mod = importlib.import_module(m.module)
    owner, attr, obj, fn = _target(mod, m.qualname)
    src = textwrap.dedent(inspect.getsource(fn))
    assert src.count(m.old) == 1, f"{m.name}: {m.old!r} occurs {src.count(m.old)} times in {m.qualname}"
    ns = dict(vars(mod))  # the module's globals, copied: the mutant sees the same names
    code = compile(src.replace(m.old, m.new), f"<mutant {m.name}>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    new = ns[fn.__name__]
    if isinstance(obj, functools.cached_property):
        new.__set_name__(owner, attr)
    monkeypatch.setattr(owner, attr, new)
    if owner is mod:  # rebind every `from m.module import name` in the package
        for other in list(sys.modules.values()):
            if getattr(other, "__name__", "").startswith(("sat_theory", "experiments")):
                for k, v in list(vars(other).items()):
                    if v is obj:
                        monkeypatch.setattr(other, k, new)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_mutation_fails_sat_verify_quick(monkeypatch, m):
    apply_mutation(monkeypatch, m)
    results = run_checks(m.catchers, quick=True, seed=0)
    crashed = [r.name for r in results if any(f.startswith("error:") for f in r.findings)]
    assert not crashed, f"{m.name}: checks crashed instead of reporting violations: {crashed}"
    missed = [r.name for r in results if r.violations == 0]
    assert not missed, f"sat verify --quick: {m.name} not caught by {missed}"


def test_every_mutation_site_exists():
    """Each edited string occurs exactly once in the current source (else the test above
    would not test what it says)."""
    for m in MUTATIONS:
        _, _, _, fn = _target(importlib.import_module(m.module), m.qualname)
        assert inspect.getsource(fn).count(m.old) == 1, m.name
