"""Adaptive drafts (lib/engine/adaptive.py): the adaptive-probe FlashHead and the bandit drafter keep the output equal
to greedy decoding; the probe count stays in its bounds and meets FlashHead at its ends; UCB1 and Thompson
sampling explore every arm and then settle on the best one; bad settings are refused with a clear message."""
import random
import shutil
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from lib import results
from lib import config, modes
from lib.models import build as engines
from lib.models.flash_checkpoint import ensure_flash_checkpoint
from lib import report
from lib.study import speculative
from lib.engine.adaptive import AdaptiveFlashHead, AdaptiveProbeDraft, BanditDraft, Thompson, UCB1, mean_probes
from lib.engine.blocks import FixedK, GrowK
from lib.engine import adaptive
from lib.models.build import make_target
from lib.engine.heads import DenseHead, FlashHead, GraphedHead
from lib.engine.runner import FILL_CHUNK, Runner
from lib.engine.speculative import Request, generate_baseline, generate_speculative

from conftest import N_CLUSTERS, SPECIAL_IDS, VOCAB

MAX_NEW, MAX_LEN = 20, 64
PROMPTS = [7, 30]


def prompt_of(n: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(100 + n)).tolist()


@pytest.fixture(scope="module")
def flash(pair, draft_clustering):
    W, cents, assign = draft_clustering
    return FlashHead(pair[1].get_output_embeddings().weight, cents, assign, 8, SPECIAL_IDS)


@pytest.fixture(scope="module")
def hidden(pair):
    """Draft hidden states at 30 prompt positions."""
    return Runner(pair[1], MAX_LEN).forward(torch.tensor([prompt_of(30)]), 0, graph=False)[0]


@pytest.fixture(scope="module")
def baselines(pair):
    return {n: generate_baseline(make_target(pair[0], MAX_LEN), Request(prompt_of(n), MAX_NEW)).tokens for n in PROMPTS}


def bandit_draft(pair, flash, bandit_cls) -> BanditDraft:
    runner = Runner(pair[1], MAX_LEN)
    arms = {"dense": GraphedHead(DenseHead(flash.weight)), "flash_p1": GraphedHead(flash.with_probes(1)),
            "flash_p8": GraphedHead(flash)}
    return BanditDraft(runner, arms["flash_p8"], arms, bandit_cls(list(arms)))


# the adaptive probe count

def test_probe_count_stays_in_bounds_and_follows_the_threshold(flash, hidden):
    ps = {t: AdaptiveFlashHead(flash, t, 2, 16).scored(hidden)[2] for t in (0.0, 0.5, 0.9, 0.99, 1.0)}
    assert all(((p >= 2) & (p <= 16)).all() for p in ps.values())
    assert (ps[0.0] == 2).all() and (ps[1.0] == 16).all()                # threshold 0: p_min; threshold 1: p_max
    assert (ps[0.5] <= ps[0.9]).all() and (ps[0.9] <= ps[0.99]).all()     # more mass needs more probes
    assert len(set(ps[0.9].tolist())) > 1                                 # it really adapts per step


def test_fixed_bounds_equal_flash_head_at_that_probe_count(flash, hidden):
    for p in (1, 4, 8):
        head = AdaptiveFlashHead(flash, 0.7, p, p)
        assert torch.equal(head(hidden), flash.with_probes(p)(hidden))


def test_only_the_chosen_probes_are_scored(flash, hidden):
    head = AdaptiveFlashHead(flash, 0.9, 1, 16)
    cand, keep, p = head.scored(hidden)
    b, s = flash.c2t.shape[1], len(SPECIAL_IDS)
    assert torch.equal(keep.sum(1), p * b + s)
    tok = head(hidden)
    assert ((cand == tok[:, None]) & keep).any(1).all()                  # the answer is a scored candidate
    counts = head.probe_counts()
    assert counts == torch.bincount(p, minlength=17).tolist()            # one step counted at each row's own p
    assert mean_probes(counts) == pytest.approx(p.double().mean().item())
    assert len(set(p.tolist())) > 1                                      # the mean is not just one count
    # the answer is the best-scoring kept candidate (ties: the smallest id), recomputed row by row
    W = flash.weight
    for c, k, h, t in zip(cand, keep, hidden, tok):
        ids = c[k].unique()
        logits = W[ids] @ h
        assert t.item() == ids[logits.argmax()].item()


