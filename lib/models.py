"""Model loading (synthetic, Hugging Face, AWQ, FlashHead checkpoints) and a static-KV-cache runner."""
from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config

from . import prompts as prompt_lib
from .config import Profile, as_dict
from .heads import FlashHead
from .synthetic import SPECIAL_TOKENS, make_pair, make_tokenizer

FLASH_KEYS = ("flash_head_cache_dir", "n_clusters", "n_probes", "flash_head_special_token_ids")


# ---------------------------------------------------------------- synthetic pair on disk

def synthetic_stamp(profile: Profile) -> dict:
    return {"seed": profile.seed, "dtype": profile.dtype, "synthetic": as_dict(profile)["models"]["synthetic"]}


def ensure_synthetic(profile: Profile) -> Path:
    """Make, save (save_pretrained) and stamp the synthetic pair once; later calls reuse it."""
    root = profile.model_dir
    stamp = root / "stamp.json"
    if stamp.exists() and json.loads(stamp.read_text()) == synthetic_stamp(profile):
        return root
    syn = profile.models.synthetic
    shutil.rmtree(root, ignore_errors=True)
    device = "cuda" if torch.cuda.is_available() and profile.draft_device.startswith("cuda") else "cpu"
    which = ("target", "draft") if syn.save_target else ("draft",)
    target, draft = make_pair(syn, profile.seed, profile.dtype, device, which)
    corpus = [p.text for p in prompt_lib.load_questions(prompt_lib.BUILTIN)]
    tok = make_tokenizer(syn.vocab_size, corpus)
    for name, model in (("draft", draft), ("target", target)):
        if name == "target" and not syn.save_target:
            continue
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    del target, draft
    stamp.write_text(json.dumps(synthetic_stamp(profile), indent=1))
    return root


def model_path(profile: Profile, which: str) -> str:
    """Where `which` (target, draft) loads from: a local directory or a hub id."""
    if profile.models.source == "pretrained":
        return getattr(profile.models, which)
    return str(ensure_synthetic(profile) / which)


AWQ_CPU_BACKENDS = ("torch_awq", "torch_fused_awq", "auto")   # gptqmodel kernels that run without CUDA
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")                # safetensors only, never pickles


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, else HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or Path(name).expanduser().exists() or name.count("/") > 1


def resolve_model_dir(name: str | Path) -> Path:
    """A local model directory for `name`: the directory itself, or the snapshot of a hub id already in
    the local Hugging Face cache (never the network). Raises FileNotFoundError naming the fetch command."""
    name = str(name)
    local = Path(name).expanduser()
    if local.is_dir():
        return local
    if not looks_like_path(name):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
        try:
            return Path(snapshot_download(name, local_files_only=True, cache_dir=str(hub_cache_dir())))
        except HFValidationError:
            pass
        except LocalEntryNotFoundError:
            raise FileNotFoundError(f"{name} is not in the local Hugging Face cache ({hub_cache_dir()}): "
                                    f"fetch it with  {fetch_command(name)}") from None
    raise FileNotFoundError(f"no model directory {local}")


def fetch_command(name: str) -> str:
    return f"hf download {name}   (huggingface_hub < 1.0: huggingface-cli download {name})"


def _import_gptqmodel():
    """Import gptqmodel (the AWQ kernels) without letting it change the process environment: on import
    it sets PYTORCH_ALLOC_CONF (expandable segments) and CUDA_DEVICE_ORDER when they are unset, which
    would change the CUDA allocator and device numbering of every later model in the study."""
    keys = ("PYTORCH_ALLOC_CONF", "CUDA_DEVICE_ORDER")
    saved = {k: os.environ.get(k) for k in keys}
    try:
        import gptqmodel  # noqa: F401
    except ImportError as e:
        raise ImportError("loading an AWQ checkpoint needs gptqmodel: pip install gptqmodel==7.6.0 "
                          "(pinned in environment.yml)") from e
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def awq_config(quant: dict, backend: str, device: str):
    """transformers' AwqConfig for a checkpoint's quantization_config and a gptqmodel backend."""
    from transformers import AwqConfig
    cpu = torch.device(device).type == "cpu"
    backend = backend or ("torch_awq" if cpu else "auto")
    if cpu and backend not in AWQ_CPU_BACKENDS:
        raise ValueError(f"AWQ backend {backend!r} needs a CUDA device, but the model goes to {device!r}; "
                         f"on a CPU use one of {list(AWQ_CPU_BACKENDS)} (models.awq_backend)")
    _import_gptqmodel()
    return AwqConfig(bits=quant.get("bits", 4), group_size=quant.get("group_size", 128),
                     zero_point=quant.get("zero_point", True), version=quant.get("version", "gemm"),
                     modules_to_not_convert=quant.get("modules_to_not_convert"), backend=backend)


