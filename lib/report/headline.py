"""The closing lines of `make reproduce`: summary.json's headline numbers as plain text (exact match with greedy
decoding, decode tok/s and acceptance per draft and schedule at fixed block length), and any engine whose fused
step fell back to the reference path."""
from __future__ import annotations

from .. import modes

# every mode name -> (draft, schedule, block-length policy)
PARTS = {modes.name(d, s, k): (d, s, k) for d in modes.DRAFTS for s in modes.SCHEDULES for k in modes.K_POLICIES}


def headline(summary: dict) -> list[str]:
    e2e = summary.get("e2e") or {}
    spec = {m: r for m, r in e2e.items() if m in PARTS}
    if not spec:
        return []
    card = summary.get("run_device") or summary.get("device")         # the e2e run's card, not notebook 02's
    lines = [f"headline ({summary.get('profile')}, {card}):"]
    if summary.get("acceptance_note"):
        lines.append(f"  {summary['acceptance_note']}")
    exact = {m: r["exact_match_rate"] for m, r in spec.items() if r.get("exact_match_rate") is not None}
    if exact and min(exact.values()) == 1.0:
        lines.append(f"  exact match with greedy decoding: 1.00 in every speculative mode ({len(exact)})")
    elif exact:
        worst = min(exact, key=exact.get)
        lines.append(f"  exact match with greedy decoding: {min(exact.values()):.2f} to {max(exact.values()):.2f} "
                     f"per mode (lowest: {worst})")
    if modes.BASELINE in e2e:
        lines.append(f"  baseline decode: {e2e[modes.BASELINE]['decode_tok_s']:.1f} tok/s")
    fixed = {m: r for m, r in spec.items() if PARTS[m][2] == modes.FIXED}
    schedules = [s for s in modes.SCHEDULES if any(PARTS[m][1] == s for m in fixed)]
    lines.append("  decode tok/s (acceptance), fixed K:".ljust(40) + "".join(f"{s:>18}" for s in schedules))
    for draft, label in modes.DRAFTS.items():
        cells = [fixed.get(modes.name(draft, s)) for s in schedules]
        if any(cells):
            lines.append(f"    {label:<36}" + "".join(f"{cell(r):>18}" for r in cells))
    if len(fixed) < len(spec):
        lines.append(f"  and {len(spec) - len(fixed)} block-length-policy modes: summary.json, notebook 04")
    return lines + fallbacks(summary.get("run_bodies") or {})


def fallbacks(bodies: dict) -> list[str]:
    """A line for each engine whose fused single-token step was asked for but not used (its body 'reference (why)',
    lib/engine/runner.py): its timings are the reference path's."""
    return [f"  NOTE {engine} ran its reference body, not the fused step: {body[len('reference ('):-1]}"
            for engine, body in bodies.items() if body.startswith("reference (")]


def cell(row: dict | None) -> str:
    if not row:
        return "-"
    acc = row.get("acceptance")
    return f"{row['decode_tok_s']:.1f}" + (f" ({acc:.3f})" if acc is not None else "")
