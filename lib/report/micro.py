"""Notebook 02's tables of microbench.json and step_breakdown.json beyond the thesis's (those: thesis.py
micro_tables): each measured call against its hardware floor, a draft step's kernels by kind, the batched heads;
notebook 01's cluster-size study (cluster_sizes.json); and FlashHead's memory beside the dense head's (notebook 04)."""
from __future__ import annotations

import pandas as pd

from .. import modes
from ..config import DTYPE_BYTES


def floor_table(micro: dict) -> pd.DataFrame:
    """Mean, p50 and p95 of each measured call (heads and draft steps on the profile's path, both dense head
    paths, FlashHead at the probe counts with a floor) beside its floor, the least time the bytes it must read
    take at the measured copy bandwidth (microbench.json's `floors`, GPU profiles), and their ratio."""
    f = micro["floors"]
    rows = {"dense head (profile path)": (micro["head"]["dense"], f["dense_head_ms"]),
            "FlashHead (profile path)": (micro["head"]["flash"], f["flash_head_ms"]),
            "dense draft step": (micro["model_step"]["dense"], f["dense_step_ms"]),
            "Flash draft step": (micro["model_step"]["flash"], f["flash_step_ms"])}
    if "dense_reference" in micro["model_step"]:
        rows.update({"dense draft step, reference path": (micro["model_step"]["dense_reference"], f["dense_step_ms"]),
                     "Flash draft step, reference path": (micro["model_step"]["flash_reference"], f["flash_step_ms"])})
    rows.update({f"dense head, {k}": (v, f["dense_head_ms"]) for k, v in micro["dense_paths"].items()})
    by_probes = f["flash_head_ms_by_probes"]
    rows.update({f"FlashHead p={r['n_probes']}, {r['kernel']}": (r, by_probes[str(r["n_probes"])])
                 for r in micro["probe_sweep"] if str(r["n_probes"]) in by_probes})
    return pd.DataFrame({k: {"mean ms": s["mean_ms"], "p50 ms": s["p50_ms"], "p95 ms": s["p95_ms"], "floor ms": fl,
                             "mean / floor": s["mean_ms"] / fl, "% of bandwidth": 100 * fl / s["mean_ms"]}
                         for k, (s, fl) in rows.items()}).T


def draft_step_table(micro: dict) -> pd.DataFrame:
    """Per draft head (GPU profiles): the step on the fused path and on the reference path, the bytes it must read
    (MB), the bandwidth it achieves, its floor and share of the bandwidth, the head's time and share of the step,
    and a round's proposal block (one graph replay) per token beside k single steps per token, with what the head
    adds to the block per token (the block against the body's alone, where measured), the block fed two tokens (as
    deferred rounds launch it ahead, where measured) and, where the block was timed
    through several instances of the fused step, the fastest and slowest instance's p50; with the FlashHead-over-dense
    step speedup on each path. Means and medians (p50: the step's mean can carry a few slow replays)."""
    step, f, heads, blk = micro["model_step"], micro["floors"], micro["head"], micro.get("block", {})
    out = {}
    for name, label in (("dense", "dense"), ("flash", "FlashHead")):
        fl = f[f"{name}_step_ms"]
        ms = step[name]["mean_ms"]
        mb_read = fl * f["bandwidth_GBps"]                                  # ms x GB/s = MB
        out[label] = {"step ms (fused)": ms, "step p50 ms (fused)": step[name]["p50_ms"],
                      "step ms (reference)": step[f"{name}_reference"]["mean_ms"],
                      "MB read": mb_read, "achieved GB/s": mb_read / ms,
                      "floor ms": fl, "% of bandwidth": 100 * fl / ms, "head ms": heads[name]["mean_ms"],
                      "head share of step": heads[name]["mean_ms"] / ms}
        if name in blk:
            out[label].update({"block ms per token": blk[name]["mean_ms"] / blk["k"],
                               "block p50 ms per token": blk[name]["p50_ms"] / blk["k"],
                               "k steps ms per token": blk[f"{name}_steps"]["mean_ms"] / blk["k"]})
        if modes.fed_two(name) in blk:                                        # as deferred rounds launch it ahead
            out[label]["block fed two tokens, ms per token"] = blk[modes.fed_two(name)]["mean_ms"] / blk["k"]
        if f"{name}_instances" in blk:                                      # the block through each fused step
            p50s = [s["p50_ms"] / blk["k"] for s in blk[f"{name}_instances"]]
            out[label].update({"block p50 per token, fastest instance": min(p50s),
                               "block p50 per token, slowest instance": max(p50s)})
        if "body" in blk:
            added = (blk[name]["p50_ms"] - blk["body"]["p50_ms"]) / blk["k"]
            out[label].update({"head p50 ms per token in block": added,
                               "head share of block": added / (blk[name]["p50_ms"] / blk["k"])})
    tab = pd.DataFrame(out).T
    tab.loc["dense / FlashHead"] = tab.loc["dense"] / tab.loc["FlashHead"]
    return tab


