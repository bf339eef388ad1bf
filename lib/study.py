"""The study's steps, one function per notebook section; notebooks call these and show the results."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from . import bench, clustering as cl, models, prompts as prompt_lib
from .config import ROOT, Profile, as_dict, load_profile
from .heads import DenseHead
from .speculative import Draft, Target, generate_baseline, generate_speculative

DRAFTS = ("dense", "flash", "dense_shared")


def setup(profile_name: str) -> Profile:
    """Load and validate the profile, seed everything, and make the output directory."""
    profile = load_profile(profile_name)
    random.seed(profile.seed)
    np.random.seed(profile.seed)
    torch.manual_seed(profile.seed)
    profile.out_dir.mkdir(parents=True, exist_ok=True)
    if profile.models.source == "pretrained":
        models.check_pretrained_available(profile)
    return profile


def save_json(profile: Profile, name: str, data: dict) -> Path:
    path = profile.out_dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=float))
    return path


def read_json(profile: Profile, name: str) -> dict:
    path = profile.out_dir / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the earlier notebooks for profile {profile.name!r} first")
    return json.loads(path.read_text())


def prompt_set(profile: Profile) -> list[prompt_lib.Prompt]:
    p = profile.prompts
    path = prompt_lib.BUILTIN if p.file == "builtin" else ROOT / Path(p.file).expanduser()   # absolute stays absolute
    return prompt_lib.select(prompt_lib.load_questions(path), p.per_group, limit=p.limit)


def encoded_prompts(profile: Profile, tokenizer=None) -> list[tuple[prompt_lib.Prompt, list[int]]]:
    """The profile's prompts with their token ids (the draft's tokenizer unless one is given)."""
    tokenizer = tokenizer or models.load_tokenizer(profile)
    ps = prompt_set(profile)
    return list(zip(ps, prompt_lib.encode(ps, tokenizer, profile.decode.max_prompt_tokens)))


@torch.no_grad()
def hidden_states(model, prompt_ids: list[list[int]]) -> torch.Tensor:
    """The model's final normed hidden states at every prompt position: (sum of lengths, d)."""
    runner = models.Runner(model, max(len(p) for p in prompt_ids))
    dev = runner.device
    return torch.cat([runner.forward(torch.tensor([p], device=dev), 0, graph=False)[0] for p in prompt_ids])


# ---------------------------------------------------------------- notebook 01: re-clustering

