"""Per-agent views (:mod:`sat_llm.protocol`) on a real ``LLMTeam`` (tiny random model, CPU):
every agent's rendered context holds its own private part and no other agent's, the exact-KL
monitor scores the very contexts that generated the messages, views survive a killed and
resumed run, ``team.json`` records them, and tasks without views render as before."""

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import sat_llm.scoring as scoring  # noqa: E402  (the module whose passes call these)
from sat_llm.protocol import Protocol, problem_views  # noqa: E402
from sat_llm.team import LLMConfig, LLMTeam  # noqa: E402
from sat_llm.team_tasks import RELAY_REVIEW  # noqa: E402
from sat_theory.cli import main  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


def relay_team(agents=3, **kw):
    base = dict(model="tiny-random", task="relay", agents=agents, max_new_tokens=4,
                n_train=16, n_eval=3, minibatch=8, lr=1e-2, seed=0, threads=1, device="cpu")
    return LLMTeam(LLMConfig(**{**base, **kw}))


def _history_before(transcript, turn_index):
    """The shared transcript an agent saw at its ``turn_index``-th turn (no environment
    feedback in relay: one entry per turn)."""
    return [tuple(x) for x in transcript[:turn_index]]


@pytest.mark.parametrize("agents", [2, 3])
def test_every_agent_sees_its_own_view_and_no_other(agents):
    team = relay_team(agents)
    batch = team.rollout(2, 2)
    tok = team.tokenizer(0)
    problems = [team.train_pool[i] for i in batch.extra["problems"] for _ in range(2)]
    n_checked = 0
    for ep, prob, transcript in zip(batch.episodes, problems, batch.extra["transcripts"],
                                    strict=True):
        shared, private = problem_views(team.task, prob, agents)
        assert len(set(private)) == agents
        for k, turn in enumerate(ep.turns):
            j = turn.agent
            text = tok.decode(list(turn.context.ids))
            assert private[j] in text
            assert not any(private[i] in text for i in range(agents) if i != j), (j, text)
            # the ids are exactly the protocol's rendering of this agent's view
            assert list(turn.context.ids) == team.protocol.render(
                tok, shared, _history_before(transcript, k), j, k == agents - 1, private[j])
            n_checked += 1
    assert n_checked == 4 * agents


def test_evaluation_contexts_carry_the_views_too(monkeypatch):
    team = relay_team(2)
    seen = []
    real = LLMTeam._messages

    def spy(self, k, items, *a, **kw):
        out = real(self, k, items, *a, **kw)
        seen.extend((k, tuple(c)) for c in out[0])  # the contexts the messages came from
        return out

    monkeypatch.setattr(LLMTeam, "_messages", spy)
    team.evaluate()
    tok = team.tokenizer(0)
    views = [problem_views(team.task, p, 2)[1] for p in team.eval_set]
    for j in range(2):  # round robin: each agent speaks once per episode, in problem order
        ctxs = [c for k, c in seen if k == j]
        assert len(ctxs) == len(views)
        for ctx, v in zip(ctxs, views, strict=True):
            text = tok.decode(list(ctx))
            assert v[j] in text and v[1 - j] not in text


def test_kl_monitor_scores_the_generation_contexts(monkeypatch):
    """The exact KL of agent j is computed on the contexts agent j generated in (its own
    view), not on a re-rendering (e.g. the shared prompt or another agent's view)."""
    team = relay_team(3)
    gen: dict[str, list] = {}
    real_gen, real_score = scoring.generate, scoring.score_logits

    def spy_gen(model, ctxs, **kw):
        gen.setdefault(model.active_adapter, []).extend(tuple(c) for c in ctxs)
        return real_gen(model, ctxs, **kw)

    monkeypatch.setattr(scoring, "generate", spy_gen)
    batch = team.rollout(2, 2)
    monkeypatch.setattr(scoring, "generate", real_gen)
    for j in range(3):
        snap = team.snapshot(j)
        # move the adapter off the snapshot: an agent still at its reference's version is
        # scored once (the reference pass is the current policy's), here both passes run
        team._set_weights(j, {k: w + 1e-3 for k, w in snap.weights.items()})
        team._bump(j)
        scored = []

        def spy_score(model, ctxs, msgs, scored=scored, **kw):
            scored.append([tuple(c) for c in ctxs])
            return real_score(model, ctxs, msgs, **kw)

        monkeypatch.setattr(scoring, "score_logits", spy_score)
        team._ref_cache = None
        team.kl(j, batch, snap)
        monkeypatch.setattr(scoring, "score_logits", real_score)
        assert len(scored) == 2  # the reference pass and the current adapter's pass
        for ctxs in scored:
            assert sorted(ctxs) == sorted(gen[f"agent{j}"])