def breakdown_table(breakdown: dict) -> pd.DataFrame:
    """Microseconds per step by kernel kind, one column per measured step (step_breakdown.json's parts, as
    lib.bench.breakdown gives them), with each step's total and its kernel launches. Where a part has them, a
    column `<part>, exposed` beside it: each kind's share of the critical path (overlapping kernels counted once)."""
    cols, totals = {}, {}
    for k, v in breakdown.items():
        cols[k], totals[k] = v["by_kind_us"], (v["total_us"], v["launches"])
        if "exposed_by_kind_us" in v:
            cols[f"{k}, exposed"], totals[f"{k}, exposed"] = v["exposed_by_kind_us"], (v["exposed_us"], v["launches"])
    kinds = pd.DataFrame(cols).fillna(0.0)
    kinds.loc["total (us)"] = [totals[k][0] for k in kinds.columns]
    kinds.loc["launches per step"] = [totals[k][1] for k in kinds.columns]
    return kinds


def int4_kernel_frame(int4: dict) -> pd.DataFrame:
    """int4_kernels.json in long form: one row per (projection, rows, kernel) with its p50/mean/p95 ms, GB/s of
    the bytes it reads, relative error against the fp32 dequantised product, and the shape's int4 floor."""
    recs = [{"projection": shape, "rows": int(m), "kernel": kernel, "floor ms": s["floor_ms"], **r}
            for shape, s in int4["shapes"].items() for m, row in s["rows"].items() for kernel, r in row.items()]
    return pd.DataFrame(recs).rename(columns={"p50_ms": "p50 ms", "mean_ms": "mean ms", "p95_ms": "p95 ms"})


def int4_kernel_table(int4: dict) -> pd.DataFrame:
    """Per projection and row count: each kernel's p50 ms, the int4 floor, this study's kernel's GB/s and share of
    the bandwidth, and its time over marlin's and the dense fp16 GEMM's; a `layer` row sums the four projections."""
    df = int4_kernel_frame(int4)
    tab = df.pivot_table(index=["projection", "rows"], columns="kernel", values="p50 ms", sort=False)
    floor = df.groupby(["projection", "rows"], sort=False)["floor ms"].first()
    layer = tab.groupby(level="rows").sum()
    tab = pd.concat([tab, pd.concat({"layer (sum)": layer})])
    tab["floor ms"] = pd.concat([floor, pd.concat({"layer (sum)": floor.groupby(level="rows").sum()})])
    for ours in ("w4a16_mma", "w4a16"):                 # this study's kernels: the CUDA one where it ran
        if ours in tab:
            tab[f"{ours} % of bandwidth"] = 100 * tab["floor ms"] / tab[ours]
            for other in ("marlin", "dense_fp16"):
                if other in tab:
                    tab[f"{ours} / {other}"] = tab[ours] / tab[other]
    return tab


def int4_invariance_table(int4: dict) -> pd.DataFrame:
    """Per kernel: of the (projection, row count) cells measured, on how many its rows were batch-invariant and
    position-invariant (lib.study.int4_kernels.invariance: what padded verify calls need), as "n of m"."""
    df = int4_kernel_frame(int4)
    out = {}
    for col in ("batch_invariant", "position_invariant"):
        if col in df:
            seen = df.dropna(subset=[col]).groupby("kernel", sort=False)[col]
            out[col.replace("_", "-")] = seen.sum().astype(int).astype(str) + " of " + seen.size().astype(str)
    return pd.DataFrame(out)


