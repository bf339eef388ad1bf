"""The adaptive-draft study (issue 14): adaptive probes against the fixed-probe sweep (top-1 containment along
greedy trajectories, and end-to-end), the bandit drafters against each of their arms run fixed (regret against
the best one, chosen afterwards), both adaptive block-length policies on the dense head and on FlashHead against
the same drafter at fixed K, and the adaptive block-length policies and adaptive drafts of the latest end-to-end
run against the best fixed setting. Writes adaptive.json; summary.json gets its `policies` rows."""
from __future__ import annotations

from collections import Counter

import torch

from ..engine import adaptive
from ..models import build as engines
from .. import modes, results
from . import common as study
from ..engine.blocks import FixedK, make_policy
from ..config import Profile
from ..models.flash_checkpoint import ensure_flash_checkpoint
from ..engine.heads import GraphedHead
from ..progress import note, steps
from ..engine.speculative import Draft, Request, generate_baseline, generate_speculative


def top1(cand: torch.Tensor, keep: torch.Tensor, best: torch.Tensor) -> float:
    """Share of states whose dense choice is among the candidates actually scored."""
    return float(((cand == best[:, None]) & keep).any(1).float().mean())


def probe_containment(profile: Profile, fh, H: torch.Tensor, best: torch.Tensor) -> dict:
    """Top-1 containment of fixed probe counts and of the adaptive rule at each threshold, with its mean p and
    the containment of the fixed probe count nearest that mean."""
    a = profile.clustering.adaptive
    p_max = a.p_max or fh.n_probes
    qs = sorted({*profile.clustering.probe_sweep, a.p_min, p_max, fh.n_probes})
    fixed_top1 = lambda q: top1(cand := fh.with_probes(q).candidates(H), torch.ones_like(cand, dtype=torch.bool), best)
    fixed = [{"n_probes": q, "top1": fixed_top1(q)} for q in qs]
    rows = []
    for t in thresholds(profile):
        cand, keep, p = adaptive.AdaptiveFlashHead(fh, t, a.p_min, p_max, a.temperature).scored(H)
        mean = float(p.float().mean())
        rows.append({"threshold": t, "top1": top1(cand, keep, best), "mean_probes": mean, "min_probes": int(p.min()),
                     "max_probes": int(p.max()), "top1_fixed_at_mean": fixed_top1(max(1, round(mean)))})
    return {"p_min": a.p_min, "p_max": p_max, "temperature": a.temperature, "n_states": int(H.shape[0]),
            "fixed": fixed, "adaptive": rows}


def thresholds(profile: Profile) -> list[float]:
    a = profile.clustering.adaptive
    return sorted({a.threshold, *a.sweep})


def study_drafts(profile: Profile, target_model=None):
    """The target, the drafters the study runs and the profile's FlashHead. Every drafter runs on the FlashHead
    draft's body: the dense head, FlashHead at each fixed probe count (flash_p<q>), the adaptive head at each
    threshold (adaptive_t<t>) and both bandits."""
    dense_name = engines.shared_dense(profile)
    target, drafts = engines.build_engines(profile, [modes.FLASH, dense_name, *modes.BANDITS], target_model,
                                           adaptive_k=True)                  # the study's block policies reach k_max
    flash, a = drafts[modes.FLASH], profile.clustering.adaptive
    fh, graphs = flash.head.head, profile.bench.cuda_graphs
    p_max = a.p_max or fh.n_probes
    arms = drafts[modes.BANDIT_UCB].arms
    probes = sorted({a.p_min, p_max, fh.n_probes, *engines.bandit_probes(profile, fh.n_probes, fh.n_clusters)})
    graphed = lambda head: GraphedHead(head, graphs, flash.runner.clock)                 # noqa: E731
    out = {modes.probes_arm(q): Draft(flash.runner, arms.get(modes.probes_arm(q)) or graphed(fh.with_probes(q)))
           for q in probes}
    out[modes.DENSE] = drafts[dense_name]
    for t in thresholds(profile):
        head = adaptive.AdaptiveFlashHead(fh, t, a.p_min, p_max, a.temperature)
        out[modes.threshold_drafter(t)] = adaptive.AdaptiveProbeDraft(flash.runner, graphed(head))
    return target, {**out, **{b: drafts[b] for b in modes.BANDITS}}, fh


def k_policy_drafters(profile: Profile, fh, schedule: str) -> dict:
    """Both adaptive block-length policies, whatever the profile's end-to-end run uses (grow; cost where notebooks
    02-03 have measured the call costs), on the dense head and on FlashHead at its own probe count:
    {name: (drafter it runs, policy factory)}, named '<drafter>_k<policy>'."""
    d = profile.decode
    try:
        costs = study.call_costs(profile, (modes.FLASH, modes.DENSE))
    except FileNotFoundError as e:
        costs = {}
        note(f"block policy 'cost' left out of the adaptive study: {e}")
    out = {}
    for policy in [modes.GROW] + ([modes.COST] if costs else []):
        for drafter, head in ((modes.probes_arm(fh.n_probes), modes.FLASH), (modes.DENSE, modes.DENSE)):
            out[f"{drafter}_k{policy}"] = (drafter, lambda policy=policy, c=costs.get(head): make_policy(
                policy, d.k, d.k_max, schedule, c))
    return out


