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
    assert f"{stage['J_after']:.3f} after 1 stage." in card
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


# ------------------------------------------------------------------ own only what is ours
def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_export_into_its_own_run_is_refused_and_deletes_nothing(trained, capsys):
    """``sat export RUN --out RUN --overwrite`` used to leave only the export."""
    run, _ = trained
    before = _tree(run)
    for out in (run, run / "sub", run.parent):
        _one_line_error(capsys, main(["export", str(run), "--out", str(out), "--overwrite"]),
                        "choose another folder")
    assert _tree(run) == before


def test_overwrite_replaces_only_an_export_it_wrote(trained, tmp_path, capsys):
    run, _ = trained
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "thesis.tex").write_text("mine")
    _one_line_error(capsys, main(["export", str(run), "--out", str(docs), "--overwrite"]),
                    "nothing was deleted")
    assert _tree(docs) == ["thesis.tex"]
    ex = tmp_path / "ex"
    assert main(["export", str(run), "--out", str(ex)]) == 0
    first = _tree(ex)
    assert ".sat-export" in first
    (ex / "agent0" / "mine.txt").write_text("mine")  # inside a listed entry: replaced with it
    assert main(["export", str(run), "--out", str(ex), "--overwrite"]) == 0
    assert _tree(ex) == first and sorted(p.name for p in tmp_path.iterdir()) == ["docs", "ex"]
    (ex / "notes.md").write_text("mine")  # a file next to the export's own entries
    _one_line_error(capsys, main(["export", str(run), "--out", str(ex), "--overwrite"]),
                    "did not write (notes.md)")
    assert (ex / "notes.md").read_text() == "mine"


def test_interrupted_overwrite_leaves_a_whole_export(trained, tmp_path, capsys, monkeypatch):
    """Ctrl-C in the worst moment (right after the old export is moved or deleted) leaves a
    whole export at --out (the old code deleted the old one and then discarded the new)."""
    import signal

    from tests.faults import interrupt_after

    run, _ = trained
    ex = tmp_path / "ex"
    assert main(["export", str(run), "--out", str(ex)]) == 0
    whole = _tree(ex)
    fired = interrupt_after(monkeypatch, ex, signal.SIGINT)
    assert main(["export", str(run), "--out", str(ex), "--overwrite"]) == 130
    assert fired and _tree(ex) == whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ex"]  # no temp or aside folder


# ------------------------------------------------------------------ hostile files
def _export_copy(trained, tmp_path):
    import shutil

    _, ex = trained
    dst = tmp_path / "ex"
    shutil.copytree(ex, dst, ignore=shutil.ignore_patterns("merged"))
    return dst


def _edit_json(path, **changes):
    d = json.loads(path.read_text())
    for k, v in changes.items():
        d[k] = v
    path.write_text(json.dumps(d))


def test_team_json_naming_a_task_class_runs_nothing(trained, tmp_path, capsys, monkeypatch):
    """A module shipped inside an export and named by its team.json does not run when the
    model card's own ``sat team .`` is followed (the export folder is on sys.path, as with
    an empty PYTHONPATH element); ``--allow-task-import`` is the explicit opt-in."""
    ex = _export_copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    (ex / "evil_task.py").write_text(f"open({str(marker)!r}, 'w').close()\n"
                                     "from sat_llm.tasks import CopyTask as Task\n")
    info = json.loads((ex / "team.json").read_text())
    info["llm_config"]["task"] = "evil_task:Task"
    (ex / "team.json").write_text(json.dumps(info))
    monkeypatch.syspath_prepend(str(ex))
    _one_line_error(capsys, main(["team", str(ex), "--prompt", "hi"]), "--allow-task-import")
    assert not marker.exists()
    assert main(["team", str(ex), "--prompt", "Repeat exactly: ab", "--allow-task-import",
                 "--no-stream"]) == 0
    assert marker.exists()  # the opt-in does what it says


def test_bad_team_json_fields_are_one_line(trained, tmp_path, capsys):
    ex = _export_copy(trained, tmp_path)
    good = (ex / "team.json").read_text()
    info = json.loads(good)
    for change, pattern in ((dict(llm_config=5), "must be objects"),
                            (dict(base_model=dict(info["base_model"], path="../../etc")),
                             "inside the export"),
                            (dict(base_model=dict(info["base_model"], path="/etc")),
                             "inside the export"),
                            (dict(llm_config=dict(info["llm_config"], agents="two")),
                             "bad llm_config"),
                            (dict(llm_config=dict(info["llm_config"], nope=1)), "bad llm_config")):
        (ex / "team.json").write_text(good)
        _edit_json(ex / "team.json", **change)
        _one_line_error(capsys, main(["team", str(ex), "--prompt", "hi"]), pattern)


