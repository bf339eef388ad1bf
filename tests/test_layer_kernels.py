"""The runner's Triton layer kernels (lib/engine/layer_kernels.py, layer_attention.py) on the CPU under Triton's
interpreter in float32: attention equal to SDPA over the whole cache with the causal mask to float32 rounding, across
splits, launched as in a short cache or a long one; a row's output bitwise the same at any row index and in a call
of any length (what batch-invariant target calls rest on); RMSNorm
with and without the residual add, and SiLU(gate) * up, equal to the model's modules; the runner says which path its
layers take and keeps speculative output equal to greedy output. Skipped where Triton is not installed (CI)."""
import copy

import pytest
import torch
import torch.nn.functional as F

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip()
from lib.engine import layer_attention, layer_kernels  # noqa: E402
from lib.engine import runner as runner_module  # noqa: E402
from lib.engine.runner import Acceleration, Runner  # noqa: E402
from lib.engine.speculative import Request, generate_baseline, generate_speculative  # noqa: E402
from lib.models.build import make_draft, make_target  # noqa: E402
from lib.engine.heads import DenseHead  # noqa: E402

HQ, HKV, HD, L = 6, 2, 32, 600                        # 3 query heads a KV head; 3 splits of layer_attention.SPLIT


def case(n: int, start: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HQ, n, HD, generator=g)
    k, v = torch.randn(1, HKV, L, HD, generator=g), torch.randn(1, HKV, L, HD, generator=g)
    return q, k, v, start + torch.arange(n)


@pytest.fixture(params=[None, 2, 8])
def rows(request, monkeypatch):
    """The attention's launch: None as in this 3-split cache (short: a program a row, its last program combining),
    or as in a long cache (layer_attention.LONG 0) with 2 or 8 rows a program (layer_attention.ROWS) and a
    kernel of their own combining the splits; at 3 query heads a KV head, 1 or 2 rows fill a 16-row query tile,
    8 a 32-row one."""
    if request.param:
        monkeypatch.setattr(layer_attention, "LONG", 0)
        monkeypatch.setattr(layer_attention, "ROWS", request.param)
    return request.param


@pytest.mark.parametrize("direct", [True, False])
def test_splits_combined_by_a_kernel_of_their_own_are_the_last_programs_bits(monkeypatch, direct):
    """A program a row either way: the long caches' combination kernel gives the short ones' bits."""
    monkeypatch.setattr(layer_attention, "ROWS", 1)
    for n, start, tiles in [(8, 252, {}), (2, 590, {"split": 8, "block": 8})]:      # 3 splits; 75 in 3 chunks
        q, k, v, pos = case(n, start, seed=4)
        monkeypatch.setattr(layer_attention, "LONG", 1000)
        last = layer_attention.cached_attention(q, k, v, pos, direct=direct, **tiles)
        monkeypatch.setattr(layer_attention, "LONG", 0)
        assert torch.equal(layer_attention.cached_attention(q, k, v, pos, direct=direct, **tiles), last)


def sdpa(q, k, v, pos):
    mask = torch.arange(k.shape[2])[None, :] <= pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("n, start", [(1, 0), (1, 255), (5, 252), (8, 400), (3, 597)])
def test_attention_is_sdpa_over_the_causal_positions(n, start, rows):
    q, k, v, pos = case(n, start)
    got = layer_attention.cached_attention(q, k, v, pos)
    assert got.shape == (1, n, HQ, HD)
    torch.testing.assert_close(got, sdpa(q, k, v, pos), rtol=1e-5, atol=1e-5)


