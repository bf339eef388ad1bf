"""Shared tiny fixtures for the unit tests.

Everything here is built in memory from tiny shapes (vocab 512, 16 token families, draft hidden 32,
target hidden 64, two layers each) so the whole suite runs in seconds on a 2-core CPU.
"""
import os
import tempfile

import pytest
import torch

# Tests never write into the checkout's outputs/: results go to a scratch root unless one is set (make test sets one),
os.environ.setdefault("STUDY_OUTPUTS", tempfile.mkdtemp(prefix="study-test-outputs-"))
os.environ.setdefault("STUDY_MODELS", tempfile.mkdtemp(prefix="study-test-models-"))   # nor into its models/

from lib.config import Shape, Synthetic

# Tiny models: one intra-op thread is far faster than two contending ones (and deterministic).
torch.set_num_threads(1)

VOCAB = 512
FAMILIES = 16
DRAFT_D = 32
TARGET_D = 64
N_CLUSTERS = 64          # 8 tokens per cluster (and != DRAFT_D, so (c,d) and (d,c) differ)
SPECIAL_IDS = [0, 1, 2]


def tiny_synthetic(**kw) -> Synthetic:
    base = dict(vocab_size=VOCAB, n_families=FAMILIES, family_cos=0.8, draft_noise=0.3, target_noise=0.3,
                target=Shape(hidden_size=TARGET_D, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, intermediate_size=2 * TARGET_D),
                draft=Shape(hidden_size=DRAFT_D, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=8, intermediate_size=2 * DRAFT_D))
    base.update(kw)
    return Synthetic(**base)


@pytest.fixture(scope="session")
def syn() -> Synthetic:
    return tiny_synthetic()


@pytest.fixture(scope="session")
def pair(syn):
    """(target, draft) Qwen3ForCausalLM, float32 on the CPU, never written to disk."""
    from lib.models.synthetic import make_pair
    return make_pair(syn, 0, "float32", "cpu")


@pytest.fixture(scope="session")
def draft_clustering(pair):
    """Equal-size clustering of the draft's (tied) output embeddings: (W, centroids, assignments)."""
    from lib.models import clustering as cl
    W = pair[1].get_output_embeddings().weight.detach()
    assign = cl.spherical_kmeans(W, N_CLUSTERS, 8, seed=0, equal=True, candidates=8, progress=False)
    cents = cl.centroids_of(cl.unit(W.float()), assign, N_CLUSTERS)
    return W, cents, assign