def test_non_finite_or_misshapen_adapters_are_refused(trained, tmp_path, capsys):
    """All-NaN adapters used to play and export with exit 0; a tensor of a shape that
    broadcasts onto the adapter was accepted."""
    from safetensors.torch import load_file, save_file

    from sat_theory.checkpoint import load_state, save_state

    ex = _export_copy(trained, tmp_path)
    f = ex / "agent1" / "adapter_model.safetensors"
    w = load_file(str(f))
    save_file({k: torch.full_like(t, float("nan")) for k, t in w.items()}, str(f))
    _one_line_error(capsys, main(["team", str(ex), "--prompt", "hi"]), "NaN or infinite")
    k = sorted(w)[0]
    save_file({**w, k: w[k][:1].clone()}, str(f))  # (1, n) broadcasts onto (r, n)
    _one_line_error(capsys, main(["team", str(ex), "--prompt", "hi"]), "has shape")

    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    ck = load_state(run / "checkpoint.safetensors")
    name = sorted(ck["team"]["weights"][0])[0]
    ck["team"]["weights"][0][name] = torch.full_like(ck["team"]["weights"][0][name], float("inf"))
    save_state(run / "checkpoint.safetensors", ck)
    _one_line_error(capsys, main(["export", str(run), "--out", str(tmp_path / "e")]),
                    "NaN or infinite")
    _one_line_error(capsys, main(["team", str(run), "--prompt", "hi"]), "NaN or infinite")
    assert not (tmp_path / "e").exists()


def test_stdin_and_prompts_are_bounded(trained, capsys, monkeypatch):
    """Non-UTF-8 stdin and prompts longer than the model's context are one line naming the
    row (exit 2), checked before the team plays (a 200 MB line aborted in the tokenizer)."""
    run, _ = trained

    class Bytes(io.StringIO):  # a pipe: text on top of bytes
        def __init__(self, data):
            super().__init__()
            self.buffer = io.BytesIO(data)

    monkeypatch.setattr("sys.stdin", Bytes(b"Repeat exactly: ab\n\xff\xfe bad\n"))
    _one_line_error(capsys, main(["team", str(run)]), "stdin line 2 is not UTF-8")
    _one_line_error(capsys, main(["team", str(run), "--prompt", "hi", "--prompt",
                                  "x" * 3000]), "prompt 2: ")
    _one_line_error(capsys, main(["team", str(run), "--prompt", "y" * (2048 * 256 + 1)]),
                    "cannot fit the model's context")


def test_team_errors_name_what_sat_team_does(tmp_path, capsys):
    tab = tmp_path / "tab"
    assert main(["train", "--env", "bandit", "--stages", "1", "--out", str(tab), "--quiet"]) == 0
    capsys.readouterr()
    _one_line_error(capsys, main(["team", str(tab), "--prompt", "hi"]), "can be played")


def test_dataset_rows_are_checked_against_the_context(trained):
    """The check ``sat team`` runs on typed prompts also takes a dataset's problems (already
    in the task's form) and names the offending one."""
    from sat_llm.export import load_team
    from sat_llm.play import check_problems_fit
    from sat_llm.tasks import Problem
    from sat_theory.errors import InputError

    team, _ = load_team(trained[0])
    fits = [Problem("Repeat exactly: ab", "ab")]
    check_problems_fit(team, fits)
    long = Problem("z" * (2048 - 40), "z")  # the character tokenizer: one token per character
    with pytest.raises(InputError, match=r"dataset row 7: \d+ tokens .* context length of 2048"):
        check_problems_fit(team, fits + [long], ["dataset row 3", "dataset row 7"])


def test_a_replaced_base_with_custom_code_runs_nothing(trained, tmp_path, capsys):
    """``sat team EXPORT`` whose ``base/`` was replaced by a folder with ``auto_map``: refused
    before transformers sees it (it used to ask, and a piped ``y`` ran the module)."""
    ex = _export_copy(trained, tmp_path)
    marker = tmp_path / "pwned"
    (ex / "base" / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    _edit_json(ex / "base" / "config.json", auto_map={"AutoModelForCausalLM": "evil.Model"})
    _one_line_error(capsys, main(["team", str(ex), "--prompt", "hi"]), "auto_map")
    assert not marker.exists()
