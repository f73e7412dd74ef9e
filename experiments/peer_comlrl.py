"""CoMLRL's ``MAGRPOTrainer`` (2 agents) as a peer of our 2-agent team, with our settings.

MAGRPO (CoMLRL 1.4) lets *every* agent act at every turn (simultaneous joint actions), with
one joint reward per turn, and expands a tree over turns (``num_generations`` joint
completions per node, aligned). Our team is turn-taking (agent 1 answers, agent 2 sees that
answer and gives the team's final one). The closest MAGRPO set-up, used here:

- ``num_turns = 2``. Turn 1: agent 1 gets our agent-1 prompt (the problem; canonical chat
  protocol, :mod:`sat_llm.protocol`), agent 2 gets the same (MAGRPO makes it act). Turn 2
  (``external_transition``): agent 2 gets our agent-2 prompt with agent 1's turn-1 answer in
  the shared context, exactly as in our protocol; agent 1 gets its prompt with agent 2's
  turn-1 message (it must act again).
- Reward: 0 at turn 1, our verifier on agent 2's turn-2 answer at turn 2. MAGRPO's return of
  a turn-1 joint action is its reward plus the mean return of its children, so agent 1's
  answer is credited with agent 2's mean success given it — the credit our protocol gives.
  The two extra messages per branch (agent 2 at turn 1, agent 1 at turn 2) are MAGRPO's cost
  of simultaneous turns; they are generated tokens and count against its budget.
- Same base (each agent its own copy: MAGRPO optimizes one module per agent), LoRA rank /
  α / targets, learning rate, group size (``num_generations``), max new tokens, temperature
  (plain sampling: top-p 1, no top-k), stop tokens. MAGRPO's own loss (REINFORCE with a group
  baseline, normalized advantages, no ratio clipping, logits at temperature 1) and buffer
  defaults are kept: that is the peer as it is.

After training (and every ``eval_every`` prompts) both adapters are copied into our 2-agent
team and evaluated by the same greedy held-out evaluation as our runs (``eval_{k}.jsonl``).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

__all__ = ["run_study_comlrl", "messages_per_prompt"]


def messages_per_prompt(group_size: int, n_agents: int = 2) -> int:
    """Messages MAGRPO generates per prompt with 2 turns: ``n·G`` at turn 1 and ``n·G²`` at
    turn 2 (each of the ``G`` turn-1 joint actions branches into ``G``)."""
    return n_agents * (group_size + group_size ** 2)


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


def run_study_comlrl(cfg, seed: int, d: Path, *, n_prompts: int, eval_every: int = 0,
                     eval_at=(), meta_extra: dict | None = None) -> Path:
    """Train with ``MAGRPOTrainer`` on ``n_prompts`` training prompts (one epoch), evaluate
    with our team every ``eval_every`` prompts, or after the prompt counts in ``eval_at``
    (the common message grid), and after the last; writes the run folder ``d`` (module
    docstring). ``cfg``: the study's :class:`~experiments.llm_team_learning.StudyConfig`."""
    import torch
    from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer
    from datasets import Dataset

    from experiments.llm_team_learning import finish_peer_run, log_peer_eval, start_peer_run
    from experiments.peer_trl import adapter_into
    from sat_llm.protocol import Protocol
    from sat_llm.team import LLMTeam
    from sat_theory.metrics import RunWriter

    if not start_peer_run(d):
        return d
    t_start = time.time()
    team = LLMTeam(cfg.llm_config(2, seed))  # our evaluation and problems (same seed → same pools)
    task, proto = team.task, Protocol(2)
    agents, toks = zip(*[_lora_model(cfg.model, cfg, seed) for _ in range(2)], strict=True)
    tok = _distinct_pad(toks[0], agents)

    def text(prompt: str, history, speaker: int, last: bool) -> str:
        return tok.apply_chat_template(proto.messages(prompt, history, speaker, last),
                                       tokenize=False, add_generation_prompt=True)

    rng = __import__("random").Random(seed)
    pool = team.train_pool
    items = [dict(prompt=pool[i].prompt, idx=i) for i in
             (rng.randrange(len(pool)) for _ in range(n_prompts))]
    first = {it["prompt"]: text(it["prompt"], [], 0, False) for it in items}

    def fmt1(item, external_prompts=None):
        return external_prompts if external_prompts is not None else first[item["prompt"]]

    def fmt2(item, external_prompts=None):
        return external_prompts if external_prompts is not None else first[item["prompt"]]

    def transition(prompt, agent_completions, num_agents, **kw):
        a1, a2 = (proto.clean(c) for c in agent_completions)
        return [text(prompt, [("agent 2", a2)], 0, False),
                text(prompt, [("agent 1", a1)], 1, True)]

    def reward(prompts, c1, c2, *, batch_items=None):
        item = batch_items[0]
        if prompts[0] == first[item["prompt"]]:  # turn 1: nothing is scored yet
            return [0.0]
        return [float(task.score(pool[item["idx"]], proto.clean(c2[0])))]

    args = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=cfg.lr, num_agents=2,
                        num_generations=cfg.group_size, max_new_tokens=cfg.max_new_tokens,
                        temperature=cfg.temperature, top_p=1.0, top_k=None, num_turns=2,
                        early_termination_threshold=None, eval_interval=0, eval_num_samples=0,
                        logging_steps=1)
    torch.manual_seed(seed)
    trainer = MAGRPOTrainer(agents=list(agents), num_agents=2, tokenizer=tok,
                            train_dataset=Dataset.from_list(items), reward_func=reward,
                            formatters=[fmt1, fmt2], external_transition=transition, args=args)
    trainer.verbose = False

    tokens = [0]
    gen = trainer._generate_completions_with_external_prompts

    def counting_gen(*a, **kw):  # generated tokens of every completion, as ours count them
        out = gen(*a, **kw)
        tokens[0] += sum(out["response_lens"])  # not the padded length
        return out

    trainer._generate_completions_with_external_prompts = counting_gen
    writer = RunWriter(str(d))
    writer.write_config(dict(peer="comlrl.MAGRPOTrainer", study=asdict(cfg), seed=seed,
                             n_prompts=n_prompts, magrpo=asdict(args)))
    clock = dict(train=0.0, last=time.perf_counter(), prompts=0)

    def evaluate(k: int) -> None:
        for j, agent in enumerate(agents):
            adapter_into(team, agent, j)
        log_peer_eval(d, team, writer, k, tokens_total=tokens[0], train_seconds=clock["train"],
                      prompts=k)

    step = trainer._train_step_returns

    def step_and_eval(batch_item, **kw):
        out = step(batch_item, **kw)
        clock["prompts"] += 1
        k = clock["prompts"]
        if ((eval_every and k % eval_every == 0) or k in eval_at) and k < n_prompts:
            clock["train"] += time.perf_counter() - clock["last"]
            evaluate(k)
            clock["last"] = time.perf_counter()
        return out

    trainer._train_step_returns = step_and_eval
    evaluate(0)
    clock["last"] = time.perf_counter()
    trainer.train()  # the last buffers are drained at the end of the epoch
    clock["train"] += time.perf_counter() - clock["last"]
    evaluate(n_prompts)
    writer.close()
    finish_peer_run(d, "comlrl", seed, t_start, cfg, meta_extra)
    return d
