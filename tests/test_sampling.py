"""Speculative sampling (lib/engine/sampling.py): reproducibility, the greedy limit, the pieces, the study.

That its tokens are distributed as the target's own sampling, on every path of a round, and that the test
has the power to see planted bugs, is tests/test_sampling_exactness.py.
"""
import json
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch
import yaml

from lib import report
from lib.engine import sampling
from lib.study import sampling as sampling_study
from lib.config import ConfigError, load_profile
from lib.results import save_json
from lib.models.build import make_draft, make_target
from lib.engine.heads import DenseHead, FlashHead
from lib.engine.speculative import Request, generate_baseline, generate_speculative

from conftest import SPECIAL_IDS

REPO = Path(__file__).resolve().parents[1]
MAX_LEN = 48
PROMPTS = [[5, 17, 99, 250, 31], [400, 7, 123]]
TEMPERATURE = 1.0


@pytest.fixture(scope="module")
def engines(pair, draft_clustering):
    W, cents, assign = draft_clustering
    heads = {"dense": DenseHead(pair[1].get_output_embeddings().weight),
             "flash": FlashHead(pair[1].get_output_embeddings().weight, cents, assign, 4, SPECIAL_IDS)}
    return make_target(pair[0], MAX_LEN), {n: make_draft(pair[1], h, MAX_LEN) for n, h in heads.items()}


# acceptance and rejection both happen

def test_rounds_really_reject_and_accept(engines):
    # Otherwise the exactness tests would not exercise both the acceptance and the residual.
    target, drafts = engines
    for name, draft in drafts.items():
        res = [generate_speculative(target, draft, Request(PROMPTS[0], 16, "ordinary", 3, temperature=TEMPERATURE,
                                                           seed=s))
               for s in range(10)]
        accepted, proposed = sum(r.accepted for r in res), sum(r.proposed for r in res)
        assert 0.2 < accepted / proposed < 0.95, (name, accepted, proposed)


# reproducibility and the greedy limit

@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_same_seed_same_tokens(engines, schedule):
    target, drafts = engines
    for draft in drafts.values():
        run = lambda seed: generate_speculative(target, draft, Request(PROMPTS[1], 20, schedule, 3, temperature=1.0,
                                                                       top_p=0.9, seed=seed)).tokens
        assert run(7) == run(7)
        assert len({tuple(run(s)) for s in range(6)}) > 1                    # and the seed matters
    base = lambda seed: generate_baseline(target, Request(PROMPTS[1], 20, temperature=1.0, top_p=0.9, seed=seed)).tokens
    assert base(3) == base(3) and len({tuple(base(s)) for s in range(6)}) > 1


def test_first_token_is_the_baselines(engines):
    # Both draw the first token from p after the prompt with a fresh generator of the same seed.
    target, drafts = engines
    for s in range(5):
        first = generate_baseline(target, Request(PROMPTS[0], 3, temperature=1.5, seed=s)).tokens[0]
        spec = generate_speculative(target, drafts["flash"], Request(PROMPTS[0], 3, "deferred", 2, temperature=1.5,
                                                                    seed=s))
        assert spec.tokens[0] == first


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_temperature_to_zero_is_greedy(engines, schedule):
    target, drafts = engines
    for prompt in PROMPTS:
        greedy = generate_baseline(target, Request(prompt, 20)).tokens
        assert generate_baseline(target, Request(prompt, 20, temperature=0.0)).tokens == greedy
        assert generate_baseline(target, Request(prompt, 20, temperature=1e-5, seed=1)).tokens == greedy
        for draft in drafts.values():
            assert generate_speculative(target, draft, Request(prompt, 20, schedule, 3)).tokens == greedy
            run = lambda **kw: generate_speculative(target, draft, Request(prompt, 20, schedule, 3, **kw)).tokens
            assert run(temperature=0.0) == greedy
            assert run(temperature=1e-5, seed=1) == greedy


