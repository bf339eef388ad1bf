import pytest
import torch

from lib.bench import Clock
from lib.engine import rounds
from lib.engine.heads import DenseHead, FlashHead
from lib.models.build import make_draft, make_target
from lib.engine.runner import Runner, _replay, fill_calls
from lib.engine.speculative import (Draft, Request, Result, Target, accepted_prefix, generate_baseline,
                                    generate_speculative)

from conftest import DRAFT_D, N_CLUSTERS, SPECIAL_IDS, TARGET_D, VOCAB

MAX_NEW = 24
MAX_LEN = 30 + MAX_NEW + 6 + 8
PROMPT_LENS = [1, 7, 30]
KS = [1, 2, 4, 6]
SCHEDULES = ["ordinary", "deferred"]
HEADS = ["dense", "flash_all", "flash_2", "flash_1"]


def prompt_of(n: int) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(100 + n)).tolist()


@pytest.fixture(scope="module")
def heads(pair, draft_clustering):
    W = pair[1].get_output_embeddings().weight
    _, cents, assign = draft_clustering
    full = FlashHead(W, cents, assign, N_CLUSTERS, SPECIAL_IDS)
    return {"dense": DenseHead(W), "flash_all": full, "flash_2": full.with_probes(2), "flash_1": full.with_probes(1)}


def target_of(pair) -> Target:
    return make_target(pair[0], MAX_LEN)


def draft_of(model, head, d: int) -> Draft:
    return make_draft(model, head, MAX_LEN)


@pytest.fixture(scope="module")
def baselines(pair):
    return {n: generate_baseline(target_of(pair), Request(prompt_of(n), MAX_NEW)) for n in PROMPT_LENS}


class Tape(Clock):
    """A clock whose marks are ticks: where a call falls among the phases."""
    tick = 0

    def mark(self, device=None):
        Tape.tick += 1
        return Tape.tick


def planned_blocks(res: Result, k: int, max_new: int) -> list[int]:
    """The block length of each round, rebuilt from the accepted lengths: min(K, room left - 1)."""
    emitted, out = 1, []
    for a in res.accepted_lengths:
        out.append(min(k, max_new - emitted - 1))
        emitted += a + 1
    return out


def check_counters(res: Result, schedule: str, k: int, max_new: int):
    lens = res.accepted_lengths
    assert len(res.tokens) == max_new
    assert res.rounds == len(lens)
    assert res.accepted == sum(lens)
    assert res.decode_tokens == sum(a + 1 for a in lens) == max_new - 1
    assert res.accepted <= res.proposed
    blocks = planned_blocks(res, k, max_new)
    assert res.proposed == sum(blocks)
    assert all(0 <= a <= kk for a, kk in zip(lens, blocks))
    assert res.skipped <= sum(a == 0 for a in lens)               # a skipped round accepts nothing
    if schedule == "ordinary":
        assert res.append_calls == res.rounds
        assert res.verify_calls + res.skipped == sum(kk > 0 for kk in blocks)   # a round with no room proposes nothing
    else:
        assert res.append_calls == 1
        # every round verifies or skips, except a first round with no room to propose (max_new == 2),
        # which emits the pending prediction of the initial append without any call
        assert res.verify_calls + res.skipped == res.rounds - (blocks[0] == 0)
        if max_new > 2:
            assert res.verify_calls + res.skipped == res.rounds
        assert res.skipped <= 1                                    # only the first round has a pending prediction
    assert {"call_target", "initial", "draft", "verify", "finalize"} <= set(res.spans_ms)
    assert res.ttft_ms >= 0 and res.decode_ms >= 0


# baseline

@pytest.mark.parametrize("n", PROMPT_LENS)
def test_baseline_matches_hf_generate(pair, baselines, n):
    target = pair[0]
    ids = torch.tensor([prompt_of(n)])
    with torch.no_grad():
        ref = target.generate(ids, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert baselines[n].tokens == ref[0, n:].tolist()


@pytest.mark.parametrize("n", PROMPT_LENS)
def test_baseline_counters(baselines, n):
    res = baselines[n]
    assert len(res.tokens) == MAX_NEW and res.decode_tokens == MAX_NEW - 1
    assert res.append_calls == MAX_NEW - 1
    assert res.rounds == res.proposed == res.accepted == res.verify_calls == res.skipped == 0
    assert res.accepted_lengths == []


def test_baselines_are_not_trivial(baselines):
    # The tiny pair must produce varied output, or the equality tests below would mean little.
    for res in baselines.values():
        assert len(set(res.tokens)) > MAX_NEW // 2
    assert len({tuple(r.tokens) for r in baselines.values()}) == len(baselines)


# speculative == baseline, for every schedule, K, draft head and prompt

@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_speculative_equals_baseline(pair, heads, baselines, schedule, k, head):
    for n in PROMPT_LENS:
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads[head], DRAFT_D),
                                   Request(prompt_of(n), MAX_NEW, schedule, k))
        assert res.tokens == baselines[n].tokens, f"prompt length {n}"
        check_counters(res, schedule, k, MAX_NEW)


