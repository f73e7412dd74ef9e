"""The n = 1 update is GRPO's: TRL 1.16's ``GRPOTrainer._compute_loss`` as the oracle.

One agent (``LLMTeam`` with ``agents=1``) and TRL's trainer load the same tiny model from one
Hugging Face folder (``sat_llm.models.hf_dir("tiny-random")``), with the same LoRA rank, alpha
and targets; our adapter weights are copied into TRL's, so both compute on identical
parameters. The batch is fixed: 2 prompts rendered by our protocol (single-agent prompt), 4
completions each (random token ids of lengths 2..L, some ending in eos), fixed rewards. TRL
gets exactly these completions through its ``rollout_func`` hook and computes everything
else itself (``_generate_and_score_completions``: reward function, advantages, masks, old
per-token log-probabilities), then its loss through its own ``_compute_loss``.

**Advantages.** We match TRL's normalisation: TRL ``scale_rewards="none"`` gives
``A = r − mean_group(r)``; ours is ``group_advantages(..., normalize_std=False, A_clip=None)``,
the same formula (asserted equal to TRL's tensor before any loss is compared).

**On-policy** (θ = θ_old, β = 0; the adapter at a random point so every LoRA factor has a
gradient). Every log-ratio Δ_u is 0, so ``w = r_u = w̄ = 1`` and no clip is active; with
``∇ exp(x) = exp(x) ∇x = ∇x`` at ``x = 0``:

- ours (either ratio form): ``∇(−L^clip) = −(1/M) Σ_m A_m Σ_u ∇log π(x_u)``;
- TRL ``luspo`` (``importance_sampling_level="sequence"``, ``w̄_m = exp(mean_u Δ_u)``), loss
  ``(1/M) Σ_m L_m · (−min(w̄ A, clip(w̄) A))``: ``∇ = −(1/M) Σ_m L_m A_m (1/L_m) Σ_u ∇log π``
  — the same gradient;
- TRL ``dr_grpo`` (token level), loss ``Σ_m Σ_u −min(r_u A, clip(r_u) A) / (M · L_max)``:
  ``∇ = −(1/(M L_max)) Σ_m A_m Σ_u ∇log π`` — ours divided by ``L_max = max_completion_length``.

**Off-policy** (after 6 AdamW steps of ``update`` on the batch, clipping active on some
tokens): ``ratio="token"`` is ``L_max ×`` TRL's ``dr_grpo`` in value and gradient (derivation
in :mod:`sat_llm.loss`); the sequence form is not, and the test prints by how much.
Agreement is to 1e-5 relative (float32 forward passes; measured ~1e-6).

**The study's plain GRPO** (``--method no-tr --agents 1 --beta 1e-300 --ratio token
--no-std-norm``) through ``run_stage``, 6 AdamW steps on one batch (5 of them off-policy)
against TRL's ``dr_grpo`` with ``scale_rewards="none"`` and TRL's own optimizer, step by step:
the same gradients up to the constant ``c = L_max·mb/M`` and the same parameters after every
step once TRL's clip and Adam ε are divided by ``c``.
"""

import numpy as np
import pytest

trl = pytest.importorskip("trl", reason="trl (the GRPO oracle) is not installed: pip install -e '.[dev]'")

import torch  # noqa: E402  (trl imports torch; only after the skip)

from sat_llm.models import hf_dir  # noqa: E402
from sat_llm.team import LLMConfig, LLMTeam, _Ctx  # noqa: E402
from sat_theory.estimators import group_advantages  # noqa: E402
from sat_theory.team import Batch, Episode, Turn  # noqa: E402

L_MAX, TAU, G, B, EPS = 8, 0.7, 4, 2, 0.2
REL = 1e-5


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