def recluster(profile: Profile, progress: bool = True) -> dict:
    """Equal-size and unconstrained spherical k-means of the draft's output embeddings; writes the
    FlashHead checkpoint for synthetic profiles. Returns the numbers notebook 01 shows."""
    c = profile.clustering
    draft = models.load_draft(profile)
    tok = models.load_tokenizer(profile)
    W = draft.get_output_embeddings().weight.detach()
    dev = W.device
    x = W.float()
    bench.sync(dev)
    t = time.perf_counter()
    assign = cl.spherical_kmeans(x, c.n_clusters, c.iterations, profile.seed, True, c.candidates, progress)
    bench.sync(dev)
    seconds = time.perf_counter() - t
    assign_u = cl.spherical_kmeans(x, c.n_clusters, c.iterations, profile.seed, False, progress=progress)
    cents = cl.centroids_of(cl.unit(x), assign, c.n_clusters)
    sizes = torch.bincount(assign, minlength=c.n_clusters)
    H = hidden_states(draft, [ids for _, ids in encoded_prompts(profile, tok)]).to(W.dtype)
    sweep = [{"n_probes": p, "top1": cl.containment(H, W, cents, assign, p, 1),
              f"top{c.top_k}": cl.containment(H, W, cents, assign, p, c.top_k)} for p in c.probe_sweep]
    result = {
        "n_tokens": int(W.shape[0]), "hidden_size": int(W.shape[1]), "n_clusters": c.n_clusters,
        "cluster_size": int(W.shape[0] // c.n_clusters), "equal_sizes": bool((sizes == sizes[0]).all()),
        "min_size": int(sizes.min()), "max_size": int(sizes.max()),
        "every_token_once": bool(assign.numel() == W.shape[0] and assign.min() >= 0),
        "seconds": seconds, "device": bench.device_name(dev),
        "mean_cosine": cl.objective(x, assign, c.n_clusters),
        "mean_cosine_unconstrained": cl.objective(x, assign_u, c.n_clusters),
        "unconstrained_size_range": [int(s) for s in torch.bincount(assign_u, minlength=c.n_clusters).aminmax()],
        "n_probes": c.n_probes, "n_hidden_states": int(H.shape[0]),
        "top1_containment": cl.containment(H, W, cents, assign, c.n_probes, 1),
        f"top{c.top_k}_containment": cl.containment(H, W, cents, assign, c.n_probes, c.top_k),
        "probe_sweep": sweep,
    }
    if c.compare_shipped:
        result["shipped"] = compare_shipped(profile, x, H, W, assign, cents)
    if profile.models.source == "synthetic":
        models.save_flash_checkpoint(models.model_path(profile, "draft"), profile.flash_dir, cents, assign,
                                     c.n_probes, models.special_token_ids(tok))
    save_json(profile, "clustering.json", result)
    return result


def compare_shipped(profile: Profile, x: torch.Tensor, H: torch.Tensor, W: torch.Tensor, assign: torch.Tensor,
                    cents: torch.Tensor) -> dict:
    """Our re-clustering against the FlashHead checkpoint's own: objectives, agreement, containment."""
    from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score
    c = profile.clustering
    _, shipped_cents, shipped = models.read_flash_checkpoint(profile.flash_dir, W.shape[1], W.shape[0])
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
    """The FlashHead draft checkpoint, made by re-clustering if an earlier notebook has not made it."""
    if profile.models.source == "synthetic" and not (profile.flash_dir / "config.json").exists():
        recluster(profile, progress=False)
    return profile.flash_dir


# ---------------------------------------------------------------- shared model set-up

def max_len(profile: Profile) -> int:
    d = profile.decode
    return d.max_prompt_tokens + d.max_new_tokens + d.k + 8


def load_drafts(profile: Profile, which=DRAFTS) -> dict[str, Draft]:
    """Draft engines: dense (dense checkpoint + dense head), flash (Flash checkpoint + FlashHead),
    dense_shared (Flash checkpoint body + its dense head)."""
    graphs = profile.bench.cuda_graphs
    out = {}
    if "dense" in which:
        m = models.load_draft(profile)
        out["dense"] = make_draft(m, DenseHead(m.get_output_embeddings().weight), profile, graphs)
    if {"flash", "dense_shared"} & set(which):
        ensure_flash_checkpoint(profile)
        m, fh = models.load_flash_draft(profile)
        runner = make_runner(m, profile, "draft")
        for name, head in (("flash", fh), ("dense_shared", DenseHead(m.get_output_embeddings().weight))):
            if name in which:
                out[name] = Draft(runner, graphed(head, m, graphs))
    return out


def graphed(head, model, graphs: bool) -> models.GraphedHead:
    W = model.get_output_embeddings().weight
    return models.GraphedHead(head, W.shape[1], W.device, W.dtype, graphs)


def make_draft(model, head, profile: Profile, graphs: bool) -> Draft:
    return Draft(make_runner(model, profile, "draft"), graphed(head, model, graphs))


def make_runner(model, profile: Profile, role: str) -> models.Runner:
    """The static-cache runner of the `role` ("draft" or "target") model, compiled where the profile says."""
    cuda = torch.device(getattr(profile, f"{role}_device")).type == "cuda"
    compile = cuda and getattr(profile.bench, f"compile_{role}")
    return models.Runner(model, max_len(profile), profile.bench.cuda_graphs, compile=compile)


# ---------------------------------------------------------------- notebook 02: microbenchmarks

def head_and_step_bench(profile: Profile) -> dict:
    """Thesis 4.1-4.4: single-step head latency (same hidden state) and complete draft decode step,
    dense vs FlashHead, plus head latency against the probe count. Alternating order, warm-up first."""
    b = profile.bench
    drafts = load_drafts(profile, ("dense", "flash"))
    dense, flash = drafts["dense"], drafts["flash"]
    dev = dense.runner.device
    prompt = encoded_prompts(profile)[0][1]
    for d in (dense, flash):
        d.runner.forward(torch.tensor([prompt], device=dev), 0, graph=False)
    pos = len(prompt)
    x = torch.tensor([[prompt[-1]]], device=dev)
    h = flash.runner.forward(x, pos)[:, -1].clone()                                # the same hidden state
    heads = interleaved_stats({"dense": lambda: dense.head(h), "flash": lambda: flash.head(h)}, b, dev)
    step = interleaved_stats({"dense": lambda: dense.head(dense.runner.forward(x, pos)[:, -1]),
                              "flash": lambda: flash.head(flash.runner.forward(x, pos)[:, -1])}, b, dev)
    fh = flash.head.head
    sweep = []
    for p in profile.clustering.probe_sweep:
        g = graphed(fh.with_probes(p), flash.runner.model, profile.bench.cuda_graphs)
        sweep.append({"n_probes": p, **bench.stats(bench.time_calls(lambda: g(h), b.warmup, b.iters, dev))})
    result = {"device": bench.device_name(dev), "n_probes": fh.n_probes, "head": heads, "model_step": step,
              "probe_sweep": sweep}
    save_json(profile, "microbench.json", result)
    return result


def interleaved_stats(fns: dict, b, dev) -> dict:
    raw = bench.interleaved(fns, b.warmup, b.iters, dev)
    out = {name: bench.stats(ms) for name, ms in raw.items()}
    out["speedup"] = out["dense"]["mean_ms"] / out["flash"]["mean_ms"]
    out["raw_ms"] = raw
    return out


def target_step_bench(profile: Profile, target=None) -> dict:
    """Target latency: one single-token step, and verify calls of each block length (graph replays)."""
    b = profile.bench
    target = target or models.load_target(profile)
    runner = make_runner(target, profile, "target")
    dev = runner.device
    prompt = encoded_prompts(profile)[0][1]
    runner.forward(torch.tensor([prompt], device=dev), 0, graph=False)
    pos = len(prompt)
    ids = {n: torch.tensor([prompt[-n:]], device=dev) for n in b.verify_lengths}
    fns = {str(n): (lambda n=n: runner.greedy(ids[n], pos)) for n in b.verify_lengths}
    iters = max(10, b.iters // 10)
    raw = bench.interleaved(fns, max(2, b.warmup // 4), iters, dev)
    verify = {n: bench.stats(ms) for n, ms in raw.items()}
    key = {"bfloat16": "bf16_ms", "float16": "fp16_ms", "float32": "fp32_ms"}[profile.dtype]
    result = {"device": bench.device_name(dev), "dtype": profile.dtype, key: verify["1"]["mean_ms"],
              "single": verify["1"], "verify_ms": {n: v["mean_ms"] for n, v in verify.items()}, "verify": verify}
    save_json(profile, "target_step.json", result)
    return result


# ---------------------------------------------------------------- notebook 03: end-to-end runs

def mode_list(profile: Profile) -> list[tuple[str, str | None]]:
    """(draft, schedule) pairs; the baseline has no draft."""
    d = profile.decode
    out = [("baseline", None)] if "baseline" in d.modes else []
    return out + [(m, s) for m in DRAFTS if m in d.modes for s in d.schedules]


def mode_name(draft: str, schedule: str | None) -> str:
    return draft if schedule is None else f"{draft}_{schedule}"


def sample_keys(profile: Profile, n_prompts: int) -> list[tuple[int, int, str, str | None]]:
    """(iteration, prompt index, draft, schedule) in run order; the mode order rotates per sample."""
    modes = mode_list(profile)
    keys = []
    for it in range(profile.bench.e2e_iters):
        for i in range(n_prompts):
            r = (it * n_prompts + i) % len(modes)
            keys += [(it, i, *m) for m in modes[r:] + modes[:r]]
    return keys


def run_one(target: Target, drafts: dict[str, Draft], profile: Profile, ids: list[int], draft: str,
            schedule: str | None):
    d = profile.decode
    if draft == "baseline":
        return generate_baseline(target, ids, d.max_new_tokens)
    return generate_speculative(target, drafts[draft], ids, d.max_new_tokens, d.k, schedule)


def record(res, prompt: prompt_lib.Prompt, ids: list[int], it: int, draft: str, schedule: str | None) -> dict:
    spans = res.spans_ms
    calls = sum(v for k, v in spans.items() if k.startswith("call_"))          # model and head calls
    return {
        "mode": mode_name(draft, schedule), "draft": draft, "schedule": schedule or "baseline",
        "question_id": prompt.question_id, "group": prompt.group, "iteration": it, "prompt_tokens": len(ids),
        "ttft_ms": res.ttft_ms, "decode_ms": res.decode_ms, "decode_tokens": res.decode_tokens,
        "rounds": res.rounds, "proposed": res.proposed, "accepted": res.accepted,
        "accepted_lengths": res.accepted_lengths, "verify_calls": res.verify_calls,
        "append_calls": res.append_calls, "skipped": res.skipped, "spans_ms": spans,
        "model_call_ms": calls, "tokens": res.tokens,
    }


def run_e2e(profile: Profile, run_dir: Path | None = None, shard: tuple[int, int] = (0, 1),
            progress: bool = True, target_model=None) -> Path:
    """Notebook 03's sample set (prompts x iterations x modes); raw JSONL beside the configuration.

    run_dir=None starts a new run directory; an existing unfinished one is resumed (finished samples
    are skipped). shard=(i, n) runs every n-th prompt starting at i (for Slurm arrays)."""
    enc = encoded_prompts(profile)
    run_dir = run_dir or start_run(profile, enc)
    keys = pending_keys(profile, run_dir, enc, shard)
    if not keys:
        return run_dir
    target_model = target_model or models.load_target(profile)
    target = Target(make_runner(target_model, profile, "target"))
    drafts = load_drafts(profile, [m for m, _ in mode_list(profile) if m != "baseline"])
    for draft, schedule in mode_list(profile):                                    # warm-up, not recorded
        for _ in range(profile.bench.e2e_warmup):
            run_one(target, drafts, profile, enc[0][1], draft, schedule)
    for it, i, draft, schedule in tqdm(keys, desc=f"e2e {profile.name}", disable=not progress):
        prompt, ids = enc[i]
        res = run_one(target, drafts, profile, ids, draft, schedule)
        bench.append_record(run_dir, record(res, prompt, ids, it, draft, schedule), shard=shard)
    return run_dir


def start_run(profile: Profile, enc: list) -> Path:
    return bench.new_run(profile.out_dir, {"profile": as_dict(profile), "device": device_info(profile),
                                           "prompts": [p.question_id for p, _ in enc]})


def pending_keys(profile: Profile, run_dir: Path, enc: list, shard: tuple[int, int] = (0, 1)) -> list:
    """Sample keys of this shard (every n-th prompt from i) that the run has no record of yet."""
    done = {(r["iteration"], r["question_id"], r["mode"]) for r in bench.read_records(run_dir)}
    return [k for k in sample_keys(profile, len(enc)) if k[1] % shard[1] == shard[0]
            and (k[0], enc[k[1]][0].question_id, mode_name(*k[2:])) not in done]


def finish_run(run_dir: Path) -> list[dict]:
    """Mark exact matches against the baseline's greedy output, then close the run."""
    recs = bench.read_records(run_dir)
    ref = {(r["iteration"], r["question_id"]): r["tokens"] for r in recs if r["mode"] == "baseline"}
    for r in recs:
        r["exact_match"] = r["tokens"] == ref.get((r["iteration"], r["question_id"]))
    bench.merge_records(run_dir, recs)
    bench.mark_finished(run_dir)
    return recs


def device_info(profile: Profile) -> dict:
    return {"target": bench.device_name(profile.target_device), "draft": bench.device_name(profile.draft_device),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def run_e2e_launch(profile: Profile, launcher: str = "local", target_model=None, run_dir: Path | None = None) -> Path:
    """Run notebook 03's sample set here (local), or sharded by prompt over a Slurm array through
    submitit (slurm; 'submitit-local' runs the same shards as local processes, for testing).
    Shards append to their own files in one run directory; a failed shard is reported with its log,
    and calling again with run_dir resumes: finished samples are skipped."""
    if launcher == "local":
        return run_e2e(profile, run_dir, target_model=target_model)
    if launcher not in ("slurm", "submitit-local"):
        raise ValueError(f"unknown launcher {launcher!r}: use local, slurm or submitit-local")
    import submitit
    enc = encoded_prompts(profile)
    run_dir = run_dir or start_run(profile, enc)
    c = profile.cluster
    n = min(c.shards, len(enc))
    shards = [(i, n) for i in range(n) if pending_keys(profile, run_dir, enc, (i, n))]
    cluster = {"slurm": "slurm", "submitit-local": "local"}[launcher]
    ex = submitit.AutoExecutor(folder=run_dir / "logs" / "%j", cluster=cluster)
    ex.update_parameters(timeout_min=c.timeout_min, gpus_per_node=c.gpus_per_task, slurm_array_parallelism=n,
                         **({"slurm_partition": c.partition} if c.partition and cluster == "slurm" else {}))
    jobs = ex.map_array(run_e2e, [profile] * len(shards), [run_dir] * len(shards), shards, [False] * len(shards))
    failed = []
    for shard, job in zip(shards, tqdm(jobs, desc="shards")):
        try:
            job.result()
        except Exception as e:                                                     # noqa: BLE001 - reported below
            lines = [ln.strip() for ln in str(e).splitlines() if "Error" in ln] or [repr(e)]
            failed.append(f"shard {shard[0]}/{n} (job {job.job_id}): {lines[-1]}; log: {job.paths.stderr}")
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(shards)} shards failed; finished samples are kept in {run_dir}. "
                           f"Resume with run_e2e_launch(profile, {launcher!r}, run_dir=Path({str(run_dir)!r})).\n"
                           + "\n".join(failed))
    return run_dir


def extra_summary(profile: Profile) -> dict:
    """Profile-specific additions to summary.json (GPU profiles add target-step timings)."""
    path = profile.out_dir / "target_step.json"
    return {"target_step": json.loads(path.read_text())} if path.exists() else {}