@pytest.mark.parametrize("max_new", [2, 3, 5])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_short_outputs_never_overshoot(pair, heads, schedule, max_new):
    prompt = prompt_of(7)
    base = generate_baseline(target_of(pair), Request(prompt, max_new))
    for k in (1, 6):
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                                   Request(prompt, max_new, schedule, k))
        assert res.tokens == base.tokens
        check_counters(res, schedule, k, max_new)


def test_drafts_reuse_runners_across_prompts(pair, heads, baselines):
    # The engine must not depend on a fresh cache: reuse one target and one draft for all prompts.
    target, draft = target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D)
    for schedule in SCHEDULES:
        for n in reversed(PROMPT_LENS):
            res = generate_speculative(target, draft, Request(prompt_of(n), MAX_NEW, schedule, 4))
            assert res.tokens == baselines[n].tokens


def test_few_probe_flash_head_really_differs_from_dense(pair, heads):
    # Otherwise the flash_1/flash_2 cases above would only repeat the dense-head case.
    runner = Runner(pair[1], MAX_LEN)
    h = runner.forward(torch.tensor([prompt_of(30)]), 0)[0]
    dense = heads["dense"](h)
    assert (heads["flash_1"](h) != dense).any()
    assert torch.equal(heads["flash_all"](h), dense)


def test_drafts_accept_something_and_reject_something(pair, heads):
    res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                               Request(prompt_of(30), MAX_NEW, "ordinary", 4))
    assert 0 < res.accepted < res.proposed


# a draft identical to the target

@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_identical_draft_accepts_everything(pair, baselines, schedule, k):
    target_model = pair[0]
    same = DenseHead(target_model.get_output_embeddings().weight)
    for n in PROMPT_LENS:
        res = generate_speculative(target_of(pair), draft_of(target_model, same, TARGET_D),
                                   Request(prompt_of(n), MAX_NEW, schedule, k))
        assert res.tokens == baselines[n].tokens
        check_counters(res, schedule, k, MAX_NEW)
        assert res.accepted == res.proposed
        assert res.accepted_lengths == planned_blocks(res, k, MAX_NEW)
        assert res.skipped == 0


# errors and helpers

def test_unknown_schedule(pair, heads):
    with pytest.raises(ValueError, match="schedule"):
        generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                             Request(prompt_of(7), 8, "lazy", 2))


@pytest.mark.parametrize("proposed,predicted,want", [
    ([], [], 0),
    ([1, 2, 3], [1, 2, 3], 3),
    ([1, 2, 3], [1, 5, 3], 1),
    ([4, 2, 3], [5, 2, 3], 0),
    ([1, 2], [1, 2, 9], 2),
    ([1, 2, 9], [1, 2], 2),
    ([7, 7, 7], [7, 7, 8], 2),
])
def test_accepted_prefix(proposed, predicted, want):
    assert accepted_prefix(proposed, predicted) == want


# impossible requests are refused before any work

@pytest.mark.parametrize("max_new,k,n,match", [(0, 2, 7, "max_new must be >= 1"), (8, 0, 7, "block length k must be >= 1"),
                                               (8, 2, MAX_LEN, "cache positions")])
