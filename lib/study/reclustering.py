"""Notebook 01: equal-size re-clustering of the draft's output embeddings and how often FlashHead's probed
clusters contain the dense head's choice (thesis 4.5)."""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import bench
from ..config import Profile
from ..models import checkpoints, clustering as cl, flash_checkpoint
from ..models.flash_checkpoint import equal_size_clusters, write_flash_checkpoint
from ..results import save_json
from .common import encoded_prompts, hidden_states, trajectories_and_states

# What notebook 01 shows, reached through its one import of this module.
from ..models.flash_checkpoint import read_flash_checkpoint  # noqa: F401
from .common import setup  # noqa: F401
from .cluster_sizes import cluster_size_study  # noqa: F401
from ..report.figures import cluster_size_plot  # noqa: F401
from ..report.micro import cluster_size_table, least_read_table  # noqa: F401


def containment_sweep(H: torch.Tensor, W: torch.Tensor, cents: torch.Tensor, assign: torch.Tensor, c) -> list[dict]:
    """Top-1 and top-k containment of the dense head's choice in FlashHead's probed clusters, per probe count."""
    return [{"n_probes": p, "top1": cl.containment(H, W, cents, assign, p, 1),
             f"top{c.top_k}": cl.containment(H, W, cents, assign, p, c.top_k)} for p in c.probe_sweep]


def recluster(profile: Profile, progress: bool = True) -> dict:
    """Equal-size and unconstrained spherical k-means of the draft's output embeddings; writes the
    FlashHead checkpoint for synthetic profiles. Returns the numbers notebook 01 shows."""
    if profile.clustering.n_probes is None:                                  # pretrained: the checkpoint's own, as
        n = flash_checkpoint.read_flash_checkpoint(profile.flash_dir)[0]["n_probes"]   # its draft's head takes
        profile = replace(profile, clustering=replace(profile.clustering, n_probes=n))
    c = profile.clustering
    draft = checkpoints.load_draft(profile)
    tok = checkpoints.load_tokenizer(profile)
    W = draft.get_output_embeddings().weight.detach()
    x = W.float()
    assign, cents, seconds = equal_size_clusters(profile, x, progress)
    with bench.all_cores(x.device):
        assign_u = cl.spherical_kmeans(x, c.n_clusters, c.iterations, profile.seed, False, progress=progress)
        clustered_on = bench.device_name(x.device)
    sizes = torch.bincount(assign, minlength=c.n_clusters)
    enc = encoded_prompts(profile, tok)
    depth = profile.models.exit_layer                                        # early-exit drafts: their own depth
    H = hidden_states(draft, [ids for _, ids in enc], depth).to(W.dtype)
    H_traj = trajectories_and_states(profile, draft, enc)[2].to(W.dtype)
    result = {
        "n_tokens": int(W.shape[0]), "hidden_size": int(W.shape[1]), "n_clusters": c.n_clusters,
        "cluster_size": int(W.shape[0] // c.n_clusters), "equal_sizes": bool((sizes == sizes[0]).all()),
        "min_size": int(sizes.min()), "max_size": int(sizes.max()),
        "every_token_once": bool(assign.numel() == W.shape[0] and assign.min() >= 0),
        "seconds": seconds, "device": clustered_on,
        "mean_cosine": cl.objective(x, assign, c.n_clusters),
        "mean_cosine_unconstrained": cl.objective(x, assign_u, c.n_clusters),
        "unconstrained_size_range": [int(s) for s in torch.bincount(assign_u, minlength=c.n_clusters).aminmax()],
        "n_probes": c.n_probes, "n_hidden_states": int(H.shape[0]), "draft_depth": depth,
        "top1_containment": cl.containment(H, W, cents, assign, c.n_probes, 1),
        f"top{c.top_k}_containment": cl.containment(H, W, cents, assign, c.n_probes, c.top_k),
        "probe_sweep": containment_sweep(H, W, cents, assign, c),
        "n_trajectory_states": int(H_traj.shape[0]),
        "trajectory_probe_sweep": containment_sweep(H_traj, W, cents, assign, c),
    }
    if c.compare_shipped:
        result["shipped"] = compare_shipped(profile, x, H, W, assign, cents)
    if profile.models.source != "pretrained":                                # we made the clustering: write it
        write_flash_checkpoint(profile, tok, assign, cents)
    save_json(profile, "clustering.json", result)
    return result


def compare_shipped(profile: Profile, x: torch.Tensor, H: torch.Tensor, W: torch.Tensor, assign: torch.Tensor,
                    cents: torch.Tensor) -> dict:
    """Our re-clustering against the FlashHead checkpoint's own: objectives, agreement, containment."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
    c = profile.clustering
    _, shipped_cents, shipped = flash_checkpoint.read_flash_checkpoint(profile.flash_dir, W.shape[1], W.shape[0])
    shipped = shipped.to(W.device)
    ours, theirs = assign.cpu().numpy(), shipped.cpu().numpy()
    n = shipped_cents.shape[0]
    return {"n_clusters": int(n), "mean_cosine_shipped": cl.objective(x, shipped, n),
            "mean_cosine_ours": cl.objective(x, assign, c.n_clusters),
            "adjusted_rand_index": float(adjusted_rand_score(theirs, ours)),
            "nmi": float(normalized_mutual_info_score(theirs, ours)),
            "top1_containment_shipped": cl.containment(H, W, shipped_cents.to(W), shipped, c.n_probes, 1),
            "top1_containment_ours": cl.containment(H, W, cents, assign, c.n_probes, 1)}
