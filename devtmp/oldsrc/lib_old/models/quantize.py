"""AWQ int4 checkpoints of a model in memory: round-to-nearest per-group quantisation, stored exactly as
AutoAWQ (and Qwen/Qwen3-32B-AWQ) store it, so the target loads through the study's real path
(lib.models.checkpoints.load_model -> transformers' AwqConfig -> gptqmodel kernels).

Format (quant_method awq, version gemm, 4 bits, group size 128, zero point), per decoder Linear of
weight W (out, in), with q in 0..15 and W[o, i] ~= (q[i, o] - z[i // 128, o]) * s[i // 128, o]:
  qweight (in, out/8) int32    q packed along the output columns
  qzeros  (in/128, out/8) int32  z packed the same way
  scales  (in/128, out) fp16
Eight 4-bit codes share an int32: nibble j (bits 4j..4j+3) of packed column c holds output column
8c + AWQ_ORDER[j], AutoAWQ's interleave (gptqmodel 7.6.0 quantization/awq/utils/packing_utils.py).
Embeddings, norms and the head stay unquantised in fp16.

Rounding: the range of each group is widened to include 0 (as GPTQ does) and the fp16 scale is rounded
up, so the zero point needs no clamping and every weight lands within half a step (s/2) of its value.
AutoAWQ's own RTN skips the widening; for random or trained weights every group of 128 spans 0 anyway.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

BITS = 4
GROUP = 128
PACK = 32 // BITS                                     # codes per int32
QMAX = 2**BITS - 1
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)                  # nibble j holds column AWQ_ORDER[j] of its 8
AWQ_REVERSE = tuple(AWQ_ORDER.index(c) for c in range(PACK))   # column c sits in nibble AWQ_REVERSE[c]
QUANTISED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANT_CONFIG = {"quant_method": "awq", "version": "gemm", "bits": BITS, "group_size": GROUP, "zero_point": True,
                "modules_to_not_convert": None}
SHARD_BYTES = 2 * 2**30                               # checkpoint shard size


def pack(q: torch.Tensor) -> torch.Tensor:
    """Codes (rows, cols) in 0..15 -> int32 (rows, cols/8) in AWQ GEMM nibble order (any device)."""
    rows, cols = q.shape
    if cols % PACK:
        raise ValueError(f"AWQ packing needs a multiple of {PACK} columns, got {cols}")
    q = q.to(torch.int64).view(rows, cols // PACK, PACK)[..., list(AWQ_ORDER)]
    shifts = torch.arange(0, 32, BITS, device=q.device, dtype=torch.int64)
    return as_int32((q << shifts).sum(-1))                                             # disjoint bits: sum == or


def as_int32(packed: torch.Tensor) -> torch.Tensor:
    """Unsigned 32-bit words held in int64 -> the int32 with the same bits (two's complement)."""
    return (packed - (packed >= 2**31).long() * 2**32).to(torch.int32)


def unpack(p: torch.Tensor) -> torch.Tensor:
    """Inverse of pack: int32 (rows, cols/8) -> int32 codes (rows, cols)."""
    shifts = torch.arange(0, 32, BITS, device=p.device, dtype=torch.int32)
    slots = (p[..., None] >> shifts) & QMAX                                            # nibble j of each int32
    return slots[..., list(AWQ_REVERSE)].reshape(p.shape[0], -1)


def check_shape(out_f: int, in_f: int, name: str = "weight") -> None:
    if in_f % GROUP or out_f % PACK:
        raise ValueError(f"{name} of shape ({out_f}, {in_f}): AWQ int4 needs in_features divisible by the group "
                         f"size {GROUP} and out_features divisible by {PACK}")


@torch.no_grad()
def quantize_weight(w: torch.Tensor) -> dict[str, torch.Tensor]:
    """A Linear weight (out, in), any float dtype and device -> {qweight, qzeros, scales} on its device."""
    out_f, in_f = w.shape
    check_shape(out_f, in_f)
    wg = w.t().float().reshape(in_f // GROUP, GROUP, out_f)                            # (groups, 128, out)
    wmax, wmin = wg.amax(1).clamp(min=0), wg.amin(1).clamp(max=0)                     # range holds 0
    s32 = ((wmax - wmin) / QMAX).clamp(min=1e-5)
    scales = s32.half()
    scales = torch.where(scales.float() < s32, torch.nextafter(scales, torch.full_like(scales, torch.inf)), scales)
    s = scales.float()
    zeros = torch.round(-wmin / s).clamp(0, QMAX)                                      # in range by construction
    q = torch.round(wg / s[:, None] + zeros[:, None]).clamp(0, QMAX)                  # exact ties at the top only
    return {"qweight": pack(q.reshape(in_f, out_f)), "qzeros": pack(zeros), "scales": scales}


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The weight (out, in) in fp32 that the AWQ tensors stand for."""
    q, z = unpack(qweight), unpack(qzeros)
    in_f, out_f = q.shape
    w = (q.view(-1, GROUP, out_f) - z[:, None]).float() * scales.float()[:, None]
    return w.reshape(in_f, out_f).t().contiguous()


def int4_bytes(K: int, N: int) -> int:
    """Bytes of an AWQ (K, N) weight: 4-bit codes, an fp16 scale and a 4-bit zero point per group and column."""
    return K * N // 2 + K // GROUP * N * 5 // 2


def checkpoint_bytes(shape, vocab_size: int, tied: bool = False) -> int:
    """Bytes of a Qwen3-shaped AWQ checkpoint (lib.config.Shape): int4 codes, fp16 scales, packed zeros,
    fp16 embeddings, head and norms. Qwen3-32B's shapes: 19.3 GB (measured 19,325,480,728 bytes)."""
    d, hd, L = shape.hidden_size, shape.head_dim, shape.num_hidden_layers
    q_out, kv_out, mlp = shape.num_attention_heads * hd, shape.num_key_value_heads * hd, shape.intermediate_size
    linears = [(q_out, d), (kv_out, d), (kv_out, d), (d, q_out), (mlp, d), (mlp, d), (d, mlp)]
    per_layer = sum(int4_bytes(i, o) for o, i in linears)
    norms = 2 * d + 2 * hd
    return L * (per_layer + 2 * norms) + 2 * d + vocab_size * d * 2 * (1 if tied else 2)


# ---------------------------------------------------------------- a whole model as an AWQ checkpoint

@torch.no_grad()
def name_shards(tmp: Path, shards: list[list[str]]) -> None:
    """Give the written shards Hugging Face's names: model.safetensors, or numbered files and an index."""
    if len(shards) == 1:
        (tmp / "shard-00000.safetensors").rename(tmp / "model.safetensors")
        return
    n, weight_map = len(shards), {}
    for j, keys in enumerate(shards):
        name = f"model-{j + 1:05d}-of-{n:05d}.safetensors"
        (tmp / f"shard-{j:05d}.safetensors").rename(tmp / name)
        weight_map.update({k: name for k in keys})
    total = sum((tmp / f).stat().st_size for f in set(weight_map.values()))
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))