def test_impossible_arguments_are_refused(pair, heads, max_new, k, n, match):
    with pytest.raises(ValueError, match=match):
        generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                             Request(prompt_of(n), max_new, "ordinary", k))


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_a_request_that_fills_both_caches_exactly_keeps_greedy_output(pair, heads, schedule, monkeypatch):
    # prompt + max_new == max_len: every write (verify batches, blocks and appends launched ahead at positions counted
    # on the device, K past what is left) stays inside both caches; one token more is refused
    monkeypatch.setattr(rounds, "AHEAD_DEVICES", ("cuda", "cpu"))
    from lib.engine.blocks import GrowK
    same = (pair[0], DenseHead(pair[0].get_output_embeddings().weight))             # accepts every proposal
    for n, max_new in ((1, 9), (7, 6), (1, 20)):
        target = make_target(pair[0], n + max_new)
        want = generate_baseline(target, Request(prompt_of(n), max_new)).tokens
        for k in (1, 2, 4, 8, "grow"):
            for model, head in ((pair[1], heads["dense"]), (pair[1], heads["flash_2"]), same):
                res = generate_speculative(target, make_draft(model, head, n + max_new), Request(
                    prompt_of(n), max_new, schedule, GrowK(2, 8) if k == "grow" else k))
                assert res.tokens == want, (n, k, head)
        with pytest.raises(ValueError, match="cache positions"):
            generate_speculative(target, make_draft(pair[1], heads["dense"], n + max_new),
                                 Request(prompt_of(n), max_new + 1, schedule, 2))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_draft_cache_too_short_is_refused_before_any_work(pair, heads, schedule):
    # (the draft's runner raised "KV cache of 12 positions cannot hold 13" mid-generation, after the prefill)
    target, calls = target_of(pair), []
    prefill = target.runner.prefill
    target.runner.prefill = lambda ids: calls.append(ids) or prefill(ids)
    with pytest.raises(ValueError, match="cache positions; the runner holds 12"):
        generate_speculative(target, make_draft(pair[1], heads["dense"], 12), Request(prompt_of(5), 20, schedule, 4))
    assert not calls


@pytest.mark.parametrize("max_new,n,match", [(0, 7, "max_new must be >= 1"), (8, MAX_LEN, "cache positions")])
def test_baseline_refuses_impossible_arguments(pair, max_new, n, match):
    with pytest.raises(ValueError, match=match):
        generate_baseline(target_of(pair), Request(prompt_of(n), max_new))


@pytest.mark.parametrize("kw,match", [(dict(k=4.0), "k must be a block length"), (dict(k=None), "k must be a block length"),
                                      (dict(max_new=5.5), "max_new must be an integer")])
def test_a_request_of_the_wrong_type_is_refused_in_one_line(kw, match):
    # (k 4.0 or None raised AttributeError: 'float' object has no attribute 'k_max'; max_new 5.5 passed, to fail
    # deep in the engine)
    with pytest.raises(ValueError, match=match):
        Request(prompt_of(7), **{"max_new": 8, "schedule": "ordinary", **kw})


def test_a_prompt_that_is_not_a_flat_list_of_token_ids_is_refused_in_one_line():
    # (Hugging Face's input_ids of shape (1, n) became a one-element prompt and failed deep in the engine)
    import numpy as np
    ids = torch.tensor([prompt_of(7)])
    for prompt in (ids, [[1, 2, 3]], [1.5, 2.0], torch.tensor([1.0, 2.0]), np.array([1.5])):
        with pytest.raises(ValueError, match="the prompt must be a flat sequence of token ids"):
            Request(prompt, 8)


def test_a_prompt_given_as_a_tensor_or_numpy_array_is_its_token_ids(pair, baselines):
    import numpy as np
    ids = torch.tensor(prompt_of(7))
    for prompt in (ids, ids.numpy(), np.asarray(prompt_of(7), dtype=np.int64), list(ids)):
        request = Request(prompt, MAX_NEW)
        assert request.prompt == tuple(prompt_of(7)) and all(type(t) is int for t in request.prompt)
    assert generate_baseline(target_of(pair), Request(ids, MAX_NEW)).tokens == baselines[7].tokens


def test_numpys_integers_are_block_lengths_and_token_counts(pair, heads, baselines):
    import numpy as np
    res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                               Request(prompt_of(7), np.int64(MAX_NEW), "deferred", np.int64(3)))
    assert res.tokens == baselines[7].tokens


def test_flash_head_refuses_more_probes_than_clusters(pair, draft_clustering):
    W, cents, assign = draft_clustering
    with pytest.raises(ValueError, match=f"n_probes must be in 1..{N_CLUSTERS}"):
        FlashHead(W, cents, assign, N_CLUSTERS + 1)
    with pytest.raises(ValueError, match="n_probes"):
        FlashHead(W, cents, assign, 4).with_probes(0)


# stopping at an end-of-sequence token: exactly where greedy decoding stops

