"""Token-level KL monitors against brute-force enumeration of every message (tiny vocabulary).

Oracle: with a 5-token vocabulary and messages of at most 3 tokens (ending early at the stop
token), every message ``m`` and its probability ``π(m|s) = Π_u π(x_u|s,x_<u)`` can be listed,
so the message-level ``KL(π(·|s)‖π'(·|s)) = Σ_m π(m) log(π(m)/π'(m))`` is computed directly
(in float64, from logits obtained by separate forward passes per prefix). The chain rule
(TeamTR Lemma B.3) says ``E_{m∼π}`` of the exact token-sum KL and of the sampled log-ratio
sum both equal it.

Every test runs on the CPU and, as its ``gpu``-marked twin, on CUDA (the models in float32,
the oracle in float64 on the host; TF32 is off, so the float32 tolerances hold there too).
"""

import itertools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from sat_llm.kl import sampled_sequence_kl, sequence_kl, token_kl  # noqa: E402
from sat_llm.models import tiny_random_model  # noqa: E402
from sat_llm.rollout import message_logprobs, score_logits  # noqa: E402
from sat_llm.team import strict_float32  # noqa: E402

torch.set_num_threads(1)  # tiny tensors: threads only add contention on a busy 2-core box
strict_float32()  # no TF32 on the CUDA twins (what every LLMTeam switches off too)
V, STOP, T = 5, 2, 3
CTX = [1, 3, 4]


def _messages():
    out = []
    for L in range(1, T + 1):
        for seq in itertools.product(range(V), repeat=L):
            if STOP in seq[:-1]:
                continue  # a message ends at its first stop token
            if L < T and seq[-1] != STOP:
                continue  # shorter than T only when stopped
            out.append(list(seq))
    return out


def _tol(device, rel):
    """``pytest.approx`` tolerance of a float32 KL against the float64 oracle. On the CPU the
    padded batched pass gives the unpadded passes' float32 logits bit for bit (measured:
    KL agreement ~1e-15), so ``rel`` has ample room. CUDA kernels change with batch shape
    and padding: each float32 log-prob may move by roundoff (~1e-7 for these |log π| <~ 3),
    summed over <= 3 tokens, hence an absolute 1e-6 on top there."""
    return dict(rel=rel) if device == "cpu" else dict(rel=rel, abs=1e-6)


def _model(seed, device):
    """A tiny random causal LM over the 5-token vocabulary, on ``device`` (float32)."""
    return tiny_random_model(V, seed=seed, hidden=16).to(device)


def _forward(model, ids):
    """Logits of one unpadded sequence, as float64 on the host."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits[0].double().cpu()


def _next_token_probs(model, prefix, tau):
    """float64 softmax(logits/τ) of the next token after ``prefix`` (one unpadded forward)."""
    logits = _forward(model, prefix)[-1]
    return torch.softmax(logits / tau, -1)


def _msg_logprob(model, msg, tau):
    """``log π(m|s)`` from one unpadded causal forward (position p predicts token p+1)."""
    logits = _forward(model, CTX + msg)
    lp = torch.log_softmax(logits / tau, -1)
    return sum(float(lp[len(CTX) - 1 + u, x]) for u, x in enumerate(msg))


@pytest.mark.parametrize("tau", [1.0, 0.7])
def test_exact_and_sampled_token_kl_match_brute_force_enumeration(tau, device):
    pi, pi2 = _model(1, device), _model(2, device)
    msgs = _messages()
    lp1 = torch.tensor([_msg_logprob(pi, m, tau) for m in msgs], dtype=torch.float64)
    lp2 = torch.tensor([_msg_logprob(pi2, m, tau) for m in msgs], dtype=torch.float64)
    assert float(lp1.exp().sum()) == pytest.approx(1.0, abs=1e-9)  # the enumeration is complete
    kl_brute = float((lp1.exp() * (lp1 - lp2)).sum())

    ctxs = [CTX] * len(msgs)
    with torch.no_grad():
        a, toks, mask = score_logits(pi, ctxs, msgs, pad_id=0, temperature=tau, dtype=torch.float64)
        b, _, _ = score_logits(pi2, ctxs, msgs, pad_id=0, temperature=tau, dtype=torch.float64)
    w = lp1.exp().to(a.device)
    exact = float((w * sequence_kl(a, b, mask)).sum())
    sampled = float((w * sampled_sequence_kl(message_logprobs(a, toks, mask),
                                             message_logprobs(b, toks, mask), mask)).sum())
    assert kl_brute > 1e-3  # the two policies really differ
    assert exact == pytest.approx(kl_brute, **_tol(device, 1e-5))
    assert sampled == pytest.approx(kl_brute, **_tol(device, 1e-5))


def test_token_kl_per_position_equals_direct_sum(device):
    pi, pi2 = _model(3, device), _model(4, device)
    msg = [0, 4, STOP]
    with torch.no_grad():
        a, _, mask = score_logits(pi, [CTX], [msg], pad_id=0, dtype=torch.float64)
        b, _, _ = score_logits(pi2, [CTX], [msg], pad_id=0, dtype=torch.float64)
    got = token_kl(a, b, mask)[0].cpu()
    for u in range(len(msg)):
        p = _next_token_probs(pi, CTX + msg[:u], 1.0)
        q = _next_token_probs(pi2, CTX + msg[:u], 1.0)
        assert float(got[u]) == pytest.approx(float((p * (p / q).log()).sum()), **_tol(device, 1e-6))


def test_token_kl_zero_for_identical_and_masked_positions(device):
    pi = _model(5, device)
    msgs = [[0, 1], [3, STOP]]
    with torch.no_grad():
        a, _, mask = score_logits(pi, [CTX, CTX[:1]], msgs, pad_id=0, dtype=torch.float64)
    assert torch.all(token_kl(a, a, mask) == 0)
    b = torch.log_softmax(torch.randn(a.shape, dtype=torch.float64), -1).to(a.device)
    mask[0, 1] = 0
    kl = token_kl(a, b, mask)
    assert kl[0, 1] == 0 and bool(torch.all(kl >= 0))
