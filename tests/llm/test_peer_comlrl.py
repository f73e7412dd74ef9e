"""CoMLRL's MAGRPOTrainer as a peer (experiments/peer_comlrl.py): the issue-21 arithmetic set-up
is unchanged by the per-agent views (same prompts, rewards, settings), and with views (relay,
2 and 3 agents) every agent is prompted with its own view of our protocol's transcript only."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")
pytest.importorskip("comlrl")

from experiments import peer_comlrl  # noqa: E402
from experiments.llm_team_learning import StudyConfig  # noqa: E402

TINY = dict(model="tiny-random", n_train=12, n_eval=4, prompts=2, group_size=2,
            max_new_tokens=4, minibatch=4)


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def spy(monkeypatch):
    """Every MAGRPOTrainer built: its keyword arguments and every generation call
    ``(agent, prompt, completions)``."""
    from comlrl.trainers.reinforce import magrpo

    seen = dict(trainers=[], calls=[])

    class Spy(magrpo.MAGRPOTrainer):
        def __init__(self, **kw):
            seen["trainers"].append(kw)
            super().__init__(**kw)

        def _generate_completions(self, agent, batch_items, agent_idx=0, **kw):
            out = super()._generate_completions(agent, batch_items, agent_idx=agent_idx, **kw)
            seen["calls"].append((agent_idx, out["prompts"][0], list(out["completions"][0])))
            return out

    monkeypatch.setattr(magrpo, "MAGRPOTrainer", Spy)
    return seen


def _chat(tok, proto, prompt, history, agent, last, view=None):
    return tok.apply_chat_template(proto.messages(prompt, history, agent, last, view),
                                   tokenize=False, add_generation_prompt=True)


def test_issue21_arithmetic_setup_is_unchanged(tmp_path, spy):
    """The arithmetic 2-agent study (issue 21) gets exactly the prompts, rewards and MAGRPO
    settings of the code before the views were added (the formulas of that code, written
    out here): turn 1 both agents get agent 1's prompt, turn 2 each agent sees the other's
    turn-1 message, reward 0 at turn 1 and the verifier on agent 2's turn-2 answer."""
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig

    from sat_llm.protocol import Protocol

    cfg = StudyConfig(**TINY)
    d = peer_comlrl.run_study_comlrl(cfg, 0, tmp_path / "run", n_prompts=2, eval_every=1)
    (kw,) = spy["trainers"]
    tok = kw["tokenizer"]
    proto = Protocol(2)
    args = kw["args"]
    want = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=cfg.lr, num_agents=2,
                        num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, top_p=1.0, top_k=None, num_turns=2,
                        early_termination_threshold=None, eval_interval=0, eval_num_samples=0,
                        logging_steps=1)
    assert args == want and kw["num_agents"] == 2
    config = json.loads((d / "config.json").read_text())
    assert set(config) == {"peer", "study", "seed", "n_prompts", "magrpo"}
    items = list(kw["train_dataset"])
    from sat_llm.tasks import make_task

    task = make_task("arithmetic", **cfg.task_options())
    for item in items:
        first = _chat(tok, proto, item["prompt"], [], 0, False)
        assert [f(item) for f in kw["formatters"]] == [first, first]
        a1, a2 = "Answer: 3 <think>x</think>", "Answer: 4"
        nxt = kw["external_transition"](prompt=item["prompt"], agent_completions=[a1, a2],
                                        num_agents=2, response_history_per_agent=[[a1], [a2]],
                                        prompt_history_per_agent=[[first], [first]])
        assert nxt == [_chat(tok, proto, item["prompt"], [("agent 2", "Answer: 4")], 0, False),
                       _chat(tok, proto, item["prompt"], [("agent 1", "Answer: 3")], 1, True)]
        reward = kw["reward_func"]
        right = f"Answer: {task.problems('train', 12, 0)[item['idx']].answer}"
        assert reward([first], ["x"], [right], batch_items=[item]) == [0.0]
        assert reward([nxt[0]], ["x"], [right], batch_items=[item]) == [1.0]
        assert reward([nxt[0]], [right], ["Answer: 9999"], batch_items=[item]) == [0.0]
    # the generated prompts are those: turn-1 calls all carry the first prompt
    firsts = {_chat(tok, proto, it["prompt"], [], 0, False) for it in items}
    turn1 = [c for c in spy["calls"] if c[1] in firsts]
    assert len(turn1) == 2 * len(items)  # both agents, once per prompt


def _views_of(problem_meta, n):
    from sat_llm.team_tasks import team_views

    return team_views(problem_meta["x"], problem_meta["op"], problem_meta["y"], n)


