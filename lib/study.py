"""The study's steps, one function per notebook section; notebooks call these and show the results."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch

from . import (bench, checkpoints, clustering as cl, engines, exit_depth, flash_checkpoint, modes, preflight,
               prompts as prompt_lib, runs)
from .config import SIDE_STUDIES, Profile, load_profile
from .heads import DenseHead, GraphedHead
from .runner import Runner
from .progress import note, steps
from .runs import read_json, save_json, update_json  # noqa: F401 - notebook steps


def setup(profile_name: str, analysis_only: bool = False) -> Profile:
    """Load and validate the profile, check this machine can run it (analysis_only: reading result files
    needs no GPU), seed everything, make its output directory."""
    profile = load_profile(profile_name)
    if not analysis_only:
        preflight.check(profile)
    if profile.target_device == profile.draft_device == "cpu":
        torch.set_num_threads(1)                  # small decoders: one intra-op thread beats two contending ones
    random.seed(profile.seed)
    np.random.seed(profile.seed)
    torch.manual_seed(profile.seed)
    profile.out_dir.mkdir(parents=True, exist_ok=True)
    return profile


def prompt_set(profile: Profile) -> list[prompt_lib.Prompt]:
    p = profile.prompts
    path, _ = prompt_lib.profile_prompt_file(p.file)
    return prompt_lib.select(prompt_lib.load_questions(path), p.per_group, limit=p.limit)


def encoded_prompts(profile: Profile, tokenizer=None) -> list[tuple[prompt_lib.Prompt, list[int]]]:
    """The profile's prompts with their token ids (the draft's tokenizer unless one is given)."""
    tokenizer = tokenizer or checkpoints.load_tokenizer(profile)
    ps = prompt_set(profile)
    ids = prompt_lib.encode(ps, tokenizer, profile.decode.max_prompt_tokens, profile.prompts.chat_template)
    return list(zip(ps, ids))


def side_prompts(profile: Profile) -> list[tuple[prompt_lib.Prompt, list[int]]]:
    """The prompts of the side studies (peers, sampling, adaptive): the first prompts.side_prompts (0: all)."""
    return encoded_prompts(profile)[:profile.prompts.side_prompts or None]


def side_studies(profile: Profile, names: str = "") -> list[str]:
    """Notebook 03's side studies: the profile's, or instead the comma-separated `names` (its parameter)."""
    chosen = [n.strip() for n in names.split(",") if n.strip()] if names else list(profile.side_studies)
    unknown = sorted(set(chosen) - set(SIDE_STUDIES))
    if unknown:
        raise ValueError(f"side_studies: unknown {unknown}; known: {list(SIDE_STUDIES)}")
    return chosen


@torch.no_grad()
def hidden_states(model, seqs: list[list[int]], n_layers: int | None = None, skip: list[int] | None = None):
    """Final normed hidden states (sum of kept positions, d) of the model (its first n_layers: an early-exit
    draft) at every position of each sequence, after its first skip[i] positions."""
    runner = Runner(model, max(len(p) for p in seqs), n_layers=n_layers)
    dev, skip = runner.device, skip or [0] * len(seqs)
    return torch.cat([runner.forward(torch.tensor([p], device=dev), 0, graph=False)[0, s:] for p, s in zip(seqs, skip)])


def greedy_trajectories(profile: Profile, model, enc: list) -> tuple[list[list[int]], list[int]]:
    """Each prompt followed by the model's own greedy continuation (the positions a draft is asked about),
    and where each continuation starts (the last prompt position predicts its first token)."""
    stop, n = stop_tokens(profile), profile.decode.max_new_tokens
    seqs = [ids + exit_depth.greedy_trajectory(model, ids, n, stop)[:-1] for _, ids in enc]
    return seqs, [len(ids) - 1 for _, ids in enc]


def containment_sweep(H: torch.Tensor, W: torch.Tensor, cents: torch.Tensor, assign: torch.Tensor, c) -> list[dict]:
    """Top-1 and top-k containment of the dense head's choice in FlashHead's probed clusters, per probe count."""
    return [{"n_probes": p, "top1": cl.containment(H, W, cents, assign, p, 1),
             f"top{c.top_k}": cl.containment(H, W, cents, assign, p, c.top_k)} for p in c.probe_sweep]


# ---------------------------------------------------------------- notebook 01: re-clustering

def recluster(profile: Profile, progress: bool = True) -> dict:
    """Equal-size and unconstrained spherical k-means of the draft's output embeddings; writes the
    FlashHead checkpoint for synthetic profiles. Returns the numbers notebook 01 shows."""
    c = profile.clustering
    draft = checkpoints.load_draft(profile)
    tok = checkpoints.load_tokenizer(profile)
    W = draft.get_output_embeddings().weight.detach()
    x = W.float()
    assign, cents, seconds = equal_size_clusters(profile, x, progress)
    with bench.all_cores(x.device):
        assign_u = cl.spherical_kmeans(x, c.n_clusters, c.iterations, profile.seed, False, progress=progress)
        clustered_on = bench.device_name(x.device)
    sizes = torch.bincount(assign, minlength=c.n_clusters)
    enc = encoded_prompts(profile, tok)
    depth = profile.models.exit_layer                                        # early-exit drafts: their own depth
    H = hidden_states(draft, [ids for _, ids in enc], depth).to(W.dtype)
    seqs, starts = greedy_trajectories(profile, draft, enc)
    H_traj = hidden_states(draft, seqs, depth, starts).to(W.dtype)
    result = {
        "n_tokens": int(W.shape[0]), "hidden_size": int(W.shape[1]), "n_clusters": c.n_clusters,
        "cluster_size": int(W.shape[0] // c.n_clusters), "equal_sizes": bool((sizes == sizes[0]).all()),
        "min_size": int(sizes.min()), "max_size": int(sizes.max()),
        "every_token_once": bool(assign.numel() == W.shape[0] and assign.min() >= 0),
        "seconds": seconds, "device": clustered_on,
        "mean_cosine": cl.objective(x, assign, c.n_clusters),
        "mean_cosine_unconstrained": cl.objective(x, assign_u, c.n_clusters),
        "unconstrained_size_range": [int(s) for s in torch.bincount(assign_u, minlength=c.n_clusters).aminmax()],
        "n_probes": c.n_probes, "n_hidden_states": int(H.shape[0]), "draft_depth": depth,
        "top1_containment": cl.containment(H, W, cents, assign, c.n_probes, 1),
        f"top{c.top_k}_containment": cl.containment(H, W, cents, assign, c.n_probes, c.top_k),
        "probe_sweep": containment_sweep(H, W, cents, assign, c),
        "n_trajectory_states": int(H_traj.shape[0]),
        "trajectory_probe_sweep": containment_sweep(H_traj, W, cents, assign, c),
    }
    if c.compare_shipped:
        result["shipped"] = compare_shipped(profile, x, H, W, assign, cents)
    if profile.models.source != "pretrained":                                # we made the clustering: write it
        write_flash_checkpoint(profile, tok, assign, cents)
    save_json(profile, "clustering.json", result)
    return result


def equal_size_clusters(profile: Profile, x: torch.Tensor, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Equal-size spherical k-means of the embeddings x (V,d), fp32: (assignments, unit centroids, seconds of k-means)."""
    c = profile.clustering
    bench.sync(x.device)
    t = time.perf_counter()
    with bench.all_cores(x.device):
        assign = cl.spherical_kmeans(x, c.n_clusters, c.iterations, profile.seed, True, c.candidates, progress)
    bench.sync(x.device)
    seconds = time.perf_counter() - t
    return assign, cl.centroids_of(cl.unit(x), assign, c.n_clusters), seconds


