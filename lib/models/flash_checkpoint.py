"""The FlashHead checkpoint format (Embedl's): a model directory whose config.json adds flash_head_cache_dir,
n_clusters, n_probes and flash_head_special_token_ids, with <cache_dir>/clustering_cache.safetensors holding
the centroids (1, 1, d, c) and cluster_assignments (V,). Written for our re-clusterings, read for every
profile; the body loads as a plain Qwen3 or Llama model, remote code off."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, Qwen3Config

from .. import bench
from ..config import Profile
from . import checkpoints, clustering as cl
from .checkpoints import load_model, local_path, looks_like_path, resolve_model_dir
from ..engine.heads import FlashHead
from .synthetic import SPECIAL_TOKENS

FLASH_KEYS = ("flash_head_cache_dir", "n_clusters", "n_probes", "flash_head_special_token_ids")
PROBES_PER_CLUSTERS = 16  # where a checkpoint leaves n_probes null: c // 16 probes, Embedl's loader's default

def special_token_ids(tokenizer) -> list[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(i for t in SPECIAL_TOKENS if (i := tokenizer.convert_tokens_to_ids(t)) is not None and i >= 0)
    return sorted(i for i in ids if i is not None and i >= 0 and i != tokenizer.unk_token_id)


def save_flash_checkpoint(draft_dir: str | Path, out_dir: str | Path, centroids: torch.Tensor,
                          assignments: torch.Tensor, n_probes: int, special_ids: list[int],
                          replace: bool = True) -> Path:
    """Write a FlashHead model directory: the draft's files, flash keys in config.json, clustering assets. It is
    written beside out_dir and renamed into place whole, so that processes making the same one at once (Slurm
    shards) never read or write a half-made one; replace=False keeps one that is already there."""
    return _placed(Path(out_dir), lambda tmp: _write_flash_dir(Path(draft_dir), tmp, centroids, assignments,
                                                               n_probes, special_ids), replace)


def _placed(out: Path, write, replace: bool) -> Path:
    """`write` (a function of a directory) run on a directory beside `out`, then renamed into place whole."""
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if replace and out.exists():
        shutil.rmtree(out)
    try:
        tmp.rename(out)
    except OSError:                              # another process put one there first: the same clustering, kept
        shutil.rmtree(tmp)
    return out


def _write_flash_dir(draft_dir: Path, out: Path, centroids: torch.Tensor, assignments: torch.Tensor, n_probes: int,
                     special_ids: list[int], cache_dir: str = "flash_head_assets") -> None:
    shutil.copytree(draft_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    body = (cfg.get("architectures") or ["Qwen3ForCausalLM"])[0]                  # FlashHeadQwen3/LlamaForCausalLM
    cfg.update(architectures=[f"FlashHead{body}"], flash_head_cache_dir=cache_dir,
               n_clusters=int(centroids.shape[0]), n_probes=int(n_probes),
               flash_head_special_token_ids=[int(i) for i in special_ids])
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / cache_dir).mkdir()
    # Embedl's layout: centroids stored as (1, 1, d, c), read back by read_flash_checkpoint.
    save_file({"centroids": centroids.float().T[None, None].contiguous().cpu(),
               "cluster_assignments": assignments.to(torch.int64).contiguous().cpu()},
              str(out / cache_dir / "clustering_cache.safetensors"))


def read_flash_checkpoint(path: str | Path, hidden_size: int | None = None, vocab_size: int | None = None):
    """Read and check a FlashHead directory (or a hub id in the local cache).
    Returns (config dict, centroids (c,d), assignments (V,))."""
    path = Path(path)
    if not local_path(path).is_dir() and not looks_like_path(str(path)):
        path = resolve_model_dir(str(path))                            # hub id -> cached snapshot
    path = local_path(path)
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"FlashHead checkpoint {path}: no config.json")
    cfg = json.loads(cfg_file.read_text())
    missing = [k for k in FLASH_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"FlashHead checkpoint {path}: config.json lacks {missing}")
    assets = path / cfg["flash_head_cache_dir"] / "clustering_cache.safetensors"
    if not assets.exists():
        raise FileNotFoundError(f"FlashHead checkpoint {path}: missing {assets.relative_to(path)}")
    t = load_file(str(assets))
    for key in ("centroids", "cluster_assignments"):
        if key not in t:
            raise ValueError(f"{assets}: no tensor {key!r} (has {sorted(t)})")
    # Null entries read as Embedl's loader reads them: the clusters the centroids hold, c // 16 probes, no special
    # tokens; special ids outside the vocabulary are dropped (written back to cfg, so every reader sees them).
    d = hidden_size or cfg.get("hidden_size")
    V = vocab_size or cfg.get("vocab_size")
    cents = centroids_from_format(t["centroids"], cfg["n_clusters"], d, assets)
    c = cfg["n_clusters"] = cents.shape[0]
    cfg["n_probes"] = cfg["n_probes"] or max(1, c // PROBES_PER_CLUSTERS)
    assign = t["cluster_assignments"].reshape(-1).long()
    cfg["flash_head_special_token_ids"] = sorted({int(i) for i in cfg["flash_head_special_token_ids"] or []
                                                  if 0 <= int(i) < assign.numel()})
    if V is not None and assign.numel() != V:
        raise ValueError(f"{assets}: cluster_assignments has {assign.numel()} entries but the vocabulary is {V}")
    if assign.min() < 0 or assign.max() >= c:
        raise ValueError(f"{assets}: cluster ids outside 0..{c - 1}")
    counts = torch.bincount(assign, minlength=c)
    if (counts != counts[0]).any():
        raise ValueError(f"{assets}: clusters are not of equal size ({counts.min().item()}..{counts.max().item()} tokens)")
    return cfg, cents, assign


def centroids_from_format(stored: torch.Tensor, c: int | None, d: int | None, where) -> torch.Tensor:
    """Unit centroids (c,d) from the stored tensor. The orientation comes from the layout, never from the
    shape (c may equal d): rank 4 is Embedl's (1, 1, d, c); rank 2 is (c, d). Rows are L2-normalised, as
    the published loader does before scoring. c, d: checked where given."""
    if stored.dim() == 4 and stored.shape[:2] == (1, 1):
        cents = stored[0, 0].T                                         # (d,c) -> (c,d)
    elif stored.dim() == 2:
        cents = stored
    else:
        raise ValueError(f"{where}: centroids of shape {tuple(stored.shape)}: expected (1, 1, d, c) or (c, d)")
    if (c is not None and cents.shape[0] != c) or (d is not None and cents.shape[1] != d):
        raise ValueError(f"{where}: centroids of shape {tuple(stored.shape)} do not match n_clusters={c} "
                         f"and hidden_size={d}")
    return torch.nn.functional.normalize(cents.float(), dim=-1).contiguous()


FLASH_BODIES = {"qwen3": (Qwen3Config, "Qwen3ForCausalLM"), "flash_head_qwen3": (Qwen3Config, "Qwen3ForCausalLM"),
                "llama": (LlamaConfig, "LlamaForCausalLM")}


def flash_body_config(cfg: dict):
    """The FlashHead checkpoint's config as a plain Qwen3 (or Llama) config. Its config.json names the
    architecture FlashHead<Body>ForCausalLM (so that vLLM refuses it without the plugin) and the body's
    model_type (older Qwen3 exports: flash_head_qwen3); the body is an ordinary Qwen3ForCausalLM or
    LlamaForCausalLM, loaded without remote code."""
    model_type = cfg.get("model_type", "qwen3")
    if model_type not in FLASH_BODIES:
        raise ValueError(f"FlashHead checkpoint body has model_type {model_type!r}; supported: {sorted(FLASH_BODIES)}")
    cls, arch = FLASH_BODIES[model_type]
    body = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "auto_map")}
    config = cls.from_dict(body)
    config.architectures = [arch]
    return config


def load_flash_draft(profile: Profile, n_probes: int | None = None):
    """The FlashHead draft: the checkpoint's body as Qwen3ForCausalLM or LlamaForCausalLM (remote code off)
    and its FlashHead."""
    path = flash_checkpoint_dir(profile)
    cfg = read_flash_checkpoint(path)[0]
    model = load_model(str(path), profile.dtype, profile.draft_device, profile.models.awq_backend,
                       config=flash_body_config(cfg))
    return model, load_flash_head(profile, model.get_output_embeddings().weight, n_probes)


def flash_checkpoint_dir(profile: Profile) -> Path:
    """The profile's FlashHead checkpoint directory (synthetic and gguf: made by notebook 01)."""
    if profile.models.source == "pretrained":
        return resolve_model_dir(profile.models.flash_draft)
    made = _clusters_made(profile)
    if made is None:
        raise FileNotFoundError(f"no FlashHead checkpoint at {profile.flash_dir}: run notebook 01 "
                                "(or lib.models.flash_checkpoint.ensure_flash_checkpoint)")
    if made != profile.clustering.n_clusters:
        raise ValueError(f"the FlashHead checkpoint at {profile.flash_dir} has {made} clusters, the profile asks for "
                         f"{profile.clustering.n_clusters}: run notebook 01 again")
    return profile.flash_dir