def load_model(path: str, dtype: str, device: str, awq_backend: str = "", config=None):
    """from_pretrained with remote code off, from a local directory or a hub id in the local cache.

    AWQ checkpoints (quantization_config.quant_method == "awq") load through transformers' AwqConfig
    with gptqmodel backend `awq_backend` (default torch_awq on a CPU, gptqmodel's choice on a GPU).
    `config` overrides the checkpoint's config (the FlashHead body loads as Qwen3 this way).
    """
    local = resolve_model_dir(path)
    if not (local / "config.json").exists():
        raise FileNotFoundError(f"model directory {local} has no config.json")
    cfg = json.loads((local / "config.json").read_text())
    kwargs = dict(dtype=getattr(torch, dtype), trust_remote_code=False, use_safetensors=True, device_map=device)
    if config is not None:
        kwargs["config"] = config
    quant = cfg.get("quantization_config") or {}
    if quant.get("quant_method") == "awq":
        kwargs["quantization_config"] = awq_config(quant, awq_backend, device)
    elif quant:
        raise ValueError(f"{path}: quantization method {quant.get('quant_method')!r} is not supported (AWQ only)")
    with warnings.catch_warnings():                                    # the checkpoint's quantization_config wins
        warnings.filterwarnings("ignore", message="You passed `quantization_config`", category=UserWarning)
        model = AutoModelForCausalLM.from_pretrained(str(local), **kwargs).eval()
    if quant and not any(hasattr(m, "qweight") for m in model.modules()):
        raise RuntimeError(f"{path}: AWQ checkpoint loaded without any quantised layer (backend {awq_backend!r})")
    return model


def is_available(name: str) -> bool:
    """A local directory, or a hub id already in the local Hugging Face cache, with config.json and weights."""
    try:
        d = resolve_model_dir(name)
    except FileNotFoundError:
        return False
    return (d / "config.json").is_file() and any((d / w).is_file() for w in WEIGHT_FILES)


def check_pretrained_available(profile: Profile) -> None:
    """Stop before any work if a pretrained model is missing, naming each and how to fetch it."""
    names = [profile.models.target, profile.models.draft, profile.models.flash_draft]
    missing = [n for n in names if not is_available(n)]
    if missing:
        lines = "\n".join(f"  {n}:  " + (f"no model directory {Path(n).expanduser()}" if looks_like_path(n)
                                          else fetch_command(n)) for n in missing)
        raise FileNotFoundError(f"profile {profile.name!r} needs model weights that are not on this machine "
                                f"(hub cache {hub_cache_dir()}):\n{lines}\n"
                                "(or set models.* in the profile to local directories)")


def load_target(profile: Profile):
    syn = profile.models.synthetic
    if profile.models.source == "synthetic" and not syn.save_target:
        ensure_synthetic(profile)                                      # draft on disk; target rebuilt in memory
        return make_pair(syn, profile.seed, profile.dtype, profile.target_device, ("target",))[0]
    return load_model(model_path(profile, "target"), profile.dtype, profile.target_device, profile.models.awq_backend)


def load_draft(profile: Profile):
    return load_model(model_path(profile, "draft"), profile.dtype, profile.draft_device, profile.models.awq_backend)


def load_tokenizer(profile: Profile):
    """The draft's tokenizer (target and draft share it), from a local directory or the local cache."""
    return AutoTokenizer.from_pretrained(str(resolve_model_dir(model_path(profile, "draft"))), trust_remote_code=False)


# ---------------------------------------------------------------- FlashHead checkpoint format