def write_flash_checkpoint(profile: Profile, tok, assign: torch.Tensor, cents: torch.Tensor) -> Path:
    return flash_checkpoint.save_flash_checkpoint(checkpoints.model_path(profile, "draft"), profile.flash_dir, cents,
                                                  assign, profile.clustering.n_probes,
                                                  flash_checkpoint.special_token_ids(tok))


def compare_shipped(profile: Profile, x: torch.Tensor, H: torch.Tensor, W: torch.Tensor, assign: torch.Tensor,
                    cents: torch.Tensor) -> dict:
    """Our re-clustering against the FlashHead checkpoint's own: objectives, agreement, containment."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
    c = profile.clustering
    _, shipped_cents, shipped = flash_checkpoint.read_flash_checkpoint(profile.flash_dir, W.shape[1], W.shape[0])
    shipped = shipped.to(W.device)
    ours, theirs = assign.cpu().numpy(), shipped.cpu().numpy()
    n = shipped_cents.shape[0]
    return {"n_clusters": int(n), "mean_cosine_shipped": cl.objective(x, shipped, n),
            "mean_cosine_ours": cl.objective(x, assign, c.n_clusters),
            "adjusted_rand_index": float(adjusted_rand_score(theirs, ours)),
            "nmi": float(normalized_mutual_info_score(theirs, ours)),
            "top1_containment_shipped": cl.containment(H, W, shipped_cents.to(W), shipped, c.n_probes, 1),
            "top1_containment_ours": cl.containment(H, W, cents, assign, c.n_probes, 1)}


def ensure_flash_checkpoint(profile: Profile) -> Path:
    """The FlashHead draft checkpoint, made by the same seeded equal-size clustering as notebook 01's if it is
    missing (a fresh machine, say); notebook 01's measurements (clustering.json) are neither redone nor rewritten."""
    if profile.models.source == "pretrained" or (profile.flash_dir / "config.json").exists():
        return profile.flash_dir
    draft = checkpoints.load_draft(profile)
    assign, cents, _ = equal_size_clusters(profile, draft.get_output_embeddings().weight.detach().float())
    return write_flash_checkpoint(profile, checkpoints.load_tokenizer(profile), assign, cents)


