"""``sat verify --executor process|ray``: the checks run as independent tasks and give the
serial results (everything but the timings), in the same order."""

import json

import pytest

from sat_theory.cli import main
from sat_theory.verify import run_checks

SUBSET = ["factor_lemma", "performance_difference", "single_step_bound", "kl_chain_rule"]


def _without_seconds(results: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in results]


def _verify_json(capsys, *extra) -> dict:
    rc = main(["verify", "--quick", "--json", *extra])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["passed"] is True
    return out


def test_process_pool_equals_serial():
    serial = [r.to_dict() for r in run_checks(SUBSET, quick=True)]
    seen = []
    pool = [r.to_dict() for r in run_checks(SUBSET, quick=True, executor="process", workers=2,
                                            progress=lambda r: seen.append(r.name))]
    assert seen == SUBSET
    assert _without_seconds(pool) == _without_seconds(serial)
    assert all(r["cases"] > 0 for r in serial)


def test_quick_suite_on_ray_equals_serial(capsys):
    ray = pytest.importorskip("ray")
    serial = _verify_json(capsys)
    try:
        on_ray = _verify_json(capsys, "--executor", "ray")
    finally:
        ray.shutdown()
    assert len(serial["checks"]) >= 20
    assert [c["name"] for c in on_ray["checks"]] == [c["name"] for c in serial["checks"]]
    assert _without_seconds(on_ray["checks"]) == _without_seconds(serial["checks"])


def test_bad_workers_is_a_one_line_error(capsys):
    rc = main(["verify", "--quick", "--only", "kl_chain_rule", "--executor", "process",
               "--workers", "0"])
    err = capsys.readouterr().err
    assert rc == 2 and "--workers must be >= 1" in err and len(err.strip().splitlines()) == 1
