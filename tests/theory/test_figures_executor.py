"""The figures' training sweeps give identical run files on every executor (issue 8)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from experiments.runs import RunSet, ensure_runs  # noqa: E402

TINY = dict(variants={"sat": {"method": "sat"}, "naive": {"method": "naive"}}, n_agents=2,
            states_per_agent=2, stages=2, budget_groups=4, group_size=4, seeds=2)


def _metrics(out: Path, rs: RunSet) -> dict[str, list]:
    """Every run's records, wall-clock ``seconds`` removed (the only field that may differ)."""
    import json

    def records(d):
        rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]

    return {str(d.relative_to(out)): records(d) for d in ensure_runs(out, rs, quiet=True)}


@pytest.mark.parametrize("executor", ["process", "ray"])
def test_sweep_equals_serial(tmp_path, executor):
    if executor == "ray":
        ray = pytest.importorskip("ray")
    rs = RunSet(**TINY)
    serial = _metrics(tmp_path / "serial", rs)
    try:
        ensure_runs(tmp_path / executor, rs, quiet=True, executor=executor, workers=2)
    finally:
        if executor == "ray":
            ray.shutdown()
    assert _metrics(tmp_path / executor, rs) == serial  # cached now: reads what was written
    assert len(serial) == 4 and all(serial.values())
