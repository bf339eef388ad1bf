"""The mma W4A16 kernel's layout (lib/models/w4a16_mma.py) on the CPU, no Triton or GPU needed: packing is
lossless (its inverse gives the codes back), each word holds the codes of an m16n8k16 A fragment whose K index the
activations' 128-bit reads follow (a torch emulation of the kernel's sums equals x @ dequantize), the scales and
zero points are the Triton layout's words, and bad shapes say so. The kernel itself: tests/test_kernels_cuda.py."""
import pytest
import torch

from lib.models import w4a16_mma as MM


def random_codes(seed, K=256, N=48, dtype=torch.float16):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (K, N), generator=g)
    scales = (torch.rand(K // 128, N, generator=g) * 0.02 + 0.001).to(dtype)
    zeros = torch.randint(0, 16, (K // 128, N), generator=g).to(torch.int16)
    return codes, torch.stack([scales, zeros.view(dtype)], -1), g


def emulate(x: torch.Tensor, w: MM.MmaInt4) -> torch.Tensor:
    """The kernel's sums in torch, from the words as the lanes hold them: lane 4g + c, step s, word bit 4j + 16t
    multiplies x at K = 8c + 4 (s % 2) + 2 (j // 2) + t of the step pair's 32 into column g + 8 (j % 2)."""
    T, G = w.words.shape[:2]
    K, N = G * 128, T * 16
    y = torch.zeros(x.shape[0], N, dtype=torch.float64)
    halves = w.groups.view(torch.int16).view(G, N, 2)
    for lane in range(32):
        g, c = divmod(lane, 4)
        for s in range(8):
            word = w.words[:, :, s // 4, lane, s % 4].to(torch.int64) & 0xFFFFFFFF           # (T, G)
            for j in range(4):
                for t in range(2):
                    q = (word >> (4 * j + 16 * t)) & 0xF
                    cols = torch.arange(T) * 16 + g + 8 * (j % 2)
                    ks = torch.arange(G) * 128 + 32 * (s // 2) + 8 * c + 4 * (s % 2) + 2 * (j // 2) + t
                    z = halves[:, cols, 1].T.to(torch.int64)                                  # (T, G)
                    sc = halves[:, cols, 0].view(torch.float16).T.double()
                    y[:, cols] += ((q - z) * sc)[None].mul(x[:, ks][:, None, :].double()).sum(-1)
    return y


def test_packing_is_lossless_and_keeps_the_groups_words():
    codes, groups, _ = random_codes(0)
    w = MM.pack(codes, groups)
    assert w.words.shape == (3, 2, 2, 32, 4) and w.words.dtype == torch.int32
    assert torch.equal(MM.codes(w), codes)
    assert torch.equal(w.groups, groups.view(torch.int32).view(2, 48))


def test_the_lanes_words_multiply_the_activations_at_their_permuted_k():
    codes, groups, g = random_codes(1)
    w = MM.pack(codes, groups)
    x = torch.randn(3, 256, generator=g).half().float()
    want = x.double() @ MM.dequantize(w).double()
    torch.testing.assert_close(emulate(x, w), want, rtol=1e-9, atol=1e-9)
    ref = (codes - groups[..., 1].view(torch.int16).repeat_interleave(128, 0)) * \
        groups[..., 0].float().repeat_interleave(128, 0)
    assert torch.equal(MM.dequantize(w), ref.float())


def test_bad_shapes_and_devices_say_what_is_wrong(monkeypatch):
    codes, groups, _ = random_codes(2)
    with pytest.raises(ValueError, match="N of 16"):
        MM.pack(codes[:, :40], groups[:, :40])
    assert MM.supported(torch.device("cpu")) == "not a Hopper (sm_90) GPU"
    monkeypatch.setenv("STUDY_W4A16_MMA", "0")
    assert MM.supported(torch.device("cpu")).startswith("off")
    assert MM.warps_for(10240) == 4 and MM.warps_for(5120) == 8


def test_the_launch_refuses_what_the_kernel_cannot_take(tmp_path, monkeypatch):
    """The built kernel checks its arguments before any CUDA call, so this runs wherever nvcc is (no GPU needed):
    fewer than 4 warps (its epilogue's 128 threads write a tile), columns not in tiles of 16, K not in groups, groups'
    rows closer than N apart."""
    if MM._nvcc() is None:
        pytest.skip("no nvcc to build lib/models/w4a16_mma.cu")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))                # a build of its own, left in tmp_path
    MM._library.cache_clear()
    try:
        launch = MM._library().w4a16_mma_launch
        args = dict(M=1, N=32, K=128, stride_g=32, warps=4)
        for bad in ({"warps": 2}, {"warps": 9}, {"N": 40}, {"K": 100}, {"M": 0}, {"stride_g": 16}):
            a = {**args, **bad}
            assert launch(None, None, None, None, None, a["M"], a["N"], a["K"], 128, a["stride_g"], a["warps"], 0, 0,
                          None) == -1
    finally:
        MM._library.cache_clear()