@pytest.mark.parametrize("head", ["dense", "flash_2"])
@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_stops_where_greedy_stops(pair, heads, baselines, schedule, k, head):
    base = baselines[30].tokens
    for j in (0, 3, 9, MAX_NEW - 1):                                     # the stop token's first position
        stop = frozenset({base[j]})
        want = base[:base.index(base[j]) + 1]
        greedy = generate_baseline(target_of(pair), Request(prompt_of(30), MAX_NEW, stop=stop))
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads[head], DRAFT_D),
                                   Request(prompt_of(30), MAX_NEW, schedule, k, stop))
        assert greedy.tokens == want and res.tokens == want, f"stop at {j}"
        assert res.stopped == greedy.stopped == True                      # noqa: E712
        lens = res.accepted_lengths
        assert res.decode_tokens == sum(a + 1 for a in lens) and res.accepted == sum(lens)


@pytest.mark.parametrize("behind", [True, False])
def test_target_only_decoding_reads_each_token_after_launching_its_append(pair, baselines, monkeypatch, behind):
    """With stop tokens, target-only decoding on a GPU reads a token on the host only after the call that appends it is
    launched (that call runs while the host waits for the read), and throws that one call away where the token was a
    stop token: the same tokens, one call past them, not counted among the append calls. A CPU reads first."""
    from lib.bench import HostCopy
    if behind:
        monkeypatch.setattr(rounds, "AHEAD_DEVICES", ("cuda", "cpu"))
    base = baselines[30].tokens
    calls, reads = [], []
    target = target_of(pair)
    greedy = target.runner.greedy
    monkeypatch.setattr(target.runner, "greedy", lambda ids, start: calls.append(start) or greedy(ids, start))
    read = HostCopy.read
    monkeypatch.setattr(HostCopy, "read", lambda self, h: reads.append((len(calls), *h.tolist())) or read(self, h))
    j = next(j for j in range(5, MAX_NEW - 1) if base.index(base[j]) == j)   # a stop token first seen at j
    res = generate_baseline(target, Request(prompt_of(30), MAX_NEW, stop=frozenset({base[j]})))
    assert res.tokens == base[:j + 1] and res.stopped and res.append_calls == j
    assert calls == list(range(30, 30 + j + behind))                   # j appends, and on a GPU one thrown away
    assert reads == ([(i + 1, base[i]) for i in range(1, j + 1)] if behind else [])   # token i read once its append ran


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_a_first_token_that_ends_the_generation_costs_no_call(pair, heads, baselines, schedule):
    # a stop token first, or max_new 1: like target-only decoding, nothing runs past the prefill (no draft prefill,
    # no append), so the counters and the metric identities hold with zero rounds
    first = baselines[30].tokens[0]
    for max_new, stop in ((MAX_NEW, frozenset({first})), (1, frozenset())):
        greedy = generate_baseline(target_of(pair), Request(prompt_of(30), max_new, stop=stop))
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                                   Request(prompt_of(30), max_new, schedule, 4, stop))
        assert res.tokens == greedy.tokens == [first]
        assert res.append_calls == greedy.append_calls == 0
        assert res.rounds == res.verify_calls == res.proposed == 0 and not res.spans_ms.get("initial")


def test_stop_tokens_given_as_a_tensor_stop_the_generation(pair, heads, baselines):
    # (a frozenset of 0-dim tensors hashes them by identity: no emitted id was ever found in it, so neither target-only
    # nor speculative decoding stopped)
    import numpy as np
    base = baselines[30].tokens
    for stop in (torch.tensor([base[5], VOCAB + 1]), np.array([base[5]]), [torch.tensor(base[5])]):
        assert Request(prompt_of(30), MAX_NEW, stop=stop).stop >= {base[5]}
        for run in (lambda r: generate_baseline(target_of(pair), r),
                    lambda r: generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D), r)):
            res = run(Request(prompt_of(30), MAX_NEW, "deferred", 4, stop))
            assert res.tokens == base[:base.index(base[5]) + 1] and res.stopped


def test_no_stop_token_runs_to_max_new(pair, heads, baselines):
    res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                               Request(prompt_of(30), MAX_NEW, "ordinary", 4, frozenset({VOCAB + 5})))
    assert res.tokens == baselines[30].tokens and not res.stopped


# adaptive block lengths (lib/engine/blocks.py): the rounds change, the output does not

COSTS = {"T_p": {n: 10.0 + n for n in range(1, 9)}, "T_q": 1.0}


