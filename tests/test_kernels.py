"""The Triton heads (lib/engine/kernels.py, flash_kernels.py) against torch references, on the CPU under Triton's
interpreter, which runs a launch's programs one after another (tests/test_kernels_cuda.py: the same cases on a GPU).
Exact-integer cases (tests/flash_cases.py): the tie rules are tested exactly. Skipped where Triton is not installed
(CI)."""
import pytest
import torch

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip("lib.engine.kernels", "lib.engine.flash_kernels")
import lib.engine.flash_kernels as F  # noqa: E402
import lib.engine.kernels as K  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from flash_cases import check_dense_in_16_bits, flash_ref, ints, problem  # noqa: E402

FAST, FULL = dict(S=64), dict(S=2, TF=8, T=2)      # slab fits every bin / overflows: full select, tiled


@pytest.mark.parametrize("seed", range(3))
def test_flash_matches_reference_with_ties(seed):
    g, W, cents, c2t_ext = problem(seed)
    c = cents.shape[0]
    paths = set()
    for p in (1, 2, 3, 5, 16, 36, c):
        for cfg in (FAST, FULL):
            h = ints(g, 1, W.shape[1])
            got = F.flash_greedy_triton(h, W, cents, c2t_ext, p, R=8, BLOCK_D=16, **cfg)
            assert got.shape == (1,) and got.dtype == torch.int64
            assert got.item() == flash_ref(h, W, cents, c2t_ext, p).item(), (p, cfg)
            paths.add((cfg["S"], K.scratch(h.device, c, cfg["S"])["plan"][3].item()))
    assert paths == {(64, 0), (2, 0), (2, 1)}                          # both paths ran


@pytest.mark.parametrize("seed", range(2))
def test_batched_flash_is_each_rows_choice_with_ties(seed, monkeypatch):
    """flash_batch_triton: each row of a batch picks flash_ref's token (probe ties to the smaller cluster id,
    token ties to the smaller id); equal centroids make every probe a tie; a head without specials too; segments
    of 16 centroids (three of them, the last one short) as well as one; Triton's topk and a whole sort."""
    g, W, cents, c2t_ext = problem(seed, specials=() if seed == 1 else (3, 70))
    monkeypatch.setattr(F, "TOPK", F.TOPK and seed == 0)              # seed 1: the segments' whole sort
    h = ints(g, 4, W.shape[1])
    c = cents.shape[0]
    for cs, seg, probes in ((cents, 1024, (1, 5, c)), (torch.ones_like(cents), 1024, (3,)), (cents, 16, (2, 20))):
        monkeypatch.setattr(F, "SEGMENT", seg)
        for p in probes:
            got = F.flash_batch_triton(h, W, cs, c2t_ext, p, R=16, block_d=16)
            assert got.shape == (4,) and got.dtype == torch.int64
            assert got.tolist() == [flash_ref(h[r:r + 1], W, cs, c2t_ext, p).item() for r in range(4)], (seg, p)
    with pytest.raises(ValueError, match="R and NB must be powers of two >= 16"):
        F.flash_batch_triton(h, W, cents, c2t_ext, 2, R=8)


def test_batched_flash_rows_in_blocks_of_any_size():
    """The centroid keys NB rows a dot: 16 (three blocks for 40 rows, the last short), 32, and the default (one
    block of 64, 24 of its rows past the batch): every row picks flash_ref's token."""
    g, W, cents, c2t_ext = problem(4)
    h = ints(g, 40, W.shape[1])
    want = [flash_ref(h[r:r + 1], W, cents, c2t_ext, 5).item() for r in range(40)]
    for nb in (16, 32, 0):
        got = F.flash_batch_triton(h, W, cents, c2t_ext, 5, R=16, block_d=16, NB=nb)
        assert got.tolist() == want, nb


def test_flash_all_scores_equal():
    """Every cluster ties: the probes are clusters 0..p-1, the token the smallest among the best."""
    g, W, cents, c2t_ext = problem(7)
    cents = torch.ones_like(cents)
    h = ints(g, 1, W.shape[1])
    for p in (1, 3, 8, cents.shape[0]):
        for cfg in (FAST, FULL):
            got = F.flash_greedy_triton(h, W, cents, c2t_ext, p, R=4, BLOCK_D=8, **cfg)
            assert got.item() == flash_ref(h, W, cents, c2t_ext, p).item()


def test_flash_without_special_tokens_scores_only_the_probes():
    """A special-token row of -1 (none, as heads.fused_kernel builds it for a head without specials) adds no
    candidate: only the probed clusters are scored."""
    g, W, cents, c2t_ext = problem(5, specials=())
    assert c2t_ext[-1].eq(-1).all()
    for p in (1, 4, 20):
        h = ints(g, 1, W.shape[1])
        assert F.flash_greedy_triton(h, W, cents, c2t_ext, p, S=8).item() == flash_ref(h, W, cents, c2t_ext, p).item()


