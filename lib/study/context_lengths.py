"""Notebook 03's context study (the thesis's future work: longer generations). A round's calls timed at positions
far past the end-to-end run's: the draft's proposal block of K tokens, dense and FlashHead (one graph replay on a
GPU, as the engine proposes; K single steps elsewhere), and the target's calls of 1, K and K + 1 tokens, at each
position of bench.context_lengths. Each call reads its weights once whatever the position, but also the KV cache
up to it: at a long enough context the draft's step is mostly attention, and the head's share of it, which bounds
what FlashHead saves, shrinks. Beside each time: the bytes the call must read (weights, heads, the cache) and, on a
GPU, that many bytes at the measured copy bandwidth (the floor). The caches hold zeros (the arithmetic, not the
values, sets a call's time). Each position gets engines of its own, their caches sized as the engine sizes them
for a prompt that long, as a call's cost may follow its cache's length, not only the position (one H200, the h100
draft before its attention took at most 64 programs a query head: a K = 6 block at position 64 cost 0.79 ms a token
in a cache of 8,270 positions, 0.53 after, 0.49 in one of 334). Saved as context.json; notebook 04 turns it into PROJECTIONS with the end-to-end run's
acceptance (lib/costmodel.context_projection)."""
from __future__ import annotations

from dataclasses import replace

import torch

from .. import bench, modes
from ..config import Profile
from ..costmodel import round_call_lengths
from ..models import build
from ..models.flash_checkpoint import ensure_flash_checkpoint
from ..progress import steps
from ..results import save_json
from .common import device_info

DRAFTS = (modes.DENSE, modes.FLASH)


def context_study(profile: Profile, target_model) -> dict:
    """The calls at each position (see the module's doc); saves context.json and returns it."""
    ensure_flash_checkpoint(profile)
    rows, w, bw = [], None, None
    for n in steps(profile.bench.context_lengths, "context lengths", "positions"):
        target, drafts = engines_at(profile, target_model, n)
        if w is None:                                             # the same at every position: measured once
            w = weight_bytes(drafts, target)
            bw = {dev: bench.copy_bandwidth(dev) for dev in {drafts[modes.DENSE].runner.device, target.device}
                  if dev.type == "cuda"}
        rows.append({**context_row(profile, drafts, target, n), "cache_positions": target.max_len,
                     "draft_path": {name: d.runner.decode_path for name, d in drafts.items()}})   # checked at each
        add_bytes(rows[-1], drafts, target, w, profile.decode.k)
        add_floors(rows[-1], drafts[modes.DENSE].runner.device, target.device, bw)
        del target, drafts
    result = {"device": device_info(profile), "synthetic": profile.models.source == "synthetic",
              "k": profile.decode.k, "draft_path": rows[-1]["draft_path"] if rows else {}, "weight_bytes": w,
              "copy_GBps": {str(dev): v / 1e9 for dev, v in bw.items()}, "rows": rows}
    save_json(profile, "context.json", result)
    return result


def engines_at(profile: Profile, target_model, pos: int) -> tuple:
    """The target's runner and both drafts with caches sized as the engine sizes them for a prompt of `pos` tokens
    (a fused step's grid and an attention's splits follow the cache's length), their calls captured."""
    k = profile.decode.k
    at = replace(profile, decode=replace(profile.decode, max_prompt_tokens=pos))
    target = build.build_target(at, target_model).runner
    target.warm("greedy", sorted(round_call_lengths(k).values()))
    drafts = build.build_drafts(at, DRAFTS, target.clock, target_model)
    for d in drafts.values():
        if d.chained:
            for fed in (1, 2):                                    # a block fed one token, and one launched ahead
                d.runner.warm_chain(d.head.head, fed, k)
    return target, drafts