def special_token_ids(tokenizer) -> list[int]:
    ids = set(tokenizer.all_special_ids)
    ids.update(i for t in SPECIAL_TOKENS if (i := tokenizer.convert_tokens_to_ids(t)) is not None and i >= 0)
    return sorted(i for i in ids if i is not None and i >= 0 and i != tokenizer.unk_token_id)


def save_flash_checkpoint(draft_dir: str | Path, out_dir: str | Path, centroids: torch.Tensor,
                          assignments: torch.Tensor, n_probes: int, special_ids: list[int],
                          cache_dir: str = "flash_head_assets") -> Path:
    """Write a FlashHead model directory: the draft's files, flash keys in config.json, clustering assets."""
    out = Path(out_dir)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(draft_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(architectures=["FlashHeadQwen3ForCausalLM"], flash_head_cache_dir=cache_dir,
               n_clusters=int(centroids.shape[0]), n_probes=int(n_probes),
               flash_head_special_token_ids=[int(i) for i in special_ids])
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / cache_dir).mkdir()
    save_file({"centroids": centroids.float().contiguous().cpu(),
               "cluster_assignments": assignments.to(torch.int64).contiguous().cpu()},
              str(out / cache_dir / "clustering_cache.safetensors"))
    return out


def read_flash_checkpoint(path: str | Path, hidden_size: int | None = None, vocab_size: int | None = None):
    """Read and check a FlashHead directory (or a hub id in the local cache).
    Returns (config dict, centroids (c,d), assignments (V,))."""
    path = Path(path)
    if not path.expanduser().is_dir() and not looks_like_path(str(path)):
        path = resolve_model_dir(str(path))                            # hub id -> cached snapshot
    path = path.expanduser()
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
    c = cfg["n_clusters"]
    d = hidden_size or cfg.get("hidden_size")
    V = vocab_size or cfg.get("vocab_size")
    cents = t["centroids"].float()
    while cents.dim() > 2 and cents.shape[0] == 1:                     # leading singleton dims
        cents = cents[0]
    if cents.dim() != 2 or {cents.shape[0], cents.shape[1]} != {c, d} and cents.shape != (c, d):
        raise ValueError(f"{assets}: centroids of shape {tuple(t['centroids'].shape)} do not match "
                         f"n_clusters={c} and hidden_size={d}")
    if cents.shape != (c, d):
        cents = cents.T.contiguous()                                   # stored as (d,c)
    assign = t["cluster_assignments"].reshape(-1).long()
    if V is not None and assign.numel() != V:
        raise ValueError(f"{assets}: cluster_assignments has {assign.numel()} entries but the vocabulary is {V}")
    if assign.min() < 0 or assign.max() >= c:
        raise ValueError(f"{assets}: cluster ids outside 0..{c - 1}")
    counts = torch.bincount(assign, minlength=c)
    if (counts != counts[0]).any():
        raise ValueError(f"{assets}: clusters are not of equal size ({counts.min().item()}..{counts.max().item()} tokens)")
    return cfg, cents, assign


def flash_body_config(cfg: dict) -> Qwen3Config:
    """The FlashHead checkpoint's config as a plain Qwen3 config. Its config.json names the architecture
    FlashHeadQwen3ForCausalLM (so that vLLM refuses it without the plugin) and model_type qwen3 (older
    exports: flash_head_qwen3); the body is an ordinary Qwen3ForCausalLM, loaded without remote code."""
    model_type = cfg.get("model_type", "qwen3")
    if model_type not in ("qwen3", "flash_head_qwen3"):
        raise ValueError(f"FlashHead checkpoint body has model_type {model_type!r}; only Qwen3 bodies are supported")
    body = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "auto_map")}
    config = Qwen3Config.from_dict(body)
    config.architectures = ["Qwen3ForCausalLM"]
    return config


