"""The runner's Triton attention (lib/engine/attention.py) on the CPU under Triton's interpreter in float32: equal to
SDPA over the whole cache with the causal mask to float32 rounding, across several splits; a row's output bitwise
the same at any row index and in a call of any length (what batch-invariant target calls rest on); the runner says
which path attends and keeps speculative output equal to greedy output. Skipped where Triton is not installed (CI)."""
import pytest
import torch
import torch.nn.functional as F

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip()
from lib.engine import attention  # noqa: E402
from lib.engine.runner import Acceleration, Runner  # noqa: E402
from lib.engine.speculative import Request, generate_baseline, generate_speculative  # noqa: E402
from lib.models.build import make_draft, make_target  # noqa: E402
from lib.engine.heads import DenseHead  # noqa: E402

HQ, HKV, HD, L = 6, 2, 32, 300                        # 3 query heads a KV head; 3 splits of attention.SPLIT


def case(n: int, start: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, HQ, n, HD, generator=g)
    k, v = torch.randn(1, HKV, L, HD, generator=g), torch.randn(1, HKV, L, HD, generator=g)
    return q, k, v, start + torch.arange(n)


def sdpa(q, k, v, pos):
    mask = torch.arange(k.shape[2])[None, :] <= pos[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


@pytest.mark.parametrize("n, start", [(1, 0), (1, 127), (5, 124), (8, 250), (3, 297)])
def test_attention_is_sdpa_over_the_causal_positions(n, start):
    q, k, v, pos = case(n, start)
    got = attention.cached_attention(q, k, v, pos)
    assert got.shape == (1, n, HQ, HD)
    torch.testing.assert_close(got, sdpa(q, k, v, pos), rtol=1e-5, atol=1e-5)


def test_a_row_is_the_same_bits_at_any_index_and_in_a_call_of_any_length():
    q, k, v, pos = case(8, 200, seed=1)
    whole = attention.cached_attention(q, k, v, pos)
    flipped = attention.cached_attention(q.flip(2), k, v, pos.flip(0))
    assert torch.equal(flipped, whole.flip(1))
    for r in (0, 3, 7):
        alone = attention.cached_attention(q[:, :, r:r + 1], k, v, pos[r:r + 1])
        assert torch.equal(alone[:, 0], whole[:, r])


def test_bad_shapes_say_what_is_wrong():
    q, k, v, pos = case(2, 10)
    with pytest.raises(ValueError, match="5 query heads over 2 KV heads"):
        attention.cached_attention(q[:, :5], k, v, pos)
    with pytest.raises(ValueError, match="contiguous per KV head"):
        attention.cached_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), v, pos)


def test_the_runner_attends_through_the_kernel_where_it_can_and_says_so(pair):
    target, draft = pair
    plain, fast = Runner(target, 40), Runner(target, 40, Acceleration(attention=True))
    assert plain.attention_path == "sdpa" and fast.attention_path == "triton"
    assert Runner(draft, 40, Acceleration(attention=True)).attention_path.startswith("sdpa (head_dim 8")
    ids = torch.randint(3, 500, (20,), generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(fast.prefill(ids[None, :12]), plain.prefill(ids[None, :12]))
    for p in (12, 15):
        torch.testing.assert_close(fast.forward(ids[None, p:p + 3], p), plain.forward(ids[None, p:p + 3], p),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_a_target_attending_through_the_kernel_keeps_speculative_output_greedy(pair, schedule):
    accel = Acceleration(rows=5, attention=True)                   # batch-invariant calls, as on a GPU
    target = make_target(pair[0], 120, accel)
    draft = make_draft(pair[1], DenseHead(pair[1].get_output_embeddings().weight), 120)
    prompt = tuple(torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist())
    greedy = generate_baseline(target, Request(prompt, 30)).tokens
    assert generate_speculative(target, draft, Request(prompt, 30, schedule, 4)).tokens == greedy