def run_drafters(profile: Profile, target, drafts: dict, enc: list, schedule: str, stop: frozenset,
                 k_policies: dict | None = None) -> dict:
    """Every drafter on every prompt (fixed K, or the block policy of a `k_policies` entry: name -> (drafter,
    policy factory); the order rotates per prompt; the bandits keep learning across prompts), after one warm-up
    pass of the fixed drafters. Sums per drafter, checked against greedy output."""
    k, n = profile.decode.k, profile.decode.max_new_tokens
    for name, d in drafts.items():
        if name not in modes.BANDITS:
            generate_speculative(target, d, Request(enc[0][1], n, schedule, FixedK(k), stop))
    runs_of = {name: (d, lambda: FixedK(k)) for name, d in drafts.items()}
    runs_of.update({name: (drafts[drafter], policy) for name, (drafter, policy) in (k_policies or {}).items()})
    names, sums = list(runs_of), {name: Counter() for name in runs_of}
    choices, probes = {name: Counter() for name in names}, {name: Counter() for name in names}
    greedy = [generate_baseline(target, Request(ids, n, stop=stop)).tokens for _, ids in enc]     # what every drafter must equal
    work = [(i, name) for i in range(len(enc)) for name in names[i % len(names):] + names[:i % len(names)]]
    for i, name in steps(work, "adaptive study", "runs"):
        ids = enc[i][1]
        draft, policy = runs_of[name]
        res = generate_speculative(target, draft, Request(ids, n, schedule, policy(), stop))
        blocks = [b for b in res.block_lengths if b > 0]
        sums[name].update(tokens=res.decode_tokens, ms=res.decode_ms, proposed=res.proposed, k_sum=sum(blocks),
                          blocks=len(blocks), accepted=res.accepted, rounds=res.rounds, exact=res.tokens == greedy[i],
                          samples=1)
        choices[name].update(res.choices)
        probes[name].update(dict(enumerate(res.probe_counts)))
    return {name: drafter_stats(sums[name], choices[name], probes[name]) for name in names}


def drafter_stats(s: Counter, choices: Counter, probes: Counter) -> dict:
    out = {"decode_tok_s": 1000 * s["tokens"] / s["ms"], "acceptance": s["accepted"] / max(s["proposed"], 1),
           "mean_emitted": s["tokens"] / max(s["rounds"], 1), "exact_match": s["exact"] / s["samples"],
           "decode_tokens": s["tokens"], "decode_ms": s["ms"], "rounds": s["rounds"],
           "mean_k": s["k_sum"] / max(s["blocks"], 1)}
    if choices:
        out["choice_freq"] = {a: c / sum(choices.values()) for a, c in sorted(choices.items())}
    if probes:
        out["mean_probes"] = adaptive.mean_probes([probes[p] for p in range(max(probes) + 1)])
    return out


def regret(stats: dict, arms: list[str]) -> dict:
    """A bandit's regret against its best arm run fixed (chosen afterwards): the decode time it spent beyond what
    the best arm needs for the same tokens, and its rate's shortfall."""
    best = max(arms, key=lambda a: stats[a]["decode_tok_s"])
    rate = stats[best]["decode_tok_s"] / 1000                                   # tokens per ms
    out = {}
    for b in (modes.BANDIT_UCB, modes.BANDIT_THOMPSON):
        s = stats[b]
        out[b] = {"best_arm": best, "regret_ms": s["decode_ms"] - s["decode_tokens"] / rate,
                  "regret_frac": 1 - s["decode_tok_s"] / stats[best]["decode_tok_s"],
                  "best_arm_share": s.get("choice_freq", {}).get(best, 0.0)}    # none: it ran no round
    return out


def policy_row(policy: str, source: str, s: dict, fixed_name: str, f: dict, extra: dict) -> dict:
    """One summary row: a policy beside the best fixed setting it competes with."""
    return {"policy": policy, "source": source, "decode_tok_s": s["decode_tok_s"], "acceptance": s["acceptance"],
            **extra, "best_fixed": fixed_name, "best_fixed_tok_s": f["decode_tok_s"],
            "best_fixed_acceptance": f["acceptance"], "tok_s_vs_best_fixed": s["decode_tok_s"] / f["decode_tok_s"]}


