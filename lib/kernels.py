"""Triton kernels for FlashHead greedy decoding of one hidden state (GPU only; imported lazily).

Three launches instead of a dozen small ops: (1) G programs each score R centroids and sort their
keys, (2) one program merges the G block-winners into the top-p clusters, (3) p+1 programs score the
b tokens of each probed cluster (and the special tokens) and keep their best; a max picks the token.
Scores and indices travel as one order-preserving int64 key, so sorting keys sorts scores.
"""
import torch, triton, triton.language as tl


@triton.jit
def _key(v, idx):
    """Order-preserving int64 key of (float32 value, int32 index): sorting keys sorts values."""
    b = v.to(tl.int32, bitcast=True)
    b = tl.where(b < 0, b ^ 0x7FFFFFFF, b)
    return (b.to(tl.int64) << 32) | idx.to(tl.int64)


@triton.jit
def _dot_rows(h_ptr, w_ptr, rows, ok, N: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    """fp32 dot products (N,) of h with rows `rows` of the (., D) matrix at w_ptr (masked by ok)."""
    acc = tl.zeros((N,), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        offs = d0 + tl.arange(0, BLOCK_D)
        hv = tl.load(h_ptr + offs).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * D + offs[None, :], mask=ok[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(w * hv[None, :], axis=1)
    return acc


@triton.jit
def _centroid_blocks(h_ptr, c_ptr, keys_ptr, C, D: tl.constexpr, R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program g scores centroids g*R.. g*R+R-1 against h and stores their keys sorted, best first."""
    g = tl.program_id(0)
    rows = g * R + tl.arange(0, R)
    ok = rows < C
    acc = tl.where(ok, _dot_rows(h_ptr, c_ptr, rows, ok, R, D, BLOCK_D), float("-inf"))
    tl.store(keys_ptr + g * R + tl.arange(0, R), tl.sort(_key(acc, rows), descending=True))


@triton.jit
def _merge_blocks(keys_ptr, out_ptr, G, R: tl.constexpr, P: tl.constexpr, GP: tl.constexpr):
    """Top-P of the G blocks' top-P keys (one program), stored sorted, best first."""
    g = tl.arange(0, GP)
    j = tl.arange(0, P)
    k = tl.load(keys_ptr + g[:, None] * R + j[None, :], mask=(g < G)[:, None], other=-9223372036854775807 - 1)
    tl.store(out_ptr + tl.arange(0, GP * P), tl.sort(tl.reshape(k, (GP * P,)), descending=True))


@triton.jit
def _score_probed(h_ptr, w_ptr, c2t_ptr, probe_keys_ptr, out_ptr, n_probes, special_row, D: tl.constexpr,
                  B: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program i < n_probes scores the b tokens of the i-th probed cluster; program n_probes scores the
    special tokens (row `special_row` of c2t). Each stores the key of its best (logit, token)."""
    i = tl.program_id(0)
    key = tl.load(probe_keys_ptr + i)
    cluster = tl.where(i < n_probes, (key & 0xFFFFFFFF).to(tl.int64), special_row)
    toks = tl.load(c2t_ptr + cluster * B + tl.arange(0, B))
    acc = _dot_rows(h_ptr, w_ptr, toks, toks >= 0, B, D, BLOCK_D)
    tl.store(out_ptr + i, tl.max(_key(acc, toks), axis=0))


def flash_greedy_triton(h, W, cents, c2t_ext, n_probes, R=64, BLOCK_D=128):
    """h (1,d) -> token (1,): FlashHead greedy in three Triton kernels and a max."""
    C, D = cents.shape
    B = c2t_ext.shape[1]
    G = triton.cdiv(C, R)
    GP = triton.next_power_of_2(G)
    keys = torch.empty(G * R, dtype=torch.int64, device=h.device)
    merged = torch.empty(GP * n_probes, dtype=torch.int64, device=h.device)
    best = torch.empty(n_probes + 1, dtype=torch.int64, device=h.device)
    _centroid_blocks[(G,)](h, cents, keys, C, D, R, BLOCK_D)
    _merge_blocks[(1,)](keys, merged, G, R, n_probes, GP)
    _score_probed[(n_probes + 1,)](h, W, c2t_ext, merged, best, n_probes, C, D, B, BLOCK_D)
    return (best.max() & 0xFFFFFFFF).view(1)