# ---------------------------------------------------------------- notebook 02: microbenchmarks

def head_and_step_bench(profile: Profile) -> dict:
    """Thesis 4.1-4.4: single-step head latency (same hidden state) and complete draft decode step,
    dense vs FlashHead, plus head latency against the probe count. Alternating order, warm-up first."""
    b = profile.bench
    ensure_flash_checkpoint(profile)
    drafts = engines.build_drafts(profile, ("dense", "flash"))
    dense, flash = drafts["dense"], drafts["flash"]
    dev = dense.runner.device
    prompt = encoded_prompts(profile)[0][1]
    for d in (dense, flash):
        d.runner.prefill(torch.tensor([prompt], device=dev))
    pos = len(prompt)
    x = torch.tensor([[prompt[-1]]], device=dev)
    h = flash.runner.forward(x, pos)[:, -1].clone()                                # the same hidden state
    heads = interleaved_stats({"dense": lambda: dense.head(h), "flash": lambda: flash.head(h)}, b, dev)
    step = interleaved_stats({"dense": lambda: dense.head(dense.runner.forward(x, pos)[:, -1]),
                              "flash": lambda: flash.head(flash.runner.forward(x, pos)[:, -1])}, b, dev)
    fh = flash.head.head
    kernels = ("torch", "triton") if dev.type == "cuda" else (b.head_kernel,)
    sweep = [probe_point(fh.with_probes(p, k), h, b, dev) for k in kernels for p in profile.clustering.probe_sweep]
    result = {"device": bench.device_name(dev), "n_probes": fh.n_probes, "head": heads, "model_step": step,
              "probe_sweep": sweep}
    if dev.type == "cuda":                                                   # hardware floors and both head paths
        result["floors"] = floors(dense, fh, bench.copy_bandwidth(dev))
        result["dense_paths"] = {k: bench.stats(bench.time_calls(
            lambda g=GraphedHead(DenseHead(dense.head.head.weight, k), True): g(h), b.warmup, b.iters, dev))
            for k in kernels}
    save_json(profile, "microbench.json", result)
    return result


