"""The sampling study: target-only sampling against speculative sampling with each draft of the profile, at
each of sampling.temperatures (top-p sampling.top_p), on the profile's prompts; FlashHead drafts once per
probe policy (sampling.probes). Greedy numbers come from notebook 03's run. Writes sampling.json: one record
per sample and one row per (temperature, mode)."""
from __future__ import annotations

import json

from . import modes
from .config import Profile
from .progress import steps
from .sampling import sample_baseline, sample_speculative

FLASH_DRAFTS = ("flash", "flash_full")                                     # drafts whose head is FlashHead


def sampling_modes(profile: Profile) -> list[tuple[str, str | None, str | None]]:
    """(draft, schedule, probe policy) of the baseline and of every draft x sampling schedule (x probe
    policy for FlashHead drafts)."""
    s = profile.sampling
    out = [(modes.BASELINE, None, None)]
    for draft, schedule, _ in modes.run_order(profile.decode.modes, s.schedules):
        if draft != modes.BASELINE and draft not in modes.ADAPTIVE_DRAFTS:              # those are greedy-only
            out += [(draft, schedule, p) for p in s.probes] if draft in FLASH_DRAFTS else [(draft, schedule, None)]
    return out


def mode_name(draft: str, schedule: str | None, probes: str | None) -> str:
    """lib.modes' name, with '_top_probes' for a FlashHead draft probing its own top clusters."""
    return modes.name(draft, schedule) + ("_top_probes" if probes == "top" else "")


def sample_once(profile: Profile, target, drafts: dict, ids: list[int], draft: str, schedule: str | None,
                probes: str | None, temperature: float, seed: int, stop: frozenset):
    d, s = profile.decode, profile.sampling
    if draft == modes.BASELINE:
        return sample_baseline(target, ids, d.max_new_tokens, temperature, s.top_p, seed, stop)
    return sample_speculative(target, drafts[draft], ids, d.max_new_tokens, d.k, schedule, temperature, s.top_p,
                              seed, stop, draw_probes=probes != "top")


def sample_record(res, prompt, mode: tuple, temperature: float, top_p: float, seed: int) -> dict:
    draft, schedule, probes = mode
    return {"mode": mode_name(*mode), "draft": draft, "schedule": schedule or modes.BASELINE, "probes": probes,
            "temperature": temperature, "top_p": top_p, "seed": seed, "question_id": prompt.question_id,
            "group": prompt.group, "ttft_ms": res.ttft_ms, "decode_ms": res.decode_ms,
            "decode_tokens": res.decode_tokens, "rounds": res.rounds, "proposed": res.proposed,
            "accepted": res.accepted, "verify_calls": res.verify_calls, "append_calls": res.append_calls,
            "skipped": res.skipped, "stopped": res.stopped, "tokens": res.tokens}


def run(profile: Profile, target, drafts: dict, enc: list, stop: frozenset) -> list[dict]:
    """Every (temperature, prompt, mode) once, after warming each mode up on the first prompt. A sample's
    seed depends on its temperature and prompt only, so every mode of one prompt shares its first token."""
    order, s = sampling_modes(profile), profile.sampling
    warm = [(mode, -1 - w) for mode in order for w in range(profile.bench.e2e_warmup)]
    for mode, seed in steps(warm, "sampling warm-up", "modes"):
        sample_once(profile, target, drafts, enc[0][1], *mode, s.temperatures[0], seed, stop)
    work = [(ti, i, mode) for ti in range(len(s.temperatures)) for i in range(len(enc))
            for mode in order[i % len(order):] + order[:i % len(order)]]    # rotate the mode order per prompt
    out = []
    for ti, i, mode in steps(work, "sampling study", "samples"):
        prompt, ids = enc[i]
        seed, temperature = profile.seed + 1000 * ti + i, s.temperatures[ti]
        res = sample_once(profile, target, drafts, ids, *mode, temperature, seed, stop)
        out.append(sample_record(res, prompt, mode, temperature, s.top_p, seed))
    return out


def aggregate(samples: list[dict]) -> list[dict]:
    """Per (temperature, mode), as lib/report.py's aggregate defines them: acceptance = accepted / proposed,
    mean emitted = (accepted + rounds) / rounds, decode tok/s = sum of decode tokens / sum of decode time;
    speedup = decode tok/s over target-only sampling's at the same temperature."""
    rows = []
    for key in dict.fromkeys((r["temperature"], r["mode"]) for r in samples):
        rs = [r for r in samples if (r["temperature"], r["mode"]) == key]
        total = lambda k: sum(r[k] for r in rs)
        rows.append({"temperature": key[0], "mode": key[1], "draft": rs[0]["draft"], "schedule": rs[0]["schedule"],
                     "probes": rs[0]["probes"], "samples": len(rs), "accepted": total("accepted"),
                     "proposed": total("proposed"),
                     "acceptance": total("accepted") / total("proposed") if total("proposed") else None,
                     "mean_emitted": (total("accepted") + total("rounds")) / total("rounds") if total("rounds") else None,
                     "decode_tok_s": 1000 * total("decode_tokens") / total("decode_ms"),
                     "verify_calls": total("verify_calls"), "skipped": total("skipped")})
    base = {r["temperature"]: r["decode_tok_s"] for r in rows if r["mode"] == modes.BASELINE}
    for r in rows:
        r["speedup"] = r["decode_tok_s"] / base[r["temperature"]] if r["temperature"] in base else None
    return rows


def result(profile: Profile, samples: list[dict], device: dict) -> dict:
    """What sampling.json holds; summary.json's `sampling` key holds all of it but the samples."""
    s, d = profile.sampling, profile.decode
    return {"temperatures": s.temperatures, "top_p": s.top_p, "probes": s.probes, "k": d.k,
            "max_new_tokens": d.max_new_tokens, "device": device, "real_weights": profile.models.source != "synthetic",
            "rows": aggregate(samples), "samples": samples}


def summary_section(profile: Profile) -> dict:
    """summary.json's `sampling` section (sampling.json without its per-sample records), if the study ran."""
    path = profile.out_dir / "sampling.json"
    if not path.exists():
        return {}
    data = {k: v for k, v in json.loads(path.read_text()).items() if k != "samples"}
    return {"sampling": {**data, "rows": sampled_rows(data)}}


def sampled_rows(data: dict) -> list[dict]:
    """The study's rows, less those of adaptive drafts: they are greedy-only, and runs made before they were
    left out sampled them with their base FlashHead, which is the flash rows again under another name."""
    return [r for r in data["rows"] if r.get("draft") not in modes.ADAPTIVE_DRAFTS]