def test_special_tokens_over_several_rows():
    """More special tokens than a cluster holds (11 over b = 4: three rows, the last padded): each is scored on every
    call, by the one-state and the batched kernels, on the fast and the overflow paths; the best of them wins."""
    specials = (3, 70, 9, 140, 33, 71, 5, 100, 12, 47, 88)
    g, W, cents, c2t_ext = problem(2, specials=specials)
    assert c2t_ext.shape[0] == cents.shape[0] + 3
    for p in (1, 4):
        for cfg in (FAST, FULL):
            h = ints(g, 1, W.shape[1])
            want = flash_ref(h, W, cents, c2t_ext, p).item()
            assert F.flash_greedy_triton(h, W, cents, c2t_ext, p, **cfg).item() == want, (p, cfg)
        h = ints(g, 3, W.shape[1])
        got = F.flash_batch_triton(h, W, cents, c2t_ext, p, R=16, block_d=16)
        assert got.tolist() == [flash_ref(h[r:r + 1], W, cents, c2t_ext, p).item() for r in range(3)]
    W[88] = 50.0                                                        # the last row's special token, scored always
    h = torch.ones(1, W.shape[1])
    assert F.flash_greedy_triton(h, W, cents, c2t_ext, 1, S=8).item() == 88
    assert F.flash_batch_triton(h.repeat(2, 1), W, cents, c2t_ext, 1, R=16).tolist() == [88, 88]


def test_flash_special_token_wins():
    g, W, cents, c2t_ext = problem(3)
    W[70] = 50.0                                                        # a special token, scored always
    h = torch.ones(1, W.shape[1])
    assert F.flash_greedy_triton(h, W, cents, c2t_ext, 1, S=8).item() == 70


def random_clusters(g: torch.Generator, c: int, b: int, d: int):
    """Random fp32 weights (c*b, d) in c equal clusters of b, with their mean centroids."""
    W = torch.randn(c * b, d, generator=g)
    assign = torch.randperm(c * b, generator=g) % c
    return W, torch.stack([W[assign == k].mean(0) for k in range(c)]), assign


def test_flash_matches_flashhead_reference():
    """Against FlashHead.reference on tie-free random data (fp32 weights), specials included."""
    heads = pytest.importorskip("lib.engine.heads")
    g = torch.Generator().manual_seed(0)
    c, b, d = 50, 8, 32
    W, cents, assign = random_clusters(g, c, b, d)
    head = heads.FlashHead(W, cents, assign, n_probes=1, special_ids=[5, 17])
    spec = torch.full((b,), -1, dtype=torch.long)
    spec[:2] = head.special
    c2t_ext = torch.cat([head.c2t, spec[None]]).contiguous()
    for p in (1, 2, 7, 16, c):
        fh = head.with_probes(p)
        for t in torch.randint(0, c * b, (4,), generator=g):
            h = W[t][None] + 0.3 * torch.randn(1, d, generator=g)
            assert F.flash_greedy_triton(h, W, cents, c2t_ext, p, S=16).item() == fh.reference(h).item()


def test_flash_repeated_calls_leave_state_clean():
    """Counters and the histogram are reset by the kernels: many calls in a row stay exact."""
    g, W, cents, c2t_ext = problem(11)
    for i in range(6):
        h = ints(g, 1, W.shape[1])
        p = 1 + i * 5
        assert F.flash_greedy_triton(h, W, cents, c2t_ext, p, S=8).item() == flash_ref(h, W, cents, c2t_ext, p).item()
    s = K.scratch(h.device, cents.shape[0], 8)
    assert s["ctl"].eq(0).all() and s["hist"].eq(0).all() and s["best"].item() == -2 ** 63


@pytest.mark.parametrize("V,d,R", [(300, 24, 16), (1000, 40, 64), (7, 8, 4)])
def test_dense_is_argmax_smallest_id(V, d, R):
    g = torch.Generator().manual_seed(V)
    W = ints(g, V, d)
    for i in range(4):
        h = ints(g, 1, d)
        Wi = W.clone()
        if i % 2:                                                              # plant ties with the best row
            Wi[torch.randperm(V, generator=g)[:3]] = W[(W.double() @ h[0].double()).argmax()]
        logits = Wi.double() @ h[0].double()
        got = K.dense_greedy_triton(h, Wi, R=R, BLOCK_D=16)
        best = (logits == logits.max()).nonzero().flatten()                   # every maximiser
        assert got.shape == (1,) and logits[got.item()] == logits.max()        # the token attains the max logit
        assert got.item() == best.min().item()                                 # and is the smallest such id
        assert i % 2 == 0 or len(best) > 1


