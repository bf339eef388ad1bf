"""Notebook 01's cluster-size study: how big should FlashHead's clusters be? (The thesis leaves the number of
clusters and the probe count to future work, to be tuned for the target that verifies the draft.)

For each cluster size b of clustering.size_sweep the draft's output embeddings are re-clustered (the same seeded
equal-size k-means as the profile's own clustering, c = V/b clusters), and FlashHead is run on the draft's hidden
states along the greedy trajectories of the profile's prompts at probe counts that score the same numbers of
tokens at every b (clustering.probe_sweep times the profile's own cluster size). Each setting reads c centroids and
p*b token rows (plus the special tokens): small clusters pay in centroids, large ones in probing coarsely. At each
setting: how often FlashHead picks the dense head's token (top-1 containment, ties aside) and how often it picks
the target's greedy token at that position (the first draft token's acceptance, the quantity speculative decoding
pays for), the share of the dense head's bytes it reads, and its time for one hidden state on the draft's device.
Every size is this study's own clustering, the profile's size too (where the profile reads a shipped FlashHead
checkpoint, notebook 01 compares that one with ours). Writes cluster_sizes.json."""
from __future__ import annotations

import torch

from .. import bench, prompts as prompt_lib
from ..config import Profile
from ..engine.heads import DenseHead, FlashHead
from ..models import checkpoints, clustering as cl
from ..models.flash_checkpoint import equal_size_clusters, special_token_ids
from ..profile_rules import ConfigError
from ..progress import steps
from ..results import save_json
from .common import encoded_prompts, hidden_states, trajectories_and_states

LEVELS = (0.90, 0.95)          # containment levels the summary gives each cluster size's least bytes for
TARGET_SLACK = 0.01            # ... and agreement with the target within this of the dense head's