@pytest.mark.parametrize("policy", ["grow", "cost"])
@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_adaptive_block_lengths_keep_greedy_output(pair, heads, baselines, schedule, policy):
    from lib.engine.blocks import make_policy
    for n in PROMPT_LENS:
        p = make_policy(policy, 2, 7, schedule, COSTS)
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                   Request(prompt_of(n), MAX_NEW, schedule, p))
        assert res.tokens == baselines[n].tokens
        assert len(res.block_lengths) == res.rounds and sum(res.block_lengths) == res.proposed
        assert res.decode_tokens == sum(a + 1 for a in res.accepted_lengths)
        assert all(1 <= b <= 7 for b in res.block_lengths[:-1])


def test_grow_policy_follows_hugging_faces_rule():
    from lib.engine.blocks import GrowK
    p = GrowK(3, 8)
    seen = []
    for proposed, accepted in [(3, 3), (5, 5), (7, 2), (6, 0), (5, 5)]:
        assert p.next() == proposed
        p.update(proposed, accepted)
        seen.append(p.next())
    assert seen == [5, 7, 6, 5, 7]                                       # +2 on full acceptance, -1 otherwise


def test_grow_policy_starts_at_one_block_at_least(pair, heads, baselines):
    # GrowK(0, ...) proposed nothing in every round (its update skips rounds of no proposal), and GrowK(-1, ...)
    # crashed in the draft: its K is kept in 1..k_max from the start, as after every update
    from lib.engine.blocks import GrowK
    assert [GrowK(k, 6).next() for k in (-1, 0, 1, 9)] == [1, 1, 1, 6]
    res = generate_speculative(target_of(pair), draft_of(pair[1], heads["dense"], DRAFT_D),
                               Request(prompt_of(7), MAX_NEW, "ordinary", GrowK(0, 6)))
    assert res.tokens == baselines[7].tokens and all(b >= 1 for b in res.block_lengths[:-1])


def test_cost_policy_grows_k_with_acceptance():
    from lib.engine.blocks import CostK
    low, high = CostK(4, 7, COSTS, "deferred"), CostK(4, 7, COSTS, "deferred")
    low.update(100, 5)
    high.update(100, 95)
    assert low.next() < high.next() and high.next() == 7                  # cheap proposals, high acceptance: long blocks


def test_unknown_policy_and_missing_costs_are_refused():
    from lib.engine.blocks import make_policy
    with pytest.raises(ValueError, match="unknown block policy"):
        make_policy("random", 4, 7, "ordinary")
    with pytest.raises(ValueError, match="needs measured call costs"):
        make_policy("cost", 4, 7, "ordinary")


@pytest.mark.parametrize("m", [1, 2])
def test_a_chained_block_proposes_what_step_by_step_calls_propose(pair, heads, m):
    """Runner.chain (one CUDA graph a round on a GPU; call by call here) feeds m tokens, then each pick in turn."""
    for name in ("dense", "flash_2"):
        a, b = draft_of(pair[1], heads[name], DRAFT_D), draft_of(pair[1], heads[name], DRAFT_D)
        prompt = prompt_of(7)
        for d in (a, b):
            d.runner.prefill(torch.tensor([prompt]))
        ids = torch.tensor([prompt[-m:]])
        got = a.runner.chain(a.head.head, ids, 7 - m, 5)
        x, pos, want = ids, 7 - m, []
        for _ in range(5):
            want.append(b.head.head(b.runner.forward(x, pos)[:, -1]))
            pos, x = pos + x.shape[1], want[-1].view(1, 1)
        assert got.tolist() == torch.cat(want).tolist(), name
        torch.testing.assert_close(a.runner.cache.k, b.runner.cache.k)
    with pytest.raises(ValueError, match="cannot hold"):
        a.runner.chain(a.head.head, ids, MAX_LEN - 2, 5)


def test_a_chain_captured_through_another_fused_step_leaves_the_runners_own(pair, monkeypatch):
    """warm_chain(decode=step) captures through `step` (another instance, for timing) and puts the runner's own
    step back, also where the capture fails (the capture itself stands in: it needs a GPU)."""
    r, other, seen = Runner(pair[1], MAX_LEN), object(), []
    own = r.decode
    monkeypatch.setattr(r, "_keep", lambda key, fn, ids, start, n: seen.append(r.decode) or {})
    r.warm_chain(lambda h: h, 1, 2, decode=other)
    r.warm_chain(lambda h: h, 1, 2)
    assert seen == [other, own] and r.decode is own

    def failing(*args):
        raise RuntimeError("capture failed")
    monkeypatch.setattr(r, "_keep", failing)
    with pytest.raises(RuntimeError, match="capture failed"):
        r.warm_chain(lambda h: h, 1, 2, decode=other)
    assert r.decode is own