def load_flash_draft(profile: Profile, n_probes: int | None = None):
    """The FlashHead draft: the checkpoint's body as Qwen3ForCausalLM (remote code off) and its FlashHead."""
    path = profile.flash_dir
    if profile.models.source == "synthetic" and not (path / "config.json").exists():
        raise FileNotFoundError(f"no FlashHead checkpoint at {path}: run notebook 01 (or lib.pipeline.ensure_flash_checkpoint)")
    if profile.models.source == "pretrained":
        path = resolve_model_dir(profile.models.flash_draft)
    cfg, cents, assign = read_flash_checkpoint(path)
    model = load_model(str(path), profile.dtype, profile.draft_device, profile.models.awq_backend,
                       config=flash_body_config(cfg))
    W = model.get_output_embeddings().weight
    if W.shape[1] != cents.shape[1] or W.shape[0] != assign.numel():
        raise ValueError(f"FlashHead checkpoint {path}: clustering is for V={assign.numel()}, d={cents.shape[1]} "
                         f"but the body has V={W.shape[0]}, d={W.shape[1]}")
    head = FlashHead(W, cents.to(W.device), assign, n_probes or profile.clustering.n_probes,
                     cfg["flash_head_special_token_ids"], kernel=profile.bench.flash_kernel)
    return model, head


# ---------------------------------------------------------------- static-cache runner

class Runner:
    """Forward passes of a loaded Qwen3 with a static KV cache, reusing the model's own modules.

    forward(ids (1,n), start) writes K/V at positions start..start+n-1 and returns final normed hidden
    states (1,n,d). Positions are device tensors, so every call of a given n can be captured once in a
    CUDA graph and replayed (graphs=True on CUDA). On CPU the same code runs eagerly.
    """

    def __init__(self, model, max_len: int, graphs: bool = False, compile: bool = False):
        cfg = model.config
        self.model, self.body = model, model.model
        self.device = model.get_output_embeddings().weight.device
        self.dtype = model.get_output_embeddings().weight.dtype
        self.n_kv, self.hd = cfg.num_key_value_heads, cfg.head_dim
        self.n_heads = cfg.num_attention_heads
        self.max_len = max_len
        shape = (cfg.num_hidden_layers, 1, self.n_kv, max_len, self.hd)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        pos = torch.arange(max_len, device=self.device)
        dummy = torch.zeros(1, dtype=self.dtype, device=self.device)
        cos, sin = self.body.rotary_emb(dummy, pos[None])                # (1,max_len,hd)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)
        self.arange = pos
        self.graphs = graphs and self.device.type == "cuda"
        self._graphs: dict = {}
        self.fused = [fuse_projections(layer) for layer in self.body.layers]
        # Optionally fuse each layer's small ops with torch.compile: one compiled layer function serves
        # every layer (its weights are inputs), recompiled once per token count n.
        if compile:
            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
            torch._dynamo.config.accumulated_cache_size_limit = max(torch._dynamo.config.accumulated_cache_size_limit, 512)
        self._layer = torch.compile(layer_forward, fullgraph=True, dynamic=False) if compile else layer_forward

    def _forward(self, ids: torch.Tensor, start: torch.Tensor, compiled: bool = True) -> torch.Tensor:
        n = ids.shape[1]
        pos = start + self.arange[:n]                                                       # (n,)
        mask = self.arange[None, :] <= pos[:, None]                                         # (n,max_len)
        x = self.body.embed_tokens(ids)
        cos, sin = self.cos[pos], self.sin[pos]                                             # (n,hd)
        for i, layer in enumerate(self.body.layers):
            fn = self._layer if compiled else layer_forward                                 # eager for any-length prefill
            x = fn(layer, self.fused[i], x, pos, mask, cos, sin, self.k[i], self.v[i])
        return self.body.norm(x)

    def _argmax(self, h: torch.Tensor) -> torch.Tensor:
        return (h[0] @ self.model.get_output_embeddings().weight.T).argmax(-1)              # (n,)

    def _step(self, kind: str, ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """What one CUDA graph holds: the (fused) forward, plus the dense argmax for kind 'greedy'."""
        h = self._forward(ids, start)
        return h if kind == "hidden" else self._argmax(h)

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, start: int, graph: bool = True) -> torch.Tensor:
        """Final normed hidden states (1,n,d) for ids (1,n) at positions start.. (writes the cache)."""
        return self._run("hidden", ids, start, graph)

    @torch.no_grad()
    def greedy(self, ids: torch.Tensor, start: int, graph: bool = True) -> torch.Tensor:
        """The model's own dense-head argmax after each of ids (1,n): (n,) on the device."""
        return self._run("greedy", ids, start, graph)

    def _run(self, kind: str, ids: torch.Tensor, start: int, graph: bool) -> torch.Tensor:
        n = ids.shape[1]
        if start + n > self.max_len:
            raise ValueError(f"KV cache of {self.max_len} positions cannot hold {start + n}")
        if not (graph and self.graphs):                                                     # eager, any n
            h = self._forward(ids, torch.tensor(start, device=self.device), compiled=False)
            return h if kind == "hidden" else self._argmax(h)
        g = self._graphs.get((kind, n)) or self._capture(kind, n)
        g["ids"].copy_(ids)
        g["start"].fill_(start)
        g["graph"].replay()
        return g["out"]

    def _capture(self, kind: str, n: int) -> dict:
        ids = torch.zeros(1, n, dtype=torch.long, device=self.device)
        start = torch.zeros((), dtype=torch.long, device=self.device)
        graph, out = capture(lambda: self._step(kind, ids, start))
        self._graphs[(kind, n)] = dict(graph=graph, ids=ids, start=start, out=out)
        return self._graphs[(kind, n)]


