import pytest
import torch

from lib.engine.adaptive import AdaptiveFlashHead
from lib.engine.heads import DenseHead, FlashHead

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
    from lib.engine.heads import exact_fp32
    W, cents, assign = draft_clustering
    head = FlashHead(W.float(), cents.float(), assign, probes, SPECIAL_IDS)
    h = hidden[:50].float()
    assert torch.equal(exact_fp32(head, h), head.reference(h))


# ---------------------------------------------------------------- kernel paths (issue 22 item 4)

import lib.engine.heads as heads_mod  # noqa: E402
from types import SimpleNamespace  # noqa: E402


def fake_kernels(dense=None, flash=None):
    """A stand-in for lib.engine's kernels and flash_kernels: dense/flash are the kernel functions (h, W, ...) -> (1,)
    token."""
    return lambda: (SimpleNamespace(dense_greedy_triton=dense), SimpleNamespace(flash_greedy_triton=flash))


def dense_ref(h, W, *args):
    return (h.float() @ W.float().T).argmax(-1)


def flash_ref(head):
    return lambda h, *args: heads_mod.exact_fp32(head, h)


def test_cpu_heads_run_torch_whatever_the_setting(parts):
    """A CPU runs the torch path (not a fallback: head_kernel applies to CUDA), and says so."""
    W, cents, assign = parts
    for kernel in ("torch", "triton"):
        fh = FlashHead(W, cents, assign, 2, SPECIAL_IDS, kernel=kernel)
        assert DenseHead(W, kernel).kernel_ran == fh.kernel_ran == fh.with_probes(4).kernel_ran == "torch"
    from lib.engine.heads import GraphedHead
    assert GraphedHead(DenseHead(W, "triton")).kernel_ran == "torch"
    with pytest.raises(ValueError, match="head kernel"):
        DenseHead(W, "cuda")


def test_triton_not_importable_is_a_reason(parts, monkeypatch):
    W, cents, assign = parts

    def missing():
        raise ModuleNotFoundError("No module named 'triton'")
    monkeypatch.setattr(heads_mod, "triton_kernels", missing)
    fn, why = heads_mod.flash_triton(flash(parts, 2))
    assert fn is None and why.startswith("Triton is not importable") and "No module named 'triton'" in why
    fn, why = heads_mod.dense_triton(W)
    assert fn is None and why.startswith("Triton is not importable")


def test_a_profile_asking_for_triton_that_cannot_have_it_stops_in_one_line(parts, monkeypatch):
    """The caller of the decision raises KernelUnavailable naming the head, the device and the reason."""
    head = flash(parts, 2)
    monkeypatch.setattr(heads_mod, "triton_kernels", lambda: (_ for _ in ()).throw(ImportError("no triton here")))
    with pytest.raises(heads_mod.KernelUnavailable) as e:
        heads_mod.fused_kernel(head)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("FlashHead (2 probes) on cpu: bench.head_kernel is triton but Triton "
                                              "is not importable (ImportError: no triton here)")
    assert "bench.head_kernel: torch" in msg


def test_flash_kernel_disagreeing_or_failing_is_refused_with_its_reason(parts, monkeypatch):
    head = flash(parts, 2)
    wrong = lambda h, *args: flash_ref(head)(h) + 1
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=wrong))
    fn, why = heads_mod.flash_triton(head)
    assert fn is None and "disagrees with the fp32 reference on 8 of 8 probe hidden states" in why
    with pytest.raises(heads_mod.KernelUnavailable, match="disagrees with the fp32 reference"):
        heads_mod.fused_kernel(head)

    def boom(*args):
        raise RuntimeError("out of resources:\n shared memory")
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=boom))
    with pytest.raises(heads_mod.KernelUnavailable) as e:
        heads_mod.fused_kernel(head)
    assert "the Triton kernel failed (RuntimeError: out of resources: shared memory)" in str(e.value)
    assert "\n" not in str(e.value)

    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=flash_ref(head)))
    fn, why = heads_mod.flash_triton(head)                                 # one that agrees: used, no reason
    assert fn is not None and why == ""


