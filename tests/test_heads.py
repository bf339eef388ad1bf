import pytest
import torch

from lib.heads import DenseHead, FlashHead

from conftest import N_CLUSTERS, SPECIAL_IDS, VOCAB


@pytest.fixture(scope="module")
def parts(draft_clustering):
    """Draft output embeddings and their clustering in float64 (so argmax ties cannot blur the checks)."""
    W, cents, assign = draft_clustering
    return W.double(), cents.double(), assign


@pytest.fixture(scope="module")
def hidden(parts):
    """Random hidden states plus hidden states near token embeddings (a mix of easy and hard cases)."""
    W = parts[0]
    g = torch.Generator().manual_seed(7)
    rnd = torch.randn(400, W.shape[1], generator=g, dtype=torch.float64)
    ids = torch.randint(0, VOCAB, (400,), generator=g)
    near = 3 * W[ids] + 0.5 * torch.randn(400, W.shape[1], generator=g, dtype=torch.float64)
    return torch.cat([rnd, near])


def flash(parts, probes, special=SPECIAL_IDS):
    W, cents, assign = parts
    return FlashHead(W, cents, assign, probes, special)


def test_dense_head_is_argmax(parts, hidden):
    W = parts[0]
    got = DenseHead(W)(hidden)
    assert got.shape == (hidden.shape[0],) and got.dtype == torch.int64
    assert torch.equal(got, torch.stack([(W @ h).argmax() for h in hidden]))


def test_full_probes_equals_dense(parts, hidden):
    head = flash(parts, N_CLUSTERS)
    assert head.n_clusters == N_CLUSTERS
    assert torch.equal(head(hidden), DenseHead(parts[0])(hidden))


def test_full_probes_equals_dense_float32(draft_clustering, hidden):
    # In the draft's own dtype the two heads sum in different orders: the chosen token must be a
    # maximiser of the dense logits up to float32 rounding.
    W, cents, assign = draft_clustering
    h = hidden.float()
    tok = FlashHead(W, cents, assign, N_CLUSTERS, SPECIAL_IDS)(h)
    logits = h @ W.T
    assert torch.allclose(logits.gather(1, tok[:, None]).squeeze(1), logits.max(1).values, atol=1e-4)


@pytest.mark.parametrize("probes", [1, 2, 5, N_CLUSTERS])
def test_candidates_shape_and_specials(parts, hidden, probes):
    head = flash(parts, probes)
    cand = head.candidates(hidden)
    b = VOCAB // N_CLUSTERS
    assert cand.shape == (hidden.shape[0], probes * b + len(SPECIAL_IDS))
    for s in SPECIAL_IDS:
        assert (cand == s).any(1).all()
    # the non-special candidates are whole clusters: p distinct clusters of b tokens
    assign = parts[2]
    clusters = assign[cand[:, :probes * b]]
    assert all(torch.bincount(row, minlength=N_CLUSTERS).max() == b for row in clusters)
    assert all(row.unique().numel() == probes for row in clusters)


