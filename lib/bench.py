"""Timing: CUDA-event clocks (perf_counter on CPU), per-call latency and its statistics; the device context, host reads
of device values and CUDA-graph capture that engines and benches share."""
from __future__ import annotations

import os
import time
import warnings
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import numpy as np
import torch
from torch.torch_version import TorchVersion


def stats(ms: list[float]) -> dict:
    """mean, p50, p95 (ms) and tok_s, calls per second: tokens per second only where each call makes one token (the
    head and the single step, as the thesis's tables 4.1-4.4 give them), not for a verify call or a block."""
    a = np.asarray(ms, dtype=float)
    mean = float(a.mean())
    return {"mean_ms": mean, "p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "tok_s": 1000.0 / mean, "n": int(a.size)}


def on(device: torch.device):
    """Make `device` the current CUDA device (a second GPU's graphs and streams live there); no-op on a CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else nullcontext()


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class HostCopy:
    """Device values read on the host without waiting for the work launched after them: queue(x) copies x into pinned
    memory and marks its arrival (CUDA; on a CPU x is its own copy), read(h) waits for that mark alone. One copy is in
    flight at a time: read it before queueing the next."""

    def __init__(self):
        self.buf, self.ready = None, None

    def queue(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cuda":
            return x
        if self.buf is None or self.buf.numel() < x.numel() or self.buf.dtype != x.dtype:
            self.buf = torch.empty(2 * x.numel(), dtype=x.dtype, pin_memory=True)
        self.buf[:x.numel()].copy_(x, non_blocking=True)
        self.ready = torch.cuda.Event()
        self.ready.record()                                 # on x's stream: before anything enqueued after the copy
        return self.buf[:x.numel()]

    def read(self, h: torch.Tensor) -> list:
        if self.ready is not None:
            self.ready.synchronize()
        return h.tolist()


def capture(fn):
    """Warm fn up on a side stream, then capture it in a CUDA graph (on the current device).
    Returns (graph, static output)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    # Capture on our own stream of this device: torch.cuda.graph's default capture stream is made once,
    # on whichever device was current then, and a second GPU's kernels would escape the capture.
    with torch.cuda.graph(graph, stream=s):
        out = fn()
    return graph, out


class Clock:
    """Named spans on one device. On CUDA spans are event pairs (no host sync until totals()).
    Engines share one clock: the runners and the head wrapper record their calls on it, the engine
    its phases; reset() starts a new generation."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.spans: dict[str, list] = defaultdict(list)

    def reset(self) -> None:
        self.spans = defaultdict(list)

    def mark(self, device=None):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record(torch.cuda.current_stream(device))
            return e
        return time.perf_counter()

    @contextmanager
    def span(self, name: str, device=None):
        """Time the enclosed work; `device` names the GPU it runs on when that is not the current one."""
        start = self.mark(device)
        yield
        self.close(name, start, device)

    def close(self, name: str, start, device=None) -> None:
        """End a span begun at the mark `start`, where a phase ends inside a block of code."""
        self.spans[name].append((start, self.mark(device)))

    def totals(self) -> dict[str, float]:
        """Milliseconds per span name (synchronises once on CUDA)."""
        if self.cuda:
            for i in range(torch.cuda.device_count()):                # spans may lie on a second GPU
                torch.cuda.synchronize(i)
            return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self.spans.items()}
        return {k: 1000.0 * sum(b - a for a, b in v) for k, v in self.spans.items()}


class NoClock:
    """A clock that records nothing (microbenchmarks, hidden-state extraction)."""

    def span(self, name: str, device=None):
        return nullcontext()

    def mark(self, device=None) -> None:
        return None

    def close(self, name: str, start, device=None) -> None:
        pass

    def reset(self) -> None:
        pass

    def totals(self) -> dict[str, float]:
        return {}


NO_CLOCK = NoClock()


def time_calls(fn, warmup: int, iters: int, device) -> list[float]:
    """Per-call latency (ms) of fn() after warm-up: CUDA events around each call on GPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    cuda = torch.device(device).type == "cuda"
    for _ in range(iters):
        if cuda:                                                       # events on the stream that runs fn
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(torch.cuda.current_stream(device))
            fn()
            b.record(torch.cuda.current_stream(device))
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append(1000.0 * (time.perf_counter() - t))
    return out


def nbytes(modules) -> int:
    """Bytes the modules hold: parameters and buffers (packed int4 weights are buffers)."""
    return sum(t.numel() * t.element_size() for m in modules for t in (*m.parameters(), *m.buffers()))


def copy_bandwidth(device, nbytes: int = 2**29) -> float:
    """Measured device memory bandwidth (bytes/s): a copy of nbytes reads and writes nbytes each."""
    x = torch.empty(nbytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = float(np.median(time_calls(lambda: y.copy_(x), 3, 20, device)))
    return 2 * nbytes / (ms / 1000)


def interleaved(fns: dict, warmup: int, iters: int, device) -> dict[str, list[float]]:
    """Time several callables, alternating their order every iteration (warm-up for each first)."""
    names = list(fns)
    for n in names:
        time_calls(fns[n], warmup, 0, device)
    out = {n: [] for n in names}
    for i in range(iters):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            out[n] += time_calls(fns[n], 0, 1, device)
    return out


@contextmanager
def all_cores(device):
    """On a CPU, every core's intra-op thread for the duration (large batched work such as k-means; the small
    decoders run on one); elsewhere nothing changes."""
    before = torch.get_num_threads()
    if torch.device(device).type == "cpu":
        torch.set_num_threads(os.cpu_count() or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def device_name(device) -> str:
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# First match wins: this study's Triton heads (lib/engine/kernels.py, flash_kernels.py; _flash_probes: the name of
# FlashHead's first launch in files before dc1aff3) first; inductor's kernels that hold a matmul
# (coordinate-descent tuning turns one-row matmuls into Triton reductions fused with their norms, activations
# and residual adds: "_mm_" in the name) before plain GEMMs (cuBLAS on Hopper names its GEMMs nvjet_*); other
# compiled kernels before attention, since inductor names the fusions around attention after the ops they hold.
KERNEL_KINDS = (("LM head (Triton)", ("_flash_scores", "_flash_probes", "_flash_tokens", "_dense_argmax")),
                ("fused decode GEMV (Triton)", ("_decode_gemv",)),
                ("fused decode attention (Triton)", ("_decode_attention",)),
                ("fused decode norm (Triton)", ("_decode_norm",)),
                ("W4A16 int4 GEMM (Triton)", ("_w4a16_kernel",)),
                ("W4A16 int4 GEMM (CUDA mma)", ("w4a16_mma",)),
                ("layer attention (Triton)", ("_layer_attention",)),
                ("layer norm (Triton)", ("_layer_rms_norm",)),
                ("layer q/k norms, RoPE and cache write (Triton)", ("_layer_rope_cache",)),
                ("layer SiLU(gate) * up (Triton)", ("_layer_silu_mul",)),
                ("GEMV fused with norms and elementwise ops (compiled)", ("_mm_",)),
                ("GEMV/GEMM", ("gemv", "gemm", "nvjet", "xmma", "cutlass", "marlin", "splitk", "cublas", "addmm", "aten::mm")),
                ("fused elementwise and norms (compiled)", ("triton",)),
                ("attention", ("flash", "fmha", "attention", "sdpa", "efficient")),
                ("argmax/top-k", ("argmax", "topk", "sort", "argreduce")),
                ("copies and indexing", ("copy", "memcpy", "memset", "index", "cat", "fill")))


def kernel_kind(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def exposed(spans: list[tuple[float, float]]) -> list[float]:
    """Each (start, end) span's time that no span ending before it covers: with kernels that overlap
    (programmatic dependent launch starts one while the one before runs) its share of the critical path.
    The shares sum to the union of the spans."""
    shares, merged = [0.0] * len(spans), []                 # merged: disjoint (start, end) of spans seen so far
    for i in sorted(range(len(spans)), key=lambda i: spans[i][1]):
        s, e = spans[i]
        covered = sum(max(0.0, min(e, b) - max(s, a)) for a, b in merged)
        shares[i] = max(0.0, e - s - covered)
        keep = [(a, b) for a, b in merged if b < s]             # the union with [s, e] inserted
        lo = min([s] + [a for a, b in merged if b >= s])
        merged = keep + [(lo, e)]
    return shares


def _kernel_spans(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel and copy the profiler saw (kineto's own events)."""
    from torch.autograd import DeviceType
    return [(e.name(), e.start_ns() / 1e3, (e.start_ns() + e.duration_ns()) / 1e3)
            for e in prof.profiler.kineto_results.events() if e.device_type() == DeviceType.CUDA]


def kernel_breakdown(fn, iters: int, device) -> list[dict]:
    """Where one call of fn spends its time, from the torch profiler over `iters` calls after warm-up:
    per kernel (CUDA; CUDA-graph replays included) or per top-level op (CPU), its launches and microseconds
    per call, largest first (group_kernels adds each one's kind). On CUDA also `exposed_us`: its share of the
    critical path (exposed), which the kernels' own durations overstate where they overlap."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")      # the profiler's own start/stop lines (level 5) are not output
    # kineto detaches CUPTI when the profile ends: left attached, every later call in the process ran slower
    # (h100awq's graphed step 8.5 -> 8.9 ms, one H100). Before CUDA 12.6, graphs crash on CUPTI's re-init: left so.
    if TorchVersion(torch.version.cuda or "12.6") >= "12.6":
        os.environ["TEARDOWN_CUPTI"] = "1"
    from torch.profiler import ProfilerActivity, profile
    cuda = torch.device(device).type == "cuda"
    for _ in range(3):
        fn()
    sync(device)
    with warnings.catch_warnings():                      # torch's note that each profile() is one cycle: we use one
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            for _ in range(iters):
                fn()
            sync(device)
        events = prof.key_averages()
    if cuda and os.environ.get("TEARDOWN_CUPTI") != "1":                     # CUDA < 12.6, or torch set it back
        warnings.warn("CUPTI stays attached after this profile: timings later in this process read slow")
    us = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    rows = [{"kernel": e.key[:120], "launches": e.count / iters, "us": us(e) / iters}
            for e in events if us(e) > 0 and (cuda or e.key.startswith("aten::"))]
    if cuda:
        spans = _kernel_spans(prof)
        shares = defaultdict(float)
        for (name, _, _), share in zip(spans, exposed([(s, e) for _, s, e in spans])):
            shares[name[:120]] += share / iters
        for r in rows:
            r["exposed_us"] = shares.get(r["kernel"], 0.0)
    return sorted(rows, key=lambda r: -r["us"])


def breakdown(fn, dev, iters: int = 20) -> dict:
    """kernel_breakdown of fn on `dev`, grouped by kind (group_kernels), with the device named and whether the
    profiler let go of CUPTI afterwards (torch keeps it attached on CUDA < 12.6 with graphs: later timings in
    the process then read slow)."""
    rows = kernel_breakdown(fn, iters, dev)
    return {"device": device_name(dev), "cupti_torn_down": os.environ.get("TEARDOWN_CUPTI") == "1", **group_kernels(rows)}


def group_kernels(rows: list[dict]) -> dict:
    """Totals of a kernel breakdown, and microseconds per kind (kinds as lib.bench.kernel_kind names them); where
    the rows have exposed_us, its totals too (exposed_us, exposed_by_kind_us)."""
    by_kind, exposed_by_kind = defaultdict(float), defaultdict(float)
    for r in rows:
        r["kind"] = kernel_kind(r["kernel"])
        by_kind[r["kind"]] += r["us"]
        exposed_by_kind[r["kind"]] += r.get("exposed_us", 0.0)
    out = {"total_us": sum(by_kind.values()), "launches": sum(r["launches"] for r in rows),
           "by_kind_us": dict(by_kind), "kernels": rows}
    if any("exposed_us" in r for r in rows):
        out.update(exposed_us=sum(exposed_by_kind.values()), exposed_by_kind_us=dict(exposed_by_kind))
    return out
