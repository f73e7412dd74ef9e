"""``sat train --backend llm``: a tiny end-to-end run, resume, and one-line errors for bad input."""

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_theory.cli import main  # noqa: E402

TINY = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy", "--agents", "2",
        "--stages", "1", "--prompts", "2", "--group-size", "2", "--max-new-tokens", "4",
        "--n-train", "8", "--n-eval", "2", "--quiet"]


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


def _one_line_error(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert pattern in err, err


def test_tiny_run_writes_the_tabular_schema_plus_llm_fields(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(TINY + ["--out", str(out)]) == 0
    assert "held-out accuracy" in capsys.readouterr().out
    conf = json.loads((out / "config.json").read_text())
    assert conf["backend"]["backend"] == "llm" and conf["algorithm"]["method"] == "sat"
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in recs if r["kind"] == "step"]
    stages = [r for r in recs if r["kind"] == "stage"]
    assert len(steps) == 2 and len(stages) == 1
    for r in steps:
        for k in ("rollout_id", "kl", "kl_sampled", "beta", "reward_mean", "surrogate", "rejected"):
            assert k in r, k
    assert "lower_bound" in stages[0] and "eval_accuracy" in stages[0]
    # a finished run resumes to no work; a second fresh run into the same folder is refused
    assert main(["train", "--backend", "llm", "--resume", str(out), "--quiet"]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 3
    capsys.readouterr()
    _one_line_error(capsys, main(TINY + ["--out", str(out)]), "--resume")


@pytest.mark.parametrize("extra, pattern", [
    (["--model", "gpt-17"], "unknown model"),
    (["--task", "chess"], "unknown task"),
    (["--delta", "0"], "delta"),
    (["--delta", "-1"], "delta"),
    (["--agents", "0"], "--agents: must be an integer >= 1"),
    (["--router", "telepathy"], "unknown router"),
])
def test_bad_input_one_line(tmp_path, capsys, extra, pattern):
    _one_line_error(capsys, main(TINY + extra + ["--out", str(tmp_path / "r")]), pattern)


def test_malformed_jsonl_one_line(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": oops}\n')
    rc = main(TINY + ["--task", "jsonl", "--jsonl", str(f), "--out", str(tmp_path / "r")])
    _one_line_error(capsys, rc, "malformed JSON")


def test_gguf_package_missing_one_line(tmp_path, capsys, monkeypatch):
    import sys

    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if `gguf` were not installed
    rc = main(TINY + ["--model", str(fake), "--out", str(tmp_path / "r")])
    _one_line_error(capsys, rc, "needs the 'gguf' package")


def test_resume_without_checkpoint_one_line(tmp_path, capsys):
    rc = main(["train", "--backend", "llm", "--resume", str(tmp_path)])
    _one_line_error(capsys, rc, "no run to resume")


def test_plug_and_play_stage0_swap_is_logged(tmp_path, capsys):
    out = tmp_path / "swap"
    k = TINY.index("--stages") + 1
    args = TINY[:k] + ["2"] + TINY[k + 1:]
    rc = main(args + ["--swap-stage", "1", "--swap-kind", "random", "--swap-strategy", "stage0",
                      "--delta-align", "1e-4", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    swap = [r for r in recs if r["kind"] == "swap"]
    assert len(swap) == 1 and swap[0]["stage"] == 1 and swap[0]["strategy"] == "stage0"
    s = swap[0]
    assert s["align_kl_end"] <= s["align_kl_start"] and s["align_kl_start"] > 0
    assert s["align_reached"] == (s["align_kl_end"] <= 1e-4)