def head_batch_table(batches: dict) -> pd.DataFrame:
    """head_batches.json by batch size: the share of FlashHead's clusters a batch's rows probe together (mean over
    random batches, its 5-95 % range, and the share independent uniform probes would give), both heads' batched
    times (mean, p50), FlashHead's speedup, and the bytes ratio that bounds it where both heads read at the same
    bandwidth; on a GPU each head's floor (its bytes at the measured copy bandwidth). Empty where every batch size
    was skipped (more than the states)."""
    if not batches["rows"]:
        return pd.DataFrame(index=pd.Index([], name="batch"))
    return pd.DataFrame([{"batch": r["batch"], "union share": r["union_share"],
                          "union share p5-p95": f"{r['union_share_p5']:.3f}-{r['union_share_p95']:.3f}",
                          "uniform probes": r["uniform_share"], "dense mean ms": r["dense"]["mean_ms"],
                          "dense p50 ms": r["dense"]["p50_ms"], "FlashHead mean ms": r["flash"]["mean_ms"],
                          "FlashHead p50 ms": r["flash"]["p50_ms"], "speedup": r["speedup"],
                          "bytes dense / FlashHead": r["bytes_ratio"],
                          **({"dense floor ms": r["dense_floor_ms"], "FlashHead floor ms": r["flash_floor_ms"]}
                             if "dense_floor_ms" in r else {})} for r in batches["rows"]]).set_index("batch")


def cluster_size_table(sizes: dict) -> pd.DataFrame:
    """cluster_sizes.json by (cluster size, probes): tokens scored, the share of the dense head's bytes read
    (centroids, probed clusters' rows, special tokens), how often FlashHead picks the dense head's token and the
    target's greedy token, and its time for one hidden state (mean, p50)."""
    return pd.DataFrame([{"cluster size": r["cluster_size"], "clusters": r["n_clusters"], "probes": r["n_probes"],
                          "tokens scored": r["scored_tokens"], "share of dense bytes": r["read_fraction"],
                          "= dense head": r["agree_dense"], "= target": r["agree_target"],
                          "mean ms": r["time"]["mean_ms"], "p50 ms": r["time"]["p50_ms"]}
                         for r in sizes["rows"]]).set_index(["cluster size", "probes"])


def least_read_table(sizes: dict) -> pd.DataFrame:
    """The least share of the dense head's bytes at which each cluster size meets each criterion of
    cluster_sizes.json's summary (containment levels; agreement with the target near the dense head's); blank
    where no setting of the sweep does."""
    t = pd.DataFrame(sizes["least_read"])
    return t.pivot(index="cluster_size", columns="criterion", values="read_fraction")[t.criterion.unique()].rename_axis(
        index="cluster size", columns="least share of dense bytes for")


def flash_extra_bytes(n_clusters: int, cluster_size: int, hidden: int, element_bytes: int, triton: bool = False,
                      n_special: int = 0) -> int:
    """Bytes a FlashHead holds beside the output embeddings it shares with the dense head (lib.engine.heads): its
    centroids (c, d) in the weights' dtype and its cluster-to-token table (c, b) of int64 ids; on the Triton path
    also that table with the special tokens' rows added (extended_c2t: one row of b ids for up to b special tokens,
    the memory table's count). Its special ids (8 bytes each) are left out."""
    table = n_clusters * cluster_size * 8
    special_rows = max(1, -(-n_special // cluster_size))
    extended = table + special_rows * cluster_size * 8 if triton else 0
    return n_clusters * hidden * element_bytes + table + extended


def head_memory_table(clustering: dict, micro: dict, dtype: str) -> pd.DataFrame:
    """FlashHead's memory overhead (the thesis's future work, 5.3) in MB: the tensors each head path holds beside
    the output embeddings both heads read, from notebook 01's clustering (V, d, c, b) and the weights' dtype; as a
    share of those embeddings and, where notebook 02 measured the body's bytes (GPU profiles), of the draft's
    weights (its body and its tied embeddings). Not counted: the Triton kernels' per-device scratch
    (lib.engine.kernels.scratch: 8.6 MB at the thesis's 9,496 clusters), which every FlashHead of a size shares."""
    c, b, d, v = (clustering[k] for k in ("n_clusters", "cluster_size", "hidden_size", "n_tokens"))
    size = DTYPE_BYTES[dtype]
    emb = v * d * size
    rows = {"embeddings (V x d), both heads": emb, "FlashHead centroids (c x d)": c * d * size,
            "FlashHead cluster table (c x b)": c * b * 8,
            "FlashHead's tensors, torch path": flash_extra_bytes(c, b, d, size),
            "FlashHead's tensors, Triton path": flash_extra_bytes(c, b, d, size, triton=True)}
    tab = pd.DataFrame({"MB": {k: n / 1e6 for k, n in rows.items()},
                        "share of the embeddings": {k: n / emb for k, n in rows.items()}})
    body = micro.get("floors", {}).get("body_bytes")
    if body:
        tab["share of the draft's weights"] = [n / (body + emb) for n in rows.values()]
    return tab