def test_tasks_without_views_render_the_whole_prompt():
    """A task without views: every agent's context is the protocol's rendering of the plain
    prompt, as before views existed (and the ``view=None`` rendering is that rendering)."""
    team = LLMTeam(LLMConfig(model="tiny-random", task="arithmetic", agents=2, max_new_tokens=4,
                             n_train=16, n_eval=2, seed=0, threads=1, device="cpu"))
    batch = team.rollout(2, 1)
    tok = team.tokenizer(0)
    for ep, i, tr in zip(batch.episodes, batch.extra["problems"], batch.extra["transcripts"],
                         strict=True):
        prompt = team.train_pool[i].prompt
        for k, turn in enumerate(ep.turns):
            want = tok(tok.apply_chat_template(
                team.protocol.messages(prompt, _history_before(tr, k), turn.agent, k == 1),
                add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"]
            assert list(turn.context.ids) == list(want)
    p = Protocol(2)
    h = [("agent 1", "x")]
    assert p.messages("q", h, 1, True) == p.messages("q", h, 1, True, None) == [
        {"role": "system", "content": p.system_prompt}, {"role": "user", "content": "q"},
        {"role": "assistant", "content": "x"}, {"role": "user", "content": p.review_prompt}]
    assert p.messages("q", h, 1, True, "v")[-1]["content"] == p.review_prompt + "\n\nv"


# ------------------------------------------------------------------ runs: resume, export, play
RELAY = ["train", "--backend", "llm", "--model", "tiny-random", "--task", "relay",
         "--agents", "2", "--stages", "2", "--prompts", "2", "--group-size", "2",
         "--max-new-tokens", "3", "--n-train", "8", "--n-eval", "2", "--delta", "0.002",
         "--llm-lr", "0.01", "--threads", "1", "--quiet"]


@pytest.mark.parametrize("method", ["sat", "naive"])
def test_views_survive_kill_and_resume(tmp_path, method):
    import signal

    from tests.faults import kill_chain, records

    argv = RELAY + ["--method", method]
    assert main(argv + ["--out", str(tmp_path / "full")]) == 0
    codes = kill_chain(argv, tmp_path / "killed", "sat_llm.team.LLMTeam",
                       chain=("write:1", "update:2", "record:2", "write:2"))
    assert codes.count(-signal.SIGKILL) >= 3, codes
    assert main(["train", "--resume", str(tmp_path / "killed"), "--quiet"]) == 0
    assert records(tmp_path / "full") == records(tmp_path / "killed")
    for k in range(3):  # per-problem held-out records (the greedy messages) identical
        a = (tmp_path / "full" / f"eval_{k}.jsonl").read_bytes()
        assert a == (tmp_path / "killed" / f"eval_{k}.jsonl").read_bytes()


def test_team_json_records_the_views_and_sat_team_plays_them(tmp_path, capsys):
    run, ex = tmp_path / "run", tmp_path / "ex"
    assert main(RELAY + ["--stages", "1", "--out", str(run)]) == 0
    assert main(["export", str(run), "--out", str(ex), "--quiet"]) == 0
    info = json.loads((ex / "team.json").read_text())
    assert info["protocol"]["review_prompt"] == RELAY_REVIEW[2]
    v = info["views"]
    assert v["function"] == "sat_llm.team_tasks.RelayTask.views" and v["n_agents"] == 2
    team = relay_team(2, n_train=8, n_eval=2)
    shared, private = problem_views(team.task, team.eval_set[0], 2)
    assert v["example"] == dict(problem=team.eval_set[0].prompt, shared=shared, private=private)
    capsys.readouterr()
    assert main(["team", str(ex), "--prompt", "Compute 7 * 8", "--answer", "56", "--json",
                 "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [who for who, _ in out["messages"]] == ["agent 1", "agent 2"]


def test_a_plain_task_exports_no_views(tmp_path):
    run, ex = tmp_path / "run", tmp_path / "ex"
    argv = [a if a != "relay" else "copy" for a in RELAY]
    assert main(argv + ["--stages", "1", "--out", str(run)]) == 0
    assert main(["export", str(run), "--out", str(ex), "--quiet"]) == 0
    assert json.loads((ex / "team.json").read_text())["views"] is None


def test_ray_worker_renders_the_views_of_the_in_process_team():
    """The Ray actor class (plain Python here) builds the team's protocol, the relay
    instruction included, and renders the views exactly as the in-process team."""
    from sat_llm.ray_team import AgentWorker

    team = relay_team(2)
    cfg = dict(team.cfg.to_dict(), agent_models=["tiny-random", "tiny-random"])
    w = AgentWorker(cfg, 1, None)
    assert w.protocol == team.protocol
    p = team.eval_set[0]
    shared, private = problem_views(team.task, p, 2)
    items = [(shared, [("agent 1", "hello")], private[1])]
    ctxs = w.generate(items, True, True, None, 1)[0]
    assert list(ctxs[0]) == team.protocol.render(team.tokenizer(1), shared, items[0][1], 1,
                                                 True, private[1])