def draft_step_breakdown(profile: Profile) -> dict:
    """Where one draft step (body + head, as the engine calls it) spends its time, dense and FlashHead:
    the profiler's kernels, grouped by kind (lib.bench.kernel_breakdown). Saved in step_breakdown.json."""
    drafts = engines.build_drafts(profile, ("dense", "flash"))
    dev = drafts["dense"].runner.device
    prompt = encoded_prompts(profile)[0][1]
    x, pos = torch.tensor([[prompt[-1]]], device=dev), len(prompt)
    out = {}
    for name, d in drafts.items():
        d.runner.prefill(torch.tensor([prompt], device=dev))
        out[f"draft_{name}"] = bench.breakdown(lambda d=d: d.head(d.runner.forward(x, pos)[:, -1]), dev)
    merged = update_json(profile, "step_breakdown.json", out)
    return {k: merged[k] for k in out}                                       # the draft parts (the file may hold the target's)


def probe_point(head, h: torch.Tensor, b, dev) -> dict:
    """Latency of one FlashHead (a probe count, a kernel path) in its CUDA graph; which path really ran."""
    g = GraphedHead(head, b.cuda_graphs)
    ran = "triton" if getattr(head, "fused", None) is not None else "torch"
    return {"n_probes": head.n_probes, "kernel": ran, **bench.stats(bench.time_calls(lambda: g(h), b.warmup, b.iters, dev))}


def floors(dense, fh, bandwidth: float) -> dict:
    """The least time (ms) each measured call can take at the measured bandwidth: the bytes it must read."""
    W = fh.weight
    size = W.element_size()
    body = sum(p.numel() * p.element_size() for layer in dense.runner.layers for p in layer.parameters())
    dense_head = W.numel() * size
    flash_head = lambda p: (fh.centroids.numel() + p * fh.c2t.shape[1] * W.shape[1]) * size
    ms = lambda nbytes: 1000 * nbytes / bandwidth
    return {"bandwidth_GBps": bandwidth / 1e9, "dense_head_ms": ms(dense_head), "flash_head_ms": ms(flash_head(fh.n_probes)),
            "flash_head_ms_by_probes": {str(p): ms(flash_head(p)) for p in (1, 16, 256) if p <= fh.n_clusters},
            "dense_step_ms": ms(body + dense_head), "flash_step_ms": ms(body + flash_head(fh.n_probes))}


def interleaved_stats(fns: dict, b, dev) -> dict:
    raw = bench.interleaved(fns, b.warmup, b.iters, dev)
    out = {name: bench.stats(ms) for name, ms in raw.items()}
    out["speedup"] = out["dense"]["mean_ms"] / out["flash"]["mean_ms"]
    out["raw_ms"] = raw
    return out


