"""The W4A16 AWQ int4 matmul (lib/models/w4a16.py) against its torch reference, on the CPU under Triton's interpreter:
the AWQ nibble order and round trip, agreement with x @ dequantize(...) for 1, 3 and 16 rows, tile and split-K
variants, a ragged N and a smaller group, batch invariance (a row of a 9-row call is bitwise the row alone) and
the one-line errors. Skipped where Triton is not installed (CI)."""
import pytest
import torch

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip()
from lib.models.w4a16 import Tiles, awq_weight, dequantize, split_plan, w4a16_matmul  # noqa: E402
from lib.models import quantize as Q  # noqa: E402


def random_awq(seed, K=256, N=64, group=128):
    """Random codes, zeros and fp16 scales in the AWQ GEMM layout (quantize.pack)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(0, 16, (K // group, N), generator=g)
    s = (torch.rand(K // group, N, generator=g) * 0.02 + 0.001).half()
    return awq_weight(Q.pack(q), Q.pack(z), s, group), g


def rel_err(y, ref):
    return ((y.float() - ref).norm() / ref.norm()).item()


def test_awq_nibble_order_and_round_trip():
    q = (torch.arange(32) % 8).repeat(3, 1)                       # column c holds the code c % 8
    assert (Q.pack(q) == 0x75316420).all()                        # nibble j holds column AWQ_ORDER[j] = 0,2,4,6,1,3,5,7
    codes = torch.randint(0, 16, (16, 40), generator=torch.Generator().manual_seed(1))
    assert torch.equal(Q.unpack(Q.pack(codes)), codes.int())


def test_dequantize_matches_quantize_module():
    W = torch.randn(64, 256, generator=torch.Generator().manual_seed(2))      # (out, in)
    t = Q.quantize_weight(W)
    ref = Q.dequantize(t["qweight"], t["qzeros"], t["scales"]).t()
    assert torch.equal(dequantize(t["qweight"], t["qzeros"], t["scales"], 128), ref)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3)).half()
    y = w4a16_matmul(x, awq_weight(t["qweight"], t["qzeros"], t["scales"]), out_dtype=torch.float32)
    assert rel_err(y, x.float() @ ref) <= 1e-5
    assert rel_err(y, x.float() @ W.t()) <= 0.2                   # int4 round-to-nearest error (~0.1), loosely


TILES = [Tiles(), Tiles(block_n=32, block_k=64, split_k=1), Tiles(block_n=16, block_k=32, split_k=3)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("tiles", TILES, ids=["default", "bn32-bk64-s1", "bn16-bk32-s3"])
def test_matches_dequantized_reference(M, dtype, tiles):
    w, g = random_awq(M)
    x = torch.randn(M, 256, generator=g).to(dtype)
    ref = x.float() @ dequantize(*w)
    y32 = w4a16_matmul(x, w, tiles, out_dtype=torch.float32)
    assert rel_err(y32, ref) <= 1e-5                              # only fp32 accumulation order differs
    y = w4a16_matmul(x, w, tiles)
    assert y.dtype == dtype
    if dtype == torch.float16:                                    # output: the fp32 result, rounded once
        assert torch.equal(y, y32.to(dtype)) and rel_err(y, ref) <= 1e-3
    else:                                                         # the interpreter's fp32 -> bf16 cast truncates
        assert ((y.float() - y32).abs() <= y32.abs() * 2**-7).all() and rel_err(y, ref) <= 4e-3


def test_split_plan_covers_k_without_empty_ranges():
    assert split_plan(256, 64, Tiles(block_k=32, split_k=3)) == (3, 96)      # 8 blocks: 3 + 3 + 2
    assert split_plan(25600, 5120, Tiles()) == (16, 1600)                    # 40 column tiles: at most 16 ranges
    assert split_plan(5120, 51200, Tiles()) == (4, 1280)                     # 400 column tiles, about 1600 programs
    assert split_plan(256, 64, Tiles()) == (4, 64)                           # one K block a range


@pytest.mark.parametrize("N,group,tiles", [(40, 128, Tiles(block_n=32)), (64, 64, Tiles(block_k=32, split_k=2))])
def test_ragged_n_and_smaller_group(N, group, tiles):
    w, g = random_awq(7, N=N, group=group)
    x = torch.randn(4, 256, generator=g).to(torch.bfloat16)
    assert rel_err(w4a16_matmul(x, w, tiles, out_dtype=torch.float32), x.float() @ dequantize(*w)) <= 1e-5


@pytest.mark.parametrize("tiles", [Tiles(), Tiles(block_n=16, block_k=32, split_k=3)], ids=["default", "split3"])
def test_batch_invariance(tiles):
    w, g = random_awq(11)
    x = torch.randn(9, 256, generator=g).to(torch.bfloat16) * 3
    y = w4a16_matmul(x, w, tiles)
    for i in range(9):
        assert torch.equal(w4a16_matmul(x[i:i + 1], w, tiles)[0], y[i]), f"row {i}"
    assert torch.equal(w4a16_matmul(x, w, tiles), y)              # and deterministic


def test_errors():
    w, _ = random_awq(5)
    with pytest.raises(ValueError, match="1..16 rows"):
        w4a16_matmul(torch.zeros(17, 256, dtype=torch.bfloat16), w)
    with pytest.raises(ValueError, match="not a multiple of the group"):
        awq_weight(torch.zeros(200, 8, dtype=torch.int32), torch.zeros(1, 8, dtype=torch.int32),
                   torch.zeros(1, 64, dtype=torch.float16), 128)
    with pytest.raises(ValueError, match="block_k must divide"):
        w4a16_matmul(torch.zeros(1, 256, dtype=torch.bfloat16), w, Tiles(block_k=256))
    with pytest.raises(ValueError, match="shape"):
        w4a16_matmul(torch.zeros(1, 128, dtype=torch.bfloat16), w)