def cluster_size_study(profile: Profile, progress: bool = True) -> dict | None:
    """Every cluster size of clustering.size_sweep at equal numbers of scored tokens (see the module's text); None
    (and no file) where the sweep is empty, as in the AWQ profiles, whose draft is their bf16 profile's."""
    c = profile.clustering
    if not c.size_sweep:
        return None
    draft, tok = checkpoints.load_draft(profile), checkpoints.load_tokenizer(profile)
    W = draft.get_output_embeddings().weight.detach()
    V = W.shape[0]
    if bad := [b for b in c.size_sweep if b < 1 or V % b]:
        raise ConfigError(f"clustering.size_sweep: {bad} do not divide the vocabulary ({V} tokens)")
    enc = encoded_prompts(profile, tok)
    seqs, starts, H = trajectories_and_states(profile, draft, enc)
    H = H.to(W.dtype)
    dense_tokens, target_tokens = (H @ W.T).argmax(-1), target_choices(profile, seqs, starts)
    specials, b0 = special_token_ids(tok), V // c.n_clusters
    budgets = sorted({p * b0 for p in c.probe_sweep})                       # tokens scored a step, equal across b
    dense = DenseHead(W, profile.bench.head_kernel)
    rows, sizes = [], []
    for b in steps(c.size_sweep, "cluster sizes", "sizes") if progress else c.size_sweep:
        cents, assign, info = clustered(profile, W, b)
        sizes.append(info)
        heads = [FlashHead(W, cents, assign, n // b, specials, profile.bench.head_kernel)
                 for n in budgets if n % b == 0 and 1 <= n // b <= V // b]
        rows += [setting_row(profile, fh, H, dense_tokens, target_tokens) for fh in heads]
    dense_target = rate(dense_tokens, target_tokens)
    result = {"device": bench.device_name(W.device), "synthetic": profile.models.source == "synthetic",
              "vocab": V, "hidden": int(W.shape[1]), "dtype": str(W.dtype).removeprefix("torch."),
              "graphed": W.is_cuda and profile.bench.cuda_graphs, "n_states": int(H.shape[0]),
              "prompts": f"{len(enc)} prompts, {prompt_lib.profile_prompt_file(profile.prompts.file)[1]}",
              "n_special": len(specials), "profile_cluster_size": b0,
              "scored_tokens": budgets, "sizes": sizes, "rows": rows,
              "dense": {"agree_target": dense_target, "time": head_time(profile, dense, H)},
              "least_read": least_read(rows, dense_target)}
    save_json(profile, "cluster_sizes.json", result)
    return result


def target_choices(profile: Profile, seqs: list[list[int]], starts: list[int]) -> torch.Tensor:
    """The target's greedy token at every trajectory position (what a draft token must equal to be accepted)."""
    target = checkpoints.load_target(profile)
    Ht = hidden_states(target, seqs, None, starts)
    Wt = target.get_output_embeddings().weight.detach()
    return (Ht.to(Wt) @ Wt.T).argmax(-1).to(profile.draft_device)


def clustered(profile: Profile, W: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """W's rows in clusters of b tokens by the profile's seeded equal-size k-means: (unit centroids (c,d),
    assignments (V,), a record of the clustering)."""
    x, n = W.float(), W.shape[0] // b
    assign, cents, seconds = equal_size_clusters(profile, x, n_clusters=n)
    sizes = torch.bincount(assign, minlength=n)
    info = {"cluster_size": b, "n_clusters": n, "equal_sizes": bool((sizes == b).all()),
            "mean_cosine": cl.objective(x, assign, n), "seconds": seconds}
    return cents, assign, info


def setting_row(profile: Profile, fh: FlashHead, H: torch.Tensor, dense_tokens: torch.Tensor,
                target_tokens: torch.Tensor) -> dict:
    """One (cluster size, probe count): agreement with the dense head and with the target, bytes, time."""
    n, b = fh.c2t.shape
    step = max(1, (1 << 26) // (fh.n_probes * b * H.shape[1]))                # states a chunk: <= 64M gathered weights
    chosen = torch.cat([fh.reference(H[i:i + step]) for i in range(0, H.shape[0], step)])
    read = n + fh.n_probes * b + fh.special.numel()                         # rows of d read: centroids, tokens
    return {"cluster_size": b, "n_clusters": n, "n_probes": fh.n_probes, "scored_tokens": fh.n_probes * b,
            "read_fraction": read / fh.weight.shape[0], "agree_dense": rate(chosen, dense_tokens),
            "agree_target": rate(chosen, target_tokens), "time": head_time(profile, fh, H), "path": fh.kernel_ran}


def rate(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a == b).float().mean())


def head_time(profile: Profile, head, H: torch.Tensor) -> dict:
    """One hidden state through the head (its single-state path, as in a draft step; on a GPU a CUDA-graph replay
    where bench.cuda_graphs, so that launches are not what is timed): bench.stats in ms."""
    h, bq = H[:1].contiguous(), profile.bench
    with bench.on(h.device):
        fn = bench.capture(lambda: head(h))[0].replay if h.is_cuda and bq.cuda_graphs else lambda: head(h)
        ms = bench.time_calls(fn, max(2, bq.warmup // 2), max(10, bq.iters // 5), h.device)
    return bench.stats(ms)


def least_read(rows: list[dict], dense_target: float) -> list[dict]:
    """For each criterion and cluster size, the setting that meets it reading the least share of the dense head's
    bytes (None where none does). Criteria: top-1 containment of at least each of LEVELS, and agreement with the
    target within TARGET_SLACK of the dense head's (dense_target)."""
    criteria = {f"= dense head >= {v:.2f}": (lambda r, v=v: r["agree_dense"] >= v) for v in LEVELS}
    near = dense_target - TARGET_SLACK
    criteria[f"= target within {TARGET_SLACK} of the dense head"] = lambda r: r["agree_target"] >= near
    out = []
    for name, meets in criteria.items():
        for b in sorted({r["cluster_size"] for r in rows}):
            ok = [r for r in rows if r["cluster_size"] == b and meets(r)]
            best = min(ok, key=lambda r: r["read_fraction"]) if ok else None
            out.append({"criterion": name, "cluster_size": b, "n_probes": best and best["n_probes"],
                        "read_fraction": best and best["read_fraction"]})
    return out
