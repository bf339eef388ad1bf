"""The fused step's q/k/v projection and attention as one CUDA kernel of thread-block clusters (qkv_attention.cu):
built with nvcc on first use (cached by the source's hash), loaded with ctypes, launched on the current stream (CUDA
graphs capture it like any launch). Hopper or later; where nvcc, the GPU or the shape does not allow it, `reason`
says why and decode.py keeps its two Triton kernels for that pair."""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("qkv_attention.cu")
CLUSTER = 16                    # blocks a KV head (the kernel's CS; beyond the portable 8); 0: off
_LIBS: dict = {}


class Args(ctypes.Structure):
    _fields_ = [(n, ctypes.c_void_p) for n in ("x", "ids", "res", "g", "w", "qn", "kn", "cos", "sin", "kc", "vc",
                                               "pos", "out")] + \
               [(n, ctypes.c_int) for n in ("D", "HQ", "HKV", "L", "qk_norm", "embed")] + \
               [(n, ctypes.c_float) for n in ("eps", "scale")]


def build_dir() -> Path:
    return Path(os.environ.get("STUDY_BUILD", Path.home() / ".cache" / "ann-draft-study"))


def library(device: torch.device):
    """The compiled kernel for the device's architecture (nvcc, once per source version), or a string: why not."""
    major, minor = torch.cuda.get_device_capability(device)
    arch = f"sm_{major}{minor}{'a' if major == 9 else ''}"
    nvcc = shutil.which("nvcc") or str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc")
    key = hashlib.sha256(SOURCE.read_bytes() + arch.encode()).hexdigest()[:16]
    if key in _LIBS:
        return _LIBS[key]
    so = build_dir() / f"qkv_attention-{key}.so"
    if not so.exists():
        if not Path(nvcc).exists():
            return "no nvcc to build the cluster kernel"
        so.parent.mkdir(parents=True, exist_ok=True)
        tmp = so.with_suffix(f".{os.getpid()}.tmp")
        done = subprocess.run([nvcc, "-O3", "-std=c++17", f"-arch={arch}", "-shared", "-Xcompiler", "-fPIC",
                               "-o", str(tmp), str(SOURCE)], capture_output=True, text=True)
        if done.returncode:
            return f"nvcc failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        tmp.replace(so)                                                    # whole, or not there at all
    lib = ctypes.CDLL(str(so))
    if lib.qkv_attention_args_size() != ctypes.sizeof(Args):
        return "the kernel's argument layout differs from cluster_step.Args"
    lib.qkv_attention_error.restype = ctypes.c_char_p
    _LIBS[key] = lib
    return lib


def reason(step, cluster: int) -> str:
    """Why the cluster kernel cannot take this fused step's layers ('' when it can)."""
    dev, hd, D = step.x.device, step.hd, step.x.shape[1]
    if dev.type != "cuda" or torch.cuda.get_device_capability(dev)[0] < 9:
        return "needs a Hopper (sm_90) or later GPU"
    if step.x.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {step.x.dtype}"
    if (hd, step.hq // step.hkv) not in ((128, 2), (64, 3)) or D % 8 or D > 1024 or cluster != CLUSTER:
        return f"no kernel for head_dim {hd}, {step.hq // step.hkv} query heads a KV head, hidden size {D}"
    return ""


def attach(step, cluster: int = CLUSTER) -> tuple:
    """(the cluster kernel for a FusedDecode step, "cuda clusters of n"), or (None, "triton (why not)")."""
    why = reason(step, cluster) if cluster else "off"
    lib = library(step.x.device) if not why else why
    if isinstance(lib, str):
        return None, f"triton ({lib})"
    kernel = ClusterQkvAttention(step, lib, cluster)
    return kernel, f"cuda clusters of {cluster} ({kernel.clusters()} can run at once)"


class ClusterQkvAttention:
    """Layer i's RMSNorm + q/k/v GEMV + attention of one token (T = 1) for a FusedDecode `step`, writing step.attn[0]
    and the runner's cache like decode.py's two kernels."""

    def __init__(self, step, lib, cluster: int = CLUSTER):
        r = step.runner
        self.step, self.lib, self.cluster = step, lib, cluster
        self.device = torch.device('cuda', step.x.device.index if step.x.device.index is not None
                                   else torch.cuda.current_device())
        self.half = int(step.x.dtype == torch.float16)
        p = lambda t: ctypes.c_void_p(t.data_ptr())
        self.args = []
        for i, layer in enumerate(r.layers):
            att, (kc, vc) = layer.self_attn, r.cache.layer(i)
            qn, kn = (att.q_norm.weight, att.k_norm.weight) if step.qk_norm else (step.x, step.x)
            a = Args(x=p(step.x), res=p(step.x), g=p(layer.input_layernorm.weight), w=p(r.fused[i]["qkv"]),
                     qn=p(qn), kn=p(kn), cos=p(r.cos), sin=p(r.sin), kc=p(kc), vc=p(vc), out=p(step.attn),
                     D=step.x.shape[1], HQ=step.hq, HKV=step.hkv, L=kc.shape[2], qk_norm=int(step.qk_norm),
                     embed=0, eps=step.eps, scale=step.hd ** -0.5)
            if i == 0:                                                     # layer 0 reads the token's embedding row
                a.x, a.embed = p(r.body.embed_tokens.weight), 1
            self.args.append(a)

    def clusters(self) -> int:
        """How many clusters can run at once (all HKV must, for the kernel to run in one wave)."""
        n = ctypes.c_int(0)
        self._ok(self.lib.qkv_attention_clusters(self.half, self.step.hd, self.step.hq // self.step.hkv, self.device.index,
                                                 ctypes.byref(n)))
        return n.value

    def __call__(self, i: int, ids: torch.Tensor, start: torch.Tensor) -> None:
        if ids.dtype != torch.int64 or start.dtype != torch.int64:
            raise TypeError(f"the cluster kernel reads int64 ids and positions, got {ids.dtype}, {start.dtype}")
        a = self.args[i]
        a.ids, a.pos = ids.data_ptr(), start.data_ptr()
        stream = ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)
        self._ok(self.lib.qkv_attention_launch(ctypes.byref(a), self.half, self.step.hd, self.step.hq // self.step.hkv, stream,
                                               self.device.index))

    def _ok(self, e: int) -> None:
        if e:
            raise RuntimeError(f"cluster kernel: {self.lib.qkv_attention_error(e).decode() if e > 0 else 'no kernel'}")
