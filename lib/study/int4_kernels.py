"""Notebook 02, AWQ int4 targets on a GPU: the target's projections through every W4A16 kernel at hand, at 1-16
activation rows (decode is 1, verify K + 1): this study's kernels (lib/models/w4a16_mma.py, the CUDA one the target
runs on Hopper, and lib/models/w4a16.py, the Triton one it runs elsewhere), gptqmodel's AWQ marlin,
torch's tinygemm, GemLite, and the dense fp16 weight through cuBLAS. Same card, same random AWQ weights (group 128,
zero point), CUDA-graph replays of 20 calls cycling over enough weight copies (>= 256 MB) that each call reads
HBM, not L2. A kernel that cannot run here is listed with its error, never replaced by another."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .. import bench, progress
from ..config import Profile
from ..models import checkpoints
from ..models.quantize import GROUP, dequantize, int4_bytes, unpack
from ..results import save_json

ROWS = (1, 2, 4, 8, 16)
CALLS = 20                                                  # calls in one graph replay
# the slow starters (autotuning, an nvcc build) last
KERNELS = ("w4a16_mma", "w4a16", "tinygemm", "dense_fp16", "gemlite", "marlin")
# one kernel's process, its JIT build or autotuning included (marlin's nvcc build: about 4 min on an H100)
KERNEL_TIMEOUT_S = float(os.environ.get("STUDY_INT4_KERNEL_TIMEOUT_S", 300))
TUNED = "tuned"                  # a profile's folder of launch configs a kernel's own autotuner chose (GemLite's)


def awq_projection_shapes(profile: Profile) -> dict[str, tuple[int, int]] | None:
    """(K, N) of an AWQ target's fused q/k/v, o, fused gate/up and down projections; None for any other target."""
    if profile.models.source == "synthetic":
        s = profile.models.synthetic.target
        if s is None or profile.models.synthetic.target_quant != "awq":
            return None
        d, hd, heads, kv, inter = s.hidden_size, s.head_dim, s.num_attention_heads, s.num_key_value_heads, s.intermediate_size
    elif profile.models.source == "pretrained":
        from transformers import AutoConfig
        c = AutoConfig.from_pretrained(checkpoints.resolve_model_dir(checkpoints.model_path(profile, "target")))
        if (getattr(c, "quantization_config", None) or {}).get("quant_method") != "awq":
            return None
        d, heads, kv, inter = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
        hd = getattr(c, "head_dim", None) or d // heads
    else:                                                   # gguf: never AWQ
        return None
    return {"qkv": (d, (heads + 2 * kv) * hd), "o": (heads * hd, d), "gate_up": (d, 2 * inter), "down": (inter, d)}


def kernel_bytes(kernel: str, K: int, N: int) -> int:
    """Bytes a kernel reads for a (K, N) weight: fp16 for the dense one; this study's W4A16 layout keeps a column's
    scale and zero point in one 4-byte word a group (lib/models/w4a16.py); the others read AWQ's int4_bytes."""
    ours = K * N // 2 + K // GROUP * N * 4
    return {"dense_fp16": K * N * 2, "w4a16": ours, "w4a16_mma": ours}.get(kernel, int4_bytes(K, N))


