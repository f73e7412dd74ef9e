"""``sat verify``: --only, --json, exit status, unknown names, the grouped table, and the
theory document its ``--help`` names."""

import json
from pathlib import Path

from sat_theory.cli import main
from sat_theory.verify import CHECKS, Check, CheckResult, load_checks, run_checks

ROOT = Path(__file__).resolve().parents[2]
FAST = "factor_lemma,performance_difference"


def test_json_only_two_checks(capsys):
    rc = main(["verify", "--quick", "--only", FAST, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["passed"] is True
    assert [c["name"] for c in out["checks"]] == FAST.split(",")
    for c in out["checks"]:
        assert set(c) >= {"name", "reference", "section", "cases", "violations", "passed",
                          "min_slack", "tightness", "findings", "seconds"}
        assert c["cases"] > 0 and c["violations"] == 0


def test_table_grouped_by_section(capsys):
    rc = main(["verify", "--quick", "--only", FAST])
    out = capsys.readouterr().out
    assert rc == 0
    # sections name the theory document's sections, in its order
    assert "== docs/theory.md §2 exact identities ==" in out
    assert "== docs/theory.md §3 divergences ==" in out
    assert out.index("theory.md §2") < out.index("theory.md §3")
    assert "2/2 checks passed" in out


def test_seed_changes_cases_but_not_verdict(capsys):
    main(["verify", "--quick", "--only", "factor_lemma", "--seed", "1", "--json"])
    a = json.loads(capsys.readouterr().out)
    main(["verify", "--quick", "--only", "factor_lemma", "--seed", "1", "--json"])
    b = json.loads(capsys.readouterr().out)
    for x in (a, b):
        for c in x["checks"]:
            c.pop("seconds")
    assert a == b  # deterministic given the seed
    assert a["passed"]


def test_unknown_only_name_is_one_line_exit_2(capsys):
    rc = main(["verify", "--only", "factor_lemma,no_such_check"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "no_such_check" in err
    assert len(err.strip().splitlines()) == 1


def test_failing_check_gives_exit_1(capsys, monkeypatch):
    load_checks()

    def always_fails(*, quick, seed, mutation):
        return CheckResult(name="always_fails", reference="test", section="THEORY §9 test",
                           cases=1, violations=1, passed=False, findings=["by design"])

    monkeypatch.setitem(CHECKS, "always_fails", Check("always_fails", "test", "THEORY §9 test",
                                                      always_fails, ()))
    rc = main(["verify", "--only", "always_fails,factor_lemma", "--quick", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["passed"] is False
    assert [c["passed"] for c in out["checks"]] == [False, True]


def test_crashing_check_reported_as_failed(monkeypatch):
    load_checks()

    def crashes(*, quick, seed, mutation):
        raise ZeroDivisionError("boom")

    monkeypatch.setitem(CHECKS, "crashes", Check("crashes", "test", "THEORY §9 test", crashes, ()))
    (res,) = run_checks(["crashes"], quick=True)
    assert not res.passed and res.violations == 1
    assert "ZeroDivisionError" in res.findings[0]


# ------------------------------------------------------------------ sat verify --help
def test_verify_help_names_the_projects_theory_document(capsys):
    from sat_theory import cli
    from sat_theory.commands import verify

    assert cli.main(["verify", "--help"]) == 0
    text = capsys.readouterr().out
    assert verify.THEORY_DOC in " ".join(text.split()) and "THEORY.md" not in text
    assert (ROOT / verify.THEORY_DOC).is_file()
    assert "THEORY.md" not in (verify.__doc__ or "")
