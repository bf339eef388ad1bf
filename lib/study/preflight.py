"""Checks before any model work or disk write: the profile parses, its devices exist, a STUDY_COMMIT claim
matches the code, its inputs are on this machine and there is room on disk for what it will write.
`python -m lib.study.preflight PROFILE` prints one line and exits 2 when a check fails (make reproduce runs it
first)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ..config import DTYPE_BYTES, ConfigError, Profile, load_profile, models_root, outputs_root

HEADROOM = 1.15                                  # estimate x this, plus 200 MB for outputs and tokenizers


class PreflightError(RuntimeError):
    """The profile cannot run on this machine as it stands; the message says why in one line."""


def check_devices(profile: Profile) -> None:
    import torch
    for key in ("target_device", "draft_device"):
        dev = torch.device(getattr(profile, key))
        if dev.type == "cpu":
            continue
        if dev.type != "cuda":
            raise PreflightError(f"{profile.name}: {key} is {dev}; only cpu and cuda devices are supported")
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (dev.index or 0) >= n:
            raise PreflightError(f"{profile.name}: {key} is {dev}, but this machine has {n} CUDA device(s); "
                                 f"run profile 'smoke' on a CPU")


def decoder_params(shape, vocab: int, tied: bool) -> int:
    """Parameters of a Qwen3-shaped decoder (the synthetic pair's shapes)."""
    d, hd = shape.hidden_size, shape.head_dim
    attn = d * hd * (2 * shape.num_attention_heads + 2 * shape.num_key_value_heads)
    layer = attn + 3 * d * shape.intermediate_size
    return shape.num_hidden_layers * layer + vocab * d * (1 if tied else 2)


def gguf_converted_bytes(profile: Profile) -> int:
    """fp32 bytes of the model converted from the profile's GGUF file: 4 bytes a parameter, the parameters
    estimated from the file's size (RECORD) at 4.5 bits each (Q4_0/Q4_1 store 4.5-5; bigger types overestimate)."""
    from importlib.metadata import PackageNotFoundError, distribution
    m = profile.models
    try:
        files = distribution(m.gguf_package.split("==")[0]).files or []
    except PackageNotFoundError:
        return 0                                                             # check_inputs says what is missing
    size = next((f.size or 0 for f in files if str(f) == m.gguf_file), 0)
    return int(size * 8 / 4.5) * 4


def disk_needed(profile: Profile) -> int:
    """Bytes the profile will write under models/ (synthetic checkpoints; gguf: the converted model and
    its FlashHead copy) that are not there yet."""
    if profile.models.source == "gguf":
        from ..models.checkpoints import gguf_converted
        converted = gguf_converted(profile)
        model = gguf_converted_bytes(profile)
        return (0 if converted else model) + (0 if converted and (profile.flash_dir / "config.json").exists() else model)
    syn = profile.models.synthetic
    if profile.models.source != "synthetic":
        return 0
    from ..models.checkpoints import synthetic_current
    if synthetic_current(profile):
        return 0
    b = DTYPE_BYTES[profile.dtype]
    draft = decoder_params(syn.draft, syn.vocab_size, tied=True) * b
    target = decoder_params(syn.target, syn.vocab_size, tied=False) * b if syn.save_target else 0
    if syn.target_quant == "awq":
        from ..models.quantize import checkpoint_bytes
        target = checkpoint_bytes(syn.target, syn.vocab_size)                # int4 codes, scales, fp16 head
    return 2 * draft + target                                                # draft, its FlashHead copy, target


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def check_disk(profile: Profile) -> None:
    """Room for the checkpoints (and the results) under models/, for the results under outputs/."""
    results = 200 * 2**20
    models = int(disk_needed(profile) * HEADROOM) + results
    for root, need in {outputs_root(): results, models_root(): models}.items():   # one root for both: models
        free = free_bytes(root)
        if free < need:
            raise PreflightError(f"{profile.name}: needs about {need / 2**30:.1f} GiB free under {root}, "
                                 f"only {free / 2**30:.1f} GiB are free")


def check_inputs(profile: Profile) -> None:
    from .. import prompts
    if profile.prompts.file not in ("builtin", "auto"):
        path = prompts.resolve_file(profile.prompts.file)
        if not path.is_file():
            raise PreflightError(f"{profile.name}: no prompt file at {path}. {prompts.SPEC_BENCH_HELP}")
    if profile.models.source == "gguf":
        from ..models.checkpoints import GGUFSourceError, check_gguf_source
        try:
            check_gguf_source(profile)                                       # package, SHA-256, gguf reader
        except GGUFSourceError as e:
            raise PreflightError(str(e)) from None
    if profile.models.source == "pretrained":
        from ..models.checkpoints import check_pretrained_available
        try:
            check_pretrained_available(profile)
        except FileNotFoundError as e:
            raise PreflightError(" ".join(str(e).split())) from None


def check_commit_claim() -> None:
    """A STUDY_COMMIT that does not match this tree's code stops the run before it writes results under it."""
    from ..results import git_commit
    try:
        git_commit()
    except ValueError as e:
        raise PreflightError(str(e)) from None


def check(profile: Profile) -> None:
    """Every check, cheapest first; raises PreflightError naming what is wrong."""
    check_devices(profile)
    check_commit_claim()
    check_inputs(profile)
    check_disk(profile)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m lib.study.preflight PROFILE   (or --claim: the STUDY_COMMIT for a copy of this "
              "checkout)", file=sys.stderr)
        return 2
    if argv[0] == "--claim":
        from ..results import commit_claim
        try:
            print(commit_claim())
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    try:
        check(load_profile(argv[0]))
    except (ConfigError, PreflightError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