@pytest.mark.parametrize("kw,match", [(dict(threshold=1.5), "threshold"), (dict(p_min=0), "p_min"),
                                      (dict(p_min=9, p_max=8), "p_min"), (dict(p_max=N_CLUSTERS + 1), "p_max"),
                                      (dict(temperature=0.0), "temperature")])
def test_bad_adaptive_settings_are_refused(flash, kw, match):
    args = dict(threshold=0.9, p_min=1, p_max=8) | kw
    with pytest.raises(ValueError, match=match):
        AdaptiveFlashHead(flash, **args)


# the bandit

def bandit_picks(bandit, means: dict, seed: int, rounds: int = 400) -> list[str]:
    """The arms `bandit` picks over `rounds`, each rewarded with its mean plus Gaussian noise."""
    rng, picks = random.Random(seed), []
    for _ in range(rounds):
        arm = bandit.choose()
        picks.append(arm)
        bandit.update(arm, means[arm] + rng.gauss(0, 0.3))
    return picks


def test_ucb1_tries_every_arm_once_then_settles_on_the_best():
    means = {"a": 1.0, "b": 2.0, "c": 1.5}
    picks = bandit_picks(UCB1(list(means), c=0.5), means, seed=0)
    assert sorted(picks[:3]) == ["a", "b", "c"]
    assert picks[-100:].count("b") > 90


def test_thompson_settles_on_the_best():
    means = {"a": 1.0, "b": 1.2, "c": 2.0}
    picks = bandit_picks(Thompson(list(means), seed=3), means, seed=1)
    assert sorted(picks[:3]) == ["a", "b", "c"] and picks[-100:].count("c") > 90


def test_bandit_needs_two_distinct_known_arms():
    with pytest.raises(ValueError, match="at least two distinct arms"):
        UCB1(["a"])
    with pytest.raises(ValueError, match="unknown arm"):
        UCB1(["a", "b"]).update("z", 1.0)


# output equals greedy decoding

@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_adaptive_probe_draft_keeps_greedy_output(pair, flash, baselines, schedule):
    draft = AdaptiveProbeDraft(Runner(pair[1], MAX_LEN), GraphedHead(AdaptiveFlashHead(flash, 0.9, 1, 16)))
    for n in PROMPTS:
        res = generate_speculative(make_target(pair[0], MAX_LEN), draft, Request(prompt_of(n), MAX_NEW, schedule, FixedK(4)))
        assert res.tokens == baselines[n]
        # this generation's head steps only (counts reset at its start): one step per proposed token, none at p=0
        assert sum(res.probe_counts) == res.proposed > 0 and res.probe_counts[0] == 0
        assert len(res.probe_counts) == 17 and any(res.probe_counts[2:])      # p_max 16; the count really varies


@pytest.mark.parametrize("bandit_cls", [UCB1, Thompson])
@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_bandit_draft_keeps_greedy_output_and_records_its_choices(pair, flash, baselines, schedule, bandit_cls):
    draft = bandit_draft(pair, flash, bandit_cls)
    for n in PROMPTS:
        for policy in (FixedK(3), GrowK(2, 6)):
            res = generate_speculative(make_target(pair[0], MAX_LEN), draft, Request(prompt_of(n), MAX_NEW, schedule, policy))
            assert res.tokens == baselines[n]
            assert len(res.choices) == res.rounds and set(res.choices) <= set(draft.arms)
    assert all(v > 0 for v in draft.bandit.n.values())                   # every arm was tried and rewarded



class RecordingUCB1(UCB1):
    """UCB1 that keeps every reward it is given."""
    def __init__(self, arms):
        super().__init__(arms)
        self.rewards = []

    def update(self, arm, reward):
        super().update(arm, reward)
        self.rewards.append(reward)


