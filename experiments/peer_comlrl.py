"""CoMLRL's ``MAGRPOTrainer`` as a peer of our turn-taking teams (2 or 3 agents), with our settings.

**What MAGRPOTrainer computes** (CoMLRL 1.4.3, ``comlrl/trainers/reinforce/magrpo.py``). Per
training prompt it grows a tree over ``num_turns`` turns: at each node *every* agent samples
``num_generations = G`` completions of its own prompt, and (``joint_mode="aligned"``) the
``g``-th completions of all agents form joint action ``g``, scored by one joint reward
(``reward_func``); below each joint action of a non-final turn, ``external_transition`` gives
every agent its next prompt and a child node is grown. A joint action's return is its reward
plus the mean return of its child's joint actions (undiscounted). Every node gives every
agent one sample (its ``G`` completions and their ``G`` returns); per agent a rollout buffer
of 2 samples, then one AdamW step per 2 samples of the same turn with the loss
``−(1/G) Σ_g Â_g Σ_u log π(y_{g,u} | ·)`` (temperature-1 logits), ``Â`` the returns minus
their mean, divided by their population std (clamped at 1e-6): REINFORCE with a group
baseline, no ratio, no clipping, no KL term. One model and optimizer per agent.

Our teams are turn-taking (agent ``j`` speaks at turn ``j``, sees the messages before it and
gives its message; the last agent's answer is scored). The closest MAGRPO set-up, used here:
``num_turns = n``, reward 0 at every turn but the last and our verifier on the last agent's
last-turn message at the last turn, so a turn-``t`` joint action is credited with the mean
success of the team below it — the credit our protocol gives agent ``t``'s message. The
messages of the agents that do not speak at a turn in our protocol (MAGRPO makes them act) are
MAGRPO's cost of simultaneous turns: they never enter a shared transcript, but they are
generated and count against its budget (:func:`messages_per_prompt`). The prompts:

- **tasks without views, 2 agents** (the issue-21 arithmetic study; unchanged): turn 1: both
  agents get our agent-1 prompt (the problem; canonical chat protocol,
  :mod:`sat_llm.protocol`). Turn 2: agent 2 gets our agent-2 prompt with agent 1's turn-1
  answer in the shared context, exactly as in our protocol; agent 1 gets its prompt with
  agent 2's turn-1 message (it must act again).
- **tasks with per-agent views** (``relay``, 2 or 3 agents): at turn ``t`` every agent ``j``
  gets its own view of the shared transcript ``H_t`` — the messages of the agents that speak
  before turn ``t`` in our protocol (agent ``s``'s turn-``s`` message on this branch, ``s <
  t``) — with its own private part (``Protocol.messages(shared, H_t, j, view=private_j)``),
  exactly the context agent ``j`` would have at that point of our protocol. No agent ever
  sees another's private part (the issue-21 mapping gives agent 2 agent 1's prompt at turn
  1, which with views would hold agent 1's private part).

Same base (each agent its own copy: MAGRPO optimizes one module per agent), LoRA rank / α /
targets, learning rate, group size (``num_generations``), max new tokens, temperature (plain
sampling: top-p 1, no top-k), stop tokens. MAGRPO's own loss and buffer defaults are kept:
that is the peer as it is.

After training (and every ``eval_every`` prompts, or at the prompt counts ``eval_at``) the
adapters are copied into our team and evaluated by the same greedy held-out evaluation as our
runs (``eval_{k}.jsonl``).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path

__all__ = ["run_study_comlrl", "messages_per_prompt", "turn_prompts"]


def messages_per_prompt(group_size: int, n_agents: int = 2) -> int:
    """Messages MAGRPO generates per prompt with ``n`` agents and ``n`` turns: every agent
    samples ``G`` completions at each of the ``G^(t−1)`` nodes of turn ``t``, so ``n · Σ_{t=1}^n
    G^t`` (2 agents: ``2(G + G²)``; 3 agents, ``G = 4``: 252)."""
    return n_agents * sum(group_size ** t for t in range(1, n_agents + 1))


def turn_prompts(render, views, responses: list[list[str]]) -> list[str]:
    """The prompt of every agent at MAGRPO turn ``t = len(responses[0])`` (module docstring).
    ``render(prompt, history, agent, last, view) -> str`` (the chat text of our protocol);
    ``views = (shared prompt, private parts | None)`` of the problem
    (:func:`sat_llm.protocol.problem_views`); ``responses[j]``: agent ``j``'s cleaned
    completions on this branch, one per earlier turn. Without views and with 2 agents: the
    issue-21 mapping (turn 1: agent 1's prompt for both; turn 2: each agent after the other's
    turn-1 message). With views: agent ``j`` sees the transcript ``H_t`` of the agents that
    speak before turn ``t`` (agent ``s``'s turn-``s`` message, ``s < t``) and its own part."""
    shared, private = views
    n, t = len(responses), len(responses[0])
    if private is None and n == 2:  # the issue-21 study's mapping, unchanged
        if t == 0:
            return [render(shared, [], 0, False, None)] * 2
        return [render(shared, [("agent 2", responses[1][0])], 0, False, None),
                render(shared, [("agent 1", responses[0][0])], 1, True, None)]
    history = [(f"agent {s + 1}", responses[s][s]) for s in range(t)]
    return [render(shared, history, j, j == n - 1, None if private is None else private[j])
            for j in range(n)]


def _joint_reward(n: int, score):
    """A ``reward_func`` of ``n`` agents' completions: CoMLRL calls it with the prompts, one
    completion list per agent and ``batch_items`` (it counts the positional parameters, so
    each team size needs its own signature); ``score(prompts, completions, batch_items)``."""
    if n == 2:
        def reward(prompts, c1, c2, *, batch_items=None):
            return score(prompts, (c1, c2), batch_items)
    elif n == 3:
        def reward(prompts, c1, c2, c3, *, batch_items=None):
            return score(prompts, (c1, c2, c3), batch_items)
    else:
        raise SystemExit(f"CoMLRL peer: 2 or 3 agents, got {n}")
    return reward


def _lora_model(name: str, cfg, seed: int):
    from peft import LoraConfig, get_peft_model

    from sat_llm.models import load_model

    model, tok = load_model(name, seed=seed)
    lora = LoraConfig(r=cfg.lora_r, lora_alpha=2 * cfg.lora_r, lora_dropout=0.0,
                      target_modules=["q_proj", "v_proj"], bias="none")
    return get_peft_model(model, lora), tok


def _distinct_pad(tok, agents):
    """A pad token that no prompt contains. MAGRPO (CoMLRL 1.4.3, ``magrpo.py``
    ``_generate_completions``) takes the prompt length to be the position of the first pad
    token in the prompt; SmolLM2's pad token is its end-of-turn token ``<|im_end|>``, which
    every chat-formatted prompt contains after the system message, so the "completions"
    would hold most of the prompt (measured: 0.335 held-out at every evaluation over 21
    prompts, 75 "generated" tokens per 16-token message). The fix is a user-side setting:
    pad with another special token (``<|endoftext|>``), in the tokenizer and the models'
    generation configs; ``<|im_end|>`` stays the stop token."""
    chat = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    if tok.pad_token is None or tok.pad_token not in chat:
        return tok
    spare = next((t for t in tok.all_special_tokens if t not in chat), None)
    if spare is None:
        raise SystemExit("CoMLRL needs a pad token that prompts do not contain; this "
                         "tokenizer has none spare")
    tok.pad_token = spare
    for a in agents:
        a.generation_config.pad_token_id = tok.pad_token_id
        a.config.pad_token_id = tok.pad_token_id
    return tok


def _snapshot(trainer, agents) -> dict:
    """What an exact continuation of a MAGRPO run needs after a prompt (a safe state tree,
    :func:`sat_theory.checkpoint.save_state`): every agent's LoRA weights and AdamW state,
    the rollout buffers (the samples not yet trained on), MAGRPO's step counter and the
    python / numpy / torch RNG states."""
    import dataclasses
    import random

    import numpy as np
    import torch

    return dict(
        agents=[{k: p.detach().clone() for k, p in a.named_parameters() if p.requires_grad}
                for a in agents],
        optimizers=[o.state_dict() for o in trainer.optimizers],
        buffers=[[{f.name: getattr(s, f.name) for f in dataclasses.fields(s)} for s in b]
                 for b in trainer.rollout_buffers],
        env_step=int(trainer.env_step),
        rng=dict(python=random.getstate(), numpy=np.random.get_state(),
                 torch=torch.get_rng_state()))


def _restore(trainer, agents, snap: dict):
    """Put :func:`_snapshot`'s state back (all but the RNG states, which the caller sets when
    training resumes); returns the RNG setter. A tree of the wrong shape: ``ValueError``."""
    import random

    import numpy as np
    import torch
    from comlrl.trainers.reinforce.magrpo import NodeSample

    if len(snap["agents"]) != len(agents) or len(snap["optimizers"]) != len(agents):
        raise ValueError("another number of agents")
    with torch.no_grad():
        for a, w in zip(agents, snap["agents"], strict=True):
            params = {k: p for k, p in a.named_parameters() if p.requires_grad}
            if set(params) != set(w):
                raise ValueError("other adapter weights")
            for k, p in params.items():
                p.copy_(w[k])
    for o, st in zip(trainer.optimizers, snap["optimizers"], strict=True):
        o.load_state_dict(st)
    trainer.rollout_buffers = [[NodeSample(**f) for f in b] for b in snap["buffers"]]
    trainer.env_step = int(snap["env_step"])
    rng = snap["rng"]

    def set_rng() -> None:
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])

    return set_rng


