import pytest
import torch

from lib.models import clustering as cl
from lib.engine.heads import cluster_to_token
from lib.models.synthetic import family_embeddings

from conftest import FAMILIES, VOCAB, tiny_synthetic


@pytest.fixture(scope="module")
def families():
    """Structured data: 512 unit embeddings in 16 families of exactly 32 tokens each (float32)."""
    E, _, fam = family_embeddings(tiny_synthetic(), torch.Generator().manual_seed(0))
    return E.float(), fam


@pytest.fixture(scope="module")
def plain():
    """Unstructured data: 480 Gaussian rows in 8 dimensions."""
    return torch.randn(480, 8, generator=torch.Generator().manual_seed(0))


def check_equal(assign: torch.Tensor, n: int, c: int):
    assert assign.shape == (n,) and assign.dtype == torch.int64
    assert assign.min() >= 0 and assign.max() < c
    assert torch.equal(torch.bincount(assign, minlength=c), torch.full((c,), n // c))


# spherical_kmeans

@pytest.mark.parametrize("c", [16, 32, 64])
def test_equal_sizes_structured(families, c):
    X, _ = families
    check_equal(cl.spherical_kmeans(X, c, 6, seed=0, equal=True, candidates=8, progress=False), VOCAB, c)


@pytest.mark.parametrize("c,candidates", [(12, 4), (40, 32), (480, 8), (1, 1)])
def test_equal_sizes_plain(plain, c, candidates):
    check_equal(cl.spherical_kmeans(plain, c, 5, seed=1, equal=True, candidates=candidates, progress=False), 480, c)


def test_equal_requires_c_to_divide_rows(plain):
    with pytest.raises(ValueError, match="divide"):
        cl.spherical_kmeans(plain, 7, 3, equal=True, progress=False)          # 480 % 7 != 0
    assign = cl.spherical_kmeans(plain, 7, 3, equal=False, progress=False)   # fine without the constraint
    assert assign.shape == (480,) and assign.min() >= 0 and assign.max() < 7


def test_deterministic_for_a_seed(families):
    X, _ = families
    a = cl.spherical_kmeans(X, 32, 4, seed=3, candidates=8, progress=False)
    b = cl.spherical_kmeans(X, 32, 4, seed=3, candidates=8, progress=False)
    assert torch.equal(a, b)


def test_equal_size_recovers_families(families):
    # 16 families of exactly 32 tokens and c=16: each cluster should be exactly one family.
    X, fam = families
    assign = cl.spherical_kmeans(X, FAMILIES, 10, seed=0, equal=True, candidates=8, progress=False)
    for i in range(FAMILIES):
        assert fam[assign == i].unique().numel() == 1


@pytest.mark.parametrize("c", [16, 32, 64])
def test_equal_objective_close_to_unconstrained_and_far_above_random(families, c):
    X, _ = families
    eq = cl.objective(X, cl.spherical_kmeans(X, c, 10, seed=0, equal=True, candidates=8, progress=False), c)
    free = cl.objective(X, cl.spherical_kmeans(X, c, 10, seed=0, equal=False, progress=False), c)
    rand = cl.objective(X, torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0)) % c, c)
    assert eq >= 0.9 * free
    assert eq > rand + 0.2
    assert eq <= 1.0 + 1e-6


def test_objective_on_plain_data(plain):
    c = 12
    eq = cl.objective(plain, cl.spherical_kmeans(plain, c, 10, seed=0, candidates=4, progress=False), c)
    free = cl.objective(plain, cl.spherical_kmeans(plain, c, 10, seed=0, equal=False, progress=False), c)
    rand = cl.objective(plain, torch.randperm(480, generator=torch.Generator().manual_seed(0)) % c, c)
    assert eq >= 0.9 * free and eq > 2 * rand


def test_objective_of_perfect_clusters_is_one():
    x = torch.tensor([[1.0, 0], [2.0, 0], [0, 3.0], [0, 0.5]])
    assert cl.objective(x, torch.tensor([0, 0, 1, 1]), 2) == pytest.approx(1.0)
    assert cl.objective(x, torch.tensor([0, 1, 0, 1]), 2) == pytest.approx(2 ** -0.5)


