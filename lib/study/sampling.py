"""The sampling study: target-only sampling against speculative sampling with each draft of the profile, at
each of sampling.temperatures (top-p sampling.top_p), on the profile's prompts; FlashHead drafts once per
probe policy (sampling.probes). Greedy numbers come from notebook 03's run. Writes sampling.json: one record
per sample and one row per (temperature, mode)."""
from __future__ import annotations

from .. import modes
from ..config import Profile
from ..progress import steps
from ..engine.speculative import Request, generate_baseline, generate_speculative
from ..report.sampling import aggregate, sampled_rows, summary_section  # noqa: F401  (pure: the report's)


def sampling_modes(profile: Profile) -> list[tuple[str, str | None, str | None]]:
    """(draft, schedule, probe policy) of the baseline and of every draft x sampling schedule (x probe
    policy for FlashHead drafts)."""
    s = profile.sampling
    out = [(modes.BASELINE, None, None)]
    for draft, schedule, _ in modes.run_order(profile.decode.modes, s.schedules):
        if draft != modes.BASELINE and draft not in modes.ADAPTIVE_DRAFTS:              # those are greedy-only
            out += [(draft, schedule, p) for p in s.probes] if draft in modes.FLASH_HEADED else [(draft, schedule, None)]
    return out


def mode_name(draft: str, schedule: str | None, probes: str | None) -> str:
    """lib.modes' name, with '_top_probes' for a FlashHead draft probing its own top clusters."""
    return modes.name(draft, schedule) + ("_top_probes" if probes == "top" else "")


def sample_request(profile: Profile, ids: list[int], mode: tuple, temperature: float, seed: int,
                   stop: frozenset) -> Request:
    """The request of one sample of `mode` (draft, schedule, probe policy); the baseline ignores its schedule."""
    d, (_, schedule, probes) = profile.decode, mode
    return Request(ids, d.max_new_tokens, schedule or modes.ORDINARY, d.k, stop, temperature=temperature,
                   top_p=profile.sampling.top_p, seed=seed, draw_probes=probes != "top")


def sample_once(target, drafts: dict, draft: str, request: Request):
    if draft == modes.BASELINE:
        return generate_baseline(target, request)
    return generate_speculative(target, drafts[draft], request)


def sample_record(res, prompt, mode: tuple, temperature: float, top_p: float, seed: int) -> dict:
    draft, schedule, probes = mode
    return {"mode": mode_name(*mode), "draft": draft, "schedule": schedule or modes.BASELINE, "probes": probes,
            "temperature": temperature, "top_p": top_p, "seed": seed, "question_id": prompt.question_id,
            "group": prompt.group, "ttft_ms": res.ttft_ms, "decode_ms": res.decode_ms,
            "decode_tokens": res.decode_tokens, "rounds": res.rounds, "proposed": res.proposed,
            "accepted": res.accepted, "verify_calls": res.verify_calls, "append_calls": res.append_calls,
            "skipped": res.skipped, "stopped": res.stopped, "tokens": res.tokens}


def run(profile: Profile, target, drafts: dict, enc: list, stop: frozenset) -> list[dict]:
    """Every (temperature, prompt, mode) once, after warming the prefill up at every prompt length and each mode up
    on the first prompt. A sample's seed depends on its temperature and prompt only, so every mode of one prompt
    shares its first token."""
    order, s = sampling_modes(profile), profile.sampling
    target.runner.warm_prefill(len(ids) for _, ids in enc)
    warm = [(mode, -1 - w) for mode in order for w in range(profile.bench.e2e_warmup)]
    for mode, seed in steps(warm, "sampling warm-up", "modes"):
        sample_once(target, drafts, mode[0], sample_request(profile, enc[0][1], mode, s.temperatures[0], seed, stop))
    work = [(ti, i, mode) for ti in range(len(s.temperatures)) for i in range(len(enc))
            for mode in order[i % len(order):] + order[:i % len(order)]]    # rotate the mode order per prompt
    out = []
    for ti, i, mode in steps(work, "sampling study", "samples"):
        prompt, ids = enc[i]
        seed, temperature = profile.seed + 1000 * ti + i, s.temperatures[ti]
        res = sample_once(target, drafts, mode[0], sample_request(profile, ids, mode, temperature, seed, stop))
        out.append(sample_record(res, prompt, mode, temperature, s.top_p, seed))
    return out


def result(profile: Profile, samples: list[dict], device: dict) -> dict:
    """What sampling.json holds; summary.json's `sampling` key holds all of it but the samples."""
    s, d = profile.sampling, profile.decode
    return {"temperatures": s.temperatures, "top_p": s.top_p, "probes": s.probes, "k": d.k,
            "max_new_tokens": d.max_new_tokens, "device": device, "real_weights": profile.models.source != "synthetic",
            "rows": aggregate(samples), "samples": samples}
