"""The run-noise evidence of the parity study (experiments/study_noise.py): worked numbers of
every statistic, the prompt-draw replays against the code they replay, and the report on
hand-made run folders (each number moves when its input does)."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from experiments import study_noise as sn

# 4 checkpoints x 4 problems; accuracies A: 1/2, 3/4, 3/4, 1/2; B: 1/2 throughout
A = [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 1], [1, 0, 1, 0]]
B = [[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1]]


def test_pair_noise_worked_numbers():
    p = sn.pair_noise(A, B)
    # d = (0, 25, 25, 0) points
    assert p["auc"] == pytest.approx(50 / 4)
    assert p["ck_rms"] == pytest.approx(math.sqrt((25 ** 2 + 25 ** 2) / 3))
    assert p["persistence"] == pytest.approx(50 ** 2 / (2 * 25 ** 2))
    assert p["lag1"] == pytest.approx(25 * 25 / (2 * 25 ** 2))
    # cells (k >= 1) where exactly one run is right: k=1: 2, k=2: 2, k=3: 2 of 4 each
    assert p["disagree"] == pytest.approx(6 / 12)
    # the identity of the module docstring: auc² = persistence · ck_rms² · (K−1) / K²
    assert p["auc"] ** 2 == pytest.approx(p["persistence"] * p["ck_rms"] ** 2 * 3 / 16)


def test_disagreement_is_paired_by_problem_and_the_auc_is_not():
    """Shuffling one run's problems leaves its accuracies (so auc, ck_rms) alone but changes
    which cells disagree: the statistic reads problems, not accuracies."""
    p = sn.pair_noise(A, B)
    q = sn.pair_noise(A, np.asarray(B)[:, [0, 2, 3, 1]])
    assert q["auc"] == pytest.approx(p["auc"]) and q["ck_rms"] == pytest.approx(p["ck_rms"])
    assert q["disagree"] == pytest.approx(2 / 12) and p["disagree"] == pytest.approx(6 / 12)


def test_persistence_separates_an_offset_from_cancelling_deviations():
    K, n = 13, 10
    base = np.zeros((K, n))
    offset = base.copy()
    offset[1:, 0] = 1  # one problem better at every checkpoint after the first
    assert sn.pair_noise(offset, base)["persistence"] == pytest.approx(K - 1)
    # problem 0 right in A at odd k, in B at even k >= 2: d = +10, -10, ... (12 values)
    k = np.arange(K)[:, None]
    first = np.arange(n)[None] == 0
    swing = sn.pair_noise(first & (k % 2 == 1), first & (k % 2 == 0) & (k > 0))
    assert swing["persistence"] == pytest.approx(0.0) and swing["lag1"] == pytest.approx(-11 / 12)


def test_persistence_is_about_one_for_independent_checkpoints():
    """Independent deviations add up like a random walk's steps: E(Σd)² = E Σd², so the mean
    persistence of many such pairs is 1; a deviation that carries over is far above it."""
    rng = np.random.default_rng(0)
    K, n = 13, 200
    indep = [sn.pair_noise(rng.random((K, n)) < 0.7, rng.random((K, n)) < 0.7)["persistence"]
             for _ in range(400)]
    assert 0.85 < np.mean(indep) < 1.15
    drift = np.cumsum(rng.normal(0, 0.05, (400, K)), 1)  # accuracy offsets that persist
    carried = [sn.pair_noise((rng.random((K, n)) < 0.5 + np.clip(x, -0.4, 0.4)[:, None]),
                             rng.random((K, n)) < 0.5)["persistence"] for x in drift[:100]]
    assert np.mean(carried) > 2.5


def test_pair_noise_refuses_mismatched_or_short_runs():
    with pytest.raises(ValueError):
        sn.pair_noise(A, np.asarray(B)[:, :3])
    with pytest.raises(ValueError):
        sn.pair_noise(A[:2], B[:2])


def test_variance_ratio_worked_numbers():
    from scipy.stats import f

    v = sn.variance_ratio([3.0, -4.0], [1.0, 1.0, -1.0])
    assert v["ratio"] == pytest.approx((9 + 16) / 2)
    assert v["p_normal"] == pytest.approx(f.sf(12.5, 2, 3))
    # of the C(5, 2) = 10 labellings only {9, 16} reaches 12.5
    assert v["p_perm"] == pytest.approx(1 / 10)
    # the other way round every labelling is at least as extreme
    assert sn.variance_ratio([1.0, 1.0, -1.0], [3.0, -4.0])["p_perm"] == pytest.approx(1.0)
    # squares 9, 1 | 16, 1, 1: every labelling but the 3 that take two 1s reaches 5/6
    w = sn.variance_ratio([3.0, 1.0], [4.0, 1.0, 1.0])
    assert w["ratio"] == pytest.approx(5 / 6) and w["p_perm"] == pytest.approx(7 / 10)
    with pytest.raises(ValueError):
        sn.variance_ratio([1.0], [0.0, 0.0])


def test_format_course_and_churn_worked_numbers():
    assert sn.format_course([0.5, 0.05, 0.5, 0.95, 0.2]) == dict(mixed=2, final=0.2)
    texts = [["a", "b", "c", "d"], ["a", "b", "c", "d"], ["a", "x", "c", "d"],
             ["y", "x", "z", "d"]]
    S = [[0, 0, 0, 0], [1, 1, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    c = sn.churn(texts, S)
    assert c["text"] == pytest.approx((1 / 4 + 2 / 4) / 2)  # k = 1 -> 2, 2 -> 3
    assert c["flips"] == pytest.approx((1 + 2) / 8)
    assert c["step_sd"] == pytest.approx(100 * np.std([-0.25, 0.0]))
    with pytest.raises(ValueError):
        sn.churn(texts[:2], S[:2])


def test_ours_prompt_counts_replay_the_rollouts_of_our_team():
    """The replay draws what :meth:`EpisodeLoop.rollout` draws (a team whose episodes are
    stubbed out: the problem choice is the real code's)."""
    from sat_llm.episodes import EpisodeLoop

    class Stub(EpisodeLoop):
        def __init__(self, seed, pool, draw="independent"):
            self.rng, self.train_pool = np.random.default_rng(seed), list(range(pool))
            self.gamma, self._rollouts, self.version = 1.0, 0, (0,)
            self.cfg = SimpleNamespace(prompt_draw=draw, seed=seed)

        def _run_episodes(self, problems, *, greedy):
            return [([], [], 0.0) for _ in problems]

    team, counts = Stub(3, 10), np.zeros(10, dtype=int)
    for _ in range(7):
        counts[team.rollout(4, 2).extra["problems"]] += 1
    assert np.array_equal(sn.ours_prompt_counts(3, 10, 4, 7), counts)
    assert not np.array_equal(sn.ours_prompt_counts(4, 10, 4, 7), counts)
    team, counts = Stub(3, 10, draw="epoch"), np.zeros(10, dtype=int)  # --prompt-draw epoch
    for _ in range(7):
        counts[team.rollout(4, 2).extra["problems"]] += 1
    assert np.array_equal(sn.epoch_prompt_counts(3, 10, 4, 7), counts)
    assert not np.array_equal(sn.ours_prompt_counts(3, 10, 4, 7), counts)


def test_trl_prompt_counts_replay_trls_repeat_sampler():
    """Against TRL's own sampler over epochs (10 prompts in chunks of 3: the tenth of every
    epoch's permutation is dropped), as its trainer iterates it: once per epoch, each chunk
    repeated ``steps_per_generation`` times with ``num_generations`` copies of a prompt."""
    utils = pytest.importorskip("trl.trainer.utils")
    G, spg, pool, per, gens, seed = 4, 2, 10, 3, 7, 5
    sampler = utils.RepeatSampler(list(range(pool)), mini_repeat_count=G, batch_size=per,
                                  repeat_count=spg, shuffle=True, seed=seed)
    counts, done = np.zeros(pool, dtype=int), 0
    while done < gens:
        flat = list(iter(sampler))
        block = per * G * spg  # one generation's indices
        for g in range(min(len(flat) // block, gens - done)):
            counts[sorted(set(flat[g * block:(g + 1) * block]))] += 1
            done += 1
    assert np.array_equal(sn.trl_prompt_counts(seed, pool, per, gens), counts)
    assert counts.sum() == gens * per and counts.max() <= 3


def test_step_profile_counts_from_the_records():
    recs = [dict(kind="stage"), dict(kind="step", kl=0.2, opt_steps=4, grad_norm=1.0),
            dict(kind="step", kl=0.4, opt_steps=0, grad_norm=0.0),
            dict(kind="step", kl=0.6, opt_steps=4, grad_norm=0.0),
            dict(kind="step", kl=0.8, opt_steps=4, grad_norm=0.5)]
    p = sn.step_profile(recs, clip=1.0)
    assert p == pytest.approx(dict(kl=0.5, zero_adv=0.25, clipped=0.25, idle_last=1 / 3))
    assert sn.step_profile([dict(kind="stage")], clip=1.0) is None


# ------------------------------------------------------------------ the report on run folders
def _run(root, name, scores, *, seed, trl=False, final=None):
    """A finished run folder: ``scores[j]`` the 0/1 list of checkpoint ``4j``."""
    d = root / name
    d.mkdir(parents=True)
    for j, row in enumerate(scores):
        (d / f"eval_{4 * j}.jsonl").write_text("".join(json.dumps(dict(
            id=i, prompt=f"p{i}", answer=1,
            final=(final or {}).get((j, i), "Answer: 1" if x else "0"), score=float(x),
            correct=bool(x), lenient=float(x), strict=float(x) if i % 2 else 0.0,
            format_ok=bool(i % 2))) + "\n" for i, x in enumerate(row)))
    units = 4 * (len(scores) - 1)
    if trl:
        cfg = dict(grpo=dict(seed=seed, generation_batch_size=32, num_generations=4,
                             max_grad_norm=0.25), study=dict(n_train=100))
        recs = [dict(kind="stage", stage=4 * j - 1) for j in range(len(scores))]
    else:
        cfg = dict(algorithm=dict(seed=seed, n_groups=8),
                   backend=dict(llm=dict(n_train=100, grad_clip=1.0)))
        recs = [dict(kind="step", stage=u, rollout_id=u + 1, kl=0.1, opt_steps=4,
                     grad_norm=1.0 if u % 2 else 0.0) for u in range(units)]
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "study.json").write_text(json.dumps(dict(run=name, finished=True, tune=False)))
    return d


S_PLAIN = [[0, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]  # 1/4, 3/4, 1
S_RERUN = [[0, 0, 1, 0], [1, 0, 1, 0], [1, 0, 1, 0]]  # 1/4, 1/2, 1/2
S_TRL = [[0, 0, 1, 0], [1, 1, 0, 0], [0, 1, 1, 0]]  # 1/4, 1/2, 1/2


@pytest.fixture
def study(tmp_path):
    _run(tmp_path, "plain_lr0.001_s0", S_PLAIN, seed=0)
    _run(tmp_path, "plain-rerun_lr0.001_s0", S_RERUN, seed=1000)
    _run(tmp_path, "trl-drgrpo_lr0.001_s0", S_TRL, seed=0, trl=True)
    _run(tmp_path, "trl-rerun_lr0.001_s0", S_RERUN, seed=1000, trl=True)
    (tmp_path / "trl-rerun_lr0.001_s1").mkdir()  # unfinished: left out
    return tmp_path


def test_report_on_hand_made_runs(study):
    assert [p[:3] for p in sn.pairs(study)] == [("rerun", "plain", 0), ("rerun", "trl-drgrpo", 0),
                                                ("cross", "plain", 0), ("cross", "plain-rerun", 0)]
    text = sn.report(study)
    # plain − rerun: d = (0, 25, 50): auc 25, RMS sqrt((625 + 2500)/2), persistence 75²/3125
    rms = math.sqrt((25 ** 2 + 50 ** 2) / 2)
    assert f"| plain_lr0.001_s0 − plain-rerun_lr0.001_s0 | +25.0 | {rms:.1f} | 1.8 | +0.40 | 0.375 |" in text
    # TRL − rerun: d = (0, 0, 0) with 4 of 8 cells disagreeing
    assert "| trl-drgrpo_lr0.001_s0 − trl-rerun_lr0.001_s0 | +0.0 | 0.0 | 0.0 | +0.00 | 0.500 |" in text
    c = sn.ours_prompt_counts(0, 100, 8, 8)
    assert (f"| plain_lr0.001_s0 | 0 | {100 * (1 / 4 + 3 / 4 + 1) / 3:.1f} / "
            f"{100 * (0 + 1 / 4 + 1 / 2) / 3:.1f} | 2 / 0.50 |") in text
    assert f"| {(c == 0).sum()}, {c.max()}, {c.std():.2f} | 0.10, 0.00, 0.50, 0.50 |" in text
    t = sn.trl_prompt_counts(0, 100, 8, 8)
    assert f"| {(t == 0).sum()}, {t.max()}, {t.std():.2f} | not logged |" in text
    # a zero TRL rerun noise: no variance ratio to report
    assert "AUC difference, RMS" not in text


def test_report_numbers_follow_their_inputs(study):
    """Each number is read from the files: one problem's score, one message, one seed."""
    before = sn.report(study)
    p = study / "plain-rerun_lr0.001_s0" / "eval_8.jsonl"
    rows = [json.loads(x) for x in p.read_text().splitlines()]
    rows[3].update(score=1.0, lenient=1.0, correct=True)  # the rerun's final 1/2 -> 3/4
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    after = sn.report(study)
    assert "| plain_lr0.001_s0 − plain-rerun_lr0.001_s0 | +16.7 |" in after and after != before
    # a changed message with the same score moves only the churn
    def trl_line():
        return next(x for x in sn.report(study).splitlines()
                    if x.startswith("| trl-drgrpo_lr0.001_s0 |"))

    assert "| 0.50 / 0.500 / 0.0 |" in trl_line()  # checkpoints 4 -> 8: 2 of 4 change
    q = study / "trl-drgrpo_lr0.001_s0" / "eval_4.jsonl"
    rows = [json.loads(x) for x in q.read_text().splitlines()]
    rows[3]["final"] = "0 (again)"
    q.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "| 0.75 / 0.500 / 0.0 |" in trl_line()
    # another trainer seed draws other prompts
    cfg = study / "plain_lr0.001_s0" / "config.json"
    c = json.loads(cfg.read_text())
    c["algorithm"]["seed"] = 7
    cfg.write_text(json.dumps(c))
    n = sn.ours_prompt_counts(7, 100, 8, 8)
    assert f"| {(n == 0).sum()}, {n.max()}, {n.std():.2f} | 0.10," in sn.report(study)


def test_report_refuses_runs_on_other_problems(study):
    p = study / "trl-rerun_lr0.001_s0" / "eval_0.jsonl"
    p.write_text(p.read_text().replace('"p0"', '"other"'))
    with pytest.raises(ValueError, match="same problems"):
        sn.report(study)


def test_main_writes_the_markdown_to_out(study, tmp_path):
    out = tmp_path / "noise.md"
    text = sn.main(study, ["--out", str(out)])
    assert out.read_text() == text and text.startswith("**Pairs of runs")