@pytest.mark.parametrize("max_new", [2, 3])
def test_a_few_new_tokens_with_a_block_longer_than_them(engines, max_new):
    # K past what is left: a last round with no room proposes nothing and draws its token from the pending p (no
    # verify call, none skipped) where one is known, from a one-token verify where it is not (deferred)
    target, drafts = engines
    for name, draft in drafts.items():
        for seed in range(4):
            base = generate_baseline(target, Request(PROMPTS[0], max_new, temperature=1.0, seed=seed)).tokens
            run = lambda s: generate_speculative(target, draft, Request(PROMPTS[0], max_new, s, 8, temperature=1.0,
                                                                        seed=seed))
            runs = {s: run(s) for s in ("ordinary", "pipelined", "deferred")}
            for schedule, res in runs.items():
                lens, blocks = res.accepted_lengths, res.block_lengths
                assert len(res.tokens) == max_new and res.tokens[0] == base[0], (name, seed, schedule)
                assert res.decode_tokens == sum(a + 1 for a in lens) and res.accepted == sum(lens) <= res.proposed
                emitted = [1 + sum(a + 1 for a in lens[:i]) for i in range(len(lens))]
                assert blocks == [max_new - e - 1 for e in emitted]                  # K cut to what is left
                made = res.verify_calls + res.skipped
                assert made == (sum(b > 0 for b in blocks) if schedule != "deferred" else res.rounds - (blocks[0] == 0))
                assert res.append_calls == (res.rounds if schedule != "deferred" else 1)
            assert runs["pipelined"].tokens == runs["ordinary"].tokens


# the pieces

