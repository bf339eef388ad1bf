"""The W4A16 AWQ int4 matmul (lib/models/w4a16.py) against its torch reference, on the CPU under Triton's interpreter:
the repacked layout stands for the same weights as AWQ's, agreement with x @ dequantize(...) for 1, 3, 16 and 17
rows, tiles and split-K, a ragged N, batch invariance (a row of a 9- or 17-row call is bitwise the row alone),
concatenated projections, the Int4Linear module (on the CPU: the Triton kernel, saying why not the mma one) and the
one-line errors. Skipped where Triton is not installed (CI); the mma kernel's layout: tests/test_w4a16_mma.py."""
import pytest
import torch

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip()
from lib.models.int4_linear import Int4Linear  # noqa: E402
from lib.models.w4a16 import (Tiles, awq_codes, codes, concat, dequantize, pack_awq, split_plan,  # noqa: E402
                              w4a16_matmul)
from lib.models import quantize as Q  # noqa: E402


def random_awq(seed, K=256, N=64, dtype=torch.float16):
    """Random codes, zeros and scales in the AWQ GEMM layout (quantize.pack): (qweight, qzeros, scales)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(0, 16, (K // 128, N), generator=g)
    s = (torch.rand(K // 128, N, generator=g) * 0.02 + 0.001).to(dtype)
    return (Q.pack(q), Q.pack(z), s), g


def rel_err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def test_awq_nibble_order_and_round_trip():
    q = (torch.arange(32) % 8).repeat(3, 1)                       # column c holds the code c % 8
    assert (Q.pack(q) == 0x75316420).all()                        # nibble j holds column AWQ_ORDER[j] = 0,2,4,6,1,3,5,7
    codes = torch.randint(0, 16, (16, 40), generator=torch.Generator().manual_seed(1))
    assert torch.equal(Q.unpack(Q.pack(codes)), codes.int())


def test_repacked_weights_are_the_awq_weights():
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))      # (out, in)
    t = Q.quantize_weight(W)
    w = pack_awq(t["qweight"], t["qzeros"], t["scales"])
    assert torch.equal(dequantize(w), Q.dequantize(t["qweight"], t["qzeros"], t["scales"]).t())
    assert w.words.shape == (4, 64, 8) and w.groups.shape == (2, 64, 2) and w.groups.dtype == t["scales"].dtype
    # word [2b + h, n, r], bits 4j + 16t: the code of column n, k = 128b + 16(4h + j) + 2r + t
    codes = Q.unpack(t["qweight"])
    b, h, r, j, tt, n = 1, 1, 5, 2, 1, 9
    k = 128 * b + 16 * (4 * h + j) + 2 * r + tt
    assert (int(w.words[2 * b + h, n, r]) >> (4 * j + 16 * tt)) & 0xF == codes[k, n]


TILES = [Tiles(), Tiles(block_n=64, split_k=1), Tiles(block_n=128, split_k=2)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 3, 16, 17])
@pytest.mark.parametrize("tiles", TILES, ids=["default", "bn64-s1", "bn128-s2"])
def test_matches_dequantized_reference(M, dtype, tiles):
    awq, g = random_awq(M, dtype=dtype)
    w = pack_awq(*awq)
    x = torch.randn(M, 256, generator=g).to(dtype)
    ref = x.float() @ dequantize(w)
    y32 = w4a16_matmul(x, w, tiles, out_dtype=torch.float32)
    assert rel_err(y32, ref) <= 1e-5                              # only fp32 accumulation order differs
    y = w4a16_matmul(x, w, tiles)
    assert y.dtype == dtype
    if dtype == torch.float16:                                    # output: the fp32 result, rounded once
        assert torch.equal(y, y32.to(dtype)) and rel_err(y, ref) <= 1e-3
    else:                                                         # the interpreter's fp32 -> bf16 cast truncates
        assert ((y.float() - y32).abs() <= y32.abs() * 2**-7).all() and rel_err(y, ref) <= 4e-3


def test_split_plan_covers_k_without_empty_ranges():
    assert split_plan(1024, 64, Tiles(split_k=3)) == (3, 384)                # 8 K-blocks: 3 + 3 + 2
    assert split_plan(25600, 5120, Tiles()) == (8, 3200)                     # 80 column tiles: about 640 programs
    assert split_plan(5120, 51200, Tiles()) == (1, 5120)                     # 800 column tiles: no split
    assert split_plan(5120, 10240, Tiles()) == (4, 1280)                     # 160 column tiles
    assert split_plan(256, 64 * 700, Tiles(block_n=64, split_k=None)) == (1, 256)
    assert split_plan(1024, 64, Tiles()) == (8, 128)                         # at most one range a K-block
    assert split_plan(256, 64, Tiles()) == (2, 128)                          # one K-block a range


def test_ragged_n():
    awq, g = random_awq(7, N=72)
    w = pack_awq(*awq)
    x = torch.randn(4, 256, generator=g).half()
    assert rel_err(w4a16_matmul(x, w, Tiles(block_n=64), out_dtype=torch.float32), x.float() @ dequantize(w)) <= 1e-5


@pytest.mark.parametrize("tiles", [Tiles(), Tiles(block_n=64, split_k=2)], ids=["default", "split2"])
def test_batch_invariance(tiles):
    awq, g = random_awq(11)
    w = pack_awq(*awq)
    x = torch.randn(17, 256, generator=g).half() * 3
    y = w4a16_matmul(x, w, tiles)
    for i in (0, 4, 8, 15, 16):
        assert torch.equal(w4a16_matmul(x[i:i + 1], w, tiles)[0], y[i]), f"row {i}"
    assert torch.equal(w4a16_matmul(x[:9], w, tiles), y[:9])
    assert torch.equal(w4a16_matmul(x, w, tiles), y)              # and deterministic


@pytest.mark.parametrize("tiles", [Tiles(), Tiles(block_n=64, split_k=2)], ids=["default", "split2"])
def test_residual_added_in_the_epilogue(tiles):
    """y = x @ W + residual, added in fp32 before the one rounding; rows still batch-invariant."""
    awq, g = random_awq(12)
    w = pack_awq(*awq)
    x, res = torch.randn(9, 256, generator=g).half(), torch.randn(9, 64, generator=g).half()
    y = w4a16_matmul(x, w, tiles, out_dtype=torch.float32, residual=res)
    assert torch.equal(y, w4a16_matmul(x, w, tiles, out_dtype=torch.float32) + res.float())
    y16 = w4a16_matmul(x, w, tiles, residual=res)
    assert torch.equal(y16, y.half())
    for i in (0, 5, 8):
        assert torch.equal(w4a16_matmul(x[i:i + 1], w, tiles, residual=res[i:i + 1])[0], y16[i])
    with pytest.raises(ValueError, match="residual must be contiguous of shape"):
        w4a16_matmul(x, w, tiles, residual=res[:, :32])


def test_concatenated_projections_and_module():
    (a, ga), (b, _) = random_awq(3), random_awq(4, N=128)
    wa, wb = pack_awq(*a), pack_awq(*b)
    x = torch.randn(2, 256, generator=ga).half()
    both = w4a16_matmul(x, concat([wa, wb]))
    assert torch.equal(both, torch.cat([w4a16_matmul(x, wa), w4a16_matmul(x, wb)], 1))

    class Awq(torch.nn.Module):                                    # a loaded AWQ module's tensors (gptqmodel's names)
        def __init__(self, t):
            super().__init__()
            self.qweight, self.qzeros, self.scales = t
            self.group_size, self.bias = 128, None

    mods = [Int4Linear.from_awq(Awq(a)), Int4Linear.from_awq(Awq(b))]
    assert mods[0].kernel == "triton" and mods[0].path.startswith("Triton (not a Hopper")   # a CPU
    alone = [m(x) for m in mods]
    fused = Int4Linear.concat(mods)
    assert (fused.in_features, fused.out_features) == (256, 192)
    assert torch.equal(fused(x[None])[0], both)                   # (1, n, K) -> (1, n, N)
    assert mods[1].words.data_ptr() == fused.words[:, 64:].data_ptr()            # views of the fused tensors
    assert all(torch.equal(m(x), y) for m, y in zip(mods, alone))  # and still the same projections
    from lib.engine.layer import _still_views                      # a second runner reuses the fusion...
    assert _still_views(mods, fused, [64, 128])
    mods[1].words = mods[1].words.clone()                          # ...unless a move gave a module its own tensors
    assert not _still_views(mods, fused, [64, 128])


def test_both_layouts_pack_awqs_codes_and_groups():
    """The Triton layout and the mma one (lib/models/w4a16_mma.py) stand for the same weights."""
    from lib.models import w4a16_mma
    awq, _ = random_awq(6, N=48)
    q, groups = awq_codes(*awq)
    packed, mma = pack_awq(*awq), w4a16_mma.pack(q, groups)
    assert torch.equal(codes(packed), q) and torch.equal(w4a16_mma.codes(mma), q)
    assert torch.equal(packed.groups, groups) and torch.equal(w4a16_mma.dequantize(mma), dequantize(packed))


def test_the_mma_kernel_is_chosen_where_it_can_run(monkeypatch):
    """Int4Linear's kernel: the mma one on a Hopper GPU with nvcc, unless its output columns are not tiles of 16."""
    from lib.models import int4_linear, w4a16_mma
    monkeypatch.setattr(w4a16_mma, "supported", lambda device: "")                # as on an H100 or H200
    assert int4_linear.kernel_for(torch.device("cpu"), 10240) == ("mma", "mma.sync (CUDA, sm_90)")
    assert int4_linear.kernel_for(torch.device("cpu"), 40) == ("triton", "Triton (40 columns, not a multiple of 16)")