class Oracle:
    """Our one-agent team, the fixed batch, and TRL trainers on the same model and adapter."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.model_dir = str(hf_dir("tiny-random"))
        self.cfg = LLMConfig(model=self.model_dir, agents=1, max_new_tokens=L_MAX, temperature=TAU,
                             lora_r=4, lora_alpha=8, minibatch=4, epochs=3, lr=0.05, eps_w=EPS,
                             n_train=8, n_eval=2, seed=0)
        self.team = team = LLMTeam(self.cfg)
        self.tok = tok = team.tokenizer(0)
        gen = torch.Generator().manual_seed(1)  # a generic adapter point: A and B both non-zero
        team._set_weights(0, {k: torch.randn(v.shape, generator=gen) * 0.3
                              for k, v in team._get_weights(0).items()})
        rng = np.random.default_rng(0)
        problems = team.train_pool[:B]
        self.prompts, self.ctxs, self.msgs, groups = [], [], [], []
        for g, p in enumerate(problems):
            ctx = tuple(team.protocol.render(tok, p.prompt, [], 0, True))
            for k in range(G):
                n = int(rng.integers(2, L_MAX + 1))
                m = [int(x) for x in rng.choice(np.arange(4, len(tok)), size=n)]  # no specials
                if k % 2 == 0:
                    m[-1] = tok.eos_token_id
                self.prompts.append(p.prompt)
                self.ctxs.append(ctx)
                self.msgs.append(tuple(m))
                groups.append(g)
        self.rewards = rng.uniform(0, 1, size=len(self.msgs)).round(3)
        self.beh_tok = team._score(0, self.ctxs, self.msgs)  # per-token, under θ_old
        episodes = [Episode(group=g, turns=[Turn(agent=0, context=_Ctx(c), action=m, logp=float(lp.sum()))],
                            ret=float(r))
                    for g, c, m, lp, r in zip(groups, self.ctxs, self.msgs, self.beh_tok, self.rewards,
                                              strict=True)]
        self.batch = Batch(episodes=episodes, rollout_id=1)
        self.adv = group_advantages(self.batch.returns, self.batch.groups, normalize_std=False,
                                    A_clip=None)
        self.ref = team.snapshot(0)
        self.reward_of = {m: float(r) for m, r in zip(self.msgs, self.rewards, strict=True)}

    # ---------------------------------------------------------------- TRL side
    def trainer(self, loss_type: str, level: str, num_iterations: int = 1, **config):
        from datasets import Dataset
        from peft import LoraConfig
        from trl import GRPOConfig, GRPOTrainer

        def reward(prompts, completions, completion_ids, **kw):
            return [self.reward_of[tuple(c)] for c in completion_ids]

        def rollout(prompts, trainer):  # TRL's hook: our fixed completions instead of sampling
            assert len(prompts) == len(self.msgs)
            return {"prompt_ids": [list(c) for c in self.ctxs],
                    "completion_ids": [list(m) for m in self.msgs], "logprobs": None}

        args = GRPOConfig(output_dir=str(self.tmp / f"trl-{loss_type}"), use_cpu=True, bf16=False,
                          report_to=[], beta=0.0, num_generations=G, per_device_train_batch_size=B * G,
                          max_completion_length=L_MAX, temperature=TAU, loss_type=loss_type,
                          importance_sampling_level=level, scale_rewards="none", epsilon=EPS,
                          num_iterations=num_iterations, gradient_checkpointing=False,
                          save_strategy="no", seed=0, **config)
        data = Dataset.from_list([{"prompt": self._chat(p)} for p in dict.fromkeys(self.prompts)])
        lora = LoraConfig(r=self.cfg.lora_r, lora_alpha=self.cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=list(self.cfg.lora_targets), bias="none")
        tr = GRPOTrainer(model=self.model_dir, reward_funcs=[reward], args=args, train_dataset=data,
                         processing_class=self.tok, peft_config=lora, rollout_func=rollout)
        tr.current_gradient_accumulation_steps = args.gradient_accumulation_steps  # set by train()
        tr.model.train()
        self.sync(tr)
        return tr

    def _chat(self, prompt):
        return self.team.protocol.messages(prompt, [], 0, True)

    def trl_params(self, tr) -> dict:
        return {k.replace(".default.", "."): p for k, p in tr.model.named_parameters() if ".default." in k}

    def sync(self, tr) -> None:
        """Copy our adapter's current weights into TRL's."""
        ours, theirs = self.team._params(0), self.trl_params(tr)
        assert set(ours) == set(theirs)
        with torch.no_grad():
            for k, p in theirs.items():
                p.copy_(ours[k])

    def trl_inputs(self, tr) -> dict:
        return tr._generate_and_score_completions([{"prompt": self._chat(p)} for p in self.prompts])

    def trl_loss_grad(self, tr, inputs):
        params = self.trl_params(tr)
        for p in params.values():
            p.grad = None
        loss = tr._compute_loss(tr.model, inputs)
        loss.backward()
        return float(loss), torch.cat([params[k].grad.detach().flatten() for k in sorted(params)])

    # ---------------------------------------------------------------- our side
    def loss_grad(self, ratio: str):
        self.team.cfg.ratio = ratio
        params = self.team._params(0)
        for p in params.values():
            p.grad = None
        loss = self.team.loss(0, self.batch, self.adv, 0.0, self.ref)
        loss.backward()
        return float(loss), torch.cat([params[k].grad.detach().flatten() for k in sorted(params)])


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trl_oracle")
    mp = pytest.MonkeyPatch()
    mp.setenv("SAT_LLM_CACHE", str(tmp / "cache"))
    mp.setenv("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental
    try:
        yield Oracle(tmp)
    finally:
        mp.undo()


def test_advantages_equal_trl(oracle):
    tr = oracle.trainer("dr_grpo", "token")
    inputs = oracle.trl_inputs(tr)
    np.testing.assert_allclose(inputs["advantages"].double().numpy(), oracle.adv, rtol=1e-6, atol=1e-7)
    assert np.any(oracle.adv != 0)


def test_on_policy_gradient_is_trl_luspo_and_dr_grpo_times_L(oracle):
    luspo = oracle.trainer("luspo", "sequence")
    _, g_luspo = oracle.trl_loss_grad(luspo, oracle.trl_inputs(luspo))
    dr = oracle.trainer("dr_grpo", "token")
    _, g_dr = oracle.trl_loss_grad(dr, oracle.trl_inputs(dr))
    assert float(g_luspo.norm()) > 0
    for ratio in ("sequence", "token"):  # on-policy the two forms have one gradient
        _, g = oracle.loss_grad(ratio)
        e_luspo, e_dr = _rel(g, g_luspo), _rel(g, L_MAX * g_dr)
        print(f"on-policy, ratio={ratio}: rel. gradient error vs luspo {e_luspo:.1e}, "
              f"vs {L_MAX} x dr_grpo {e_dr:.1e}")
        assert e_luspo < REL and e_dr < REL


def test_off_policy_token_ratio_is_dr_grpo_times_L_and_sequence_is_not(oracle):
    team = oracle.team
    # TRL at θ_old: num_iterations=2 makes it compute and keep old_per_token_logps
    tr = oracle.trainer("dr_grpo", "token", num_iterations=2)
    inputs = oracle.trl_inputs(tr)
    assert "old_per_token_logps" in inputs
    # a few optimizer steps of our update (3 epochs x 2 minibatches), then both at θ
    team.cfg.ratio = "token"
    try:
        _off_policy_checks(oracle, tr, inputs, team.update(0, oracle.batch, oracle.adv, 0.0, oracle.ref))
    finally:
        team.restore(0, oracle.ref)


def _off_policy_checks(oracle, tr, inputs, info):
    team = oracle.team
    assert info["opt_steps"] == 6
    oracle.sync(tr)
    # clipping is active: some tokens' ratios leave [1-ε, 1+ε] on the side where the clip binds
    new_tok = team._score(0, oracle.ctxs, oracle.msgs)
    r = np.concatenate([np.exp(n - o) for n, o in zip(new_tok, oracle.beh_tok, strict=True)])
    a = np.concatenate([np.full(len(m), oracle.adv[i]) for i, m in enumerate(oracle.msgs)])
    binds = ((r > 1 + EPS) & (a > 0)) | ((r < 1 - EPS) & (a < 0))
    print(f"off-policy: token ratios in [{r.min():.3f}, {r.max():.3f}], clip binds on "
          f"{binds.sum()} of {r.size} tokens")
    assert 0 < binds.sum() < r.size

    v_trl, g_trl = oracle.trl_loss_grad(tr, inputs)
    v_tok, g_tok = oracle.loss_grad("token")
    e_v, e_g = abs(v_tok - L_MAX * v_trl) / abs(L_MAX * v_trl), _rel(g_tok, L_MAX * g_trl)
    print(f"off-policy, ratio=token: loss {v_tok:.6f} vs {L_MAX} x dr_grpo {L_MAX * v_trl:.6f} "
          f"(rel {e_v:.1e}); rel. gradient error {e_g:.1e}")
    assert e_v < REL and e_g < REL

    # the sequence form on the same batch and parameters: one ratio per message
    v_seq, g_seq = oracle.loss_grad("sequence")
    w = np.exp([float(n.sum() - o.sum()) for n, o in zip(new_tok, oracle.beh_tok, strict=True)])
    d_g = _rel(g_seq, L_MAX * g_trl)
    print(f"off-policy, ratio=sequence: loss {v_seq:.6f} vs token {v_tok:.6f}; gradient differs "
          f"from {L_MAX} x dr_grpo by {d_g:.1%} (relative norm); message ratios w = exp(Σ Δ_u): "
          + ", ".join(f"{x:.3f}" for x in w))
    assert d_g > 100 * REL and abs(v_seq - v_tok) > 100 * REL * abs(v_tok)


def test_peer_trl_harness_same_prompts_reward_and_adapter(tmp_path, monkeypatch):
    """``experiments/peer_trl.py`` builds TRL's trainer on our prompts (token for token), with
    our verifier as reward, and its trained adapter loads into our team."""
    from experiments.llm_kl_monitor import _lowercase_task
    from experiments.peer_trl import adapter_into, grpo_trainer, prompt_ids

    monkeypatch.setenv("SAT_LLM_CACHE", str(tmp_path / "cache"))
    cfg = LLMConfig(model="tiny-random", agents=1, max_new_tokens=6, n_train=4, n_eval=2,
                    lora_r=4, lora_alpha=8, seed=0)
    team = LLMTeam(cfg)
    # score = fraction of lowercase letters: varies even for a random model, so TRL's step moves
    team.task = _lowercase_task()
    team.train_pool = team.task.problems("train", 4, 0)
    tok = team.tokenizer(0)
    tr = grpo_trainer("tiny-random", team.task, team.train_pool, lora_r=4, lora_alpha=8,
                      group_size=4, prompts_per_step=2, lr=0.05, max_new_tokens=6,
                      temperature=1.0, seed=0, out_dir=tmp_path / "trl", steps=1)
    assert prompt_ids(tr) == [team.protocol.render(tok, p.prompt, [], 0, True) for p in team.train_pool]
    assert tr.args.max_completion_length == 6 and tr.num_generations == 4 and tr.beta == 0.0
    p = team.train_pool[0]
    texts = ["abc", "  aBC  ", "<think>ABC</think> abc"]  # clean() strips spaces and think blocks
    got = tr.reward_funcs[0]([None] * 3, [[{"role": "assistant", "content": t}] for t in texts],
                             problem=[0, 0, 0])
    assert got == [team.task.score(p, team.protocol.clean(t)) for t in texts]
    assert got == [1.0, 1 / 3, 1.0]
    tr.train()
    assert tr.state.global_step == 1
    before = team._get_weights(0)
    adapter_into(team, tr)
    theirs = {k.replace(".default.", "."): v for k, v in tr.model.named_parameters() if ".default." in k}
    after = team._get_weights(0)
    assert all(torch.equal(after[k], theirs[k].detach()) for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after)  # TRL's step moved it


def test_no_tr_stage_is_trl_dr_grpo_over_several_off_policy_steps(oracle, monkeypatch):
    """``--method no-tr --agents 1`` with β = 0 (the study's ``plain``: ``--beta 1e-300``, which
    is 0 in the float32 loss), the token ratio and no std normalisation, run through the
    algorithm's ``run_stage``, against TRL's ``dr_grpo`` (``scale_rewards="none"``) stepped by
    TRL's own optimizer (``create_optimizer``) and gradient clip, minibatch by minibatch in
    our order: 2 minibatches x 3 epochs = 6 AdamW steps on one batch, so every step after the
    first is off-policy (ratios != 1). Per step our minibatch gradient is ``c = L_max·mb/M``
    times TRL's (dr_grpo divides by ``mb·L_max``, ours by ``M``), hence TRL's clip is ours
    divided by ``c`` (:func:`experiments.llm_team_learning.trl_drgrpo_clip`); the parameters
    after every step agree (with Adam's ε divided by ``c`` too; with TRL's own ε the first
    step already differs by 0.6% of the distance moved on this tiny model, whose gradient
    entries are ~1e-7). No backtracking (0 backtracks), β is 1e-300 at every step."""
    from sat_theory.algorithm import RunState, TrainConfig, run_stage

    team, cfg = oracle.team, oracle.cfg
    M, mb = len(oracle.msgs), cfg.minibatch
    c = L_MAX * mb / M
    tcfg = TrainConfig(method="no-tr", beta_init=1e-300, normalize_std=False, A_clip=None,
                       n_groups=B, group_size=G, stages=1, eval_every=1)
    params = team._params(0)
    keys = sorted(params)
    theta0 = {k: p.detach().clone() for k, p in params.items()}
    opt = team._opt[0]
    ours_theta, ours_grad, betas = [], [], []
    step_, update_ = opt.step, team.update

    def recording_step(*a, **kw):  # our gradient (after our clip) and θ after each step
        ours_grad.append(torch.cat([params[k].grad.detach().flatten() for k in keys]))
        out = step_(*a, **kw)
        ours_theta.append(torch.cat([params[k].detach().flatten() for k in keys]))
        return out

    def recording_update(agent, batch, adv, beta, *a, **kw):
        betas.append(beta)
        return update_(agent, batch, adv, beta, *a, **kw)

    monkeypatch.setattr(opt, "step", recording_step)
    monkeypatch.setattr(team, "update", recording_update)
    monkeypatch.setattr(team, "rollout", lambda n_groups, group_size: oracle.batch)
    team.cfg.ratio = "token"
    clip = team.cfg.grad_clip
    team.cfg.grad_clip = 0.03  # so that the clip binds on some steps (our norms: 0.02-0.1)
    records = []
    try:
        run_stage(team, tcfg, RunState.initial(tcfg, 1), log=records.append, J_before=None,
                  evaluate_after=False)
    finally:
        monkeypatch.undo()
        team.restore(0, oracle.ref)
        team.cfg.grad_clip = clip
    step_rec = next(r for r in records if r["kind"] == "step")
    assert betas == [1e-300] and step_rec["backtracks"] == 0 and step_rec["opt_steps"] == 6

    # TRL: same start, same completions, its dr_grpo loss, its optimizer and clip (ours / c)
    # Adam's ε acts on gradients c times smaller in TRL: ε / c makes the step identical (the
    # study keeps TRL's ε = 1e-8: negligible against its gradient entries, see the report)
    eps = team._opt[0].defaults["eps"]
    tr = oracle.trainer("dr_grpo", "token", num_iterations=2, learning_rate=cfg.lr,
                        weight_decay=0.0, max_grad_norm=0.03 / c, adam_epsilon=eps / c)
    theirs = oracle.trl_params(tr)
    with torch.no_grad():
        for k, p in theirs.items():
            p.copy_(theta0[k])
    inputs = oracle.trl_inputs(tr)  # old_per_token_logps at θ_0, as TRL's generation step
    trl_opt = tr.create_optimizer()
    n_rows = len(oracle.msgs)
    clipped = 0
    for step in range(6):
        s = (step % (M // mb)) * mb
        rows = {k: (v[s:s + mb] if torch.is_tensor(v) and v.dim() and v.shape[0] == n_rows else v)
                for k, v in inputs.items()}
        trl_opt.zero_grad(set_to_none=True)
        tr._compute_loss(tr.model, rows).backward()
        g_trl = torch.cat([theirs[k].grad.detach().flatten() for k in keys])
        norm = float(torch.nn.utils.clip_grad_norm_(list(theirs.values()), tr.args.max_grad_norm))
        clipped += norm > tr.args.max_grad_norm
        g_trl_clipped = torch.cat([theirs[k].grad.detach().flatten() for k in keys])
        trl_opt.step()
        theta = torch.cat([theirs[k].detach().flatten() for k in keys])
        moved = float((ours_theta[step] - torch.cat([theta0[k].flatten() for k in keys])).norm())
        e_g = _rel(ours_grad[step], c * g_trl_clipped)
        e_t = float((theta - ours_theta[step]).norm()) / moved
        print(f"step {step + 1}: TRL grad norm {norm:.3g} (clip {tr.args.max_grad_norm:.3g}); "
              f"rel. gradient error {e_g:.1e}, parameter error / distance moved {e_t:.1e}")
        # clip_grad_norm_ scales by clip/(norm + 1e-6): the 1e-6 weighs c times more on
        # TRL's smaller norm, (c−1)·1e-6/norm ≈ 1e-5..1e-4 relative here (measured 3e-5..8e-5)
        assert e_g < 2e-4 and e_t < 1e-4
        if step == 0:
            g0 = g_trl
    assert clipped  # the clip matters, so matching it is tested
    assert float(g0.norm()) > 0
    # off-policy after the first step: TRL's ratios at the last θ are not all 1
    with torch.no_grad():
        lp = tr._get_per_token_logps_and_entropies(
            tr.model, torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            inputs["completion_ids"].size(1))[0]
    ratio = torch.exp(lp - inputs["old_per_token_logps"])[inputs["completion_mask"].bool()]
    assert float((ratio - 1).abs().max()) > 0.05
