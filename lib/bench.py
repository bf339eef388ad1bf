"""Timing: CUDA-event clocks (perf_counter on CPU), latency statistics, and run directories."""
from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch


def stats(ms: list[float]) -> dict:
    """mean, p50, p95 (ms) and tokens per second of one-token calls."""
    a = np.asarray(ms, dtype=float)
    mean = float(a.mean())
    return {"mean_ms": mean, "p50_ms": float(np.percentile(a, 50)), "p95_ms": float(np.percentile(a, 95)),
            "tok_s": 1000.0 / mean, "n": int(a.size)}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Named spans on one device. On CUDA spans are event pairs (no host sync until totals())."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.spans: dict[str, list] = defaultdict(list)

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
        self.spans[name].append((start, self.mark(device)))

    def totals(self) -> dict[str, float]:
        """Milliseconds per span name (synchronises once on CUDA)."""
        if self.cuda:
            torch.cuda.synchronize()
            return {k: sum(a.elapsed_time(b) for a, b in v) for k, v in self.spans.items()}
        return {k: 1000.0 * sum(b - a for a, b in v) for k, v in self.spans.items()}


def time_calls(fn, warmup: int, iters: int, device) -> list[float]:
    """Per-call latency (ms) of fn() after warm-up: CUDA events around each call on GPU."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    cuda = torch.device(device).type == "cuda"
    for _ in range(iters):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            out.append(1000.0 * (time.perf_counter() - t))
    return out


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


def device_name(device) -> str:
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    import platform
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


# ---------------------------------------------------------------- run directories

def new_run(out_dir: Path, config: dict, name: str = "e2e") -> Path:
    """A fresh run directory outputs/<profile>/runs/<name>-<UTC time>/ with config.json beside the records."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    run = Path(out_dir) / "runs" / f"{name}-{stamp}"
    i = 1
    while run.exists():                                                # never reuse a directory
        run = run.with_name(f"{name}-{stamp}-{i}")
        i += 1
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(config, indent=1, default=str))
    return run


def finished(run: Path) -> bool:
    return (run / "DONE").exists()


def mark_finished(run: Path) -> None:
    (run / "DONE").write_text(datetime.now(timezone.utc).isoformat())


def latest_run(out_dir: Path, name: str = "e2e") -> Path:
    runs = sorted((p for p in (Path(out_dir) / "runs").glob(f"{name}-*") if finished(p)),
                  key=lambda p: (p / "DONE").stat().st_mtime_ns)
    if not runs:
        raise FileNotFoundError(f"no finished {name} run under {out_dir}/runs: run notebook 03 first")
    return runs[-1]


def read_records(run: Path) -> list[dict]:
    """All records of a run: samples.jsonl plus any shard files not merged yet."""
    return [json.loads(line) for path in sorted(Path(run).glob("samples*.jsonl")) if path.is_file()
            for line in path.read_text().splitlines() if line.strip()]


def append_record(run: Path, record: dict, shard: tuple[int, int] = (0, 1)) -> None:
    """Append one sample; shards of an array each write their own file (no concurrent appends)."""
    if finished(run):
        raise RuntimeError(f"{run} is a finished run; start a new one instead of adding to it")
    name = "samples.jsonl" if shard[1] == 1 else f"samples.shard{shard[0]:03d}of{shard[1]:03d}.jsonl"
    with open(Path(run) / name, "a") as f:
        f.write(json.dumps(record) + "\n")


def merge_records(run: Path, records: list[dict]) -> None:
    """Write the one results set samples.jsonl and drop the shard files it now holds."""
    tmp = Path(run) / "samples.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    for path in Path(run).glob("samples.shard*.jsonl"):
        path.unlink()
    tmp.replace(Path(run) / "samples.jsonl")