def context_row(profile: Profile, drafts: dict, target, pos: int) -> dict:
    """Both drafts' proposal blocks (interleaved) and the target's calls (interleaved) at position `pos`: stats in
    ms a call, and each draft's time a proposed token; `draft_fed_two`: the same for the block fed two tokens, as
    deferred rounds launch it ahead (chained drafts: a GPU)."""
    b, k = profile.bench, profile.decode.k
    x = torch.zeros((1, 1), dtype=torch.long, device=drafts[modes.DENSE].runner.device)
    blocks = {name: proposal_block(d, x, pos, k) for name, d in drafts.items()}
    blocks.update({modes.fed_two(name): proposal_block(d, x.repeat(1, 2), pos, k)
                   for name, d in drafts.items() if d.chained})
    raw = bench.interleaved(blocks, max(2, b.warmup // 4), max(10, b.iters // 4), x.device)
    stats = {name: bench.stats(ms) for name, ms in raw.items()}
    for s in stats.values():
        s["per_token_ms"] = s["mean_ms"] / k
    draft = {name: stats[name] for name in drafts}
    fed_two = {name: stats[modes.fed_two(name)] for name in drafts if modes.fed_two(name) in stats}
    ids = {name: torch.zeros((1, n), dtype=torch.long, device=target.device) for name, n in round_call_lengths(k).items()}
    calls = {name: (lambda i=i: target.greedy(i, pos)) for name, i in ids.items()}
    raw = bench.interleaved(calls, max(2, b.warmup // 4), max(10, b.iters // 10), target.device)
    return {"position": pos, "draft": draft, "draft_fed_two": fed_two,
            "target": {name: bench.stats(ms) for name, ms in raw.items()},
            "draft_step_ratio": draft[modes.DENSE]["mean_ms"] / draft[modes.FLASH]["mean_ms"]}


def proposal_block(d, x: torch.Tensor, pos: int, k: int):
    """A draft's k greedy proposals from `pos` as the engine makes them, fed the tokens x (1 or, launched ahead, 2):
    one graph replay where the draft chains its blocks (lib/engine/rounds.propose_block), else k steps of body and
    head fed one token (the tokens fed do not change the time)."""
    if d.chained:
        return lambda: d.runner.chain(d.head.head, x, pos, k)
    return lambda: [d.head(d.runner.forward(x, pos + i)[:, -1]) for i in range(k)]


def kv_bytes(runner, positions: int) -> int:
    """Bytes of the keys and values a call attending over `positions` reads from runner's cache (its layers)."""
    _, _, heads, _, hd = runner.cache.k.shape
    return 2 * len(runner.layers) * heads * hd * positions * runner.cache.k.element_size()


def weight_bytes(drafts: dict, target) -> dict:
    """Bytes a call reads whatever the position: the draft's body, each head (FlashHead: its centroids and its
    probes' token rows), the target's layers and head (parameters and buffers: packed int4 weights are buffers)."""
    W = drafts[modes.DENSE].head.head.weight
    return {"draft_body": bench.nbytes(drafts[modes.DENSE].runner.layers), "draft_dense_head": W.numel() * W.element_size(),
            "draft_flash_head": drafts[modes.FLASH].head.head.bytes_read(),
            "target": bench.nbytes([*target.layers, target.model.get_output_embeddings()])}


def add_bytes(r: dict, drafts: dict, target, w: dict, k: int) -> None:
    """Each call's bytes in row r: a draft's block reads its body, its head and the cache up to each of its k
    positions; a target call of n tokens its weights and the cache up to its last position."""
    p = r["position"]
    for name, d in drafts.items():
        r["draft"][name]["bytes"] = sum(w["draft_body"] + w[f"draft_{name}_head"] + kv_bytes(d.runner, p + i + 1)
                                        for i in range(k))
    for name, n in round_call_lengths(k).items():
        r["target"][name]["bytes"] = w["target"] + kv_bytes(target, p + n)


def add_floors(r: dict, draft_dev, target_dev, bw: dict) -> None:
    """On a GPU, each call's floor in row r: its bytes at its device's measured copy bandwidth (bw)."""
    for part, dev in (("draft", draft_dev), ("target", target_dev)):
        for s in r[part].values():
            if dev in bw:
                s["floor_ms"] = 1000 * s["bytes"] / bw[dev]