def test_special_tokens_past_one_cluster_row_take_more_rows(parts, monkeypatch):
    """The Triton kernels score the special tokens as rows below the clusters (heads.extended_c2t): b + 1 of them take
    two rows, the second padded with -1 (no candidate), and the head still gets its kernel (it had refused past b)."""
    W, cents, assign = parts
    b = VOCAB // N_CLUSTERS
    for n, rows in ((0, 1), (b, 1), (b + 1, 2)):
        head = FlashHead(W, cents, assign, 2, list(range(n)))
        ext = heads_mod.extended_c2t(head)
        assert ext.shape == (N_CLUSTERS + rows, b) and torch.equal(ext[:N_CLUSTERS], head.c2t)
        tail = ext[N_CLUSTERS:].flatten()
        assert tail[:n].tolist() == list(range(n)) and tail[n:].eq(-1).all()
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=flash_ref(head)))
    fn, why = heads_mod.flash_triton(head)
    assert fn is not None and why == ""


@pytest.fixture
def as_if_cuda(monkeypatch):
    """Heads built as if their weights were on CUDA (the construction check runs on the CPU)."""
    monkeypatch.setattr(heads_mod, "wants_triton", lambda kernel, weight: kernel == "triton")


def test_dense_head_checks_its_triton_kernel_at_construction(parts, hidden, monkeypatch, as_if_cuda):
    W = parts[0]
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(dense=lambda h, W: dense_ref(h, W) + 1))
    with pytest.raises(heads_mod.KernelUnavailable) as e:
        DenseHead(W, "triton")
    assert str(e.value).startswith("DenseHead on cpu: bench.head_kernel is triton but the Triton kernel disagrees "
                                   "with the fp32 reference on 8 of 8 probe hidden states")
    assert DenseHead(W, "torch").kernel_ran == "torch"                     # asked for torch: never checked
    calls = []
    monkeypatch.setattr(heads_mod, "triton_kernels",
                        fake_kernels(dense=lambda h, W: calls.append(1) or dense_ref(h, W)))
    head = DenseHead(W, "triton")
    assert head.kernel_ran == "triton" and len(calls) == 8                 # checked on 8 probe states
    assert torch.equal(head(hidden[:1]), DenseHead(W)(hidden[:1])) and len(calls) == 9   # one state: the kernel


def test_flash_head_checks_its_triton_kernel_at_construction(parts, monkeypatch, as_if_cuda):
    W, cents, assign = parts
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=lambda h, W, *a: torch.zeros(1, dtype=torch.long)))
    with pytest.raises(heads_mod.KernelUnavailable, match=r"^FlashHead \(2 probes\) on cpu: .* disagrees"):
        FlashHead(W, cents, assign, 2, SPECIAL_IDS, kernel="triton")
    head = FlashHead(W, cents, assign, 2, SPECIAL_IDS, kernel="torch")
    assert head.kernel_ran == "torch"
    monkeypatch.setattr(heads_mod, "triton_kernels", fake_kernels(flash=lambda h, W, cents, c2t, p: torch.zeros(1, dtype=torch.long)))
    with pytest.raises(heads_mod.KernelUnavailable):                       # with_probes checks its own kernel too
        head.with_probes(4, "triton")


@pytest.mark.parametrize("probes", [1, 3, N_CLUSTERS])
@pytest.mark.parametrize("n", [1, 5, 64])
def test_union_select_is_each_rows_flashhead_choice(parts, hidden, probes, n):
    head = flash(parts, probes)
    h = hidden[torch.randperm(hidden.shape[0], generator=torch.Generator().manual_seed(n))[:n]]
    assert torch.equal(head.union_select(h), head.reference(h))


def test_union_select_breaks_ties_to_the_smaller_id(parts):
    W, cents, assign = parts
    c2t = FlashHead(W, cents, assign, 1, []).c2t
    a, b = sorted([c2t[0, 3].item(), c2t[1, 5].item()])      # tokens in clusters 0 and 1
    W2 = W.clone()
    W2[a] = W2[b]                                             # equal logits for every hidden state
    head = FlashHead(W2, cents, assign, N_CLUSTERS, [])       # every cluster probed: both are candidates
    h = 10 * W2[b][None]
    assert (h @ W2.T).argmax().item() == a                    # the dense argmax: the first maximum
    assert head.union_select(h).item() == a


