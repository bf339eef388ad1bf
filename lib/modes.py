"""The study's modes, each name written once: the baseline (target alone) and every draft x round schedule.

A record carries `draft` and `schedule`; its `mode` is name(draft, schedule). Validation, run order,
report order and labels all come from the tables below: to add a draft or a schedule, add a row here
(and teach the engine builder or the engine what it means).
"""
from __future__ import annotations

BASELINE = "baseline"

# draft -> label stem. dense: the dense draft checkpoint and its dense head; flash: the FlashHead checkpoint's
# body and FlashHead; dense_shared: the FlashHead checkpoint's body with its dense head (the thesis's control).
# gguf profiles (one checkpoint): dense and flash are the target's first exit_layer layers with the dense head
# or FlashHead; flash_full is the full-depth target with FlashHead, a fidelity control whose acceptance is
# FlashHead's top-1 agreement with the dense head along the target's greedy trajectory.
DRAFTS = {"dense": "Dense", "dense_shared": "Dense shared", "flash": "FlashHead", "flash_full": "FlashHead full-depth"}

# schedule -> label suffix (see lib/speculative.py for what each does)
SCHEDULES = {"ordinary": "", "pipelined": ", pipelined", "deferred": ", deferred"}
ORDINARY, PIPELINED, DEFERRED = SCHEDULES


def name(draft: str, schedule: str | None) -> str:
    """The mode's name: 'baseline', or '<draft>_<schedule>'."""
    return BASELINE if draft == BASELINE or schedule in (None, BASELINE) else f"{draft}_{schedule}"


def run_order(drafts: list[str], schedules: list[str]) -> list[tuple[str, str | None]]:
    """(draft, schedule) pairs of a profile in run order; the baseline (draft 'baseline') has no schedule."""
    out = [(BASELINE, None)] if BASELINE in drafts else []
    return out + [(d, s) for d in DRAFTS if d in drafts for s in SCHEDULES if s in schedules]


# every mode name in the order tables and figures show them (by schedule, then draft), with its label
LABELS = {BASELINE: "Baseline", **{name(d, s): f"{DRAFTS[d]} draft{SCHEDULES[s]}" for s in SCHEDULES for d in DRAFTS}}