def study_rows(stats: dict, reg: dict, k_policies: dict | None = None) -> list[dict]:
    """Adaptive probes (each threshold) against the best fixed probe count; each bandit against its best arm;
    each block-length policy against its drafter at fixed K."""
    best = lambda names: max(names, key=lambda a: stats[a]["decode_tok_s"])
    flash_fixed = best([n for n in stats if n.startswith("flash_p") and n not in (k_policies or {})])   # fixed p, fixed K
    rows = [policy_row(n, "adaptive study", stats[n], flash_fixed, stats[flash_fixed], {"mean_probes": stats[n]["mean_probes"]})
            for n in stats if n.startswith("adaptive_t")]
    for b, r in reg.items():
        rows.append(policy_row(b, "adaptive study", stats[b], r["best_arm"], stats[r["best_arm"]],
                               {"choice_freq": stats[b]["choice_freq"], "regret_ms": r["regret_ms"],
                                "regret_frac": r["regret_frac"]}))
    for name, (drafter, _) in (k_policies or {}).items():
        rows.append(policy_row(name, "adaptive study", stats[name], drafter, stats[drafter], {"mean_k": stats[name]["mean_k"]}))
    return rows


E2E_SOURCE = "e2e run "          # the source of the rows made from an end-to-end run: this, then the run's name


def run_rows(run) -> list[dict]:
    """e2e_rows of a finished end-to-end run, their source naming it."""
    return e2e_rows(results.read_records(run), E2E_SOURCE + run.name)


def e2e_rows(records: list[dict], source: str) -> list[dict]:
    """From an end-to-end run: each adaptive-K policy against the same draft at fixed K, and each adaptive draft
    against the best fixed-K plain draft of its schedule on its body (not the full-depth control flash_full; mean K,
    mean probes or choice frequencies beside)."""
    by_mode = {}
    for r in records:
        if r["draft"] != modes.BASELINE:
            by_mode.setdefault(r["mode"], []).append(r)
    stats = {m: record_stats(rs) for m, rs in by_mode.items()}
    first = {m: rs[0] for m, rs in by_mode.items()}
    # the fixed drafts an adaptive one could be: not flash_full, the full-depth target as a fidelity control
    plain_fixed = [m for m, r in first.items() if r["k_policy"] == modes.FIXED
                   and r["draft"] not in (*modes.ADAPTIVE_DRAFTS, modes.FLASH_FULL)]
    rows = []
    for m, r in first.items():
        if r["k_policy"] != modes.FIXED:
            fixed = modes.name(r["draft"], r["schedule"])
        elif r["draft"] in modes.ADAPTIVE_DRAFTS:
            same = [f for f in plain_fixed if first[f]["schedule"] == r["schedule"]]
            fixed = max(same, key=lambda f: stats[f]["decode_tok_s"], default=None)
        else:
            continue
        if fixed in stats:
            extra = {key: stats[m][key] for key in ("mean_k", "mean_probes", "choice_freq") if key in stats[m]}
            rows.append(policy_row(m, source, stats[m], fixed, stats[fixed], extra))
    return rows


def record_stats(rs: list[dict]) -> dict:
    """Pooled decode tok/s and acceptance of a mode's records, with its mean K, probes or arm choices."""
    tokens, ms = sum(r["decode_tokens"] for r in rs), sum(r["decode_ms"] for r in rs)
    out = {"decode_tok_s": 1000 * tokens / ms, "acceptance": sum(r["accepted"] for r in rs) / max(sum(r["proposed"] for r in rs), 1)}
    blocks = [b for r in rs for b in r.get("block_lengths", []) if b > 0]
    if rs[0]["k_policy"] != modes.FIXED and blocks:
        out["mean_k"] = sum(blocks) / len(blocks)
    counts = [r["probe_counts"] for r in rs if r.get("probe_counts")]
    if counts:
        out["mean_probes"] = adaptive.mean_probes([sum(c) for c in zip(*counts)])
    choices = Counter(c for r in rs for c in r.get("choices", []))
    if choices:
        out["choice_freq"] = {a: n / sum(choices.values()) for a, n in sorted(choices.items())}
    return out


def adaptive_study(profile: Profile, target_model=None, n_prompts: int | None = None, schedule: str | None = None) -> dict:
    """The whole study (see the module's doc) on the first n_prompts prompts (all by default) under `schedule`
    (default: deferred if the profile runs it, else its first schedule); saved as adaptive.json."""
    schedule = schedule or (modes.DEFERRED if modes.DEFERRED in profile.decode.schedules else profile.decode.schedules[0])
    ensure_flash_checkpoint(profile)
    target, drafts, fh = study_drafts(profile, target_model)
    H, best = study.trajectory_states(profile, fh)
    enc = study.side_prompts(profile)[:n_prompts]
    k_policies = k_policy_drafters(profile, fh, schedule)
    stats = run_drafters(profile, target, drafts, enc, schedule, study.stop_tokens(profile), k_policies)
    reg = regret(stats, list(drafts[modes.BANDIT_UCB].arms))
    rows = study_rows(stats, reg, k_policies)
    try:
        run = results.latest_run(profile.out_dir, profile=profile)
        rows += run_rows(run)
    except FileNotFoundError:
        run = None                                                               # no end-to-end run yet
    result = {"device": study.device_info(profile), "schedule": schedule, "k": profile.decode.k, "prompts": len(enc),
              "probes": probe_containment(profile, fh, H, best), "drafters": stats, "regret": reg,
              "e2e_run": run.name if run else None, "policies": rows}
    results.save_json(profile, "adaptive.json", result)
    return result