def test_a_long_cache_combines_its_splits_in_chunks(monkeypatch):
    """75 splits of 8 positions: the combination reads them 32 at a time (kernels.COMBINE_CHUNK), 3 chunks."""
    q, k, v, pos = case(2, 590)
    got = layer_attention.cached_attention(q, k, v, pos, split=8, block=8)
    torch.testing.assert_close(got, sdpa(q, k, v, pos), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(layer_attention, "COMBINE_CHUNK", 128)               # one chunk: the same output
    torch.testing.assert_close(layer_attention.cached_attention(q, k, v, pos, split=8, block=8), got, rtol=1e-6,
                               atol=1e-6)


def test_a_row_is_the_same_bits_at_any_index_and_in_a_call_of_any_length(rows):
    """Rows a program takes share its query tile, each masked at its own position: a row's bits do not depend on
    its neighbours (rows 252-259 cross the first split's end, so some programs see rows on both sides of it)."""
    q, k, v, pos = case(8, 252, seed=1)
    whole = layer_attention.cached_attention(q, k, v, pos)
    flipped = layer_attention.cached_attention(q.flip(2), k, v, pos.flip(0))
    assert torch.equal(flipped, whole.flip(1))
    for r in (0, 3, 7):
        alone = layer_attention.cached_attention(q[:, :, r:r + 1], k, v, pos[r:r + 1])
        assert torch.equal(alone[:, 0], whole[:, r])


def test_two_rows_a_program_are_one_rows_bits_where_the_tile_keeps_its_shape(monkeypatch):
    """3 query heads a KV head: one row or two fill the same 16-row query tile, so the products are the same."""
    q, k, v, pos = case(8, 252, seed=1)
    monkeypatch.setattr(layer_attention, "LONG", 0)
    monkeypatch.setattr(layer_attention, "ROWS", 2)
    two = layer_attention.cached_attention(q, k, v, pos)
    monkeypatch.setattr(layer_attention, "ROWS", 1)
    assert torch.equal(two, layer_attention.cached_attention(q, k, v, pos))


@pytest.mark.parametrize("n, start", [(1, 0), (5, 100), (8, 250)])
def test_rows_in_the_first_split_written_directly_are_the_combined_bits(n, start, rows):
    q, k, v, pos = case(n, start, seed=2)
    direct = layer_attention.cached_attention(q, k, v, pos, direct=True)
    assert torch.equal(direct, layer_attention.cached_attention(q, k, v, pos, direct=False))


@pytest.mark.parametrize("direct", [True, False])
def test_a_padding_row_attends_nothing_and_leaves_the_other_rows_bits(direct, rows):
    """Rows at position -1 (a batch-invariant call's padding, runner.py): output zeros, no cache read; the real
    rows bitwise as in a call without them."""
    q, k, v, pos = case(4, 300, seed=3)
    padded = layer_attention.cached_attention(q, k, v, torch.tensor([300, 301, -1, -1]), direct=direct)
    assert not padded[:, 2:].any()
    got = layer_attention.cached_attention(q[:, :, :2], k, v, pos[:2], direct=direct)
    assert torch.equal(padded[:, :2], got)


def test_a_padded_call_marks_its_padding_rows_for_the_kernel(pair, monkeypatch):
    seen = []
    attend = layer_kernels.TritonLayer.attend
    monkeypatch.setattr(layer_kernels.TritonLayer, "attend", staticmethod(lambda *a: seen.append(a[3]) or attend(*a)))
    plain, padded = Runner(pair[0], 40), Runner(pair[0], 40, Acceleration(rows=5, triton_layers=True))
    ids = torch.randint(3, 500, (1, 14), generator=torch.Generator().manual_seed(7))
    for r in (plain, padded):
        r.prefill(ids[:, :12])
    got, want = padded.greedy(ids[:, 12:], 12), plain.greedy(ids[:, 12:], 12)
    assert torch.equal(seen[-1], torch.tensor([12, 13, -1, -1, -1])) and torch.equal(got, want)


def test_bad_shapes_say_what_is_wrong():
    q, k, v, pos = case(2, 10)
    with pytest.raises(ValueError, match="5 query heads over 2 KV heads"):
        layer_attention.cached_attention(q[:, :5], k, v, pos)
    with pytest.raises(ValueError, match="contiguous per KV head"):
        layer_attention.cached_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, pos)


@pytest.mark.parametrize("add", [False, True])
def test_rms_norm_is_the_models_module(pair, add):
    module = copy.deepcopy(pair[0].model.layers[0].post_attention_layernorm)          # not the shared model's
    module.weight.data.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(1, 7, module.weight.numel(), generator=g), torch.randn(1, 7, module.weight.numel(), generator=g)
    if add:
        s, h = layer_kernels.TritonLayer.add_norm(module, x, y)
        torch.testing.assert_close(s, x + y, rtol=0, atol=0)
    else:
        s, h = x, layer_kernels.TritonLayer.norm(module, x)
    torch.testing.assert_close(h, module(s), rtol=1e-6, atol=1e-6)