def run_study_comlrl(cfg, seed: int, d: Path, *, n_prompts: int, eval_every: int = 0,
                     eval_at=(), meta_extra: dict | None = None, n_agents: int = 2,
                     resume: bool = True) -> Path:
    """Train ``n_agents`` agents with ``MAGRPOTrainer`` on ``n_prompts`` training prompts (one
    epoch), evaluate with our team every ``eval_every`` prompts, or after the prompt counts in
    ``eval_at`` (the common message grid), and after the last; writes the run folder ``d``
    (module docstring). ``cfg``: the study's :class:`~experiments.llm_team_learning.StudyConfig`
    (its ``llm_config`` names the task: arithmetic in issue 21, relay in issue 22).

    **Resumable, exactly.** After every evaluation but the last the run saves its state
    (:func:`_snapshot`, one safetensors state file ``d/ckpt/checkpoint-K/state.safetensors``,
    K = prompts trained; no pickle) and commits it
    (:func:`experiments.peer_runs.write_peer_checkpoint`, with our counters). MAGRPO's
    own checkpoints are at epoch boundaries only (empty rollout buffers), and the study trains
    one epoch. With ``resume`` and a checkpoint the run continues from it: the state put
    back, the prompts after K (MAGRPO's data loader is sequential), the RNG states set just
    before the next prompt's rollout (after the data loader's iterator, which draws a seed
    from torch's generator, is made), so the eval files and metrics records (timing aside)
    are those of a run never stopped (``tests/llm/test_peer_resume.py``)."""
    import torch
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset

    from experiments import peer_runs
    from experiments.peer_trl import adapter_into
    from sat_llm.protocol import problem_views
    from sat_llm.team import LLMTeam
    from sat_theory.checkpoint import load_state, save_state
    from sat_theory.errors import InputError
    from sat_theory.metrics import RunWriter

    n = n_agents
    go, ck = peer_runs.start_peer_run(d, resume)
    if not go:
        return d
    t_start = time.time()
    team = LLMTeam(cfg.llm_config(n, seed))  # our evaluation and problems (same seed → same pools)
    task, proto = team.task, team.protocol  # the task's protocol (Protocol(2) for arithmetic)
    agents, toks = zip(*[_lora_model(cfg.model, cfg, seed) for _ in range(n)], strict=True)
    tok = _distinct_pad(toks[0], agents)

    def text(prompt: str, history, speaker: int, last: bool, view=None) -> str:
        return tok.apply_chat_template(proto.messages(prompt, history, speaker, last, view),
                                       tokenize=False, add_generation_prompt=True)

    rng = __import__("random").Random(seed)
    pool = team.train_pool
    items = [dict(prompt=pool[i].prompt, idx=i) for i in
             (rng.randrange(len(pool)) for _ in range(n_prompts))]
    views = {it["prompt"]: problem_views(task, pool[it["idx"]], n) for it in items}
    first = {p: turn_prompts(text, v, [[] for _ in range(n)]) for p, v in views.items()}
    turn_of = {ps[0]: 0 for ps in first.values()}  # agent 1's prompt -> its turn

    def formatter(j: int):
        def fmt(item, external_prompts=None):
            return external_prompts if external_prompts is not None else first[item["prompt"]][j]
        return fmt

    def transition(prompt, agent_completions, num_agents, **kw):
        branch = [[proto.clean(c) for c in h] for h in kw["response_history_per_agent"]]
        nxt = turn_prompts(text, views[prompt], branch)
        turn_of[nxt[0]] = len(branch[0])
        return nxt

    def score(prompts, completions, batch_items):
        item = batch_items[0]
        if turn_of[prompts[0]] < n - 1:  # before the last turn nothing is scored yet
            return [0.0]
        return [float(task.score(pool[item["idx"]], proto.clean(completions[-1][0])))]

    args = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=cfg.lr, num_agents=n,
                        num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, top_p=1.0, top_k=None, num_turns=n,
                        early_termination_threshold=None, eval_interval=0, eval_num_samples=0,
                        logging_steps=1)
    torch.manual_seed(seed)
    trainer = MAGRPOTrainer(agents=list(agents), num_agents=n, tokenizer=tok,
                            train_dataset=Dataset.from_list(items),
                            reward_func=_joint_reward(n, score),
                            formatters=[formatter(j) for j in range(n)],
                            external_transition=transition, args=args)
    trainer.verbose = False

    state = dict(tokens_total=0, train_seconds=0.0, wall_seconds=0.0, prompts=0)
    gen = trainer._generate_completions_with_external_prompts

    def counting_gen(*a, **kw):  # generated tokens of every completion, as ours count them
        out = gen(*a, **kw)
        state["tokens_total"] += sum(out["response_lens"])  # not the padded length
        return out

    trainer._generate_completions_with_external_prompts = counting_gen
    config = dict(peer="comlrl.MAGRPOTrainer", study=asdict(cfg), seed=seed,
                  n_prompts=n_prompts, magrpo=asdict(args),
                  **({} if n == 2 else dict(n_agents=n)))
    peer_runs.resume_peer_config(d, ck, config)
    set_rng = None
    if ck is not None:
        try:
            set_rng = _restore(trainer, agents, load_state(ck["path"] / "state.safetensors"))
        except (InputError, KeyError, TypeError, ValueError, RuntimeError) as e:
            peer_runs.peer_error(f"{ck['path']}: not a state this run can continue from "
                                 f"({type(e).__name__}: {str(e)[:120]}); nothing was loaded")
        state.update(ck["state"])
        trainer.train_dataset = Dataset.from_list(items[state["prompts"]:])
    writer = RunWriter(str(d), append=ck is not None)
    if ck is None:
        writer.write_config(config)
    clock = dict(last=time.perf_counter())
    wall_before = state["wall_seconds"]

    def evaluate(k: int) -> None:
        for j, agent in enumerate(agents):
            adapter_into(team, agent, j)
        peer_runs.log_peer_eval(d, team, writer, k, tokens_total=state["tokens_total"],
                                train_seconds=state["train_seconds"], prompts=k)

    def checkpoint(k: int) -> None:
        name = f"checkpoint-{k}"
        folder = d / peer_runs.PEER_CKPT / name
        if folder.exists():  # torn by a kill before its record was written
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        save_state(folder / "state.safetensors", _snapshot(trainer, agents))
        state["wall_seconds"] = wall_before + time.time() - t_start
        peer_runs.write_peer_checkpoint(d, name, k, dict(state))

    step = trainer._train_step_returns

    def step_and_eval(batch_item, **kw):
        nonlocal set_rng
        if set_rng is not None:  # resumed: the RNG states of the checkpoint, now
            set_rng()
            set_rng = None
        out = step(batch_item, **kw)
        state["prompts"] += 1
        k = state["prompts"]
        if ((eval_every and k % eval_every == 0) or k in eval_at) and k < n_prompts:
            state["train_seconds"] += time.perf_counter() - clock["last"]
            evaluate(k)
            checkpoint(k)
            clock["last"] = time.perf_counter()
        return out

    trainer._train_step_returns = step_and_eval
    if ck is None:
        evaluate(0)
    clock["last"] = time.perf_counter()
    if state["prompts"] < n_prompts:
        trainer.train()  # the last buffers are drained at the end of the epoch
    state["train_seconds"] += time.perf_counter() - clock["last"]
    evaluate(n_prompts)
    writer.close()
    peer_runs.finish_peer_run(d, "comlrl", seed, t_start, cfg, meta_extra, wall_before)
    return d
