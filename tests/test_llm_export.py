"""``sat export`` / ``sat team``: a trained team as plain peft adapters + protocol + model card,
loaded back by peft (same log-probabilities as the trained team) and played on prompts."""

import io
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from sat_theory.cli import main  # noqa: E402

TINY = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "copy",
        "--agents", "2", "--stages", "1", "--prompts", "4", "--group-size", "4",
        "--max-new-tokens", "4", "--n-train", "8", "--n-eval", "3", "--save-policies",
        "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny trained run and its export (``--merged``), shared by the module's tests."""
    root = tmp_path_factory.mktemp("export")
    run, ex = root / "run", root / "ex"
    assert main(TINY + ["--out", str(run)]) == 0
    assert main(["export", str(run), "--out", str(ex), "--merged"]) == 0
    return run, ex


def _one_line_error(capsys, rc, pattern):
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert pattern in err, err


def _peft_logps(model, ctx, msg, temperature):
    """Per-token log π(msg | ctx) under softmax(logits/τ) computed with plain transformers."""
    ids = torch.tensor([list(ctx) + list(msg)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    L = len(ctx)
    return np.array([float(lp[L - 1 + u, t]) for u, t in enumerate(msg)])


def test_export_layout_and_model_card(trained):
    run, ex = trained
    info = json.loads((ex / "team.json").read_text())
    assert info["format"] == "sat-team-export/1" and info["n_agents"] == 2
    assert info["base_model"] == dict(name="tiny-random", hub_id=None, path="base")
    proto = info["protocol"]
    assert proto["router"] == "round-robin" and proto["n_turns"] == 2
    assert "<|im_start|>" in proto["chat_template"]
    assert [s["text"] for s in proto["stop_tokens"]] == ["<|im_end|>"]
    for j in range(2):
        conf = json.loads((ex / f"agent{j}" / "adapter_config.json").read_text())
        assert conf["r"] == 8 and conf["base_model_name_or_path"] == "../base"
        assert (ex / f"agent{j}" / "merged" / "config.json").is_file()
    # the card states the run's measured held-out accuracy, from its metrics.jsonl
    stage = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()
             if json.loads(x)["kind"] == "stage"][-1]
    card = (ex / "README.md").read_text()
    assert f"{stage['J_after']:.3f} after 1 stages" in card
    assert info["source"]["weights"].startswith("checkpoint.safetensors")


def test_plain_peft_reproduces_the_trained_teams_logprobs(trained):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from sat_llm.export import load_team

    run, ex = trained
    team, _ = load_team(run)
    p = team.eval_set[0]
    rng = np.random.default_rng(0)
    for j in range(2):
        ctx = team.protocol.render(team.tokenizer(j), p.prompt, [], j, j == 1)
        msg = [int(x) for x in rng.integers(4, 90, size=5)]
        ours = team._score(j, [ctx], [msg])[0]
        base = AutoModelForCausalLM.from_pretrained(ex / "base").float().eval()
        pm = PeftModel.from_pretrained(base, ex / f"agent{j}").eval()
        theirs = _peft_logps(pm, ctx, msg, team.cfg.temperature)
        np.testing.assert_allclose(ours, theirs, atol=1e-5)
        merged = AutoModelForCausalLM.from_pretrained(ex / f"agent{j}" / "merged").float().eval()
        np.testing.assert_allclose(_peft_logps(merged, ctx, msg, team.cfg.temperature), theirs,
                                   atol=1e-4)
    # the test has teeth: training moved an adapter away from its fresh (= base) weights
    assert any(not torch.equal(team._init_weights[j][k], team._get_weights(j)[k])
               for j in range(2) for k in team._init_weights[j])


def test_team_plays_the_same_from_run_and_export(trained, capsys):
    run, ex = trained
    outs = []
    for src in (run, ex):
        assert main(["team", str(src), "--prompt", "Repeat exactly: abcd", "--answer", "abcd",
                     "--json"]) == 0
        outs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert outs[0] == outs[1]
    r = outs[0]
    assert [who for who, _ in r["messages"]] == ["agent 1", "agent 2"]
    assert 0.0 <= r["score"] <= 1.0 and r["final"] == r["messages"][-1][1]


def test_team_reads_prompts_from_stdin(trained, capsys, monkeypatch):
    run, _ = trained
    monkeypatch.setattr("sys.stdin", io.StringIO('Repeat exactly: abab\n\n{"prompt": '
                                                 '"Repeat exactly: wxyz", "answer": "wxyz"}\n'))
    assert main(["team", str(run), "--no-stream"]) == 0
    out = capsys.readouterr().out
    assert out.count("agent 1: ") == 2 and out.count("final answer: ") == 2
    assert "expected wxyz; score" in out


def test_bad_input_is_one_line(trained, tmp_path, capsys):
    run, ex = trained
    _one_line_error(capsys, main(["export", str(run), "--out", str(ex)]), "exists")
    _one_line_error(capsys, main(["export", str(run), "--out", str(tmp_path / "e"),
                                  "--stage", "7"]), "no policies/stage7")
    _one_line_error(capsys, main(["export", str(tmp_path / "nothing"), "--out",
                                  str(tmp_path / "e")]), "config.json missing")
    tab = tmp_path / "tab"
    assert main(["train", "--env", "bandit", "--stages", "1", "--out", str(tab), "--quiet"]) == 0
    capsys.readouterr()
    _one_line_error(capsys, main(["export", str(tab), "--out", str(tmp_path / "e")]),
                    "not an LLM run")
    bad = tmp_path / "badex"
    bad.mkdir()
    (bad / "team.json").write_text("{nope")
    _one_line_error(capsys, main(["team", str(bad), "--prompt", "hi"]), "not valid JSON")
    _one_line_error(capsys, main(["team", str(run), "--answer", "3"]), "--answer needs --prompt")
    assert not (tmp_path / "e").exists()  # nothing half-written


def test_streamed_tokens_are_the_messages(trained):
    """What ``sat team`` streams on a terminal is exactly each agent's message."""
    from sat_llm.export import load_team
    from sat_llm.play import play

    team, _ = load_team(trained[0])
    got = {}

    class Collect:  # the streamer protocol: put(prompt ids) once, then the new tokens, end()
        def __init__(self, agent):
            self.agent, self.prompt_seen = agent, False
            got[agent] = []

        def put(self, value):
            if self.prompt_seen:
                got[self.agent] += value.flatten().tolist()
            self.prompt_seen = True

        def end(self):
            pass

    team.streamer_for = Collect
    r = play(team, "Repeat exactly: abcd", "abcd")
    tok = team.tokenizer(0)
    assert sorted(got) == [0, 1]
    for j, (_who, text) in enumerate(r["messages"]):
        assert team.protocol.clean(tok.decode(got[j], skip_special_tokens=True)) == text
