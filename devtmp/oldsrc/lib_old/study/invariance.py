"""Batch invariance on and off, beside each other (issue 24): the target's single-token step and verify calls
timed with both targets interleaved, and every greedy mode's exact match with greedy decoding and acceptance on
the side prompts, with the target's calls batch-invariant (lib/engine/runner.py: Acceleration.rows) and not.
The drafts are built once; the two targets share the model's weights. Saved as invariance.json."""
from __future__ import annotations

from dataclasses import replace


from .. import bench, modes
from ..config import Profile
from ..engine.speculative import Request, generate_baseline, generate_speculative
from ..models import build, checkpoints
from ..models.flash_checkpoint import ensure_flash_checkpoint
from ..progress import steps
from ..results import save_json
from .common import device_info, side_prompts, stop_tokens
from .microbench import target_calls, time_target_calls

SETTINGS = {"invariant": True, "variant": False}       # the label of each setting of decode.batch_invariant


def targets(profile: Profile, target_model) -> dict:
    """One target engine per setting, on the same model and one clock, their call lengths captured."""
    out, clock = {}, None
    for label, on in SETTINGS.items():
        p = replace(profile, decode=replace(profile.decode, batch_invariant=on))
        out[label] = build.make_target(target_model, build.cache_len(p), build.acceleration(p, "target"), clock)
        out[label].runner.warm("greedy", range(1, profile.decode.k + 2))
        clock = out[label].runner.clock
    return out


def step_times(profile: Profile, engines: dict, prompt: list[int]) -> dict:
    """Single-token and verify(n) calls of both targets, interleaved after warm-up: {label: {n: stats}}."""
    fns, out = {}, {}
    for label, target in engines.items():
        calls = target_calls(target.runner, prompt, profile.bench.verify_lengths)
        fns.update({f"{label}:{n}": fn for n, fn in calls.items()})
    raw = time_target_calls(profile, fns, next(iter(engines.values())).runner.device)
    for key, ms in raw.items():
        label, n = key.split(":")
        out.setdefault(label, {})[n] = bench.stats(ms)
    return out


def greedy_modes(profile: Profile) -> list[tuple[str, str]]:
    """The profile's greedy speculative modes at fixed K (draft, schedule); adaptive drafts left out."""
    return [(d, s) for d, s, k in modes.run_order(profile.decode.modes, profile.decode.schedules)
            if d != modes.BASELINE and d not in modes.ADAPTIVE_DRAFTS]


def exactness(profile: Profile, engines: dict, drafts: dict, enc: list) -> list[dict]:
    """Per setting and mode over the encoded prompts `enc`: samples, exact match with that target's greedy
    output, acceptance."""
    d, stop, rows = profile.decode, stop_tokens(profile), []
    for label, target in engines.items():
        counts = {}
        for _, ids in steps(enc, f"invariance ({label})", "prompts"):
            greedy = generate_baseline(target, Request(ids, d.max_new_tokens, stop=stop)).tokens
            for draft, schedule in greedy_modes(profile):
                res = generate_speculative(target, drafts[draft], Request(ids, d.max_new_tokens, schedule, d.k, stop))
                c = counts.setdefault(modes.name(draft, schedule), [0, 0, 0, 0])
                c[0], c[1] = c[0] + 1, c[1] + (res.tokens == greedy)
                c[2], c[3] = c[2] + res.proposed, c[3] + res.accepted
        rows += [{"setting": label, "mode": m, "samples": n, "exact_match_rate": e / n,
                  "acceptance": a / max(p, 1)} for m, (n, e, p, a) in counts.items()]
    return rows


def invariance_study(profile: Profile, target_model=None) -> dict:
    """Both settings side by side (see the module's doc); saves invariance.json and returns it."""
    ensure_flash_checkpoint(profile)
    target_model = target_model if target_model is not None else checkpoints.load_target(profile)
    engines = targets(profile, target_model)
    clock = engines["invariant"].runner.clock
    drafts = build.build_all_drafts(profile, [m for m, _ in greedy_modes(profile)], clock, target_model)
    enc = side_prompts(profile)
    data = {"device": device_info(profile), "rows": engines["invariant"].runner.rows,
            "step_ms": step_times(profile, engines, enc[0][1]), "modes": exactness(profile, engines, drafts, enc)}
    save_json(profile, "invariance.json", data)
    return data
