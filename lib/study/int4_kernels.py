"""Notebook 02, AWQ int4 targets on a GPU: the target's projections through every W4A16 kernel at hand, at 1-16
activation rows (decode is 1, verify K + 1): this study's kernel (lib/models/w4a16.py), gptqmodel's AWQ marlin,
torch's tinygemm, GemLite, and the dense fp16 weight through cuBLAS. Same card, same random AWQ weights (group 128,
zero point), CUDA-graph replays of 20 calls cycling over enough weight copies (>= 256 MB) that each call reads
HBM, not L2. A kernel that cannot run here is listed with its error, never replaced by another."""
from __future__ import annotations

import math

import torch

from .. import bench
from ..config import Profile
from ..engine.runner import capture
from ..models import checkpoints
from ..models.quantize import GROUP, unpack
from ..results import save_json

ROWS = (1, 2, 4, 8, 16)
CALLS = 20                                                  # calls in one graph replay
KERNELS = ("w4a16", "marlin", "tinygemm", "gemlite", "dense_fp16")


def projection_shapes(profile: Profile) -> dict[str, tuple[int, int]]:
    """(K, N) of the target's fused q/k/v, o, fused gate/up and down projections."""
    if profile.models.source == "synthetic":
        s = profile.models.synthetic.target
        d, hd, heads, kv, inter = s.hidden_size, s.head_dim, s.num_attention_heads, s.num_key_value_heads, s.intermediate_size
    else:
        from transformers import AutoConfig
        c = AutoConfig.from_pretrained(checkpoints.model_path(profile, "target"))
        d, heads, kv, inter = c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
        hd = getattr(c, "head_dim", None) or d // heads
    return {"qkv": (d, (heads + 2 * kv) * hd), "o": (heads * hd, d), "gate_up": (d, 2 * inter), "down": (inter, d)}


def random_awq(K: int, N: int, device) -> tuple:
    """AWQ GEMM tensors of random codes, zero points and fp16 scales: (qweight, qzeros, scales)."""
    qweight = torch.randint(-2**31, 2**31, (K, N // 8), dtype=torch.int32, device=device)
    qzeros = torch.randint(-2**31, 2**31, (K // GROUP, N // 8), dtype=torch.int32, device=device)
    return qweight, qzeros, (torch.rand(K // GROUP, N, device=device) * 0.01 + 0.002).half()


def kernel_calls(awq: tuple, K: int, N: int) -> dict:
    """{kernel: make(x) -> call}; each make holds its own copy of the weights and raises where the kernel is
    unavailable."""
    return {"w4a16": _w4a16(awq), "marlin": _marlin(awq, K, N), "tinygemm": _tinygemm(awq),
            "gemlite": _gemlite(awq, K, N), "dense_fp16": _dense(awq)}


def _w4a16(awq: tuple):
    from ..models import w4a16
    def make(x):
        packed = w4a16.pack_awq(*awq)
        return lambda: w4a16.w4a16_matmul(x, packed)
    return make


def _dense(awq: tuple):
    from ..models import w4a16
    def make(x):
        w = w4a16.dequantize(w4a16.pack_awq(*awq)).half()
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


def _tinygemm(awq: tuple):
    """torch's int4 mm (bf16 activations only): (q - z) s = (q - 8) s + (8 - z) s, codes packed two to a byte."""
    def make(x):
        q, z, s = unpack(awq[0]).t().contiguous(), unpack(awq[1]), awq[2].float()
        packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), 8)
        sz = torch.stack([s, (8 - z).float() * s], -1).to(torch.bfloat16).contiguous()
        xb = x.to(torch.bfloat16)
        return lambda: torch.ops.aten._weight_int4pack_mm(xb, packed, GROUP, sz)
    return make


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
    graph, _ = capture(lambda: [calls[i % copies]() for i in range(CALLS)])
    return graph.replay


def shape_bench(name: str, K: int, N: int, dev, iters: int) -> dict:
    """Every kernel at every row count on one projection shape: per-call ms, GB/s, error, invariance."""
    awq = random_awq(K, N, dev)
    calls = kernel_calls(awq, K, N)
    int4 = K * N // 2 + awq[2].numel() * 2 + awq[1].numel() * 4                    # packed codes, scales, zeros
    ref_w = unpack(awq[0]).float().sub_(unpack(awq[1]).float().repeat_interleave(GROUP, 0))
    ref_w.mul_(awq[2].float().repeat_interleave(GROUP, 0))                          # (K, N) fp32
    x16 = torch.randn(16, K, device=dev, dtype=torch.float16)
    out = {"K": K, "N": N, "int4_bytes": int4, "rows": {}, "unavailable": {}}
    alone = calls["w4a16"](x16)
    for m in ROWS:
        x = x16[:m].contiguous()
        ref, fns, row = x.float() @ ref_w, {}, {}
        for kernel, make in calls.items():
            if kernel in out["unavailable"]:
                continue
            nbytes = K * N * 2 if kernel == "dense_fp16" else int4
            try:
                y = make(x)().float()
                row[kernel] = {"bytes": nbytes, "rel_err": float((y - ref).norm() / ref.norm())}
                fns[kernel] = graphed(make, x, min(CALLS, math.ceil(256e6 / nbytes)))
            except Exception as e:                                                   # noqa: BLE001 - recorded
                out["unavailable"][kernel] = f"{type(e).__name__}: {e}"[:300]
        # batch invariance: each row of this m-row call is bitwise that row of the 16-row call
        row["w4a16"]["batch_invariant"] = bool(torch.equal(calls["w4a16"](x)(), alone()[:m]))
        for kernel, ms in bench.interleaved(fns, 3, iters, dev).items():
            st = bench.stats([t / CALLS for t in ms])
            row[kernel].update(st, GBps=row[kernel]["bytes"] / st["p50_ms"] / 1e6)
        out["rows"][str(m)] = row
    return out


def int4_kernel_bench(profile: Profile, iters: int = 30) -> dict | None:
    """The table of the module docstring for a CUDA profile with an AWQ target, saved as int4_kernels.json; None
    elsewhere. The floor of a shape: its int4 bytes at the measured copy bandwidth."""
    quant = profile.models.source != "synthetic" or profile.models.synthetic.target_quant == "awq"
    dev = torch.device(profile.target_device)
    if dev.type != "cuda" or not quant:
        return None
    bw = bench.copy_bandwidth(dev)
    result = {"device": bench.device_name(dev), "copy_GBps": bw / 1e9, "activations": "float16 (tinygemm: bfloat16)",
              "shapes": {}}
    for name, (K, N) in projection_shapes(profile).items():
        shape = result["shapes"][name] = shape_bench(name, K, N, dev, iters)
        shape["floor_ms"] = shape["int4_bytes"] / bw * 1e3
        torch.cuda.empty_cache()
    save_json(profile, "int4_kernels.json", result)
    return result