def random_awq(K: int, N: int, device) -> tuple:
    """AWQ GEMM tensors of random codes, zero points and fp16 scales: (qweight, qzeros, scales)."""
    qweight = torch.randint(-2**31, 2**31, (K, N // 8), dtype=torch.int32, device=device)
    qzeros = torch.randint(-2**31, 2**31, (K // GROUP, N // 8), dtype=torch.int32, device=device)
    return qweight, qzeros, (torch.rand(K // GROUP, N, device=device) * 0.01 + 0.002).half()


def kernel_call(kernel: str, awq: tuple, K: int, N: int):
    """make(x) -> call for one kernel; each make holds its own copy of the weights and raises where the kernel is
    unavailable (a missing package: only when called)."""
    return {"w4a16": _w4a16, "w4a16_mma": _w4a16_mma, "marlin": _marlin, "tinygemm": _tinygemm, "gemlite": _gemlite,
            "dense_fp16": _dense}[kernel](awq, K, N)


def dequantized(awq: tuple) -> torch.Tensor:
    """The (K, N) fp32 weight the AWQ tensors stand for."""
    return dequantize(*awq).t()


def _w4a16(awq: tuple, K: int, N: int):
    def make(x):
        from ..models import w4a16                      # Triton
        packed = w4a16.pack_awq(*awq)
        return lambda: w4a16.w4a16_matmul(x, packed)
    return make


def _w4a16_mma(awq: tuple, K: int, N: int):
    def make(x):
        from ..models import w4a16, w4a16_mma           # the CUDA kernel, built by nvcc on first use
        why = w4a16_mma.supported(x.device)
        if why:
            raise RuntimeError(f"w4a16_mma: {why}")
        w = w4a16_mma.pack(*w4a16.awq_codes(*awq))
        return lambda: w4a16_mma.mma_matmul(x, w)
    return make


def _dense(awq: tuple, K: int, N: int):
    def make(x):
        w = dequantized(awq).half()
        return lambda: x @ w
    return make


def _marlin(awq: tuple, K: int, N: int):
    def make(x):
        from gptqmodel.nn_modules.qlinear.marlin_awq import AwqMarlinLinear
        m = AwqMarlinLinear(bits=4, group_size=GROUP, desc_act=False, sym=False, in_features=K, out_features=N,
                            bias=False, register_buffers=True, dtype=torch.float16).to(x.device)
        for name, t in zip(("qweight", "qzeros", "scales"), awq):
            getattr(m, name).data.copy_(t)
        m.post_init()
        return lambda: m(x)
    return make


def _tinygemm(awq: tuple, K: int, N: int):
    """torch's int4 mm (bf16 activations only): (q - z) s = (q - 8) s + (8 - z) s, codes packed two to a byte."""
    def make(x):
        q, z, s = unpack(awq[0]).t().contiguous(), unpack(awq[1]), awq[2].float()
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        sz = torch.stack([s, (8 - z).float() * s], -1).to(torch.bfloat16).contiguous()
        xb = x.to(torch.bfloat16)
        return lambda: torch.ops.aten._weight_int4pack_mm(xb, packed, GROUP, sz)
    return make


def gemlite_tuned(tuned: Path, dev) -> Path:
    """The file that keeps GemLite's autotuned launch configs for this card between runs (its load_config and
    cache_config): an autotuning that outlasts one process's time limit then finishes over several runs."""
    return Path(tuned) / f"gemlite_{re.sub('[^a-z0-9]+', '_', bench.device_name(dev).lower()).strip('_')}.json"


def _gemlite(awq: tuple, K: int, N: int):
    def make(x):
        from gemlite.core import DType, GemLiteLinearTriton
        m = GemLiteLinearTriton(W_nbits=4, group_size=GROUP, in_features=K, out_features=N,
                                input_dtype=DType.FP16, output_dtype=DType.FP16)
        q, z = unpack(awq[0]).t().contiguous(), unpack(awq[1]).t().contiguous()      # (N, K), (N, K/group)
        m.pack(q.to(torch.uint8), awq[2].t().contiguous(), z.half(), bias=None)
        return lambda: m(x)
    return make


def graphed(make, x: torch.Tensor, copies: int):
    """One CUDA graph of CALLS calls cycling over `copies` independently made calls (own weights each)."""
    calls = [make(x) for _ in range(copies)]
    graph, _ = bench.capture(lambda: [calls[i % copies]() for i in range(CALLS)])
    return graph.replay


def invariance(make, x: torch.Tensor, y: torch.Tensor, y16: torch.Tensor) -> dict[str, bool]:
    """Whether the rows of y = make(x)() are what padded verify calls need, x being the first rows of the 16-row x16
    with y16 = make(x16)(): `batch_invariant`, each row of y bitwise that row of y16 (a row against how many rows
    share its call); `position_invariant`, x's rows in reverse order give y's rows reversed, bitwise (a row against
    where it sits: a verify call's token i is row i, the same token alone is row 0)."""
    return {"batch_invariant": bool(torch.equal(y, y16[:len(x)])),
            "position_invariant": bool(torch.equal(make(x.flip(0).contiguous())().flip(0), y))}


def kernel_bench(kernel: str, shapes: dict, dev, iters: int, tuned: str = "") -> dict:
    """One kernel on every projection shape at every row count: per-call ms (p50, mean, p95), GB/s, relative error
    against the fp32 product of the dequantised weights, and the two row invariances (`invariance`). The same
    random weights in every process (seeded per shape). GemLite starts from, and adds to, its configs in the
    folder `tuned` (gemlite_tuned), where one is given."""
    configs = gemlite_tuned(tuned, dev) if tuned and kernel == "gemlite" else None
    if configs is not None:
        from gemlite.core import GemLiteLinearTriton as gemlite
        if configs.exists():
            gemlite.load_config(str(configs))
    out = {}
    for name, (K, N) in shapes.items():
        torch.manual_seed(K * 7 + N)
        awq = random_awq(K, N, dev)
        make = kernel_call(kernel, awq, K, N)
        nbytes = kernel_bytes(kernel, K, N)
        ref_w = dequantized(awq)                                                    # (K, N) fp32
        x16 = torch.randn(16, K, device=dev, dtype=torch.float16)
        y16 = make(x16)().clone()
        rows = out[name] = {}
        for m in ROWS:
            x = x16[:m].contiguous()
            ref, y = x.float() @ ref_w, make(x)().clone()
            rows[str(m)] = row = {"bytes": nbytes, "rel_err": float((y.float() - ref).norm() / ref.norm()),
                                  **invariance(make, x, y, y16)}
            replay = graphed(make, x, min(CALLS, math.ceil(256e6 / nbytes)))
            st = bench.stats([t / CALLS for t in bench.time_calls(replay, 3, iters, dev)])
            row.update(st, GBps=nbytes / st["p50_ms"] / 1e6)
        del make, ref_w, y16
        torch.cuda.empty_cache()
        if configs is not None:                             # what autotuning chose so far survives a time limit
            configs.parent.mkdir(parents=True, exist_ok=True)
            gemlite.cache_config(str(configs))
    return out


def int4_kernel_bench(profile: Profile, iters: int = 30) -> dict | None:
    """The table of the module docstring for a CUDA profile with an AWQ target, saved as int4_kernels.json; None
    elsewhere. Each kernel runs in its own process, so one that fails (an import, an illegal memory access)
    is recorded with its last error line and cannot stop the others; kernels are timed one after the other,
    not interleaved. The floor of a shape: its int4 bytes at the measured copy bandwidth."""
    dev = torch.device(profile.target_device)
    shapes = awq_projection_shapes(profile) if dev.type == "cuda" else None
    if shapes is None:
        return None
    bw = bench.copy_bandwidth(dev)
    result = {"device": bench.device_name(dev), "copy_GBps": bw / 1e9, "activations": "float16 (tinygemm: bfloat16)",
              "shapes": {name: {"K": K, "N": N, "floor_ms": int4_bytes(K, N) / bw * 1e3,
                                "rows": {str(m): {} for m in ROWS}, "unavailable": {}}
                         for name, (K, N) in shapes.items()}}
    configs = gemlite_tuned(profile.out_dir / TUNED, dev)
    result["gemlite_configs"] = (f"started from {configs.name}, autotuned by an earlier run on this card"
                                 if configs.exists() else "autotuned in this run")
    for kernel in progress.steps(KERNELS, "int4 kernels", "kernels", name=str):
        got, error = _in_subprocess(kernel, shapes, str(dev), iters, profile.out_dir / TUNED)
        for name, shape in result["shapes"].items():
            if error:
                shape["unavailable"][kernel] = error
            else:
                for m, row in got[name].items():
                    shape["rows"][m][kernel] = row
    save_json(profile, "int4_kernels.json", result)
    return result


def _in_subprocess(kernel: str, shapes: dict, device: str, iters: int, tuned: Path | str = "",
                   timeout_s: float = KERNEL_TIMEOUT_S) -> tuple[dict, str]:
    """(kernel_bench's result, "") from `python -m lib.study.int4_kernels`, or ({}, its last error line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        args = [sys.executable, "-m", "lib.study.int4_kernels", kernel, json.dumps(shapes), device, str(iters), str(out),
                str(tuned)]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
                                  timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {}, f"stopped after {timeout_s:g} s (a JIT build or autotuning counts in it)"
        if proc.returncode == 0 and out.exists():
            return json.loads(out.read_text()), ""
        lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
        return {}, (lines[-1] if lines else f"exit code {proc.returncode}")[:300]


if __name__ == "__main__":                                 # one kernel, in its own process (int4_kernel_bench)
    kernel, shapes, device, iters, path, *tuned = sys.argv[1:7]
    Path(path).write_text(json.dumps(kernel_bench(kernel, json.loads(shapes), torch.device(device), int(iters),
                                                  *tuned)))
