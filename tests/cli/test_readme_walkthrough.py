"""The README's dataset → trained team → export → play → rerun walk-through runs as written
(the shell blocks of "Your own data" and "Trained teams: export, play, reproduce", tiny-random)."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("datasets")

README = Path(__file__).resolve().parents[2] / "README.md"
SECTIONS = ("#### Your own data", "#### Trained teams: export, play, reproduce")


def _bash_blocks(text: str, heading: str) -> list[str]:
    start = text.index(heading)
    nxt = re.search(r"\n#{2,4} ", text[start + len(heading):])
    body = text[start:start + len(heading) + (nxt.start() if nxt else len(text))]
    return re.findall(r"```bash\n(.*?)```", body, flags=re.DOTALL)


def test_walkthrough_runs_as_written(tmp_path):
    text = README.read_text(encoding="utf-8")
    script = "set -euo pipefail\n" + "\n".join(b for h in SECTIONS for b in _bash_blocks(text, h))
    assert "sat export" in script and "sat team" in script and "--config" in script
    env = dict(os.environ, HF_HUB_OFFLINE="1", SAT_LLM_CACHE=str(tmp_path / "cache"))
    if shutil.which("sat") is None:  # not installed as a script: the same entry point
        shim = tmp_path / "bin" / "sat"
        shim.parent.mkdir()
        shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m sat_theory.cli \"$@\"\n")
        shim.chmod(0o755)
        env["PATH"] = f"{shim.parent}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    ex = tmp_path / "exported" / "mini"
    assert (ex / "agent0" / "adapter_model.safetensors").is_file()
    assert json.loads((ex / "team.json").read_text())["n_agents"] == 2
    assert r.stdout.count("final answer:") == 1  # the text-mode sat team call
    played = [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]
    assert len(played) == 1 and played[0]["answer"] == "7"
    runs = [tmp_path / "runs" / n / "metrics.jsonl" for n in ("mini", "mini-again")]

    def records(p):
        out = [json.loads(x) for x in p.read_text().splitlines()]
        for rec in out:
            rec.pop("seconds", None)
            rec.pop("peak_memory_bytes", None)
        return out

    assert records(runs[0]) == records(runs[1])
