"""``sat bench --out/--strict``: results go to ``--out`` (never the source tree's reference
results), a missed goal is explained and ``--strict`` turns it into exit status 1."""

from __future__ import annotations

import json
from pathlib import Path


def _reference_results() -> dict:
    from sat_theory.commands.bench import bench_dir

    return {p: p.stat().st_mtime_ns for p in (bench_dir() / "results").rglob("*.json")}


def test_bench_writes_to_out_and_strict_exits_1_on_a_miss(tmp_path, capsys, monkeypatch):
    from sat_theory import cli
    from sat_theory.commands.bench import MISSED_NOTE, bench_dir, out_folder

    before = _reference_results()
    out = tmp_path / "o"
    argv = ["bench", "--smoke", "--only", "certificate", "--out", str(out)]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    result = json.loads((out / "bench_certificate.json").read_text())
    assert result["benchmark"] == "certificate" and f"results: {out}" in text
    assert _reference_results() == before  # the source tree's reference results untouched
    # a goal no run can reach: MISSED, explained; --strict turns it into exit status 1
    monkeypatch.syspath_prepend(str(bench_dir()))
    import _common
    import bench_certificate

    monkeypatch.setattr(bench_certificate, "target_line",
                        lambda name, value, goal, **kw: _common.target_line(name, value, 1e300, **kw))
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "MISSED" in text and MISSED_NOTE in " ".join(text.split())
    assert cli.main(argv + ["--strict"]) == 1
    capsys.readouterr()
    assert cli.main(argv + ["--strict", "--json"]) == 1
    assert not any(t["met"] for t in json.loads(capsys.readouterr().out)["targets"])
    # defaults: ./bench_out (relative, so never the source tree's results/), a temporary
    # folder for --smoke; a file as --out is refused
    assert out_folder(None, False) == (Path("bench_out"), None)
    folder, tmp = out_folder(None, True)
    assert folder.is_dir() and bench_dir() not in folder.parents
    tmp.cleanup()
    (tmp_path / "f").write_text("x")
    assert cli.main(["bench", "--smoke", "--only", "certificate", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err
