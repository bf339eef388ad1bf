"""Batch-invariant target calls (lib/engine/runner.py: Acceleration.rows): every call of at most `rows` tokens
runs at exactly `rows` rows, so a verify call's rows are bitwise the single-token calls' at the same positions,
and speculative decoding returns exactly the greedy output in bf16 too."""
import pytest
import torch

from lib.config import load_profile
from lib.engine.heads import DenseHead, FlashHead
from lib.engine.runner import Acceleration, Runner
from lib.engine.speculative import Request, generate_baseline, generate_speculative
from lib.models.build import acceleration, make_draft, make_target
from lib.models.synthetic import make_pair

from conftest import SPECIAL_IDS, VOCAB

K = 4
MAX_NEW = 40
MAX_LEN = 24 + MAX_NEW + K + 8


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def models(request, syn):
    return make_pair(syn, 0, request.param, "cpu")


def stepwise_and_batched(model, rows: int, n: int = 8):
    """Hidden states of n tokens after a prompt, fed one call per token and in one call of n tokens."""
    g = torch.Generator().manual_seed(1)
    prompt, cont = torch.randint(3, VOCAB, (1, 20), generator=g), torch.randint(3, VOCAB, (1, n), generator=g)
    one, batch = Runner(model, MAX_LEN, Acceleration(rows=rows)), Runner(model, MAX_LEN, Acceleration(rows=rows))
    one.prefill(prompt)
    batch.prefill(prompt)
    step = torch.cat([one.forward(cont[:, i:i + 1], 20 + i)[0] for i in range(n)])
    return step, batch.forward(cont, 20)[0], (one, batch, cont)


@pytest.mark.parametrize("n", [2, 5, K + 1])
def test_verify_rows_are_bitwise_the_single_token_rows(models, n):
    step, batched, (one, batch, cont) = stepwise_and_batched(models[0], rows=K + 1, n=n)
    assert torch.equal(step, batched)
    # the K/V the batched call wrote are the stepwise ones too, so the next call sees the same cache
    assert torch.equal(one.cache.k[:, :, :, :20 + n], batch.cache.k[:, :, :, :20 + n])
    nxt = cont[:, -1:]
    assert torch.equal(one.greedy(nxt, 20 + n), batch.greedy(nxt, 20 + n))


def test_calls_longer_than_the_rows_run_as_they_are(models):
    step, batched, (_, batch, cont) = stepwise_and_batched(models[0], rows=3, n=6)   # 6 > 3 rows: unpadded
    assert step.shape == batched.shape == (6, models[0].config.hidden_size)
    # unpadded: the same call a runner without batch-invariant rows makes, bit for bit, and the same hidden states
    # as the one-token calls up to the rounding of a different row count
    plain = Runner(models[0], MAX_LEN)
    plain.prefill(torch.randint(3, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1)))
    assert torch.equal(batched, plain.forward(cont, 20)[0])
    tol = 1e-5 if batched.dtype == torch.float32 else 5e-2
    torch.testing.assert_close(batched, step, rtol=tol, atol=tol)


def engines(models, draft_clustering):
    target_model, draft_model = models
    W = draft_model.get_output_embeddings().weight
    _, cents, assign = draft_clustering
    heads = {"dense": DenseHead(W), "flash": FlashHead(W, cents.to(W.dtype), assign, 2, SPECIAL_IDS)}
    target = make_target(target_model, MAX_LEN, Acceleration(rows=K + 1))
    return target, {name: make_draft(draft_model, h, MAX_LEN) for name, h in heads.items()}


@pytest.mark.parametrize("schedule", ["ordinary", "deferred", "pipelined"])
def test_speculative_output_is_the_greedy_output_in_every_dtype(models, draft_clustering, schedule):
    target, drafts = engines(models, draft_clustering)
    for seed in range(3):
        prompt = torch.randint(3, VOCAB, (24,), generator=torch.Generator().manual_seed(seed)).tolist()
        greedy = generate_baseline(target, Request(prompt, MAX_NEW)).tokens
        for name, draft in drafts.items():
            for k in (1, 2, K):
                res = generate_speculative(target, draft, Request(prompt, MAX_NEW, schedule, k))
                assert res.tokens == greedy, (name, k, seed)


def test_the_profile_turns_it_on_for_cuda_targets_only():
    p = load_profile("smoke")
    assert acceleration(p, "target").rows == 0                              # CPU: off unless asked
    h = load_profile("h100")
    assert acceleration(h, "target").rows == h.decode.k_max + 1 and acceleration(h, "draft").rows == 0
    from dataclasses import replace
    off = replace(h, decode=replace(h.decode, batch_invariant=False))
    on = replace(p, decode=replace(p.decode, batch_invariant=True))
    assert acceleration(off, "target").rows == 0 and acceleration(on, "target").rows == p.decode.k_max + 1