def test_fill_writes_the_cache_prefill_writes_in_calls_of_the_captured_lengths(pair):
    """A draft's prompt goes into its cache through its captured call lengths (on a CPU there are none: one call;
    here captured lengths of 2 and 4 are named so that the chunks run, eagerly), the last call padded past the
    prompt: every prompt position's K/V as the one-call prefill writes them, and the next call (which overwrites the
    padding's position) sees the same cache."""
    ids = torch.randint(3, VOCAB, (1, 14), generator=torch.Generator().manual_seed(4))
    whole, chunked = Runner(pair[1], 40), Runner(pair[1], 40)
    whole.prefill(ids[:, :13])
    chunked._graphs[("hidden", 4)] = chunked._graphs[("hidden", 2)] = None
    calls = []
    run = chunked._run
    chunked._run = lambda kind, x, start, graph: calls.append((x.shape[1], start, graph)) or run(kind, x, start, graph)
    chunked.fill(ids[:, :13])
    assert calls == [(4, 0, True), (4, 4, True), (4, 8, True), (2, 12, True)]      # the last one padded to 2
    torch.testing.assert_close(chunked.cache.k[..., :13, :], whole.cache.k[..., :13, :], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked.cache.v[..., :13, :], whole.cache.v[..., :13, :], rtol=1e-5, atol=1e-5)
    assert not torch.equal(chunked.cache.k[..., 13, :], whole.cache.k[..., 13, :])    # the padding's token 0 there
    torch.testing.assert_close(chunked.forward(ids[:, 13:], 13), whole.forward(ids[:, 13:], 13), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n, lengths, room, calls", [
    (13, {2, 4}, 40, [(0, 4), (4, 4), (8, 4), (12, 2)]),               # the rest padded to the shortest that holds it
    (124, {*range(1, 8), 64}, 200, [(0, 64), (64, 64)]),              # a 124-token prompt: two replays
    (70, {*range(1, 8), 64}, 80, [(0, 64), (64, 6)]),                 # a rest of 6 has its own length
    (13, {4}, 14, [(0, 4), (4, 4), (8, 4), (12, 1)]),                 # 12 + 4 > 14 positions: the rest eagerly
    (100, {7, 64}, 100, [(0, 64)] + [(s, 7) for s in range(64, 99, 7)] + [(99, 1)]),   # past 36: only 7 fits
    (5, set(), 40, [(0, 5)]),                                         # nothing captured (a CPU): one call
])
def test_fill_calls_cover_the_prompt_once_within_the_cache(n, lengths, room, calls):
    assert fill_calls(n, lengths, room) == calls


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_draft_filled_in_chunks_keeps_speculative_output_greedy(pair, heads, baselines, schedule):
    draft = draft_of(pair[1], heads["flash_2"], DRAFT_D)
    draft.runner._graphs[("hidden", 3)] = None                      # a captured length of 3: 30 tokens in 10 calls
    res = generate_speculative(target_of(pair), draft, Request(prompt_of(30), MAX_NEW, schedule, 4))
    assert res.tokens == baselines[30].tokens


@pytest.mark.parametrize("k", [1, 4])
def test_deferred_rounds_launch_the_next_block_ahead_and_keep_greedy_output(pair, heads, baselines, k, monkeypatch):
    """Deferred greedy rounds of a plain draft launch the next round's block before the verify result is read
    (fed the last accepted token again and the final token, at a position counted on the device): most rounds use
    it, none is launched and thrown away, and the output is still the target's greedy output; the other schedules
    never launch ahead."""
    not_ahead = type("NotAhead", (Draft,), {"per_round": True})        # chooses per round: no launch ahead
    on_cpu = generate_speculative(target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                  Request(prompt_of(7), MAX_NEW, "deferred", k))
    assert on_cpu.launched_ahead == 0                                  # a CPU only moves the block earlier: off
    monkeypatch.setattr(rounds, "AHEAD_DEVICES", ("cuda", "cpu"))
    for n in PROMPT_LENS:
        draft = draft_of(pair[1], heads["flash_2"], DRAFT_D)
        blocks, chain = [], draft.runner.chain
        draft.runner.chain = lambda *a: blocks.append(a[-1]) or chain(*a)
        res = generate_speculative(target_of(pair), draft, Request(prompt_of(n), MAX_NEW, "deferred", k))
        del draft.runner.chain
        assert res.tokens == baselines[n].tokens, f"prompt length {n}"
        # without graphs the rule proposes step by step: every chain call is a block launched ahead
        assert not draft.chained and len(blocks) == res.launched_ahead, "a block launched ahead and not used"
        assert res.rounds - 3 <= res.launched_ahead < res.rounds       # not the first round, nor the last one or two
        plain = generate_speculative(target_of(pair), not_ahead(draft.runner, draft.head),
                                     Request(prompt_of(n), MAX_NEW, "deferred", k))
        assert plain.launched_ahead == 0 and plain.accepted_lengths == res.accepted_lengths   # the same proposals
        ordinary = generate_speculative(target_of(pair), draft, Request(prompt_of(n), MAX_NEW, "ordinary", k))
        assert ordinary.launched_ahead == 0