def test_candidates_are_the_top_scoring_clusters(parts, hidden):
    W, cents, assign = parts
    head = flash(parts, 3)
    top = (hidden @ cents.T).topk(3, dim=1).indices
    got = assign[head.candidates(hidden)[:, :3 * (VOCAB // N_CLUSTERS)]]
    for t, g in zip(top, got):
        assert set(g.tolist()) == set(t.tolist())


@pytest.mark.parametrize("probes", [1, 2, 4, N_CLUSTERS])
def test_output_is_a_candidate(parts, hidden, probes):
    head = flash(parts, probes)
    tok = head(hidden)
    assert tok.shape == (hidden.shape[0],) and tok.dtype == torch.int64
    assert (head.candidates(hidden) == tok[:, None]).any(1).all()


@pytest.mark.parametrize("probes", [1, 2, 4])
def test_fewer_probes_exact_when_dense_argmax_is_probed(parts, hidden, probes):
    head = flash(parts, probes)
    dense = DenseHead(parts[0])(hidden)
    tok = head(hidden)
    inside = (head.candidates(hidden) == dense[:, None]).any(1)
    assert torch.equal(tok[inside], dense[inside])
    assert (tok[~inside] != dense[~inside]).all()          # output is always a candidate
    assert inside.any() and (~inside).any(), "need both cases for this test to mean something"
    # and among its candidates FlashHead picks the best-scoring one
    cand = head.candidates(hidden)
    scores = torch.einsum("nmd,nd->nm", parts[0][cand], hidden)
    chosen = (parts[0][tok] * hidden).sum(1)
    assert torch.allclose(chosen, scores.max(1).values)


def test_special_token_found_outside_probed_clusters(parts):
    W, cents, assign = parts
    s = 5
    h = 10 * W[s][None]                                    # dense argmax is token 5
    assert DenseHead(W)(h).item() == s
    # relabel so that token 5's cluster sits under the least attractive centroid: never probed
    far = (h @ cents.T).argmin().item()
    own = assign[s].item()
    perm = assign.clone()
    perm[assign == own], perm[assign == far] = far, own
    without = FlashHead(W, cents, perm, 1, [])
    with_special = FlashHead(W, cents, perm, 1, [s])
    assert (without.candidates(h) != s).all() and without(h).item() != s
    assert with_special(h).item() == s


def test_no_special_ids(parts, hidden):
    head = flash(parts, 2, special=())
    assert head.candidates(hidden).shape[1] == 2 * VOCAB // N_CLUSTERS


def test_with_probes_returns_new_head_and_keeps_original(parts, hidden):
    head = flash(parts, 2)
    before = head(hidden).clone()
    other = head.with_probes(N_CLUSTERS)
    assert isinstance(other, FlashHead) and other is not head
    assert other.n_probes == N_CLUSTERS and head.n_probes == 2
    assert torch.equal(other(hidden), DenseHead(parts[0])(hidden))
    assert torch.equal(head(hidden), before)
    assert torch.equal(head.with_probes(4)(hidden), flash(parts, 4)(hidden))


def test_flash_head_refuses_unequal_assignments(parts):
    W, cents, assign = parts
    bad = assign.clone()
    bad[0] = (bad[0] + 1) % N_CLUSTERS
    with pytest.raises(ValueError):
        FlashHead(W, cents, bad, 2, SPECIAL_IDS)


@pytest.mark.parametrize("c", [7, 42, 64])
def test_probes_are_exactly_the_top_p_clusters_for_every_p(c):
    # FlashHead may split the centroid scores into rows before its top-p: the probed set must still be
    # exactly the top-p clusters, for every p, whether built with p or derived with with_probes.
    g = torch.Generator().manual_seed(c)
    b, d = 4, 16
    W = torch.randn(c * b, d, generator=g, dtype=torch.float64)
    cents = torch.randn(c, d, generator=g, dtype=torch.float64)
    assign = torch.randperm(c * b, generator=g) % c
    h = torch.randn(50, d, generator=g, dtype=torch.float64)
    order = (h @ cents.T).argsort(dim=1, descending=True)
    first, last = FlashHead(W, cents, assign, 1), FlashHead(W, cents, assign, c)
    for p in range(1, c + 1):
        want = order[:, :p].sort(1).values
        for head in (FlashHead(W, cents, assign, p), first.with_probes(p), last.with_probes(p)):
            assert head.n_probes == p
            assert torch.equal(head.probes(h).sort(1).values, want), (c, p)
            assert torch.equal(assign[head.candidates(h)].sort(1).values, want.repeat_interleave(b, 1)), (c, p)


@pytest.mark.parametrize("probes", [1, 3, N_CLUSTERS])
def test_exact_fp32_selection_is_flashheads_on_fp32_inputs(draft_clustering, hidden, probes):
    """The reference the Triton path is checked against: on fp32 weights it is FlashHead's own selection."""
    from lib.heads import exact_fp32
    W, cents, assign = draft_clustering
    head = FlashHead(W.float(), cents.float(), assign, probes, SPECIAL_IDS)
    h = hidden[:50].float()
    assert torch.equal(exact_fp32(head, h), head.reference(h))