@pytest.mark.parametrize("n", [2, 3])
def test_views_prompts_show_each_agent_only_its_part_and_the_speakers_before(n):
    """turn_prompts with views: at turn t agent j sees the turn-s messages of agents s < t
    (our protocol's transcript at turn t) and its own private part, never another's."""
    shared, private = _views_of(dict(x=7, op="*", y=5), n)
    seen = []

    def render(prompt, history, agent, last, view):
        seen.append((prompt, tuple(history), agent, last, view))
        return f"{agent}|{len(history)}|{view}"

    responses = [[] for _ in range(n)]
    for t in range(n):
        got = peer_comlrl.turn_prompts(render, (shared, private), responses)
        assert got == [f"{j}|{t}|{private[j]}" for j in range(n)]
        for prompt, history, agent, last, view in seen[-n:]:
            assert prompt == shared and view == private[agent] and last == (agent == n - 1)
            assert history == tuple((f"agent {s + 1}", f"msg {s} at {s}") for s in range(t))
        for j in range(n):
            responses[j].append(f"msg {j} at {t}")


def test_relay_three_agents_train_and_are_evaluated_with_views(tmp_path, spy):
    """A 3-agent relay MAGRPO run: every prompt an agent is given holds its own private part
    and no other agent's; the tree has n·Σ_t G^t messages per prompt; rewards only at the
    last turn; our held-out evaluation after every prompt."""
    from experiments.llm_team_task import study_config
    from sat_llm.protocol import problem_views
    from sat_llm.team_tasks import RelayTask

    cfg = study_config(**{**TINY, "n_train": 8})
    d = peer_comlrl.run_study_comlrl(cfg, 0, tmp_path / "run", n_prompts=2, eval_every=1,
                                     n_agents=3)
    (kw,) = spy["trainers"]
    assert kw["num_agents"] == 3 and kw["args"].num_turns == 3 and kw["args"].num_agents == 3
    assert len(spy["calls"]) == 2 * 3 * (1 + 2 + 4)  # prompts x agents x nodes of the tree
    assert sum(len(c) for *_, c in spy["calls"]) == 2 * peer_comlrl.messages_per_prompt(2, 3)
    task = RelayTask(lo=cfg.lo, hi=cfg.hi, ops=cfg.ops)
    items = list(kw["train_dataset"])
    pool = task.problems("train", 8, 0)
    parts = {it["prompt"]: problem_views(task, pool[it["idx"]], 3)[1] for it in items}
    for agent, prompt, _ in spy["calls"]:
        owner = [p for p in parts.values() if p[agent] in prompt]
        assert owner, "an agent's prompt lacks its private part"
        for private in parts.values():
            for k in range(3):
                if k != agent:
                    assert private[k] not in prompt, (agent, k)
    assert sorted(f.name for f in d.glob("eval_*.jsonl")) == [
        "eval_0.jsonl", "eval_1.jsonl", "eval_2.jsonl"]
    recs = [json.loads(x) for x in (d / "eval_2.jsonl").read_text().splitlines()]
    assert len(recs) == cfg.n_eval and {"strict", "lenient"} <= set(recs[0])
    assert json.loads((d / "config.json").read_text())["n_agents"] == 3
    # the joint reward: 0 at turns 1 and 2, the verifier on agent 3's turn-3 message
    item, reward, step = items[0], kw["reward_func"], kw["external_transition"]
    right = f"Answer: {pool[item['idx']].answer}"
    hist = [[f"m{j}"] for j in range(3)]
    p1 = step(prompt=item["prompt"], agent_completions=["m0", "m1", "m2"], num_agents=3,
              response_history_per_agent=hist)
    p2 = step(prompt=item["prompt"], agent_completions=["a", "b", "c"], num_agents=3,
              response_history_per_agent=[h + ["x"] for h in hist])
    first = kw["formatters"][0](item)
    assert reward([first], [right], [right], [right], batch_items=[item]) == [0.0]
    assert reward([p1[0]], [right], [right], [right], batch_items=[item]) == [0.0]
    assert reward([p2[0]], ["x"], ["x"], [right], batch_items=[item]) == [1.0]
    assert reward([p2[0]], [right], [right], ["Answer: 9999"], batch_items=[item]) == [0.0]


def test_messages_per_prompt_counts_the_tree():
    assert peer_comlrl.messages_per_prompt(4) == 2 * (4 + 16)
    assert peer_comlrl.messages_per_prompt(4, 2) == 40
    assert peer_comlrl.messages_per_prompt(4, 3) == 3 * (4 + 16 + 64)