def test_silu_mul_is_the_models_activation_times_up_and_row_invariant(pair):
    mlp, kernels = pair[0].model.layers[0].mlp, layer_kernels.TritonLayer
    assert kernels.takes_activation(mlp)                                              # SiLU
    gu = 3 * torch.randn(1, 5, 2 * 3000, generator=torch.Generator().manual_seed(6))   # 3 column blocks, the last short
    g, u = gu.chunk(2, dim=-1)
    got = kernels.silu_mul(gu)
    torch.testing.assert_close(got, mlp.act_fn(g) * u, rtol=1e-6, atol=1e-6)
    assert torch.equal(kernels.silu_mul(gu[:, 3:4]), got[:, 3:4])
    relu = copy.deepcopy(mlp)
    relu.config = copy.copy(mlp.config)
    relu.config.hidden_act = "relu"
    assert not kernels.takes_activation(relu)                                         # another activation: torch


@pytest.mark.parametrize("qk_norm", [True, False], ids=["qwen3", "llama"])
def test_rope_cache_is_the_torch_path(pair, qk_norm):
    """q/k norms (Qwen3 only), RoPE and the cache write in one kernel: q as lib/engine/layer.py's torch path makes
    it, k and v written at the rows' positions and nowhere else."""
    from lib.engine.layer import fuse_projections, rope_cache
    layer = copy.deepcopy(pair[0].model.layers[0])
    fused, att = fuse_projections(layer), layer.self_attn
    if not qk_norm:
        del att.q_norm, att.k_norm
    cfg, hd = att.config, att.head_dim
    g = torch.Generator().manual_seed(7)
    h, pos = torch.randn(1, 3, cfg.hidden_size, generator=g), torch.tensor([9, 10, 11])
    cos, sin = torch.randn(3, hd, generator=g), torch.randn(3, hd, generator=g)
    caches = [[torch.randn(1, cfg.num_key_value_heads, 16, hd, generator=g) for _ in "kv"] for _ in "ab"]
    caches[1] = [c.clone() for c in caches[0]]
    want = rope_cache(att, fused, h, cos, sin, caches[0], pos)
    got = layer_kernels.TritonLayer.rope_cache(att, h @ fused["qkv"].T, cos, sin, caches[1], pos)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for a, b in zip(*caches):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
        assert torch.equal(b[:, :, :9], a[:, :, :9]) and torch.equal(b[:, :, 12:], a[:, :, 12:])


def test_the_runner_takes_the_kernels_where_it_can_and_says_so(pair):
    target, draft = pair
    plain, fast = Runner(target, 40), Runner(target, 40, Acceleration(triton_layers=True))
    assert plain.layer_path == "torch" and fast.layer_path == "triton"
    assert Runner(draft, 40, Acceleration(triton_layers=True)).layer_path.startswith("torch (head_dim 8")
    ids = torch.randint(3, 500, (20,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(fast.prefill(ids[None, :12]), plain.prefill(ids[None, :12]))
    for p in (12, 15):
        torch.testing.assert_close(fast.forward(ids[None, p:p + 3], p), plain.forward(ids[None, p:p + 3], p),
                                   rtol=1e-5, atol=1e-5)


def test_long_prefills_take_the_torch_layers(pair, monkeypatch):
    monkeypatch.setattr(runner_module, "TRITON_LAYER_ROWS", 8)
    calls = []
    attend = layer_kernels.TritonLayer.attend
    monkeypatch.setattr(layer_kernels.TritonLayer, "attend", staticmethod(lambda *a: calls.append(1) or attend(*a)))
    plain, fast = Runner(pair[0], 40), Runner(pair[0], 40, Acceleration(triton_layers=True))
    ids = torch.randint(3, 500, (1, 12), generator=torch.Generator().manual_seed(6))
    assert torch.equal(fast.prefill(ids), plain.prefill(ids)) and not calls     # 12 > 8 rows: SDPA, the modules
    fast.forward(ids[:, :3], 12)
    assert len(calls) == len(fast.layers)                                       # 3 rows: the kernels


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_a_target_attending_through_the_kernel_keeps_speculative_output_greedy(pair, schedule):
    accel = Acceleration(rows=5, triton_layers=True)                   # batch-invariant calls, as on a GPU
    target = make_target(pair[0], 120, accel)
    draft = make_draft(pair[1], DenseHead(pair[1].get_output_embeddings().weight), 120)
    prompt = tuple(torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist())
    greedy = generate_baseline(target, Request(prompt, 30)).tokens
    assert generate_speculative(target, draft, Request(prompt, 30, schedule, 4)).tokens == greedy