def test_errors():
    awq, _ = random_awq(5)
    w = pack_awq(*awq)
    with pytest.raises(ValueError, match="group size 128"):
        pack_awq(*awq, group=64)
    with pytest.raises(ValueError, match="shape"):
        w4a16_matmul(torch.zeros(1, 128, dtype=torch.float16), w)
    with pytest.raises(ValueError, match="float16"):
        w4a16_matmul(torch.zeros(1, 256, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="block_n"):
        w4a16_matmul(torch.zeros(1, 256, dtype=torch.float16), w, Tiles(block_n=32))


@pytest.fixture(scope="module")
def awq_target(tmp_path_factory):
    """The tiny synthetic target (hidden 128) written as an AWQ checkpoint."""
    pytest.importorskip("gptqmodel")
    import fixtures_thesis as fx
    from lib.models.synthetic import make_pair
    target = make_pair(fx.tiny_synthetic(), 0, "float32", "cpu", ("target",))[0]
    return Q.write_awq_model(target, tmp_path_factory.mktemp("awq") / "target")


def test_backend_loads_like_torch_awq_and_fuses(awq_target):
    """models.awq_backend triton_w4a16: AwqConfig (torch_awq), then Int4Linear on the same weights; the runner fuses
    q/k/v and gate/up into one matmul each and traces the custom op without graph breaks."""
    from lib.engine.runner import Acceleration, Runner
    from lib.models import checkpoints
    ref = checkpoints.load_model(str(awq_target), "float16", "cpu", "torch_awq")
    model = checkpoints.load_model(str(awq_target), "float16", "cpu", checkpoints.W4A16_BACKEND)
    assert type(model.model.layers[0].mlp.down_proj) is Int4Linear
    assert not any(hasattr(m, "qweight") for m in model.modules())
    ids = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = model(ids).logits[0].float(), ref(ids).logits[0].float()
    assert (got - want).abs().max() < 2e-2 * want.abs().max()          # fp16 projections: rounding apart
    eager, compiled = Runner(model, 32), Runner(model, 32, Acceleration(compile=True))
    assert isinstance(compiled.fused[0]["qkv"], Int4Linear) and compiled.fused[0]["gate_up"].out_features == 2 * 256
    for r in (eager, compiled):
        r.prefill(ids[:, :8])
    assert any(p.requires_grad for p in model.parameters())             # as loaded: compile must not trace a backward
    want = eager._forward(ids[:, 8:], torch.tensor(8), compiled=False)   # (grad mode on, as a graph capture runs)
    got = compiled._forward(ids[:, 8:], torch.tensor(8), compiled=True)
    assert torch.equal(compiled._argmax(got), eager._argmax(want))
    assert torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def test_backend_refused_on_cpu_without_the_interpreter(monkeypatch):
    from lib.models import checkpoints
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        checkpoints.awq_config({}, checkpoints.W4A16_BACKEND, "cpu")