def test_bandit_reward_is_tokens_per_ms_of_each_round(pair, flash, monkeypatch):
    # The draft reads the clock once at each round's start and once at its end; a fake clock that moves 1 ms per
    # read makes a round last 2 ms up to the next round's start, and the last round 1 ms up to its own end.
    t = iter(range(10**6))
    monkeypatch.setattr(adaptive, "time", SimpleNamespace(perf_counter=lambda: next(t) / 1000))
    draft = bandit_draft(pair, flash, RecordingUCB1)
    res = generate_speculative(make_target(pair[0], MAX_LEN), draft, Request(prompt_of(30), MAX_NEW, "ordinary", 3))
    last = res.rounds - 1
    want = [(a + 1) / (1 if i == last else 2) for i, (a, kk) in enumerate(zip(res.accepted_lengths, res.block_lengths))
            if kk > 0]                                                   # a round with no room is not rewarded
    assert draft.bandit.rewards == pytest.approx(want)
    assert len(res.choices) == res.rounds

# the profile's modes, built by lib/models/build.py and run by lib/study/runs.py on smoke

@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    p = config.load_profile("smoke")
    return replace(p, prompts=replace(p.prompts, per_group=1, limit=2),
                   decode=replace(p.decode, max_new_tokens=12, modes=["baseline", "flash", *modes.ADAPTIVE_DRAFTS],
                                  schedules=["ordinary", "deferred"], k_policies=["fixed", "grow"]),
                   bench=replace(p.bench, e2e_warmup=0))


@pytest.fixture(scope="module")
def smoke_run(smoke):
    return results.read_records(speculative.run_speculative(smoke, fresh=True))


def test_smoke_adaptive_modes_equal_greedy_and_record_choices(smoke, smoke_run):
    recs = smoke_run
    spec = [r for r in recs if r["draft"] in modes.ADAPTIVE_DRAFTS]
    assert {r["mode"] for r in spec} == {modes.name(d, s) for d in modes.ADAPTIVE_DRAFTS for s in ("ordinary", "deferred")}
    assert all(r["exact_match"] for r in recs)                           # fixed K only: adaptive drafts skip grow
    for r in spec:
        if r["draft"] == "flash_adaptive":
            a = smoke.clustering.adaptive
            assert sum(r["probe_counts"][:a.p_min]) == 0 and len(r["probe_counts"]) == (a.p_max or smoke.clustering.n_probes) + 1
        else:
            assert len(r["choices"]) == r["rounds"] and all(c == "dense" or c.startswith("flash_p") for c in r["choices"])