@pytest.mark.parametrize("k", [1, 4])
def test_ordinary_rounds_launch_the_append_ahead_and_keep_greedy_output(pair, heads, baselines, k, monkeypatch):
    """Ordinary greedy rounds on a GPU launch the final token's append, at a position counted on the device, before
    the host reads the verify result: every verified round but a last one does, the target makes the same calls as
    appending from the host, the output is the target's greedy output, and the append is timed as the finalize
    phase, after the verify phase has ended; stop tokens still stop it where greedy decoding stops."""
    host_appends = {n: generate_speculative(target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                            Request(prompt_of(n), MAX_NEW, "ordinary", k)) for n in PROMPT_LENS}
    assert all(r.appended_ahead == 0 for r in host_appends.values())  # a CPU: off
    monkeypatch.setattr(rounds, "AHEAD_DEVICES", ("cuda", "cpu"))
    for n in PROMPT_LENS:
        target = target_of(pair)
        starts, greedy = [], target.runner.greedy
        target.runner.greedy = lambda ids, start, *a: starts.append(start) or greedy(ids, start, *a)
        res = generate_speculative(target, draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                   Request(prompt_of(n), MAX_NEW, "ordinary", k))
        assert res.tokens == baselines[n].tokens, f"prompt length {n}"
        assert res.verify_calls - 1 <= res.appended_ahead <= res.verify_calls and res.appended_ahead > 0
        assert res.accepted_lengths == host_appends[n].accepted_lengths
        assert res.append_calls == host_appends[n].append_calls and res.launched_ahead == 0
        device_starts = [int(t) for t in starts if isinstance(t, torch.Tensor)]   # launched ahead: 0-dim tensors
        assert len(device_starts) == res.appended_ahead and all(n <= t < MAX_LEN for t in device_starts)
    target, clock, calls = target_of(pair), Tape("cpu"), []
    target.runner.clock, greedy = clock, target.runner.greedy
    target.runner.greedy = lambda ids, start, *a: (isinstance(start, torch.Tensor) and calls.append(clock.mark())
                                                    or greedy(ids, start, *a))
    res = generate_speculative(target, draft_of(pair[1], heads["flash_2"], DRAFT_D),
                               Request(prompt_of(7), MAX_NEW, "ordinary", k))
    inside = lambda t, name: any(a < t < b for a, b in clock.spans[name])
    assert len(calls) == res.appended_ahead > 0
    assert all(inside(t, "finalize") and not inside(t, "verify") for t in calls)
    base = baselines[30].tokens
    for i in range(4, 12):              # an append launched in the round a stop token ends is thrown away, uncounted
        res = generate_speculative(target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                   Request(prompt_of(30), MAX_NEW, "ordinary", k, frozenset({base[i]})))
        assert res.tokens == base[:base.index(base[i]) + 1] and res.stopped
        assert res.append_calls == res.rounds, f"stop token at {i}"
    for schedule in ("deferred", "pipelined"):
        other = generate_speculative(target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D),
                                     Request(prompt_of(7), MAX_NEW, schedule, k))
        assert other.appended_ahead == 0