@pytest.mark.parametrize("dtype,scale", [(torch.bfloat16, 1.0), (torch.float16, 1.0), (torch.float16, 2.0 ** -24)])
def test_dense_in_16_bits(dtype, scale):
    """bf16 and fp16 (the h100awq drafts' dtype), also with every weight an fp16 subnormal (scale 2^-24)."""
    check_dense_in_16_bits(torch.device("cpu"), dtype, scale)


# ---------------------------------------------------------------- tiles past 32,768 (issue 22 item 6)

def _decreasing(C, lo):
    return lo + (C - torch.arange(C, dtype=torch.float64)) * 0.002


@pytest.mark.parametrize("case", ["select", "compact"])
def test_running_counts_are_exact_past_32768_in_one_tile(case):
    """The full selection's scans count, per tile, the keys above and equal to a threshold (radix select) and the
    clusters above and in the P-th score's bin (compaction). Packed as 16-bit halves of an int32 they overflowed
    once one tile held 32,768 of the first kind: here a tile of 32,768 holds exactly that many."""
    C, tile = 40000, 32768
    i = torch.arange(C)
    if case == "select":                      # every score in one bin: the top 39,000 by radix select
        score, P = _decreasing(C, 1024.0), 39000
    else:                                     # clusters 0..32767 in bins above the P-th score's: compacted first
        score, P = torch.where(i < tile, _decreasing(C, 4096.0), _decreasing(C, 1024.0)), tile + 100
    keys = keys_of(score.float())                                        # as kernels._key makes them
    top = ((keys.sort(descending=True).values[P - 1] >> 52) + 2048).item()    # the P-th score's bin
    cand, probes = torch.zeros(C, dtype=torch.int64), torch.zeros(C, dtype=torch.int32)
    _select_all_kernel[(1,)](keys, cand, probes, C, P, top, tile, tile)      # one program: the selection alone
    want = torch.sort(-score, stable=True).indices[:P]
    assert torch.equal(probes[:P].sort().values, want.sort().values.to(probes.dtype))


def keys_of(v: torch.Tensor) -> torch.Tensor:
    """kernels._key of fp32 scores v (no -0.0 here) and their indices, in torch."""
    b = v.view(torch.int32)
    ordered = b ^ ((b >> 31) & 0x7FFFFFFF)
    return (ordered.long() << 32) | (0x7FFFFFFF - torch.arange(len(v)))


@triton.jit
def _select_all_kernel(keys_ptr, cand_ptr, probes_ptr, C, P, top, TF: tl.constexpr, T: tl.constexpr):
    F._select_all(keys_ptr, cand_ptr, probes_ptr, C, P, top, TF, T)


@pytest.mark.parametrize("kw,match", [
    (dict(n_probes=0), "n_probes must be in 1..37"), (dict(n_probes=38), "n_probes must be in 1..37"),
    (dict(S=48), "S must be a power of two"), (dict(TF=3000), "TF must be a power of two"),
    (dict(T=1 << 21), r"tiles TF and T hold at most 1048576 elements"), (dict(rows=37), "c2t_ext needs more than 37 rows")])
def test_flash_configuration_is_checked_on_the_host(kw, match):
    g, W, cents, c2t_ext = problem(0)
    rows = kw.pop("rows", None)
    c2t = c2t_ext[:rows] if rows else c2t_ext
    p = kw.pop("n_probes", 2)
    with pytest.raises(ValueError, match=match):
        F.flash_greedy_triton(ints(g, 1, W.shape[1]), W, cents, c2t, p, **kw)
    F.check_flash_config(37, 4, 37, 38, F.FlashTuning(S=1, TF=1 << 20, T=1 << 20))   # the largest: allowed


def test_the_heads_triton_decisions_accept_the_real_kernels():
    """heads.flash_triton / dense_triton on the real kernels (the interpreter): checked, agreeing, used."""
    heads = pytest.importorskip("lib.engine.heads")
    W, cents, assign = random_clusters(torch.Generator().manual_seed(3), 24, 8, 16)
    head = heads.FlashHead(W, cents, assign, 3, [1, 2])
    fn, why = heads.flash_triton(head)
    assert why == "" and fn(W[5][None]).item() == head.reference(W[5][None]).item()
    fn, why = heads.dense_triton(W)
    assert why == "" and fn(W[7][None]).item() == heads.DenseHead(W)(W[7][None]).item()


def test_launch_options_ask_for_programmatic_dependent_launch_only_where_the_gpu_has_it():
    assert K.launches(torch.device("cpu"), 4) == (False, {"num_warps": 4})          # the interpreter: plain launches
    assert K.launches(torch.device("cpu"), 2, pdl=False) == (False, {"num_warps": 2})