def test_adaptive_study_compares_every_policy_with_fixed_settings(smoke, smoke_run):
    from lib.study import adaptive as adaptive_study
    a = adaptive_study.adaptive_study(smoke, n_prompts=1)
    assert all(s["exact_match"] == 1.0 for s in a["drafters"].values())
    pr = a["probes"]
    assert [r["threshold"] for r in pr["adaptive"]] == sorted({smoke.clustering.adaptive.threshold, *smoke.clustering.adaptive.sweep})
    assert all(pr["p_min"] <= r["min_probes"] <= r["mean_probes"] <= r["max_probes"] <= pr["p_max"] for r in pr["adaptive"])
    tops = [r["top1"] for r in pr["fixed"]]
    assert tops == sorted(tops)                                           # more probes never contain less
    arms = set(a["drafters"]["bandit_ucb"]["choice_freq"])
    assert arms <= {"dense", "flash_p2", "flash_p8", "flash_p32"} and a["regret"]["bandit_ucb"]["best_arm"] in a["drafters"]
    policies = {r["policy"] for r in a["policies"]}
    assert {"bandit_ucb", "bandit_thompson", "adaptive_t0.9", "flash_adaptive_deferred", "flash_deferred_grow"} <= policies
    grow = next(r for r in a["policies"] if r["policy"] == "flash_deferred_grow")
    assert grow["best_fixed"] == "flash_deferred" and grow["mean_k"] >= 1
    fixed = {r["best_fixed"] for r in a["policies"] if r["policy"].startswith("adaptive_t")}
    assert len(fixed) == 1 and "_k" not in fixed.pop()                    # adaptive probes against a fixed-K drafter
    q = smoke.clustering.n_probes                                         # the side study's own block policies
    for drafter in (f"flash_p{q}", "dense"):
        row = next(r for r in a["policies"] if r["policy"] == f"{drafter}_kgrow")
        assert row["best_fixed"] == drafter and 1 <= row["mean_k"] <= smoke.decode.k_max
        assert a["drafters"][f"{drafter}_kgrow"]["exact_match"] == 1.0
    assert a["drafters"]["dense"]["mean_k"] == pytest.approx(smoke.decode.k, abs=1)   # fixed K (the last block may be cut)
    assert report.extra_summary(smoke)["adaptive"]["policies"] == a["policies"]
    # notebook 04 sets the adaptive drafts against the run it analyses, not the one that was newest in notebook 03
    from lib.study import analysis, runs
    later = runs.new_run(smoke.out_dir, {})
    for r in smoke_run:                                                        # the e2e run's records
        runs.append_record(later, {**r, "decode_ms": 2 * r["decode_ms"]})         # the same run, timed at half speed
    runs.finish_run(later)
    ad = analysis.adaptive_results(smoke, later)
    e2e = [r for r in ad["policies"] if r["source"].startswith("e2e run")]
    assert ad["e2e_run"] == later.name and e2e and all(r["source"] == f"e2e run {later.name}" for r in e2e)
    before = {r["policy"]: r for r in a["policies"] if r["source"].startswith("e2e run")}
    assert all(r["decode_tok_s"] == pytest.approx(before[r["policy"]]["decode_tok_s"] / 2) for r in e2e)
    assert analysis.extra_summary(smoke, ad)["adaptive"]["policies"] == ad["policies"]
    shutil.rmtree(later)                                                      # the other tests' latest run stays theirs


def test_e2e_adaptive_drafts_are_set_against_the_fixed_drafts_on_their_body_not_the_full_depth_control():
    """An adaptive draft runs on the FlashHead draft's body; flash_full (gguf profiles) is the full-depth target with
    FlashHead, a fidelity control whose acceptance is near 1: it was taken as the best fixed draft an adaptive draft
    competes with (smollm2_full's e2e run: flash_adaptive deferred 9.27 tok/s against flash_full's 17.5, not fixed
    FlashHead's 9.61 on the same body). A block policy of flash_full is still set against flash_full at fixed K."""
    from lib.study.adaptive import e2e_rows

    def rec(draft, schedule, tok_s, k_policy="fixed", **kw):
        return {"mode": modes.name(draft, schedule, k_policy), "draft": draft, "schedule": schedule, "k_policy": k_policy,
                "decode_tokens": tok_s, "decode_ms": 1000.0, "accepted": 3, "proposed": 4, "block_lengths": [4],
                "probe_counts": [], "choices": [], **kw}
    recs = [rec("baseline", "baseline", 5.0), rec("dense", "deferred", 9.0), rec("flash", "deferred", 9.6),
            rec("flash_full", "deferred", 17.5), rec("flash_full", "deferred", 18.7, "grow"),
            rec("flash_adaptive", "deferred", 9.3, probe_counts=[0, 2, 2]),
            rec("bandit_ucb", "deferred", 9.2, choices=["dense", "flash_p8"])]
    best = {r["policy"]: r["best_fixed"] for r in e2e_rows(recs, "e2e run x")}
    assert best == {"flash_adaptive_deferred": "flash_deferred", "bandit_ucb_deferred": "flash_deferred",
                    "flash_full_deferred_grow": "flash_full_deferred"}


@pytest.mark.parametrize("section,kw,match", [
    ("adaptive", dict(threshold=1.2), "threshold"), ("adaptive", dict(p_min=5, p_max=4), "p_min"),
    ("adaptive", dict(temperature=-1.0), "temperature"), ("bandit", dict(probes=[0]), "bandit.probes"),
    ("bandit", dict(ucb_c=-1.0), "ucb_c")])
def test_bad_profile_settings_are_refused(section, kw, match):
    p = config.load_profile("smoke")
    if section == "adaptive":
        p = replace(p, clustering=replace(p.clustering, adaptive=replace(p.clustering.adaptive, **kw)))
    else:
        p = replace(p, decode=replace(p.decode, bandit=replace(p.decode.bandit, **kw)))
    with pytest.raises(config.ConfigError, match=match):
        config.validate(p, "smoke.yaml")