def test_probed_marks_exactly_the_probe_clusters(parts, hidden):
    head = flash(parts, 3)
    hit = head.probed(hidden)
    assert hit.shape == (hidden.shape[0], N_CLUSTERS) and (hit.sum(1) == 3).all()
    assert torch.equal(hit.nonzero()[:, 1].view(-1, 3), head.probes(hidden).sort(1).values)


def test_batched_checks_its_triton_kernel_on_first_use(parts, hidden, monkeypatch, as_if_cuda):
    """FlashHead.batched with kernel "triton": the batched kernel is checked against exact_fp32 before its first
    batch and refused in one line when it disagrees; once accepted it is used (never union_select)."""
    W, cents, assign = parts
    ref = FlashHead(W, cents, assign, 2, SPECIAL_IDS)
    fake = SimpleNamespace(flash_greedy_triton=lambda h, *a: heads_mod.exact_fp32(ref, h),
                           flash_batch_triton=lambda h, *a: heads_mod.exact_fp32(ref, h) + 1)
    monkeypatch.setattr(heads_mod, "triton_kernels", lambda: (None, fake))
    head = FlashHead(W, cents, assign, 2, SPECIAL_IDS, kernel="triton")
    with pytest.raises(heads_mod.KernelUnavailable, match=r"^FlashHead \(2 probes, batched\) on cpu: .* disagrees "
                                                            r"with the fp32 reference on 16 of 16 probe hidden states"):
        head.batched(hidden[:4])
    calls = []
    fake.flash_batch_triton = lambda h, *a: calls.append(len(h)) or heads_mod.exact_fp32(ref, h)
    monkeypatch.setattr(head, "union_select", None)
    assert torch.equal(head.batched(hidden[:5]), head.reference(hidden[:5])) and head.batched_ran == "triton"
    assert calls == [16, 5]                                                 # the check's batch, then ours


def test_batched_on_a_cpu_is_union_select(parts, hidden):
    head = flash(parts, 3)
    assert head.batched_ran == "torch" and torch.equal(head.batched(hidden[:9]), head.union_select(hidden[:9]))


@pytest.mark.parametrize("probes", [2, 8])
def test_an_exact_tie_goes_to_the_smallest_id_as_in_the_dense_head(probes):
    # Tokens with equal logits (duplicate embedding rows: untrained tokens of real vocabularies; in bf16 also
    # near-ties rounded together): the dense head takes the smallest id, and so must FlashHead once both are
    # candidates (every cluster probed: it is the dense head), whichever of their clusters it scores first.
    g = torch.Generator().manual_seed(0)
    c, b, d = 8, 4, 6
    W = torch.nn.functional.normalize(torch.randn(c * b, d, generator=g, dtype=torch.float64), dim=1)
    cents = torch.randn(c, d, generator=g, dtype=torch.float64)
    best = torch.nn.functional.normalize(torch.randn(d, generator=g, dtype=torch.float64), dim=0)
    h = 5 * best[None]
    top = (h @ cents.T).topk(probes).indices[0].tolist()                    # both copies' clusters are probed
    assign = (torch.arange(c * b) + 1) % c
    for first, second in ((top[0], top[1]), (top[1], top[0])):              # either cluster holds the smaller id
        lo, hi = (assign == first).nonzero()[0].item(), (assign == second).nonzero()[-1].item()
        V = W.clone()
        V[lo], V[hi] = best, best                                           # the best token twice: ids lo and hi
        want = DenseHead(V)(h).item()
        assert want == min(lo, hi)
        head = FlashHead(V, cents, assign, probes)
        assert head(h).item() == head.union_select(h).item() == want, (first, second)
        adaptive = AdaptiveFlashHead(head, 1.0, probes, probes)                   # probes as many clusters, masked
        assert adaptive(h).item() == want, (first, second)