def layer_forward(layer, fused: dict, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor, cos: torch.Tensor,
                  sin: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
    """One Qwen3 decoder layer on x (1,n,D) at positions pos (n,), writing K/V into the static cache
    (1,Hkv,max_len,hd); mask (n,max_len) allows each query its own and earlier positions."""
    att = layer.self_attn
    n, hd = x.shape[1], k_cache.shape[-1]
    h = layer.input_layernorm(x)
    if fused:                                                                               # one GEMV for q, k, v
        q, k, v = torch.nn.functional.linear(h, fused["qkv"]).split(fused["qkv_sizes"], dim=-1)
    else:
        q, k, v = att.q_proj(h), att.k_proj(h), att.v_proj(h)
    q = att.q_norm(q.view(1, n, -1, hd)).transpose(1, 2)                                    # (1,H,n,hd)
    k = att.k_norm(k.view(1, n, -1, hd)).transpose(1, 2)                                    # (1,Hkv,n,hd)
    v = v.view(1, n, -1, hd).transpose(1, 2)
    q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, v)
    o = torch.nn.functional.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask,
                                                         enable_gqa=q.shape[1] != k.shape[1])
    x = x + att.o_proj(o.transpose(1, 2).reshape(1, n, -1))
    h = layer.post_attention_layernorm(x)
    if fused:                                                                               # one GEMV for gate, up
        g, u = torch.nn.functional.linear(h, fused["gate_up"]).chunk(2, dim=-1)
        return x + layer.mlp.down_proj(layer.mlp.act_fn(g) * u)
    return x + layer.mlp(h)


def fuse_projections(layer) -> dict:
    """Store q/k/v and gate/up weights of plain Linear layers contiguously (the modules keep views,
    so nothing is duplicated), letting one GEMV read each group. Quantised layers are left alone."""
    att, mlp = layer.self_attn, layer.mlp
    groups = {"qkv": (att.q_proj, att.k_proj, att.v_proj), "gate_up": (mlp.gate_proj, mlp.up_proj)}
    mods = [m for g in groups.values() for m in g]
    if not all(type(m) is torch.nn.Linear and m.bias is None for m in mods):
        return {}
    out = {}
    for name, group in groups.items():
        sizes = [m.weight.shape[0] for m in group]
        fused = torch.cat([m.weight.data for m in group])
        for m, w in zip(group, fused.split(sizes)):
            m.weight.data = w
        out[name], out[name + "_sizes"] = fused, sizes
    return out


def capture(fn):
    """Warm fn up on a side stream, then capture it in a CUDA graph. Returns (graph, static output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


class GraphedHead:
    """A head (n=1 hidden -> token) captured in a CUDA graph on CUDA; called directly on CPU."""

    def __init__(self, head, d: int, device, dtype, graphs: bool):
        self.head = head
        self.graph = None
        if graphs and torch.device(device).type == "cuda":
            self.h = torch.zeros(1, d, device=device, dtype=dtype)
            self.graph, self.out = capture(lambda: head(self.h))

    @torch.no_grad()
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        if self.graph is None:
            return self.head(h)
        self.h.copy_(h)
        self.graph.replay()
        return self.out


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)