def test_flash_proposal_lives_on_the_drawn_clusters(engines, draft_clustering):
    _, drafts = engines
    fs = sampling.sampler_for(drafts["flash"], sampling.Dist(0.7))
    h = torch.randn(1, fs.head.weight.shape[1], generator=torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(0)
    draws = [fs.probes(h, gen) for _ in range(200)]
    assert all(len(set(d.tolist())) == fs.head.n_probes for d in draws)    # without replacement
    assert len({tuple(sorted(d.tolist())) for d in draws}) > 1               # and random
    gen = torch.Generator().manual_seed(5)
    tok, q = fs(h, gen)
    probes = fs.probes(h, torch.Generator().manual_seed(5))                  # the same draw again
    support = set(fs.head.c2t[probes].flatten().tolist()) | set(SPECIAL_IDS)
    assert set(q.nonzero().flatten().tolist()) == support and int(tok) in support
    assert abs(float(q.sum()) - 1) < 1e-5
    top = sampling.FlashSampler(fs.head, fs.dist, draw_probes=False)          # FlashHead's own top-p clusters
    _, q = top(h, torch.Generator().manual_seed(5))
    assert set(q.nonzero().flatten().tolist()) == set(fs.head.candidates(h)[0].tolist())


def test_nucleus_keeps_the_smallest_top_set():
    probs = torch.tensor([0.1, 0.5, 0.15, 0.25])
    assert torch.allclose(sampling.nucleus(probs, 0.7), torch.tensor([0.0, 0.5, 0.0, 0.25]) / 0.75)
    assert torch.allclose(sampling.nucleus(probs, 0.3), torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(sampling.nucleus(probs, 1.0), probs)


def test_residual_is_the_positive_part():
    p, q = torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(sampling.residual(p, q), torch.tensor([0.3, 0.0, 0.0]))
    assert torch.equal(sampling.residual(p, p), p)


@pytest.mark.parametrize("kwargs,message", [(dict(temperature=-1.0), "temperature must be > 0"),
                                            (dict(top_p=0.0), "top_p must be in"),
                                            (dict(top_p=1.5), "top_p must be in"),
                                            (dict(schedule="lazy"), "unknown schedule")])
def test_bad_requests_are_refused(engines, kwargs, message):
    target, drafts = engines
    args = dict(schedule="ordinary", temperature=1.0, top_p=1.0) | kwargs
    with pytest.raises(ValueError, match=message):
        generate_speculative(target, drafts["dense"], Request(PROMPTS[0], 8, k=2, **args))


# the study and its configuration

def test_profile_sampling_settings_are_validated(tmp_path):
    smoke = yaml.safe_load((REPO / "params" / "smoke.yaml").read_text())
    s = load_profile("smoke").sampling
    assert (s.temperatures, s.top_p, s.schedules, s.probes) == ([0.5, 1.0], 1.0, ["ordinary", "deferred"], ["drawn", "top"])
    for bad, message in (({"temperatures": [0.5, 0.0]}, "sampling.temperatures must be a non-empty list"),
                         ({"temperatures": []}, "sampling.temperatures must be a non-empty list"),
                         ({"top_p": 1.2}, r"sampling.top_p must be in \(0, 1\]"),
                         ({"schedules": ["lazy"]}, "sampling.schedules must be a non-empty subset"),
                         ({"probes": ["random"]}, "sampling.probes must be a non-empty subset"),
                         ({"temperatures": ["hot"]}, "expected float")):
        path = tmp_path / "custom.yaml"
        path.write_text(yaml.safe_dump({**smoke, "sampling": bad}))
        with pytest.raises(ConfigError, match=message):
            load_profile(str(path))


def test_sampling_modes():
    p = load_profile("smoke")
    p = replace(p, decode=replace(p.decode, modes=["baseline", "dense", "flash"]),
                sampling=replace(p.sampling, schedules=["deferred"]))
    order = sampling_study.sampling_modes(p)
    assert order == [("baseline", None, None), ("dense", "deferred", None), ("flash", "deferred", "drawn"),
                     ("flash", "deferred", "top")]
    assert [sampling_study.mode_name(*m) for m in order] == ["baseline", "dense_deferred", "flash_deferred",
                                                             "flash_deferred_top_probes"]


@dataclass
class FakePrompt:
    question_id: int
    group: str


def test_study_records_and_summary(engines):
    target, drafts = engines
    p = load_profile("smoke")
    p = replace(p, decode=replace(p.decode, modes=["baseline", "dense", "flash"], max_new_tokens=10, k=3),
                sampling=replace(p.sampling, temperatures=[0.7, 1.3], top_p=0.9), bench=replace(p.bench, e2e_warmup=1))
    enc = [(FakePrompt(i, "g"), ids) for i, ids in enumerate(PROMPTS)]
    samples = sampling_study.run(p, target, drafts, enc, frozenset())
    assert len(samples) == 2 * len(PROMPTS) * 7                                 # temperatures x prompts x modes
    for t in (0.7, 1.3):
        for qid in range(len(PROMPTS)):
            same = [r for r in samples if r["temperature"] == t and r["question_id"] == qid]
            assert len({r["seed"] for r in same}) == 1 and len({r["tokens"][0] for r in same}) == 1
    data = sampling_study.result(p, samples, {})
    save_json(p, "sampling.json", data)
    section = report.extra_summary(p)["sampling"]
    assert "samples" not in section and section["rows"] == json.loads(json.dumps(data["rows"]))
    for row in data["rows"]:
        rs = [r for r in samples if r["mode"] == row["mode"] and r["temperature"] == row["temperature"]]
        assert row["samples"] == 2 and row["accepted"] == sum(r["accepted"] for r in rs)
        if row["mode"] == "baseline":
            assert row["acceptance"] is None and row["speedup"] == 1.0
        else:
            assert 0 <= row["acceptance"] <= 1 and 1 <= row["mean_emitted"] <= 4
            assert row["mean_emitted"] == pytest.approx(sum(r["decode_tokens"] for r in rs) / sum(r["rounds"] for r in rs))


def test_adaptive_drafts_are_greedy_only_and_left_out_of_the_sampling_study():
    from lib import modes
    from lib.config import load_profile
    from lib.study.sampling import sampled_rows, sampling_modes
    p = load_profile("smoke")
    assert set(modes.ADAPTIVE_DRAFTS) & set(p.decode.modes)                    # smoke runs some
    assert not {d for d, _, _ in sampling_modes(p)} & set(modes.ADAPTIVE_DRAFTS)
    rows = [{"draft": "flash"}, {"draft": "bandit_ucb"}, {"draft": "baseline"}]
    assert sampled_rows({"rows": rows}) == [{"draft": "flash"}, {"draft": "baseline"}]