def check_layers(body) -> None:
    """Every projection to be quantised has shapes the group size and packing allow."""
    for i, layer in enumerate(body.layers):
        for name, m in layer.named_modules():
            if name.rsplit(".", 1)[-1] in QUANTISED:
                check_shape(*m.weight.shape, f"layer {i} {name}")


def write_awq_model(model, out_dir: str | Path, shard_bytes: int = SHARD_BYTES) -> Path:
    """Write a Qwen3 (or Llama) causal LM as an AWQ GEMM checkpoint directory (config.json with its
    quantization_config, safetensors shards and their index), layer by layer: each decoder layer is
    quantised where its weights lie (GPU or CPU), copied to the host, and its dense weights are then
    freed (moved to the meta device), so GPU memory only falls and host memory holds one shard.
    The model is unusable afterwards. Written under <out_dir>.part and renamed when complete."""
    out = Path(out_dir)
    tmp = out.with_name(out.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg, body = model.config, model.model
    check_layers(body)                                                                 # refuse before writing
    shards: list[list[str]] = []
    pending: dict[str, torch.Tensor] = {}

    def flush(force: bool = False):
        nonlocal pending
        size = sum(t.numel() * t.element_size() for t in pending.values())
        if pending and (force or size >= shard_bytes):
            save_file(pending, str(tmp / f"shard-{len(shards):05d}.safetensors"), metadata={"format": "pt"})
            shards.append(list(pending))
            pending = {}

    def dense(prefix: str, module) -> None:
        for k, v in module.state_dict().items():
            pending[f"{prefix}{k}"] = v.detach().to("cpu", torch.float16).contiguous()

    for i, layer in enumerate(body.layers):
        prefix = f"model.layers.{i}."
        for name, m in layer.named_modules():
            if name.rsplit(".", 1)[-1] in QUANTISED:
                for k, v in quantize_weight(m.weight).items():
                    pending[f"{prefix}{name}.{k}"] = v.cpu()
                if m.bias is not None:
                    pending[f"{prefix}{name}.bias"] = m.bias.detach().to("cpu", torch.float16)
            elif not list(m.children()):                                               # norms (leaf modules)
                dense(f"{prefix}{name}." if name else prefix, m)
        layer.to("meta")                                                               # free the dense layer
        flush()
    dense("model.embed_tokens.", body.embed_tokens)
    dense("model.norm.", body.norm)
    if not cfg.tie_word_embeddings:
        dense("lm_head.", model.get_output_embeddings())
    flush(force=True)
    name_shards(tmp, shards)
    c = {**cfg.to_dict(), "architectures": [type(model).__name__], "dtype": "float16", "quantization_config": dict(QUANT_CONFIG)}
    (tmp / "config.json").write_text(json.dumps(c, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_tensors(path: str | Path, device: str = "cpu"):
    """(key, tensor) of every tensor of a checkpoint directory, one at a time."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    for f in files:
        with safe_open(str(f), "pt", device=device) as h:
            for k in h.keys():
                yield k, h.get_tensor(k)


@torch.no_grad()
def dequantized_model(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    """The dense reference of an AWQ checkpoint: its architecture (no quantization_config) holding the
    dequantised weights and every other tensor as stored; decoded here, independently of gptqmodel."""
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(str(path))
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    sd, trio = {}, {}
    for k, v in read_tensors(path, device):
        mod, _, leaf = k.rpartition(".")
        if leaf in ("qweight", "qzeros", "scales"):
            trio.setdefault(mod, {})[leaf] = v
            if len(trio[mod]) == 3:
                sd[f"{mod}.weight"] = dequantize(**trio.pop(mod)).to(getattr(torch, dtype))
        else:
            sd[k] = v.to(getattr(torch, dtype))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    if cfg.tie_word_embeddings:
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected or trio:
        raise ValueError(f"{path}: not a complete AWQ checkpoint of its config (missing {missing[:4]}, "
                         f"unexpected {unexpected[:4]}, incomplete {sorted(trio)[:4]})")
    return model.eval()