def test_adaptive_drafts_need_fixed_k():
    p = config.load_profile("smoke")
    p = replace(p, decode=replace(p.decode, modes=["baseline", "flash_adaptive"], k_policies=["grow"]))
    with pytest.raises(config.ConfigError, match="fixed K only"):
        config.validate(p, "smoke.yaml")


def test_bandit_arms_come_from_the_profile():
    p = config.load_profile("smoke")
    assert engines.bandit_probes(p, 8, 256) == [2, 8, 32]
    p = replace(p, decode=replace(p.decode, bandit=replace(p.decode.bandit, probes=[4, 64])))
    assert engines.bandit_probes(p, 8, 256) == [4, 8, 64]


@pytest.mark.parametrize("k_policies,adaptive_k,longest", [(["fixed"], False, "k"), (["fixed"], True, "k_max"),
                                                           (["fixed", "grow"], False, "k_max")])
def test_engines_capture_every_length_their_block_policies_reach(smoke, monkeypatch, k_policies, adaptive_k, longest):
    """Every verify length a round can use is captured before timing: up to K+1, or k_max+1 where a block policy
    may grow K (the profile's, or the adaptive study's whatever the profile's); the draft's calls too, and the call
    its prompt fill replays (FILL_CHUNK tokens, as many as its cache holds)."""
    seen = []
    monkeypatch.setattr(Runner, "warm", lambda self, kind, lengths: seen.append((self.role, kind, list(lengths))))
    p = replace(smoke, decode=replace(smoke.decode, k_policies=k_policies))
    ensure_flash_checkpoint(p)                                          # (made by the e2e run when that ran first)
    engines.build_engines(p, ["flash"], adaptive_k=adaptive_k)
    rounds = list(range(1, getattr(p.decode, longest) + 2))
    fill = min(FILL_CHUNK, engines.cache_len(p))
    assert seen == [("target", "greedy", rounds), ("target", "hidden", rounds), ("draft", "hidden", rounds + [fill])]


def test_adaptive_probes_are_set_against_fixed_probes_at_fixed_k():
    """A block policy on FlashHead (flash_p16_kcost) may be the fastest drafter; the adaptive probe rows still
    compare with the best fixed probe count at fixed K, and the policy with its own drafter."""
    from lib.study import adaptive as adaptive_study
    row = lambda tok_s: {"decode_tok_s": tok_s, "acceptance": 0.5, "mean_probes": 9.0, "mean_k": 3.0}
    stats = {"flash_p4": row(10.0), "flash_p16": row(12.0), "flash_p16_kcost": row(20.0), "adaptive_t0.9": row(11.0)}
    rows = adaptive_study.study_rows(stats, {}, {"flash_p16_kcost": ("flash_p16", None)})
    by = {r["policy"]: r for r in rows}
    assert by["adaptive_t0.9"]["best_fixed"] == "flash_p16" and by["flash_p16_kcost"]["best_fixed"] == "flash_p16"
    assert by["flash_p16_kcost"]["tok_s_vs_best_fixed"] == pytest.approx(20 / 12)


def test_regret_of_a_bandit_that_ran_no_round():
    """Every generation ended at its first token (a stop token): the bandit chose no arm, and its regret is still
    reported (no share of rounds on the best arm) instead of failing on a missing choice_freq."""
    from lib.study.adaptive import regret
    stats = {"dense": {"decode_tok_s": 10.0}, "flash_p4": {"decode_tok_s": 20.0}}
    for b in (modes.BANDIT_UCB, modes.BANDIT_THOMPSON):
        stats[b] = {"decode_tok_s": 10.0, "decode_ms": 100.0, "decode_tokens": 1}
    r = regret(stats, ["dense", "flash_p4"])[modes.BANDIT_UCB]
    assert r["best_arm"] == "flash_p4" and r["best_arm_share"] == 0.0 and r["regret_frac"] == pytest.approx(0.5)
