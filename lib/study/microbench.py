"""Notebook 02: head and draft-step microbenchmarks (thesis tables 4.1-4.4), hardware floors, where a draft
step's time goes, the early-exit depth of one-checkpoint profiles, and the target's single-token and verify
calls (notebook 03 measures those)."""
from __future__ import annotations

from dataclasses import asdict, replace

import torch

from .. import bench, modes
from ..config import Profile
from ..engine.heads import DenseHead, GraphedHead
from ..models import build as engines, checkpoints
from ..models.flash_checkpoint import ensure_flash_checkpoint
from ..results import save_json, update_json
from . import exit_depth
from .common import encoded_prompts, stop_tokens

# What notebook 02 shows, reached through its one import of this module.
from ..report.figures import exit_depth_plot, head_batch_plot, int4_kernel_plot, probe_sweep_plot  # noqa: F401
from ..report.micro import (breakdown_table, draft_step_table, floor_table, head_batch_table,  # noqa: F401
                             int4_invariance_table, int4_kernel_frame, int4_kernel_table)
from .head_batches import head_batch_study  # noqa: F401
from .int4_kernels import int4_kernel_bench  # noqa: F401
from ..report.thesis import micro_tables  # noqa: F401
from .common import setup  # noqa: F401


def head_and_step_bench(profile: Profile, prepared: tuple | None = None) -> dict:
    """Thesis 4.1-4.4: single-step head latency (same hidden state) and complete draft decode step,
    dense vs FlashHead, plus head latency against the probe count. Alternating order, warm-up first.
    On a GPU also: the same steps through the reference path (the fused kernels off), a round's whole
    proposal block as one graph replay, and which decode path each draft ran. `prepared`: step_drafts(profile),
    made here when not given (notebook 02 makes it once for this and draft_step_breakdown)."""
    b = profile.bench
    drafts, x, pos = prepared or step_drafts(profile)
    dense, flash = drafts[modes.DENSE], drafts[modes.FLASH]
    dev = dense.runner.device
    h = flash.runner.forward(x, pos)[:, -1].clone()                                # the same hidden state
    heads = interleaved_stats({"dense": lambda: dense.head(h), "flash": lambda: flash.head(h)}, b, dev)
    steps = {k: (lambda d=d: d.head(d.runner.forward(x, pos)[:, -1])) for k, d in drafts.items()}
    step = interleaved_stats(steps, b, dev)
    fh = flash.head.head
    kernels = ("torch", "triton") if dev.type == "cuda" else (b.head_kernel,)
    sweep = [probe_point(fh.with_probes(p, k), h, b, dev) for k in kernels for p in profile.clustering.probe_sweep]
    result = {"device": bench.device_name(dev), "n_probes": fh.n_probes, "head": heads, "model_step": step,
              "probe_sweep": sweep, "decode_path": {k: d.runner.decode_path for k, d in drafts.items()},
              "layer_path": {k: d.runner.layer_path for k, d in drafts.items()},
              "decode_check": {k: getattr(d.runner.decode, "checked", None) for k, d in drafts.items()}}
    if dev.type == "cuda":                                                   # hardware floors, head paths, blocks
        result["floors"] = floors(dense, fh, bench.copy_bandwidth(dev), pos + 1)
        result["dense_paths"] = {k: bench.stats(bench.time_calls(
            lambda g=GraphedHead(DenseHead(dense.head.head.weight, k), True): g(h), b.warmup, b.iters, dev))
            for k in kernels}
        result["block"] = block_bench(profile, {modes.DENSE: dense, modes.FLASH: flash}, x, pos)
    save_json(profile, "microbench.json", result)
    return result


def step_drafts(profile: Profile) -> tuple[dict, torch.Tensor, int]:
    """The dense and FlashHead drafts, on a GPU also through the reference path (dense_reference,
    flash_reference: the fused kernels off), each prefilled with the first prompt; and the step's input:
    the prompt's last token (1,1) fed again at the prompt's end."""
    ensure_flash_checkpoint(profile)
    drafts = engines.build_drafts(profile, (modes.DENSE, modes.FLASH))
    dev = drafts[modes.DENSE].runner.device
    if dev.type == "cuda":
        off = replace(profile, decode=replace(profile.decode, fused_draft=False))
        drafts.update({f"{k}_reference": d for k, d in engines.build_drafts(off, (modes.DENSE, modes.FLASH)).items()})
    prompt = encoded_prompts(profile)[0][1]
    for d in drafts.values():
        d.runner.prefill(torch.tensor([prompt], device=dev))
    return drafts, torch.tensor([[prompt[-1]]], device=dev), len(prompt)


BLOCK_INSTANCES = 3    # fused steps a draft's block is timed through: their buffers lie elsewhere in memory, and on
                       # one H100 identical kernels differed by up to 5 % (p50) from one such instance to the next