def test_a_block_launched_ahead_is_timed_in_the_draft_phase_not_the_verify(pair, heads, monkeypatch):
    """The verify phase ends where the block launched ahead begins, and the block is timed as the next round's draft
    phase, as a block proposed in its own round is: a deferred run's phase shares mean the same either way."""
    monkeypatch.setattr(rounds, "AHEAD_DEVICES", ("cuda", "cpu"))

    target, draft, clock = target_of(pair), draft_of(pair[1], heads["flash_2"], DRAFT_D), Tape("cpu")
    target.runner.clock, calls, chain = clock, [], draft.runner.chain
    draft.runner.chain = lambda *a: calls.append(clock.mark()) or chain(*a)
    res = generate_speculative(target, draft, Request(prompt_of(7), MAX_NEW, "deferred", 4))
    inside = lambda t, name: any(a < t < b for a, b in clock.spans[name])
    assert res.launched_ahead > 0 and len(calls) == res.launched_ahead
    assert all(inside(t, "draft") and not inside(t, "verify") for t in calls)
    assert res.spans_ms["verify"] > 0 and len(clock.spans["verify"]) == res.rounds


def test_a_captured_call_is_replayed_with_its_start_from_the_host_or_the_device():
    """Runner's graph replay sets the captured inputs: ids copied, start filled from a host int or copied from a 0-dim
    device tensor (a position counted on the device, never read by the host), then one replay."""
    class Graph:
        replays = 0

        def replay(self):
            Graph.replays += 1

    g = dict(ids=torch.zeros(1, 2, dtype=torch.long), start=torch.zeros((), dtype=torch.long), graph=Graph(),
             out=torch.ones(2))
    assert _replay(g, torch.tensor([[5, 6]]), 7) is g["out"] and g["start"].item() == 7 and Graph.replays == 1
    assert g["ids"].tolist() == [[5, 6]]
    _replay(g, torch.tensor([[8, 9]]), torch.tensor(11))
    assert g["start"].item() == 11 and g["ids"].tolist() == [[8, 9]] and Graph.replays == 2


def test_warming_the_prefill_runs_each_length_once_and_changes_no_output(pair, heads, baselines, monkeypatch):
    """Runner.warm_prefill (run on CUDA before timed prefills) calls the eager prefill once per distinct length,
    and what it writes to the cache changes no later generation."""
    from lib.engine import runner as runner_mod
    monkeypatch.setattr(runner_mod, "WARM_DEVICES", ("cuda", "cpu"))
    target = target_of(pair)
    draft = draft_of(pair[1], heads["flash_2"], DRAFT_D)
    calls = []
    run = target.runner._run
    monkeypatch.setattr(target.runner, "_run", lambda kind, ids, start, graph: calls.append(ids.shape[1]) or
                        run(kind, ids, start, graph))
    target.runner.warm_prefill([30, 7, 30, 1])
    assert calls == [1, 7, 30]
    assert generate_baseline(target, Request(prompt_of(7), MAX_NEW)).tokens == baselines[7].tokens
    target.runner.warm_prefill([1, 30])
    spec = generate_speculative(target, draft, Request(prompt_of(30), MAX_NEW, "deferred", 4))
    assert spec.tokens == baselines[30].tokens


def test_warming_the_prefill_is_a_no_op_on_a_cpu(pair):
    target = target_of(pair)
    before = target.runner.cache.k.clone()
    target.runner.warm_prefill([7, 30])
    assert torch.equal(target.runner.cache.k, before)


class _Timed(Exception):
    """Raised by a stand-in for the first timed (or warm-up) generation of a study."""


@pytest.mark.parametrize("study", ["e2e", "sampling"])
def test_the_studies_warm_the_prefill_at_every_prompt_length_before_any_generation(study, monkeypatch, tmp_path):
    """The e2e run and the sampling study prefill once at each prompt length before their first generation, so
    that a kernel built on first use never lands in a timed TTFT (one sample of every GPU e2e run had 1-2.4 s)."""
    from types import SimpleNamespace
    from lib import config
    from lib.study import runs, sampling as sampling_study
    seen = []
    target = SimpleNamespace(runner=SimpleNamespace(warm_prefill=lambda lengths: seen.append(sorted(lengths))))

    def generation(*_):
        seen.append("generation")
        raise _Timed
    enc = [(None, [5] * 9), (None, [6] * 4), (None, [7] * 9)]
    profile = config.load_profile("smoke")
    with pytest.raises(_Timed):
        if study == "e2e":
            monkeypatch.setattr(runs, "generate", generation)
            runs.run_samples(profile, tmp_path, (target, {}, frozenset(), None), enc, [(0, 0, "baseline", None, None)],
                             progress=False)
        else:
            monkeypatch.setattr(sampling_study, "sample_once", generation)
            sampling_study.run(profile, target, {}, enc, frozenset())
    assert seen == [[4, 9, 9], "generation"]
