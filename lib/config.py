"""Typed run configuration: one YAML file per profile under params/, validated before any model work."""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "params"


class ConfigError(ValueError):
    """A profile file has an unknown key, a missing key or a value of the wrong type."""


@dataclass(frozen=True)
class Shape:
    """One Qwen3 decoder body."""
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int


@dataclass(frozen=True)
class Synthetic:
    """How the synthetic target/draft pair is made (see lib/synthetic.py)."""
    vocab_size: int
    n_families: int          # shared token-family directions in the embedding
    family_cos: float        # cosine of each token embedding to its family direction
    draft_noise: float       # weight scale of the draft's random (context) layers
    target_noise: float      # weight scale of the target's random (context) layers
    target: Shape
    draft: Shape
    save_target: bool = True  # save_pretrained + from_pretrained round trip for the target


@dataclass(frozen=True)
class Models:
    source: str                       # "synthetic" or "pretrained"
    target: str = ""                  # pretrained: hub id or local path
    draft: str = ""                   # pretrained: dense draft
    flash_draft: str = ""             # pretrained: FlashHead checkpoint; synthetic: written by notebook 01
    awq_backend: str = ""             # gptqmodel backend for AWQ targets: torch_awq, marlin, gemm_triton
    synthetic: Synthetic | None = None


@dataclass(frozen=True)
class Clustering:
    n_clusters: int
    n_probes: int                     # probes used by the FlashHead draft everywhere
    probe_sweep: list[int]
    iterations: int = 10              # spherical k-means iterations
    candidates: int = 32              # nearest centroids considered per token in the balanced assignment
    top_k: int = 5                    # top-k containment
    compare_shipped: bool = False     # thesis profile: compare with the checkpoint's own clustering


@dataclass(frozen=True)
class Decode:
    k: int                            # speculative block length
    max_new_tokens: int
    max_prompt_tokens: int
    modes: list[str] = field(default_factory=lambda: ["baseline", "dense", "flash", "dense_shared"])
    schedules: list[str] = field(default_factory=lambda: ["ordinary", "deferred"])


@dataclass(frozen=True)
class Prompts:
    file: str = "builtin"             # "builtin" or a Spec-Bench question.jsonl path
    per_group: int | None = None
    limit: int | None = None


@dataclass(frozen=True)
class Bench:
    warmup: int                       # microbenchmark warm-up calls
    iters: int                        # microbenchmark measured calls
    e2e_warmup: int                   # speculative warm-up passes over the first prompt
    e2e_iters: int                    # measured passes over the prompt set
    cuda_graphs: bool = True          # capture decode/verify/head calls in CUDA graphs (GPU only)
    compile_draft: bool = False       # fuse the draft body's small ops with torch.compile (GPU only)
    compile_target: bool = False      # the same for the target (one compile per verify length)
    flash_kernel: str = "torch"       # FlashHead on CUDA: "torch" ops or the "triton" kernels (lib/kernels.py)
    verify_lengths: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8])


@dataclass(frozen=True)
class Cluster:
    """Slurm array for notebook 03 (launcher=slurm), through submitit."""
    shards: int = 4                   # array tasks; prompts are dealt round-robin
    timeout_min: int = 240
    gpus_per_task: int = 2            # target and draft on separate GPUs, as in the thesis
    partition: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    seed: int
    dtype: str                        # float32, bfloat16, float16
    target_device: str
    draft_device: str
    models: Models
    clustering: Clustering
    decode: Decode
    prompts: Prompts
    bench: Bench
    cluster: Cluster = field(default_factory=Cluster)

    # Derived locations: computed here, never set in the YAML or the notebooks.
    @property
    def out_dir(self) -> Path:
        return ROOT / "outputs" / self.name

    @property
    def model_dir(self) -> Path:
        return ROOT / "models" / self.name

    @property
    def flash_dir(self) -> Path:
        if self.models.source == "pretrained":
            return Path(self.models.flash_draft)
        return self.model_dir / "draft-flashhead"


def _build(cls, data, where: str):
    """Build dataclass `cls` from a dict, naming the offending key on any mismatch."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(names)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        key = f"{where}.{f.name}"
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key}: missing required key")
            continue
        kwargs[f.name] = _check(hints[f.name], data[f.name], key)
    return cls(**kwargs)


def _check(tp, value, key: str):
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check(inner, value, key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (inner,) = typing.get_args(tp)
        return [_check(inner, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    ok = isinstance(value, tp) and not (tp in (int, float) and isinstance(value, bool))
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{key}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
    return value


def _validate(p: Profile, where: str) -> None:
    def need(cond: bool, msg: str):
        if not cond:
            raise ConfigError(f"{where}: {msg}")
    need(p.dtype in ("float32", "bfloat16", "float16"), f"dtype must be float32, bfloat16 or float16, got {p.dtype!r}")
    need(p.models.source in ("synthetic", "pretrained"), f"models.source must be synthetic or pretrained, got {p.models.source!r}")
    if p.models.source == "synthetic":
        need(p.models.synthetic is not None, "models.synthetic is required when models.source is synthetic")
        s = p.models.synthetic
        need(s.n_families < s.draft.hidden_size, "models.synthetic.n_families must be below draft.hidden_size")
        need(s.target.hidden_size >= s.draft.hidden_size, "models.synthetic: target.hidden_size must be >= draft.hidden_size")
        for nm, sh in (("target", s.target), ("draft", s.draft)):
            need(sh.intermediate_size >= 2 * sh.hidden_size, f"models.synthetic.{nm}.intermediate_size must be >= 2*hidden_size")
        need(s.vocab_size % p.clustering.n_clusters == 0,
             f"clustering.n_clusters ({p.clustering.n_clusters}) must divide the vocabulary ({s.vocab_size})")
    else:
        need(bool(p.models.target and p.models.draft and p.models.flash_draft),
             "models.target, models.draft and models.flash_draft are required when models.source is pretrained")
    need(0 < p.clustering.n_probes <= p.clustering.n_clusters, "clustering.n_probes must be in 1..n_clusters")
    need(all(0 < q <= p.clustering.n_clusters for q in p.clustering.probe_sweep), "clustering.probe_sweep values must be in 1..n_clusters")
    need(p.decode.k >= 1, "decode.k must be >= 1")
    need(p.decode.max_new_tokens >= 2, "decode.max_new_tokens must be >= 2")
    need(set(p.decode.modes) <= {"baseline", "dense", "flash", "dense_shared"}, f"decode.modes: unknown mode in {p.decode.modes}")
    need(set(p.decode.schedules) <= {"ordinary", "deferred", "pipelined"},
         f"decode.schedules: unknown schedule in {p.decode.schedules}")
    need(p.bench.flash_kernel in ("torch", "triton"), f"bench.flash_kernel must be torch or triton, got {p.bench.flash_kernel!r}")
    need(p.clustering.iterations >= 1, "clustering.iterations must be >= 1")
    need(p.bench.iters >= 1 and p.bench.e2e_iters >= 1, "bench.iters and bench.e2e_iters must be >= 1")


def load_profile(name_or_path: str) -> Profile:
    """Read params/<name>.yaml (or a path) into a validated Profile."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PARAMS / f"{name_or_path}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in PARAMS.glob("*.yaml") if not p.stem.startswith("thesis_"))
        raise ConfigError(f"no profile file {path}; known profiles: {known}")
    data = yaml.safe_load(path.read_text())
    profile = _build(Profile, data, str(path.name))
    _validate(profile, str(path.name))
    return profile


def as_dict(profile: Profile) -> dict:
    """The whole run configuration, for writing next to results."""
    return dataclasses.asdict(profile)
