"""The LLM flags of ``sat train`` (``--backend llm``). Imports nothing heavy: ``sat train``
adds these flags even for the tabular backend.

The shared flags (``--agents --stages --delta --seed --group-size --groups --method --order
--beta --gamma --out --quiet`` and the plug-and-play ones) come from
``sat_theory.commands.train``; these are the LLM-only ones.
"""

from __future__ import annotations

__all__ = ["add_arguments", "LLM_DEFAULTS"]

#: defaults of shared flags when the backend is llm (the tabular defaults are for MDPs)
LLM_DEFAULTS = dict(agents=2, groups=4, group_size=4, gamma=1.0)


def add_arguments(p) -> None:
    g = p.add_argument_group("llm backend (--backend llm)")
    g.add_argument("--model", default="tiny-random",
                   help="base model: smollm2-135m | tiny-random | a HF model directory | a .gguf file")
    g.add_argument("--agent-models", default=None,
                   help="heterogeneous team: comma-separated model per agent (separate bases)")
    g.add_argument("--task", default="arithmetic",
                   help="arithmetic | countdown | guess | blocksworld | copy | jsonl, or "
                        "package.module:TaskClass (a sat_llm.tasks.Task subclass)")
    g.add_argument("--jsonl", default=None, help="task jsonl: file of {\"prompt\", \"answer\"} lines")
    g.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                   help="task option, e.g. digits=3 (repeatable)")
    g.add_argument("--prompts", type=int, default=None,
                   help="prompts (groups) per rollout, B (default 4; same as --groups)")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens per message at most")
    g.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature τ; the policy is softmax(logits/τ)")
    g.add_argument("--router", default="round-robin", help="turn router: round-robin | random")
    g.add_argument("--turns", type=int, default=0, help="turns per episode (0: one per agent)")
    g.add_argument("--llm-lr", type=float, default=2e-4, help="AdamW learning rate of the adapters")
    g.add_argument("--llm-epochs", type=int, default=1, help="passes over the batch per update")
    g.add_argument("--minibatch", type=int, default=16, help="turns per optimizer step")
    g.add_argument("--ratio", choices=("sequence", "token"), default="sequence",
                   help="surrogate ratio: sequence (w = exp(Σ_u Δ_u), TeamTR eq. 17; default) | token "
                        "(per-token exp(Δ_u), clipped per token: TRL's dr_grpo loss × max-new-tokens)")
    g.add_argument("--lora-r", type=int, default=8, help="LoRA rank")
    g.add_argument("--n-train", type=int, default=512, help="training problems in the pool")
    g.add_argument("--n-eval", type=int, default=32, help="held-out problems (team accuracy)")
    g.add_argument("--engine", default="hf",
                   help="rollout engine: hf (transformers) | vllm (GPU multi-LoRA; NOT exercised yet)")
    g.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (0: torch's default; 1 is fastest on a busy machine)")
    g.add_argument("--resume", default=None, metavar="DIR",
                   help="continue the killed run in DIR from its last checkpoint")
