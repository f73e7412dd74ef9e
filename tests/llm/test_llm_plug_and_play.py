"""Plug-and-play on LLM teams: a team started from a saved team file (``--init-from``) and a
``stronger`` replacement agent read from one (``--swap-from FILE[:J]``). The team and CLI
runs go on the CPU and, as ``gpu``-marked twins, on CUDA in float32 (the ``device`` fixture
of ``conftest.py``); team files hold host tensors, so weights are compared on the host."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from sat_llm.team import LLMConfig, LLMTeam, load_team_file, swap_adapter  # noqa: E402
from sat_theory.cli import main  # noqa: E402
from sat_theory.errors import InputError  # noqa: E402

BASE = dict(model="tiny-random", task="copy", agents=2, max_new_tokens=4, n_train=8, n_eval=4,
            minibatch=4, seed=0, threads=1, dtype="float32")


def _same(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu(), b[k].cpu()) for k in a)


def _trained_file(tmp_path, device="cpu"):
    team = LLMTeam(LLMConfig(**BASE, device=device))
    for j in range(2):  # distinct, non-initial adapters
        team.replace(j, team.new_agent(j, "random", seed=10 + j))
    path = tmp_path / "team.safetensors"
    team.save(str(path))
    return team, path


def test_init_from_and_stronger_swap_read_the_saved_adapters(tmp_path, device):
    src, path = _trained_file(tmp_path, device)
    team = LLMTeam(LLMConfig(**BASE, device=device, init_from=str(path), swap_from=f"{path}:1"))
    for j in range(2):
        assert _same(team._get_weights(j), src._get_weights(j))
    # 'retrain' resets to fresh adapters, not to the loaded ones
    fresh = LLMTeam(LLMConfig(**BASE, device=device))._get_weights(0)
    assert _same(team._init_weights[0], fresh)
    new = team.new_agent(0, "stronger", seed=3)
    assert _same(new.weights, src._get_weights(1))
    assert load_team_file(str(path)).keys() == {0, 1}


def test_bad_team_files_are_one_line_errors(tmp_path):
    _, path = _trained_file(tmp_path)
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x80\x04not a safetensors file")
    for spec, msg in [(str(tmp_path / "none.safetensors"), "no team file"),
                      (str(junk), "not a safetensors"), (f"{path}:7", "no adapter for agent 7")]:
        with pytest.raises(InputError, match=msg):
            swap_adapter(spec)
    with pytest.raises(InputError, match="needs --swap-from"):
        LLMTeam(LLMConfig(**BASE)).new_agent(0, "stronger", seed=0)


def test_cli_stronger_swap_without_a_file_fails_before_loading(tmp_path, capsys):
    rc = main(["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
               "--stages", "1", "--swap-stage", "0", "--swap-kind", "stronger",
               "--swap-from", str(tmp_path / "missing.safetensors"), "--out", str(tmp_path / "r")])
    assert rc == 2 and "no team file" in capsys.readouterr().err


def test_cli_direct_swap_to_a_stronger_saved_agent(tmp_path, device):
    src, path = _trained_file(tmp_path, device)
    out = tmp_path / "run"
    rc = main(["train", "--backend", "llm", "--device", device, "--dtype", "float32",
               "--model", "tiny-random", "--task", "copy",
               "--agents", "2", "--stages", "1", "--prompts", "2", "--group-size", "2",
               "--max-new-tokens", "4", "--n-train", "8", "--n-eval", "4", "--minibatch", "4",
               "--threads", "1", "--init-from", str(path), "--swap-stage", "0",
               "--swap-agent", "1", "--swap-kind", "stronger", "--swap-from", f"{path}:0",
               "--swap-strategy", "direct", "--save-policies", "--quiet", "--out", str(out)])
    assert rc == 0
    import json

    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    (swap,) = [r for r in recs if r["kind"] == "swap"]
    assert swap["swap_kind"] == "stronger" and swap["agent"] == 1
    assert (out / "eval_0_swap.jsonl").is_file()  # per-problem results right after the swap
    pre = load_team_file(str(out / "policies" / "stage0.safetensors"))  # right after the swap
    assert _same(pre[1], src._get_weights(0))
