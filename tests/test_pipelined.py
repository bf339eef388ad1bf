"""The pipelined ordinary schedule (thesis 3.6.1) emits the same tokens with the same counters as
the serial ordinary schedule: only the timing of the target append changes. So does speculative sampling at
the same seed (the append draws nothing, so every draw happens in the same order). And every schedule of the
one round loop emits greedy decoding."""
import pytest
import torch

from lib import modes
from lib.engine import heads, speculative as sp
from lib.engine.blocks import GrowK
from lib.engine.runner import Acceleration
from lib.models.build import make_draft, make_target

FIELDS = ("tokens", "rounds", "proposed", "accepted", "verify_calls", "append_calls", "skipped", "accepted_lengths")


@pytest.fixture(scope="module")
def engines(pair, draft_clustering):
    target, draft = pair
    W, cents, assign = draft_clustering
    flash = heads.FlashHead(W, cents, assign, 2, [0])                      # few probes: differs from dense
    mk = lambda head: make_draft(draft, head, 96)
    return make_target(target, 96), {"dense": mk(heads.DenseHead(W)), "flash": mk(flash)}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_pipelined_equals_serial_ordinary(engines, k, head):
    target, drafts = engines
    for prompt in ([5, 17, 200, 33], list(range(40, 71))):
        serial = sp.generate_speculative(target, drafts[head], sp.Request(prompt, 20, "ordinary", k))
        piped = sp.generate_speculative(target, drafts[head], sp.Request(prompt, 20, "pipelined", k))
        assert serial.tokens == sp.generate_baseline(target, sp.Request(prompt, 20)).tokens
        for f in FIELDS:
            assert getattr(piped, f) == getattr(serial, f), f
        assert piped.spans_ms["finalize"] > 0                              # the append ran, on the worker


PROMPTS = ([5, 17, 200, 33], list(range(40, 71)))


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_pipelined_sampling_equals_ordinary_sampling_at_the_same_seed(engines, head, temperature, top_p):
    target, drafts = engines
    for prompt in PROMPTS:
        for seed in range(3):
            run = lambda schedule: sp.generate_speculative(target, drafts[head], sp.Request(
                prompt, 20, schedule, 3, temperature=temperature, top_p=top_p, seed=seed))
            serial, piped = run("ordinary"), run("pipelined")
            for f in FIELDS:
                assert getattr(piped, f) == getattr(serial, f), (f, seed)
            assert piped.spans_ms["finalize"] > 0


@pytest.mark.parametrize("schedule", list(modes.SCHEDULES))
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_every_schedule_emits_greedy_decoding(engines, head, schedule):
    target, drafts = engines
    for prompt in PROMPTS:
        want = sp.generate_baseline(target, sp.Request(prompt, 20)).tokens
        for k in (lambda: 1, lambda: 4, lambda: GrowK(2, 6)):             # fixed K and a block policy
            res = sp.generate_speculative(target, drafts[head], sp.Request(prompt, 20, schedule, k()))
            assert res.tokens == want, (schedule, head, res.block_lengths)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams need a GPU")


def gpu_engines(syn, draft_device: str):
    """The target on cuda:0 and the drafts on draft_device with CUDA graphs, none captured yet (each is captured
    at its first call)."""
    from lib.models import clustering as cl
    from lib.models.synthetic import make_pair
    target, draft = make_pair(syn, 0, "float32", "cuda:0")
    draft.to(draft_device)
    W, graphs = draft.get_output_embeddings().weight.detach(), Acceleration(graphs=True)
    assign = cl.spherical_kmeans(W.cpu(), 64, 8, seed=0, equal=True, candidates=8, progress=False)
    cents = cl.centroids_of(cl.unit(W.cpu().float()), assign, 64)
    flash = heads.FlashHead(W, cents.to(draft_device), assign.to(draft_device), 2, [0])
    mk = lambda head: make_draft(draft, head, 96, graphs)
    return make_target(target, 96, graphs), {"dense": mk(heads.DenseHead(W)), "flash": mk(flash)}


@pytest.fixture(scope="module")
def cuda_engines(syn):
    return gpu_engines(syn, "cuda:0")


@CUDA
def test_a_graph_captured_mid_generation_leaves_the_cache_as_it_was(cuda_engines):
    runner = cuda_engines[0].runner
    runner.prefill(torch.arange(5, 25, device="cuda")[None])
    k, v = runner.cache.k.clone(), runner.cache.v.clone()
    runner.warm("hidden", [7])                                           # capturing runs the call at position 0
    assert torch.equal(runner.cache.k, k) and torch.equal(runner.cache.v, v)


@CUDA
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_pipelined_sampling_on_a_gpu_equals_ordinary_sampling(cuda_engines, head):
    # The pipelined append runs on its own CUDA stream; graphs are captured on first use, inside these runs.
    target, drafts = cuda_engines
    for prompt in PROMPTS:
        for seed in range(3):
            run = lambda schedule: sp.generate_speculative(target, drafts[head], sp.Request(
                prompt, 20, schedule, 3, temperature=1.0, seed=seed))
            piped, serial = run("pipelined"), run("ordinary")
            for f in FIELDS:
                assert getattr(piped, f) == getattr(serial, f), (f, seed)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="the thesis's placement needs two GPUs")
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_with_the_draft_on_a_second_gpu_every_schedule_emits_greedy_decoding(syn, head):
    # The thesis's placement (the two_gpu profiles): tokens cross between the GPUs every round, and the pipelined
    # schedule appends on cuda:0 while cuda:1 proposes; it must still equal the serial ordinary schedule.
    target, drafts = gpu_engines(syn, "cuda:1")
    assert drafts[head].runner.cache.k.device == torch.device("cuda:1")
    for prompt in PROMPTS:
        want = sp.generate_baseline(target, sp.Request(prompt, 20)).tokens
        runs = {s: sp.generate_speculative(target, drafts[head], sp.Request(prompt, 20, s, 3)) for s in modes.SCHEDULES}
        assert all(r.tokens == want for r in runs.values()), {s: r.tokens for s, r in runs.items()}
        for f in FIELDS:
            assert getattr(runs[modes.PIPELINED], f) == getattr(runs[modes.ORDINARY], f), f
