"""The study's modes, each name written once: the baseline (target alone) and every draft x round schedule
x block-length policy.

A record carries `draft`, `schedule` and `k_policy`; its `mode` is name(draft, schedule, k_policy). Validation, run order,
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
# Adaptive drafts (lib/engine/adaptive.py, on the FlashHead draft's body): flash_adaptive chooses its probe count per step;
# bandit_ucb / bandit_thompson choose a head (dense or FlashHead at several probe counts) each round. They run
# at fixed K only (one adaptive axis at a time).
DRAFTS = {"dense": "Dense", "dense_shared": "Dense shared", "flash": "FlashHead", "flash_full": "FlashHead full-depth",
          "flash_adaptive": "FlashHead adaptive probes", "bandit_ucb": "Bandit (UCB1)", "bandit_thompson": "Bandit (Thompson)"}
DENSE, DENSE_SHARED, FLASH, FLASH_FULL, FLASH_ADAPTIVE, BANDIT_UCB, BANDIT_THOMPSON = DRAFTS
ADAPTIVE_DRAFTS = (FLASH_ADAPTIVE, BANDIT_UCB, BANDIT_THOMPSON)
BANDITS = (BANDIT_UCB, BANDIT_THOMPSON)     # rewarded with tokens per ms: their choices follow measured timings
FLASH_HEADED = (FLASH, FLASH_FULL)          # drafts whose greedy head is FlashHead (sampling draws their probes)


def probes_arm(p: int) -> str:
    """The name of FlashHead at p probes as a bandit arm or adaptive-study drafter: 'flash_p<p>'."""
    return f"{FLASH}_p{p}"


def fed_two(draft: str) -> str:
    """The name of a draft's proposal block fed two tokens, as deferred rounds launch it ahead, in the benches:
    '<draft>_fed_two'."""
    return f"{draft}_fed_two"


def threshold_drafter(t: float) -> str:
    """The name of the adaptive-probe head at threshold t in the adaptive study: 'adaptive_t<t>'."""
    return f"adaptive_t{t:g}"

# schedule -> label suffix (see lib/engine/rounds.py for what each does)
SCHEDULES = {"ordinary": "", "pipelined": ", pipelined", "deferred": ", deferred"}
ORDINARY, PIPELINED, DEFERRED = SCHEDULES


# block-length policy -> label suffix (see lib/engine/blocks.py); "fixed" adds nothing to a mode's name
K_POLICIES = {"fixed": "", "grow": ", K by acceptance", "cost": ", K by cost model"}
FIXED, GROW, COST = K_POLICIES


def follows_timings(draft: str, k_policy: str | None) -> bool:
    """Whether a mode's tokens per round (hence acceptance) follow this machine's measured timings: the bandits
    (rewarded with tokens per ms) and the cost-model block policy (its K from measured call costs)."""
    return draft in BANDITS or k_policy == COST


def name(draft: str, schedule: str | None, k_policy: str | None = FIXED) -> str:
    """The mode's name: 'baseline', '<draft>_<schedule>', or '<draft>_<schedule>_<k_policy>'."""
    if draft == BASELINE or schedule in (None, BASELINE):
        return BASELINE
    return f"{draft}_{schedule}" + ("" if k_policy in (None, FIXED) else f"_{k_policy}")


def run_order(drafts: list[str], schedules: list[str], k_policies=(FIXED,)) -> list[tuple[str, str | None, str | None]]:
    """(draft, schedule, k_policy) of a profile in run order; the baseline has neither schedule nor policy."""
    out = [(BASELINE, None, None)] if BASELINE in drafts else []
    return out + [(d, s, k) for d in DRAFTS if d in drafts for s in SCHEDULES if s in schedules
                  for k in K_POLICIES if k in k_policies and (k == FIXED or d not in ADAPTIVE_DRAFTS)]


# every mode name in the order tables and figures show them (by policy, schedule, then draft), with its label
LABELS = {BASELINE: "Baseline", **{name(d, s, k): f"{DRAFTS[d]} draft{SCHEDULES[s]}{K_POLICIES[k]}"
                                   for k in K_POLICIES for s in SCHEDULES for d in DRAFTS}}


# Peers measured in the same harness (lib/study/peers.py): Hugging Face transformers' own generate() on the profile's
# target (and dense draft), with its label. "engine_baseline" is this engine's generate_baseline, timed beside them.
PEERS = {"hf_greedy": "HF generate, greedy (dynamic cache)", "hf_static": "HF generate, greedy (static cache)",
         "hf_assisted": "HF assisted generation (dense draft)", "hf_prompt_lookup": "HF prompt-lookup decoding"}
ENGINE_BASELINE = "engine_baseline"


# How notebook 03 runs its end-to-end samples (lib/study/speculative.py): in its own process, over a Slurm array,
# or as that array's shards run locally by submitit.
LAUNCHERS = ("local", "slurm", "submitit-local")

# Notebook 03's side studies after the end-to-end run, each on the first prompts.side_prompts prompts (the context
# study on no prompt: it times a round's calls at bench.context_lengths).
SIDE_STUDIES = {"sampling": "exact speculative sampling (sampling.json)", "adaptive": "adaptive drafts (adaptive.json)",
                "peers": "Hugging Face generate() peers (peers.json)",
                "invariance": "batch-invariant target calls on and off: step times, exact match (invariance.json)",
                "context": "a round's calls at longer contexts (context.json)"}
