"""The algorithm and the runner reach a team only through declared protocols
(:mod:`sat_theory.team`, issue 24 item 3): no member is looked up by name (``getattr``/
``hasattr`` on a team), every member they use on a team is declared in ``Team`` or one of
its ``runtime_checkable`` hook protocols, and every protocol and declared method has a
docstring. Read from the source (an AST scan), so a new ``team.x`` fails here until ``x`` is
declared."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from sat_theory import team as team_module
from sat_theory.envs import random_mdp
from sat_theory.policy import TeamPolicy
from sat_theory.tabular_team import TabularTeam
from sat_theory.team import Checkpointable, SupportsExactTerms, Team

ROOT = Path(__file__).resolve().parents[2]
USERS = ("sat_theory/algorithm.py", "sat_theory/runner.py")


def protocols() -> dict[str, type]:
    """Every protocol class that :mod:`sat_theory.team` defines."""
    return {n: c for n, c in vars(team_module).items()
            if isinstance(c, type) and c.__module__ == team_module.__name__
            and getattr(c, "_is_protocol", False)}


def declared(proto: type) -> set[str]:
    """The members ``proto`` declares: its own methods, properties and annotated attributes."""
    own = {n for n in vars(proto) if not n.startswith("_")}
    return own | set(vars(proto).get("__annotations__", {}))


def _is_team(node: ast.AST) -> bool:
    """``team`` or ``<anything>.team``."""
    return ((isinstance(node, ast.Name) and node.id == "team")
            or (isinstance(node, ast.Attribute) and node.attr == "team"))


def team_members_used(path: Path) -> set[str]:
    """The attributes read on ``team`` / ``self.team`` in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and _is_team(n.value)}


def lookups_by_name(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls whose object is a team, as source text."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [ast.unparse(n) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in ("getattr", "hasattr") and n.args and _is_team(n.args[0])]


@pytest.mark.parametrize("rel", USERS)
def test_no_team_member_is_looked_up_by_name(rel):
    assert lookups_by_name(ROOT / rel) == []


@pytest.mark.parametrize("rel", USERS)
def test_every_team_member_used_is_declared_in_a_protocol(rel):
    everything = set().union(*(declared(p) for p in protocols().values()))
    used = team_members_used(ROOT / rel)
    assert used, "the scan found no team member: did the code stop naming it `team`?"
    assert used - everything == set()


def test_every_protocol_and_declared_method_has_a_docstring():
    found = protocols()
    assert {"Team", "Checkpointable", "SupportsExactTerms", "Versioned", "ReportsMetrics",
            "HasEvalRecords", "Closeable"} <= set(found)
    for name, proto in found.items():
        assert inspect.getdoc(proto), name
        for member in declared(proto):
            obj = vars(proto).get(member)
            if callable(obj) or isinstance(obj, property):
                assert inspect.getdoc(obj), f"{name}.{member}"


def test_the_lookup_scan_sees_a_lookup_by_name(tmp_path):
    """The scan itself: it finds ``getattr(team, …)`` and ``hasattr(self.team, …)``."""
    f = tmp_path / "m.py"
    f.write_text("def f(team):\n    g = getattr(team, 'version', None)\n"
                 "    return hasattr(self.team, 'close'), team.rollout\n")
    assert len(lookups_by_name(f)) == 2
    assert team_members_used(f) == {"rollout"}


def test_the_tabular_team_offers_the_protocols_the_runner_needs():
    mdp = random_mdp(3, 2, seed=0)
    team = TabularTeam(mdp, TeamPolicy.random(mdp, 0))
    assert isinstance(team, Team) and isinstance(team, Checkpointable)
    assert isinstance(team, SupportsExactTerms)