def block_bench(profile: Profile, drafts: dict, x: torch.Tensor, pos: int) -> dict:
    """A round's k proposals as the engine makes them with CUDA graphs (Runner.chain: one replay) against k
    single steps (a replay of the body and one of the head each): mean, p50, p95 per block. A fused draft's block
    is timed through BLOCK_INSTANCES instances of its fused step, interleaved: `<draft>` pools their replays,
    `<draft>_instances` gives each one's. `body`: the dense draft's chain with no head (each step fed the same
    token), so that block - body is what a head adds to the block where its kernels overlap the body's last ones
    (programmatic dependent launch). `<draft>_fed_two`: the block fed two tokens, as deferred rounds launch it ahead
    (its first step the two-token one), through the runner's own step."""
    b, k = profile.bench, profile.decode.k
    fns, same, names, two = {}, x.view(1), {}, x.repeat(1, 2)
    body_only = lambda h: same                                               # one object: one captured graph
    for name, d in drafts.items():
        steps = fused_instances(d.runner)
        names[name] = [f"{name}#{i}" for i in range(len(steps))]
        for key, step in zip(names[name], steps):
            fns[key] = instance_block(d.runner, step, d.head.head, x, pos, k)
        fns[f"{name}_steps"] = lambda d=d: [d.head(d.runner.forward(x, pos + i)[:, -1]) for i in range(k)]
        fns[modes.fed_two(name)] = lambda d=d: d.runner.chain(d.head.head, two, pos, k)
    fns["body"] = lambda d=drafts[modes.DENSE]: d.runner.chain(body_only, x, pos, k)
    raw = bench.interleaved(fns, b.warmup, max(10, b.iters // 4), x.device)
    out = {"k": k, **{name: bench.stats(ms) for name, ms in raw.items() if "#" not in name}}
    for name, keys in names.items():
        out[name] = bench.stats([t for key in keys for t in raw[key]])
        out[f"{name}_instances"] = [bench.stats(raw[key]) for key in keys]
    return out


def fused_instances(runner) -> list:
    """The runner's fused step and BLOCK_INSTANCES - 1 more made alike (CUDA graphs: each block replays its own
    capture); the runner's step alone where it runs the reference path or without graphs."""
    if runner.decode is None or not runner.graphs:
        return [runner.decode]
    return [runner.decode] + [type(runner.decode)(runner) for _ in range(BLOCK_INSTANCES - 1)]


def instance_block(runner, step, pick, x: torch.Tensor, pos: int, k: int):
    """A function that proposes a block through `step`: the runner's own, or another instance captured in a graph
    of its own (under a pick of its own: graphs are kept by pick)."""
    if step is runner.decode:
        return lambda: runner.chain(pick, x, pos, k)
    own = lambda h: pick(h)
    runner.warm_chain(own, x.shape[1], k, decode=step)
    return lambda: runner.chain(own, x, pos, k)


def draft_step_breakdown(profile: Profile, prepared: tuple | None = None) -> dict:
    """Where one draft step (body + head, as the engine calls it) spends its time, dense and FlashHead (on a GPU
    also through the reference path): the profiler's kernels, grouped by kind (lib.bench.kernel_breakdown).
    Saved in step_breakdown.json. The fused kernels overlap (programmatic dependent launch): their summed
    times can exceed the step's; each kernel's exposed time (its share of the critical path) sums to the step's
    span. `prepared`: as for head_and_step_bench."""
    drafts, x, pos = prepared or step_drafts(profile)
    out = {f"draft_{name}": bench.breakdown(lambda d=d: d.head(d.runner.forward(x, pos)[:, -1]), x.device)
           for name, d in drafts.items()}
    merged = update_json(profile, "step_breakdown.json", out)
    return {k: merged[k] for k in out}                                       # the draft parts (the file may hold the target's)


def probe_point(head, h: torch.Tensor, b, dev) -> dict:
    """Latency of one FlashHead (a probe count, a kernel path) in its CUDA graph; which path really ran."""
    g = GraphedHead(head, b.cuda_graphs)
    ran = "triton" if getattr(head, "fused", None) is not None else "torch"
    return {"n_probes": head.n_probes, "kernel": ran, **bench.stats(bench.time_calls(lambda: g(h), b.warmup, b.iters, dev))}


def floors(dense, fh, bandwidth: float, positions: int) -> dict:
    """The least time (ms) each measured call can take at the measured bandwidth: the bytes it must read (a step's body:
    its layers' weights and the KV cache at the `positions` it attends to)."""
    W, weights, kv = fh.weight, bench.nbytes(dense.runner.layers), dense.runner.cache.bytes_at(positions)
    body, dense_head, flash_head = weights + kv, W.numel() * W.element_size(), fh.bytes_read
    ms = lambda nbytes: 1000 * nbytes / bandwidth
    return {"bandwidth_GBps": bandwidth / 1e9, "body_bytes": weights, "kv_cache_bytes": kv, "body_ms": ms(body),
            "dense_head_ms": ms(dense_head), "flash_head_ms": ms(flash_head(fh.n_probes)),
            "flash_head_ms_by_probes": {str(p): ms(flash_head(p)) for p in (1, 16, 256) if p <= fh.n_clusters},
            "dense_step_ms": ms(body + dense_head), "flash_step_ms": ms(body + flash_head(fh.n_probes))}


def interleaved_stats(fns: dict, b, dev) -> dict:
    raw = bench.interleaved(fns, b.warmup, b.iters, dev)
    out = {name: bench.stats(ms) for name, ms in raw.items()}
    out["speedup"] = out["dense"]["mean_ms"] / out["flash"]["mean_ms"]
    if "dense_reference" in out:                                             # the fused path against the reference
        out["speedup_reference"] = out["dense_reference"]["mean_ms"] / out["flash_reference"]["mean_ms"]
    out["raw_ms"] = raw
    return out


def target_calls(runner, prompt: list[int], lengths) -> dict:
    """The target's call of each length n after `prompt` (prefilled here): {str(n): fn}, each feeding the
    prompt's last n tokens at the prompt's end (a single-token step for n = 1, a verify call otherwise)."""
    runner.prefill(torch.tensor([prompt], device=runner.device))
    ids = {n: torch.tensor([prompt[-n:]], device=runner.device) for n in lengths}
    return {str(n): (lambda n=n: runner.greedy(ids[n], len(prompt))) for n in lengths}


def time_target_calls(profile: Profile, fns: dict, dev) -> dict[str, list[float]]:
    """The calls interleaved after a short warm-up, fewer than a draft step gets (a target call costs tens of
    them): a tenth of bench.iters (at least 10) after a quarter of bench.warmup (at least 2)."""
    b = profile.bench
    return bench.interleaved(fns, max(2, b.warmup // 4), max(10, b.iters // 10), dev)


def w4a16_tiles(projection) -> dict | None:
    """The Triton W4A16 kernel's launch parameters where a target projection runs it (an Int4Linear whose kernel is
    Triton's; only then is Triton imported)."""
    if getattr(projection, "kernel", None) != "triton":
        return None
    from ..models import w4a16
    return asdict(w4a16.DEFAULT_TILES)


def target_step_bench(profile: Profile, target_model=None) -> dict:
    """Target latency: one single-token step, and verify calls of each block length (graph replays); the single step
    is timed whether or not bench.verify_lengths lists 1."""
    b = profile.bench
    runner = engines.build_target(profile, target_model).runner
    dev = runner.device
    prompt = encoded_prompts(profile)[0][1]
    raw = time_target_calls(profile, target_calls(runner, prompt, sorted({1, *b.verify_lengths})), dev)
    verify = {n: bench.stats(ms) for n, ms in raw.items()}
    quant = getattr(runner.model.config, "quantization_config", None)
    key = "awq_ms" if quant else {"bfloat16": "bf16_ms", "float16": "fp16_ms", "float32": "fp32_ms"}[profile.dtype]
    down = runner.layers[0].mlp.down_proj
    result = {"device": bench.device_name(dev), "dtype": profile.dtype, key: verify["1"]["mean_ms"],
              "projection": type(down).__name__, "w4a16_kernel": getattr(down, "path", None),
              "compiled": profile.bench.compile_target, "batch_invariant_rows": runner.rows,
              "w4a16_tiles": w4a16_tiles(down), "layers": runner.layer_path,
              "single": verify["1"], "verify_ms": {n: v["mean_ms"] for n, v in verify.items()}, "verify": verify}
    save_json(profile, "target_step.json", result)
    if dev.type == "cuda":                                                   # where a single-token step goes
        x = torch.tensor([prompt[-1:]], device=dev)
        update_json(profile, "step_breakdown.json", {"target": bench.breakdown(lambda: runner.greedy(x, len(prompt)), dev)})
    return result


def exit_depth_study(profile: Profile, target_model=None):
    """One-checkpoint (early-exit) profiles: the table of lib.study.exit_depth.exit_depth_table at the depths
    notebook 02 tabulates (table_depths), on the profile's prompts, block length, token budget and stop tokens;
    saved in exit_depth.json. None where the profile has no early-exit draft (models.exit_layer)."""
    if not profile.models.exit_layer:
        return None
    model = target_model if target_model is not None else checkpoints.load_target(profile)
    depths = exit_depth.table_depths(model.config.num_hidden_layers)
    table = exit_depth.exit_depth_table(model, [ids for _, ids in encoded_prompts(profile)], k=profile.decode.k,
                                        max_new=profile.decode.max_new_tokens, depths=depths, stop=stop_tokens(profile))
    save_json(profile, "exit_depth.json", {"depths": table.reset_index().to_dict("records")})
    return table