def load_flash_head(profile: Profile, W: torch.Tensor, n_probes: int | None = None) -> FlashHead:
    """FlashHead over output embeddings W (V,d) with the profile's FlashHead checkpoint's clustering; W may
    be any loaded model's that the clustering was made for (gguf: the one model target and drafts share)."""
    path = flash_checkpoint_dir(profile)
    cfg, cents, assign = read_flash_checkpoint(path)
    if W.shape[1] != cents.shape[1] or W.shape[0] != assign.numel():
        raise ValueError(f"FlashHead checkpoint {path}: clustering is for V={assign.numel()}, d={cents.shape[1]} "
                         f"but the body has V={W.shape[0]}, d={W.shape[1]}")
    n_probes = n_probes or profile.clustering.n_probes or cfg["n_probes"]             # else the checkpoint's own
    return FlashHead(W, cents.to(W.device), assign, n_probes,
                     cfg["flash_head_special_token_ids"], kernel=profile.bench.head_kernel)


def equal_size_clusters(profile: Profile, x: torch.Tensor, progress: bool = False,
                        n_clusters: int | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Equal-size spherical k-means of the embeddings x (V,d), fp32, into n_clusters (default: the profile's):
    (assignments, unit centroids, seconds of k-means)."""
    c = profile.clustering
    n = n_clusters or c.n_clusters
    bench.sync(x.device)
    t = time.perf_counter()
    with bench.all_cores(x.device):
        assign = cl.spherical_kmeans(x, n, c.iterations, profile.seed, True, c.candidates, progress)
    bench.sync(x.device)
    seconds = time.perf_counter() - t
    return assign, cl.centroids_of(cl.unit(x), assign, n), seconds


def write_flash_checkpoint(profile: Profile, tok, assign: torch.Tensor, cents: torch.Tensor,
                           replace: bool = True) -> Path:
    """Our clustering of the profile's draft as a FlashHead checkpoint in profile.flash_dir, with the settings it
    was made with (clustering_settings) beside its assets."""
    def write(tmp: Path) -> None:
        _write_flash_dir(Path(checkpoints.model_path(profile, "draft")), tmp, cents, assign,
                         profile.clustering.n_probes, special_token_ids(tok))
        (tmp / MADE_WITH).write_text(json.dumps(clustering_settings(profile)))     # inside: placed with it, whole
    return _placed(profile.flash_dir, write, replace)


MADE_WITH = "flash_head_assets/made_with.json"       # our checkpoints: the settings of the clustering in them


def clustering_settings(profile: Profile) -> dict:
    """What our equal-size clustering of the draft depends on besides the draft's weights: its settings and the code
    that clusters and writes the checkpoint."""
    c = profile.clustering
    return {"seed": profile.seed, "dtype": profile.dtype, "n_clusters": c.n_clusters, "iterations": c.iterations,
            "candidates": c.candidates,
            "code": checkpoints.code_digest(cl, equal_size_clusters, write_flash_checkpoint, _write_flash_dir)}


def ensure_flash_checkpoint(profile: Profile) -> Path:
    """The FlashHead draft checkpoint, made by the same seeded equal-size clustering as notebook 01's if it is
    missing (a fresh machine, say) or made with other settings (clustering_settings: a number of clusters, k-means
    settings, seed or dtype; unrecorded, by older code); notebook 01's measurements (clustering.json) are neither
    redone nor rewritten."""
    if profile.models.source == "pretrained":
        return profile.flash_dir
    checkpoints.model_path(profile, "draft")              # the base model first: one made again drops its FlashHead
    made = _clusters_made(profile)
    record = profile.flash_dir / MADE_WITH
    if made == profile.clustering.n_clusters and record.is_file() and \
            json.loads(record.read_text()) == clustering_settings(profile):
        return profile.flash_dir
    draft = checkpoints.load_draft(profile)
    assign, cents, _ = equal_size_clusters(profile, draft.get_output_embeddings().weight.detach().float())
    return write_flash_checkpoint(profile, checkpoints.load_tokenizer(profile), assign, cents, replace=made is not None)


def _clusters_made(profile: Profile) -> int | None:
    """n_clusters of the FlashHead checkpoint in profile.flash_dir (None where there is none)."""
    cfg = profile.flash_dir / "config.json"
    return json.loads(cfg.read_text()).get("n_clusters") if cfg.exists() else None