def target_step_bench(profile: Profile, target_model=None) -> dict:
    """Target latency: one single-token step, and verify calls of each block length (graph replays)."""
    b = profile.bench
    runner = engines.build_target(profile, target_model).runner
    dev = runner.device
    prompt = encoded_prompts(profile)[0][1]
    runner.prefill(torch.tensor([prompt], device=dev))
    pos = len(prompt)
    ids = {n: torch.tensor([prompt[-n:]], device=dev) for n in b.verify_lengths}
    fns = {str(n): (lambda n=n: runner.greedy(ids[n], pos)) for n in b.verify_lengths}
    iters = max(10, b.iters // 10)
    raw = bench.interleaved(fns, max(2, b.warmup // 4), iters, dev)
    verify = {n: bench.stats(ms) for n, ms in raw.items()}
    quant = getattr(runner.model.config, "quantization_config", None)
    key = "awq_ms" if quant else {"bfloat16": "bf16_ms", "float16": "fp16_ms", "float32": "fp32_ms"}[profile.dtype]
    result = {"device": bench.device_name(dev), "dtype": profile.dtype, key: verify["1"]["mean_ms"],
              "projection": type(runner.layers[0].mlp.down_proj).__name__, "compiled": profile.bench.compile_target,
              "single": verify["1"], "verify_ms": {n: v["mean_ms"] for n, v in verify.items()}, "verify": verify}
    save_json(profile, "target_step.json", result)
    if dev.type == "cuda":                                                   # where a single-token step goes
        x = torch.tensor([prompt[-1:]], device=dev)
        update_json(profile, "step_breakdown.json", {"target": bench.breakdown(lambda: runner.greedy(x, pos), dev)})
    return result


# ---------------------------------------------------------------- notebook 03: end-to-end runs

def device_info(profile: Profile) -> dict:
    return {"target": bench.device_name(profile.target_device), "draft": bench.device_name(profile.draft_device),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def stop_tokens(profile: Profile, tokenizer=None) -> frozenset:
    """The end-of-sequence token ids generation stops at (none unless decode.stop_at_eos)."""
    if not profile.decode.stop_at_eos:
        return frozenset()
    tok = tokenizer or checkpoints.load_tokenizer(profile)
    ids = tok.eos_token_id
    return frozenset(ids if isinstance(ids, list) else [ids]) - {None}


def run_speculative(profile: Profile, launcher: str = "local", target_model=None, fresh: bool = False,
                    reuse: str = "") -> Path:
    """Notebook 03's sample set (prompts x iterations x modes), raw JSONL beside the configuration, here
    (local) or sharded by prompt over a Slurm array (slurm; submitit-local runs the shards as local
    processes). Resumes the latest unfinished run of the same configuration unless fresh; finishes it.
    reuse: the name of a finished run of the same configuration to take as it is (nothing is measured)."""
    if launcher not in ("local", "slurm", "submitit-local"):
        raise ValueError(f"unknown launcher {launcher!r}: use local, slurm or submitit-local")
    enc = encoded_prompts(profile)
    qids = [p.question_id for p, _ in enc]
    if reuse:
        return runs.reused_run(profile.out_dir, reuse, runs.run_config(profile, qids, device_info(profile)))
    run, resumed = runs.start_or_resume(profile, runs.run_config(profile, qids, device_info(profile)), fresh)
    done = len(runs.read_records(run))
    state = ("reusing finished" if runs.finished(run) else "resuming") if resumed else "new"
    note(f"{state} run {run.name}" + (f" ({done} samples already recorded)" if resumed else ""))
    if launcher == "local":
        run_shard(profile, run, (0, 1), target_model)
    else:
        runs.launch_slurm(profile, run, qids, run_shard, {"slurm": "slurm", "submitit-local": "local"}[launcher])
    if not runs.finished(run):
        runs.finish_run(run)
    return run


def run_shard(profile: Profile, run: Path, shard: tuple[int, int] = (0, 1), target_model=None) -> None:
    """The pending samples of one shard (every n-th prompt from i) of a run (a Slurm array task's work)."""
    enc = encoded_prompts(profile)
    keys = runs.pending_keys(profile, run, [p.question_id for p, _ in enc], shard)
    if not keys:
        return
    ensure_flash_checkpoint(profile)
    target, drafts = engines.build_engines(profile, target_model=target_model)
    runs.record_kernels(run, engines.kernels(target, drafts))              # which head kernels the samples use
    runs.run_samples(profile, run, target, drafts, enc, keys, stop_tokens(profile), shard,
                     costs=call_costs(profile) if modes.COST in profile.decode.k_policies else None)


def call_costs(profile: Profile, drafts=None) -> dict:
    """Per-draft call costs for the cost-model block policy, from notebooks 02-03's measurements, for `drafts`
    (default: the profile's)."""
    from . import costmodel
    micro, steps = read_json(profile, "microbench.json"), read_json(profile, "target_step.json")
    return {d: costmodel.call_costs(micro, steps, d) for d in (drafts or profile.decode.modes) if d != modes.BASELINE}


def decoded_samples(profile: Profile, records: list[dict], n: int = 3):
    """The text of the first n prompts' outputs, baseline beside every speculative mode (first iteration)."""
    import pandas as pd
    tok = checkpoints.load_tokenizer(profile)
    qids = list(dict.fromkeys(r["question_id"] for r in records))[:n]
    rows = [{"question_id": r["question_id"], "mode": r["mode"], "exact_match": r.get("exact_match"),
             "text": tok.decode(r["tokens"])} for r in records if r["question_id"] in qids and r["iteration"] == 0]
    return pd.DataFrame(rows).sort_values(["question_id", "mode"], key=lambda c: c.map(str)).reset_index(drop=True)


@torch.no_grad()
def divergences(profile: Profile, records: list[dict], target_model) -> list[dict]:
    """For every sample whose output differs from the baseline's: the first divergent position and the
    target's top-1 minus top-2 logit gap there, with the shared prefix fed one token at a time (as the
    baseline feeds it) and in one batch (as a verify call does). A near-tie of low-precision arithmetic
    shows as a gap of a few ulps of the logits; a defect as a large gap. Written to divergences.json.
    Modes that leave the baseline at the same point share one measurement of its gaps."""
    enc = {p.question_id: ids for p, ids in encoded_prompts(profile)}
    base = {(r["iteration"], r["question_id"]): r["tokens"] for r in records if r["draft"] == modes.BASELINE}
    runner = Runner(target_model, engines.cache_len(profile))
    W = target_model.get_output_embeddings().weight
    measured: dict[tuple, dict] = {}                                    # (iteration, question, position) -> gaps
    out = []
    for r in steps(records, "divergences", "samples"):
        ref = base.get((r["iteration"], r["question_id"]))
        if r.get("exact_match", True) or ref is None:
            continue
        j = next(i for i, (a, b) in enumerate(zip(r["tokens"] + [-1], ref + [-1])) if a != b)
        point = (r["iteration"], r["question_id"], j)
        if point not in measured:
            measured[point] = logit_gaps(runner, W, enc[r["question_id"]], ref[:j])
        out.append({"mode": r["mode"], "question_id": r["question_id"], "iteration": r["iteration"], "position": j,
                    "baseline_token": ref[j] if j < len(ref) else None,
                    "mode_token": r["tokens"][j] if j < len(r["tokens"]) else None, **measured[point]})
    save_json(profile, "divergences.json", {"dtype": profile.dtype, "divergences": out})
    return out


def logit_gaps(runner: Runner, W: torch.Tensor, prompt: list[int], shared: list[int]) -> dict:
    """The target's top-1 minus top-2 logit after prompt + shared, fed stepwise and in one batch."""
    ids, dev = prompt + shared, W.device
    h_batch = runner.forward(torch.tensor([ids], device=dev), 0, graph=False)[0, -1]
    h_step = runner.forward(torch.tensor([prompt], device=dev), 0, graph=False)[0, -1]
    for pos in range(len(prompt), len(ids)):                            # one token at a time
        h_step = runner.forward(torch.tensor([[ids[pos]]], device=dev), pos, graph=False)[0, -1]
    gaps = {}
    for name, h in (("stepwise", h_step), ("batched", h_batch)):
        top = (h @ W.T).float().topk(2).values
        gaps[f"gap_{name}"] = float(top[0] - top[1])
    return gaps


# ---------------------------------------------------------------- peers in the same harness

def peer_study(profile: Profile, target_model=None) -> dict:
    """Hugging Face generate() (greedy, static cache, assisted with the dense draft, prompt lookup) beside this
    engine's baseline on the same prompts, device, token budget and stop tokens (lib/peers.py): peers.json."""
    from . import peers
    data = peers.run(profile, side_prompts(profile), stop_tokens(profile), target_model)
    save_json(profile, "peers.json", data)
    return data


# ---------------------------------------------------------------- speculative sampling (lib/sampling.py)

def sampling_study(profile: Profile, target_model=None) -> dict:
    """Target-only sampling and speculative sampling with each draft and schedule of the profile, at each of
    sampling.temperatures (lib/sampling_study.py); saves sampling.json and returns it."""
    from . import sampling_study as ss
    ensure_flash_checkpoint(profile)
    target, drafts = engines.build_engines(profile, target_model=target_model)
    # Sampling verifies through the target's hidden states: capture those call lengths now too (on h100 one
    # length first met inside a timed sample had cost it 3.7 s, in the run at 6a4ba48).
    target.runner.warm("hidden", range(1, profile.decode.k + 2))
    samples = ss.run(profile, target, drafts, side_prompts(profile), stop_tokens(profile))
    data = ss.result(profile, samples, device_info(profile))
    save_json(profile, "sampling.json", data)
    return data
