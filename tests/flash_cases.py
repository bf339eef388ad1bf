"""Exact-integer FlashHead cases shared by the Triton head tests (tests/test_kernels.py under the interpreter,
tests/test_kernels_cuda.py on a GPU): small-integer weights make every fp32 dot product exact, so any summation
order gives the same scores, ties are common, and the tie rules (smaller cluster id, smaller token id) are exact."""
import torch


def ints(g, *shape, lo=-2, hi=2):
    return torch.randint(lo, hi + 1, shape, generator=g).float()


def problem(seed, c=37, b=4, d=24, specials=(3, 70)):
    """Integer W (V,d), centroids (c,d), c2t_ext (c+x,b) from a random equal-size assignment: x rows of special
    tokens (b a row, -1 padding the last; one row of -1 where there are none), as heads.extended_c2t builds them."""
    g = torch.Generator().manual_seed(seed)
    V = c * b
    W, cents = ints(g, V, d), ints(g, c, d)
    c2t = torch.randperm(V, generator=g).view(c, b)
    spec = torch.full((max(1, -(-len(specials) // b)) * b,), -1, dtype=torch.long)
    spec[:len(specials)] = torch.tensor(specials, dtype=torch.long)
    return g, W, cents, torch.cat([c2t, spec.view(-1, b)]).contiguous()


def flash_ref(h, W, cents, c2t_ext, p):
    """The documented rule in float64 (exact here): top-p clusters by (score desc, id asc), then the
    candidate token with the largest logit, smallest id among equals."""
    c = cents.shape[0]
    s = (cents.double() @ h[0].double())
    probes = torch.sort(-s, stable=True).indices[:p]                   # stable: equal scores by id
    cand = torch.cat([c2t_ext[probes].flatten(), c2t_ext[c:].flatten()])
    cand = cand[cand >= 0]
    logits = W[cand].double() @ h[0].double()
    return cand[logits == logits.max()].min()


def check_dense_in_16_bits(device, dtype, scale) -> None:
    """The dense head in `dtype` with integer weights times `scale` and inputs times 256 (every product and sum
    exact): the smallest id of the largest logit, ties planted. Scale 2^-24 makes every nonzero fp16 weight a
    subnormal: a conversion or product flushed to zero would lose it."""
    from lib.engine.kernels import dense_greedy_triton
    g = torch.Generator().manual_seed(1)
    W = ints(g, 500, 64) * scale
    for i in range(4):
        h = ints(g, 1, 64) * 256
        if i % 2:
            W[7] = W[(W.double() @ h[0].double()).argmax()]                     # a tie, from below or above
        logits = W.double() @ h[0].double()
        want = (logits == logits.max()).nonzero().min().item()
        assert dense_greedy_triton(h.to(device, dtype), W.to(device, dtype)).item() == want, i
