"""The Triton heads on a CUDA GPU, where a launch's programs run at once (FlashHead's overflow path: a ticket and a
flag; programmatic dependent launch on Hopper): the exact-integer cases of tests/test_kernels.py in fp32, bf16 and
fp16, every path of the plan hit. Skipped without a GPU (CI) and where Triton was imported under the interpreter (run
this file alone then)."""
import os

import pytest
import torch

if not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("needs a CUDA GPU and compiled (not interpreted) Triton", allow_module_level=True)
pytest.importorskip("triton")
import lib.engine.flash_kernels as F  # noqa: E402
import lib.engine.kernels as K  # noqa: E402
from flash_cases import check_dense_in_16_bits, flash_ref, ints, problem  # noqa: E402
from lib.bench import capture  # noqa: E402
from widen_cases import check_widen  # noqa: E402

if K.interpreted(K._dense_argmax):
    pytest.skip("Triton was imported under the interpreter: run this file alone", allow_module_level=True)

DEV = torch.device("cuda")
PATHS = {"short sort": dict(S=64), "S-wide sort": dict(S=64), "overflow": dict(S=2, TF=8, T=2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(3))
def test_flash_is_exact_on_every_path(seed, dtype):
    """Random integer centroids (the P-th score's bin holds few: the short sort), equal ones (all 37 in one bin:
    the sort over S slots) and a slab of 2 (overflow: the first program selects, the others wait); then the
    scratch is clean."""
    g, W, cents, c2t_ext = problem(seed)
    c, overflowed = cents.shape[0], set()
    for path, cfg in PATHS.items():
        cs = torch.ones_like(cents) if path == "S-wide sort" else cents
        for p in (1, 2, 5, 16, 36, c):
            h = ints(g, 1, W.shape[1])
            want = flash_ref(h, W, cs, c2t_ext, p).item()
            got = F.flash_greedy_triton(h.to(DEV, dtype), W.to(DEV, dtype), cs.to(DEV, dtype), c2t_ext.to(DEV), p,
                                        **cfg)
            plan = K.scratch(DEV, c, cfg["S"])["plan"].tolist()
            assert got.item() == want, (path, p, plan)
            overflowed.add((path, plan[3]))
            if path == "S-wide sort":
                assert plan[2] == c                                       # all in one bin, sorted in the slab
    assert overflowed == {("short sort", 0), ("S-wide sort", 0), ("overflow", 0), ("overflow", 1)}
    for S in (64, 2):
        s = K.scratch(DEV, c, S)
        assert s["ctl"].eq(0).all() and s["hist"].eq(0).all() and s["best"].item() == -2 ** 63


def test_flash_many_programs_and_ties():
    """600 clusters of 3-valued scores (large tied bins) at 64 and 128 probes, the launch settings' defaults."""
    g = torch.Generator().manual_seed(5)
    c, b, d = 600, 4, 8
    W, cents = ints(g, c * b, d), ints(g, c, d, lo=-1, hi=1)
    c2t_ext = torch.cat([torch.randperm(c * b, generator=g).view(c, b), torch.full((1, b), -1)]).contiguous()
    for p in (64, 128):
        for _ in range(4):
            h = ints(g, 1, d)
            got = F.flash_greedy_triton(h.to(DEV), W.to(DEV), cents.to(DEV), c2t_ext.to(DEV), p)
            assert got.item() == flash_ref(h, W, cents, c2t_ext, p).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batched_flash_is_each_rows_choice_on_the_gpu(dtype):
    """flash_batch_triton on a GPU, where a batch's programs fold into best[r] concurrently: each row's flash_ref
    token (3-valued centroid scores: many ties) at every batch size and probe count, replayed from a CUDA graph
    too."""
    g = torch.Generator().manual_seed(11)
    c, b, d = 600, 4, 8
    W, cents = ints(g, c * b, d), ints(g, c, d, lo=-1, hi=1)
    c2t_ext = torch.cat([torch.randperm(c * b, generator=g).view(c, b), torch.tensor([[3, 70, -1, -1]])]).contiguous()
    args = (W.to(DEV, dtype), cents.to(DEV, dtype), c2t_ext.to(DEV))
    for n in (1, 7, 64):
        h = ints(g, n, d)
        for p in (1, 16, 128):
            want = [flash_ref(h[r:r + 1], W, cents, c2t_ext, p).item() for r in range(n)]
            assert F.flash_batch_triton(h.to(DEV, dtype), *args, p).tolist() == want, (n, p)
    x = h.to(DEV, dtype)
    graph, out = capture(lambda: F.flash_batch_triton(x, *args, 16))
    x.copy_(ints(g, 64, d).to(DEV, dtype))
    graph.replay()
    assert out.tolist() == [flash_ref(x[r:r + 1].float().cpu(), W, cents, c2t_ext, 16).item() for r in range(64)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_special_tokens_over_several_rows_on_the_gpu(dtype):
    """26 special tokens (Qwen3's count) over b = 4: seven rows below the clusters, each scored on every call by the
    one-state kernel (fast and overflow paths) and the batched one, whose programs fold concurrently here."""
    specials = tuple(range(100, 126))
    g, W, cents, c2t_ext = problem(6, specials=specials)
    assert c2t_ext.shape[0] == cents.shape[0] + 7
    args = (W.to(DEV, dtype), cents.to(DEV, dtype), c2t_ext.to(DEV))
    for p in (1, 5, 36):
        for cfg in (PATHS["short sort"], PATHS["overflow"]):
            h = ints(g, 1, W.shape[1])
            assert F.flash_greedy_triton(h.to(DEV, dtype), *args, p, **cfg).item() == flash_ref(h, W, cents, c2t_ext,
                                                                                                 p).item(), (p, cfg)
        h = ints(g, 9, W.shape[1])
        want = [flash_ref(h[r:r + 1], W, cents, c2t_ext, p).item() for r in range(9)]
        assert F.flash_batch_triton(h.to(DEV, dtype), *args, p).tolist() == want, p


def test_dense_is_argmax_smallest_id_on_the_gpu():
    g = torch.Generator().manual_seed(2)
    W = ints(g, 5000, 64)
    W[4000] = W[17]                                                             # a planted tie
    for _ in range(4):
        h = ints(g, 1, 64)
        logits = W.double() @ h[0].double()
        best = (logits == logits.max()).nonzero().flatten()
        assert K.dense_greedy_triton(h.to(DEV, torch.bfloat16), W.to(DEV, torch.bfloat16)).item() == best.min().item()


@pytest.mark.parametrize("scale", [1.0, 2.0 ** -24])
def test_dense_in_fp16_on_the_gpu(scale):
    """fp16 weights (the h100awq drafts' dtype), subnormal ones too, lose no product on the GPU (bf16: above)."""
    check_dense_in_16_bits(DEV, torch.float16, scale)


@pytest.mark.parametrize("rows", [None, 1, 2, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_rows_are_the_same_bits_at_any_index_and_length_on_the_gpu(dtype, rows, monkeypatch):
    """lib/engine/layer_attention.py at the 32B target's heads (64 over 8, head_dim 128), 8 rows crossing a split,
    as in this 3-split cache (rows None) or as in a long one with 1, 2 or 8 rows a program (a 16-, 16- or 64-row
    query tile): each row bitwise itself alone and in reverse order, and SDPA over the masked cache to the dtype's
    rounding; 1 and 2 rows a program are the short cache's bits."""
    import torch.nn.functional as TF
    from lib.engine import layer_attention
    from lib.engine.layer_attention import cached_attention
    short = None
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 64, 8, 128, generator=g).to(DEV, dtype)
    k, v = (torch.randn(1, 8, 600, 128, generator=g).to(DEV, dtype) for _ in range(2))
    pos = torch.arange(252, 260, device=DEV)
    if rows:
        short = cached_attention(q, k, v, pos)
        monkeypatch.setattr(layer_attention, "LONG", 0)
        monkeypatch.setattr(layer_attention, "ROWS", rows)
    whole = cached_attention(q, k, v, pos)
    assert torch.equal(cached_attention(q.flip(2), k, v, pos.flip(0)), whole.flip(1))
    for r in range(8):
        assert torch.equal(cached_attention(q[:, :, r:r + 1], k, v, pos[r:r + 1])[:, 0], whole[:, r])
    if rows in (1, 2):
        assert torch.equal(whole, short)
    mask = torch.arange(600, device=DEV)[None, :] <= pos[:, None]
    want = TF.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    torch.testing.assert_close(whole.float(), want.float(), rtol=0, atol=2e-2 if dtype == torch.bfloat16 else 2e-3)


def test_a_compiled_target_captures_its_graphs_with_grad_mode_on(pair):
    """The Triton layer ops have no backward: warm() (outside the runner's no_grad calls) must capture without
    autograd tracing them, and the graphed verify call must equal the eager one."""
    import copy
    from lib.engine.runner import Acceleration, Runner
    target = copy.deepcopy(pair[0]).to(DEV, torch.float16)
    fast = Runner(target, 64, Acceleration(graphs=True, compile=True, rows=4, triton_layers=True))
    assert fast.layer_path == "triton" and torch.is_grad_enabled()
    fast.warm("hidden", [4])
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(1)).to(DEV)
    fast.prefill(ids[:, :8])
    graphed = fast.forward(ids[:, 8:12], 8)
    torch.testing.assert_close(graphed, fast.forward(ids[:, 8:12], 8, graph=False), rtol=1e-2, atol=1e-2)


def test_fill_replays_the_captured_graphs_and_writes_the_cache_prefill_writes(pair):
    """A draft's prompt through its captured call lengths (Runner.fill; 13 tokens as 8 and 5 padded to 8): the K/V of
    every prompt position as the eager one-call prefill writes them, to fp16 rounding of compiled code, and no new
    graph captured."""
    import copy
    from lib.engine.runner import Acceleration, Runner
    model = copy.deepcopy(pair[0]).to(DEV, torch.float16)
    graphed = Runner(model, 64, Acceleration(graphs=True, compile=True, triton_layers=True))
    eager = Runner(model, 64)
    graphed.warm("hidden", [3, 8])
    captured = set(graphed._graphs)
    ids = torch.randint(3, 500, (1, 13), generator=torch.Generator().manual_seed(5)).to(DEV)
    graphed.fill(ids)
    eager.prefill(ids)
    assert set(graphed._graphs) == captured
    for a, b in ((graphed.cache.k, eager.cache.k), (graphed.cache.v, eager.cache.v)):
        torch.testing.assert_close(a[..., :13, :], b[..., :13, :], rtol=1e-2, atol=1e-2)


def test_a_prefill_at_a_warmed_length_builds_no_kernel(pair):
    """Runner.warm_prefill before the timed prefills: afterwards a prefill (greedy, or sampling's hidden states) at
    each warmed length compiles no Triton kernel (a new length class did, inside a timed TTFT, before)."""
    import copy
    import triton
    from lib.engine.runner import Acceleration, Runner
    knobs = getattr(getattr(triton, "knobs", None), "runtime", None)
    if knobs is None or not hasattr(knobs, "jit_post_compile_hook"):
        pytest.skip("this Triton has no compile hook")
    model = copy.deepcopy(pair[0]).to(DEV, torch.float16)
    runner = Runner(model, 128, Acceleration(graphs=True, rows=4, triton_layers=True))
    assert runner.layer_path == "triton"
    lengths = [3, 17, 48, 96]                                  # 48: a multiple of 16; 96: past the Triton layer rows
    runner.warm_prefill(lengths)
    built, hook = [], knobs.jit_post_compile_hook
    knobs.jit_post_compile_hook = lambda *a, **kw: built.append(kw.get("fn") or a)
    try:
        for n in lengths:
            ids = torch.randint(3, 500, (1, n), generator=torch.Generator().manual_seed(n)).to(DEV)
            runner.prefill(ids)
            runner.forward(ids, 0, graph=False)
    finally:
        knobs.jit_post_compile_hook = hook
    assert built == []


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_w4a16_compiled_is_exact_and_batch_invariant(dtype):
    """The W4A16 kernel's compiled path (inline-PTX int4 -> float, one K = 128 dot a K-block; the interpreter runs
    integer arithmetic instead): within fp32 accumulation of x @ dequantize(W), and a row of a 9-row call is
    bitwise that row alone, with and without split-K."""
    from lib.models.w4a16 import Tiles, dequantize, pack_awq, w4a16_matmul
    from lib.study.int4_kernels import random_awq
    torch.manual_seed(7)
    K, N = 1024, 320
    qweight, qzeros, scales = random_awq(K, N, DEV)
    w = pack_awq(qweight, qzeros, scales.to(dtype))
    x = torch.randn(9, K, device=DEV, dtype=dtype)
    ref = x.float() @ dequantize(w)
    for tiles in (Tiles(), Tiles(split_k=1), Tiles(block_n=128, split_k=3)):
        y32 = w4a16_matmul(x, w, tiles, out_dtype=torch.float32)
        assert ((y32 - ref).norm() / ref.norm()).item() <= 1e-5
        assert torch.equal(w4a16_matmul(x, w, tiles), y32.to(dtype))         # the fp32 sum, rounded once
        assert torch.equal(w4a16_matmul(x[4:5], w, tiles), w4a16_matmul(x, w, tiles)[4:5])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_w4a16_mma_is_exact_batch_invariant_and_graphed(dtype):
    """The mma W4A16 kernel (lib/models/w4a16_mma.cu, sm_90): within fp32 accumulation of x @ dequantize(W) (the
    output rounded once, after the residual); a row of a 20-row call (blocks of two row tiles of 8) bitwise the row
    alone (one tile), in a 12-row call and in a graph; Int4Linear on this GPU takes it and says so."""
    from lib.models import w4a16_mma as MM
    from lib.models.int4_linear import Int4Linear, kernel_for
    from lib.models.w4a16 import codes, pack_awq
    from lib.study.int4_kernels import random_awq
    if MM.supported(DEV):
        pytest.skip(f"the mma kernel cannot run here: {MM.supported(DEV)}")
    torch.manual_seed(8)
    K, N = 1024, 640
    qweight, qzeros, scales = random_awq(K, N, DEV)
    packed = pack_awq(qweight, qzeros, scales.to(dtype))
    w = MM.pack(codes(packed), packed.groups)
    x, res = torch.randn(20, K, device=DEV, dtype=dtype), torch.randn(20, N, device=DEV, dtype=dtype)
    ref = x.float() @ MM.dequantize(w, dtype)
    y = MM.mma_matmul(x, w)
    assert ((y.float() - ref).norm() / ref.norm()).item() <= (1e-3 if dtype == torch.float16 else 4e-3)
    assert ((MM.mma_matmul(x, w, res).float() - (ref + res.float())).norm() / ref.norm()).item() <= 4e-3
    for r in (0, 7, 8, 19):
        assert torch.equal(MM.mma_matmul(x[r:r + 1], w), y[r:r + 1])
    assert torch.equal(MM.mma_matmul(x[:12], w), y[:12])
    g, out = capture(lambda: MM.mma_matmul(x[:8], w))
    g.replay()
    assert torch.equal(out, y[:8])
    assert kernel_for(DEV) == ("mma", "mma.sync (CUDA, sm_90)")

    class Awq(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qweight, self.qzeros, self.scales, self.group_size, self.bias = qweight, qzeros, scales, 128, None

    assert Int4Linear.from_awq(Awq()).kernel == "mma"


@pytest.mark.parametrize("kernel", ["mma", "triton"])
def test_int4_projections_fused_side_by_side_still_compute_their_own_outputs(kernel):
    """Int4Linear.concat leaves each projection a view of the fused tensors: called alone (as the model's own forward
    calls q, k, v: Hugging Face's generate in the peers study) each gives what it gave before, bitwise. The mma
    kernel had read a view's groups rows N apart (h100awq's HF peers left the engine's tokens at the 8th new token:
    hidden states 34 % apart after layer 0). The fused call gives them side by side."""
    from lib.models import w4a16_mma as MM
    from lib.models.int4_linear import Int4Linear
    from lib.study.int4_kernels import random_awq
    if kernel == "mma" and MM.supported(DEV):
        pytest.skip(f"the mma kernel cannot run here: {MM.supported(DEV)}")
    torch.manual_seed(9)
    K = 512

    class Awq(torch.nn.Module):
        def __init__(self, N):
            super().__init__()
            self.qweight, self.qzeros, self.scales = random_awq(K, N, DEV)
            self.group_size, self.bias = 128, None

    mods = [Int4Linear.from_awq(Awq(N), kernel) for N in (256, 64, 64)]
    x = torch.randn(3, K, device=DEV, dtype=torch.float16)
    alone = [m(x) for m in mods]
    fused = Int4Linear.concat(mods)
    for m, y in zip(mods, alone):
        assert torch.equal(m(x), y)
    torch.testing.assert_close(fused(x), torch.cat(alone, dim=1), rtol=2e-3, atol=2e-3)    # its own split of K


def test_rope_cache_on_the_gpu(pair):
    """q/k norms, RoPE and the cache write in one kernel, against the torch path (fp16)."""
    import copy
    from lib.engine import layer_kernels
    from lib.engine.layer import fuse_projections, rope_cache
    layer = copy.deepcopy(pair[0].model.layers[0]).to(DEV, torch.float16)
    fused, att = fuse_projections(layer), layer.self_attn
    hd, hkv = att.head_dim, att.config.num_key_value_heads
    h, pos = torch.randn(1, 8, att.config.hidden_size, device=DEV, dtype=torch.float16), torch.arange(20, 28, device=DEV)
    cos, sin = torch.randn(8, hd, device=DEV, dtype=torch.float16), torch.randn(8, hd, device=DEV, dtype=torch.float16)
    caches = [[torch.zeros(1, hkv, 40, hd, device=DEV, dtype=torch.float16) for _ in "kv"] for _ in "ab"]
    want = rope_cache(att, fused, h, cos, sin, caches[0], pos)
    got = layer_kernels.TritonLayer.rope_cache(att, h @ fused["qkv"].T, cos, sin, caches[1], pos)
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
    for a, b in zip(*caches):
        torch.testing.assert_close(b, a, rtol=2e-2, atol=2e-2)


def _fused_runners(pair, seed):
    """Two fused fp16 runners of the draft, each prefilled with the first 40 of 60 random ids (returned too)."""
    import copy
    from lib.engine.runner import Acceleration, Runner
    model = copy.deepcopy(pair[1]).to(DEV, torch.float16)
    a, b = (Runner(model, 96, Acceleration(fused=True)) for _ in "ab")
    assert a.decode_path == "fused"
    ids = torch.randint(3, 200, (1, 60), generator=torch.Generator().manual_seed(seed)).to(DEV)
    for r in (a, b):
        r.prefill(ids[:, :40])
    return a, b, ids


def test_the_draft_attention_widens_an_fp16_tile_by_bit_moves_on_the_gpu():
    """The inline PTX of decode_attention._widen_bits (its _widen on a GPU): widen_cases.py's bits, each finite half."""
    check_widen(DEV)


def test_a_two_token_fused_step_is_two_single_steps_on_the_gpu(pair):
    """The fused draft step fed 2 tokens (each weight read once; the second token's attention launched during the
    first's, reading its cache entry after the wait): the bits of two 1-token steps, cache included (fp16)."""
    a, b, ids = _fused_runners(pair, 4)
    for p in range(40, 58, 2):                                       # across attention split boundaries
        both = a.forward(ids[:, p:p + 2], p, graph=False).clone()
        one = torch.cat([b.forward(ids[:, p + t:p + t + 1], p + t, graph=False).clone() for t in (0, 1)], dim=1)
        assert torch.equal(both, one), p
    assert torch.equal(a.cache.k, b.cache.k) and torch.equal(a.cache.v, b.cache.v)


def test_the_fused_steps_launch_settings_change_at_most_its_rounding_on_the_gpu(pair, monkeypatch):
    """The GEMVs' warps and the o-projection's late activation reads are launch settings: the step as it was before
    them (1-warp o, 2-warp down, every activation read at once after the wait) gives the same values up to fp16
    rounding, cache included (bitwise here; on the 0.6B shapes the 4-warp down projection sums K in another order,
    1-2 units in the last place in fp16)."""
    from lib.engine import decode as D
    a, b, ids = _fused_runners(pair, 5)
    monkeypatch.setattr(D, "LATE_ACTIVATIONS", set())
    b.decode = D.FusedDecode(b, warps=dict(D.GEMV_WARPS, o=1, down=2))      # prefill ran the reference path
    assert a.decode.late and not b.decode.late
    for p in range(40, 56):                                          # across an attention split boundary
        step = [r.forward(ids[:, p:p + 1], p, graph=False) for r in (a, b)]
        assert torch.allclose(*step, rtol=1e-2, atol=1e-2), p
    assert torch.allclose(a.cache.k, b.cache.k, rtol=1e-2, atol=1e-2)
    assert torch.allclose(a.cache.v, b.cache.v, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_speculative_output_is_greedy_output_with_graphs_on_the_gpu(pair, schedule):
    """The engine as GPU runs build it (CUDA graphs, the fused draft step, the Triton target layers, fp16): every
    schedule emits the target's greedy tokens; ordinary rounds launch their appends and deferred rounds their next
    block before the host reads the verify result (the position counted on the device)."""
    import copy
    from lib.engine.heads import DenseHead
    from lib.engine.runner import Acceleration
    from lib.engine.speculative import Request, generate_baseline, generate_speculative
    from lib.models.build import make_draft, make_target
    target_model, draft_model = (copy.deepcopy(m).to(DEV, torch.float16) for m in pair)
    target = make_target(target_model, 128, Acceleration(graphs=True, rows=8, triton_layers=True))
    draft = make_draft(draft_model, DenseHead(draft_model.get_output_embeddings().weight), 128,
                       Acceleration(graphs=True, fused=True))
    draft.warm(4)
    assert draft.chained and draft.runner.decode_path == "fused"
    for n in (1, 9, 30):
        prompt = torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(n)).tolist()
        want = generate_baseline(target, Request(prompt, 40)).tokens
        res = generate_speculative(target, draft, Request(prompt, 40, schedule, 4))
        assert res.tokens == want, n
        ordinary, deferred = schedule == "ordinary", schedule == "deferred"
        assert res.verify_calls - 1 <= res.appended_ahead <= res.verify_calls if ordinary else res.appended_ahead == 0
        assert res.rounds - 3 <= res.launched_ahead < res.rounds if deferred else res.launched_ahead == 0