# balanced_assign (including the fallback for rows whose candidate lists all fill up)

@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("data", ["families", "plain"])
def test_balanced_assign_tiny_candidate_lists(request, monkeypatch, m, data):
    X = request.getfixturevalue(data)
    X = X[0] if isinstance(X, tuple) else X
    n, c = X.shape[0], 16
    xn = cl.unit(X)
    cents = cl.init_centroids(xn, c, seed=0)
    calls = []
    real = cl.top_candidates
    monkeypatch.setattr(cl, "top_candidates", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    assign = cl.balanced_assign(xn, cents, n // c, m)
    check_equal(assign, n, c)
    assert len(calls) == 2, "the fallback path was not exercised"


def test_balanced_assign_without_binding_capacity_is_nearest_centroid(plain):
    xn = cl.unit(plain)
    cents = cl.init_centroids(xn, 12, seed=0)
    nearest = (xn @ cents.T).argmax(1)
    assert torch.equal(cl.balanced_assign(xn, cents, size=480, m=1), nearest)


def test_balanced_assign_keeps_the_most_similar_proposers():
    # Two centroids, room for 2 each; three rows prefer centroid 0: the least similar one moves.
    cents = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    xn = cl.unit(torch.tensor([[1.0, 0.1], [1.0, 0.5], [1.0, 0.0], [0.0, 1.0]]))
    assert cl.balanced_assign(xn, cents, size=2, m=2).tolist() == [0, 1, 0, 1]


# cluster_to_token

@pytest.mark.parametrize("data,c", [("families", 32), ("plain", 12)])
def test_cluster_to_token_is_a_consistent_permutation(request, data, c):
    X = request.getfixturevalue(data)
    X = X[0] if isinstance(X, tuple) else X
    n = X.shape[0]
    assign = cl.spherical_kmeans(X, c, 4, seed=0, candidates=4, progress=False)
    m = cluster_to_token(assign, c)
    assert m.shape == (c, n // c)
    assert torch.equal(m.flatten().sort().values, torch.arange(n))
    assert torch.equal(assign[m], torch.arange(c)[:, None].expand(c, n // c))


def test_cluster_to_token_refuses_unequal_clusters():
    with pytest.raises(ValueError, match="equal size"):
        cluster_to_token(torch.tensor([0, 0, 0, 1]), 2)
    with pytest.raises(ValueError):
        cluster_to_token(torch.tensor([0, 0, 1, 1]), 3)         # an empty cluster
    with pytest.raises(ValueError):
        cluster_to_token(torch.tensor([0, 1, 2, 3]), 2)         # ids beyond c


# containment

@pytest.fixture(scope="module")
def contain_setup(families):
    X, _ = families
    c = 32
    assign = cl.spherical_kmeans(X, c, 6, seed=0, candidates=8, progress=False)
    cents = cl.centroids_of(cl.unit(X), assign, c)
    hidden = torch.randn(300, X.shape[1], generator=torch.Generator().manual_seed(5))
    return hidden, X, cents, assign, c


@pytest.mark.parametrize("top_k", [1, 5])
def test_containment_full_probes_is_one(contain_setup, top_k):
    hidden, W, cents, assign, c = contain_setup
    assert cl.containment(hidden, W, cents, assign, c, top_k) == 1.0


@pytest.mark.parametrize("top_k", [1, 5])
def test_containment_non_decreasing_in_probes(contain_setup, top_k):
    hidden, W, cents, assign, c = contain_setup
    vals = [cl.containment(hidden, W, cents, assign, p, top_k, chunk=64) for p in (1, 2, 4, 8, 16, 32)]
    assert all(0.0 <= v <= 1.0 for v in vals)
    assert all(a <= b for a, b in zip(vals, vals[1:]))
    assert vals[0] < 1.0


def test_containment_matches_direct_count(contain_setup):
    hidden, W, cents, assign, c = contain_setup
    best = (hidden @ W.T).argmax(1)
    probed = (hidden @ cents.T).topk(3, dim=1).indices
    want = (assign[best][:, None] == probed).any(1).float().mean().item()
    assert cl.containment(hidden, W, cents, assign, 3, 1, chunk=50) == pytest.approx(want)
