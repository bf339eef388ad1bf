"""The thesis's cost model of a speculative round, fed with this machine's measured per-call costs:
checked against the measured runs, then used for labelled PROJECTIONS (never measurements)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import modes
from .modes import DEFERRED, ORDINARY, PIPELINED
from .config import thesis_numbers


def expected_emitted(alpha: float, k: int) -> float:
    """E[R], tokens emitted per round when each proposal is accepted independently with prob. alpha."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


COSTED = (modes.DENSE, modes.DENSE_SHARED, modes.FLASH)   # drafts whose step notebook 02 measures (dense_shared: dense's)


def call_costs(micro: dict, target_step: dict, draft: str = modes.FLASH) -> dict:
    """Per-call costs (ms) measured in notebooks 02-03: T_p(n) target call with n tokens, T_q draft step
    (the FlashHead model's step for FlashHead drafts, the dense model's otherwise): per token of a round's
    proposal block where notebook 02 timed one (GPU profiles: the engine proposes a block in one graph
    replay), else the single step; T_q2 the same for a block fed two tokens, as deferred rounds launch it ahead
    (lib/engine/rounds.py: its first step is the two-token one), where notebook 02 timed one, else T_q. Lengths
    between the measured ones (a profile may time only some) are interpolated linearly."""
    measured = sorted((int(n), v) for n, v in target_step["verify_ms"].items())
    n, ms = zip(*measured)
    name = modes.FLASH if draft == modes.FLASH else modes.DENSE     # notebook 02 times these two drafts
    block = micro.get("block", {})
    t_q = block[name]["mean_ms"] / block["k"] if name in block else micro["model_step"][name]["mean_ms"]
    two = modes.fed_two(name)
    return {"T_p": {i: float(np.interp(i, n, ms)) for i in range(1, n[-1] + 1)}, "T_q": t_q,
            "T_q2": block[two]["mean_ms"] / block["k"] if two in block else t_q}


def tpot_ms(costs: dict, k: float, emitted: float, schedule: str, skip: float = 0.0, appends: float = 1.0,
            ahead: float = 0.0) -> float:
    """TPOT ~ ((1 - s) T_p(K) + K*T_q + u T_o) / E[R], the share `ahead` of the rounds charged K*T_q2 instead
    (their block launched ahead, fed two tokens: measured_ahead); T_o is the single-token append (ordinary; pipelined,
    whose append runs beside the next proposal, charges max(K*T_q, u T_o) for the two) or nothing (deferred,
    whose verify batch carries one more token: T_p(K+1)). s is the share of rounds without a verify call:
    the ordinary schedule skips it when the first proposal disagrees with the pending prediction, which
    happens with probability 1 - alpha at per-token acceptance alpha (skip_share); in the deferred schedule
    only the first round of a generation can skip. Pass the measured share (measured_skip) or the
    expectation; 0 charges a verify every round. u is the share of rounds that append: a generation's last
    round has no next token to predict (measured_appends); 1 charges every round, as for a long generation.
    K is the block length; the check against a run passes its mean block (measured_block)."""
    tp, tq = costs["T_p"], draft_token_ms(costs, ahead)
    if schedule == modes.BASELINE:
        return tp[1]
    verify, append = round_calls(tp, k, schedule, appends)
    verify *= 1 - skip
    prepare = max(k * tq, append) if schedule == PIPELINED else k * tq + append
    return (verify + prepare) / emitted


def draft_token_ms(costs: dict, ahead: float = 0.0) -> float:
    """A proposed token's draft cost: T_q, and T_q2 (a block fed two tokens) in the share `ahead` of the rounds."""
    return (1 - ahead) * costs["T_q"] + ahead * costs.get("T_q2", costs["T_q"])


def round_call_lengths(k: int) -> dict[str, int]:
    """The target's calls a round is made of, by name: the single-token append (1), the ordinary verify (K), the
    deferred verify (K+1)."""
    return {"1": 1, "K": k, "K+1": k + 1}


def projected_tok_s(costs: dict, k: int, emitted: float, schedule: str, ahead: float = 0.0) -> float:
    """1 / TPOT for a long generation at mean emitted `emitted` a round: every round appends, and the ordinary
    schedule skips the verify calls its per-token acceptance implies (skip_share); `ahead`: the share of rounds
    whose block is launched ahead, fed two tokens (tpot_ms)."""
    skip = skip_share(per_token_acceptance(emitted, k), schedule)
    return 1000 / tpot_ms(costs, k, emitted, schedule, skip, ahead=ahead)


def round_calls(tp: dict, k: float, schedule: str, appends: float = 1.0) -> tuple[float, float]:
    """(a verify call, a round's append) in ms from the target call costs tp: the deferred verify carries K+1 tokens
    and nothing is appended; the other schedules verify K and append one token in the share `appends` of rounds.
    K may be a run's mean block (measured_block)."""
    if schedule == DEFERRED:
        return target_ms(tp, k + 1), 0.0
    return target_ms(tp, k), appends * tp[1]


def target_ms(tp: dict, n: float) -> float:
    """T_p(n) from the call costs tp: interpolated linearly between the lengths it holds (a mean block is no
    integer), the longest one's beyond them."""
    lengths = sorted(tp)
    return float(np.interp(n, lengths, [tp[i] for i in lengths]))


def skip_share(alpha: float, schedule: str) -> float:
    """Expected share of rounds whose verify call is skipped at per-token acceptance alpha: 1 - alpha in the
    ordinary and pipelined schedules (the first proposal rejected against the pending prediction), 0 in the
    deferred schedule (only its first round has a pending prediction)."""
    return 0.0 if schedule == DEFERRED else 1 - alpha


def per_token_acceptance(emitted: float, k: int) -> float:
    """The per-token acceptance alpha with expected_emitted(alpha, k) == emitted (1 <= emitted <= k + 1)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):                                                  # expected_emitted rises with alpha
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_emitted(mid, k) < emitted else (lo, mid)
    return (lo + hi) / 2


def _checked(agg: pd.DataFrame):
    """The modes the cost model can be checked on: a measured step cost and a fixed K."""
    for mode, r in agg.iterrows():
        if r.draft in (modes.BASELINE, *COSTED) and r.k_policy == modes.FIXED:
            yield mode, r


def measured_skip(r) -> float:
    """The share of a mode's rounds without a verify call (1 - verify calls / rounds: the skipped rounds, and a
    generation's last round where it had nothing to propose; 0 for the baseline)."""
    return float(1 - r.verify_calls / r.rounds) if r.schedule != modes.BASELINE and r.rounds > 0 else 0.0


def measured_block(r, k: int) -> float:
    """A mode's mean block (proposed / rounds): K, less where max_new cut a generation's last round short."""
    return float(r.mean_block) if r.rounds > 0 else float(k)


def measured_ahead(r) -> float:
    """The share of a mode's rounds whose proposal block was launched ahead, fed two tokens (launched_ahead /
    rounds: deferred greedy rounds on a GPU; 0 where the run has no such count)."""
    return float(r.get("launched_ahead", 0) / r.rounds) if r.schedule != modes.BASELINE and r.rounds > 0 else 0.0


def measured_appends(r) -> float:
    """The share of a mode's rounds that append their final token: the run's append calls less each generation's
    first (the initial step's; none where the first token ended it), over its rounds (1 where nothing is appended:
    deferred, baseline)."""
    if r.schedule in (modes.BASELINE, DEFERRED) or r.rounds <= 0:
        return 1.0
    return float((r.append_calls - first_appends(r)) / r.rounds)


def first_appends(r) -> int:
    """A mode's initial appends: one a generation that ran a round (`decoded`; every sample in runs before it)."""
    return int(r.get("decoded", r.samples))


def model_check(agg: pd.DataFrame, micro: dict, target_step: dict, k: int) -> pd.DataFrame:
    """Measured decode tok/s beside the cost model fed with the measured mean emitted per round, the
    measured share of rounds without a verify call (measured_skip) and of those that append (measured_appends: a
    generation's last round does not), K the run's mean block (measured_block), plus the per-token share
    of the initial step (draft prefill and first append). The rounds columns leave the initial step out of both:
    the measured tokens over the rounds' time, and the model's 1 / TPOT (a sample's start is eager, host-bound and
    varies from run to run more than a cheaper head changes the rounds)."""
    rows = []
    for mode, r in _checked(agg):
        if r.schedule != modes.BASELINE and not r.rounds:             # every generation ended at its first token
            continue
        em = 1.0 if r.schedule == modes.BASELINE else r.mean_emitted
        tokens = r.decode_tok_s * r.decode_total_ms / 1000
        initial = r.initial_ms / tokens                                  # I: draft prefill + first append, per token
        skip, appends, block = measured_skip(r), measured_appends(r), measured_block(r, k)
        tpot = tpot_ms(call_costs(micro, target_step, r.draft), block, em, r.schedule, skip, appends, measured_ahead(r))
        pred = 1000 / (tpot + initial)
        rows.append({"mode": mode, "schedule": r.schedule, "mean block": block, "skip share": skip,
                     "append share": appends,
                     "measured tok/s": r.decode_tok_s,
                     "model tok/s": pred, "model / measured": pred / r.decode_tok_s,
                     "rounds tok/s": 1000 * tokens / (r.decode_total_ms - r.initial_ms),
                     "model rounds tok/s": 1000 / tpot})
    return pd.DataFrame(rows).set_index("mode")


def phase_check(agg: pd.DataFrame, micro: dict, target_step: dict, k: int) -> pd.DataFrame:
    """Where the model and the run part, per round (ms), K the run's mean block (measured_block): the measured draft
    phase against K*T_q (K*T_q2 for the rounds launched ahead), the
    measured verify phase against the model's (1 - skip share) T_p, the measured append (finalize) against
    the append share's T_o per round, and the decode time outside the timed phases (host work, and the
    pipelined schedule's wait for its append). The model's per-call costs are notebook 02's isolated draft step
    and notebook 03's isolated target call; the last five columns set the run's own calls beside them: draft ms
    per proposed token (its model and head calls) against T_q, target ms per call (verify and append calls)
    against the model's mix of T_p(K or K+1) and T_p(1) for the same calls, and `between calls`: what the verify
    and finalize phases hold a round besides the target's calls (the host's read of the verify result, acceptance,
    roll-back; the model charges nothing for it), each generation's first append taken at the mean call's cost."""
    rows = []
    for mode, r in _checked(agg):
        if r.schedule == modes.BASELINE or not r.rounds:
            continue
        c, n, block = call_costs(micro, target_step, r.draft), r.rounds, measured_block(r, k)
        skip = measured_skip(r)
        verify, append = round_calls(c["T_p"], block, r.schedule, measured_appends(r))
        spans = r.initial_ms + r.draft_ms + r.verify_ms + (0 if r.schedule == PIPELINED else r.finalize_ms)
        target_calls = r.verify_calls + r.append_calls
        rows.append({"mode": mode, "measured ms/round": r.ms_per_round,
                     "draft": r.draft_ms / n,
                     "model draft": block * draft_token_ms(c, measured_ahead(r)),
                     "verify": r.verify_ms / n, "model verify": (1 - skip) * verify,
                     "finalize": r.finalize_ms / n,
                     "model finalize": append,
                     "initial": r.initial_ms / n, "untimed": (r.decode_total_ms - spans) / n,
                     "draft ms/token": (r.draft_body_ms + r.draft_head_ms + r.get("draft_block_ms", 0.0))
                     / (r.mean_block * n), "T_q": c["T_q"],
                     "target ms/call": r.target_call_ms / target_calls,
                     "model target ms/call": (r.verify_calls * verify + r.append_calls * c["T_p"][1]) / target_calls,
                     "between calls": (r.verify_ms + r.finalize_ms
                                       - r.target_call_ms * (target_calls - first_appends(r)) / target_calls) / n})
    return pd.DataFrame(rows).set_index("mode")


def summary_section(agg: pd.DataFrame, micro: dict, target_step: dict, k: int) -> dict:
    """summary.json's `cost_model`: per checked mode, predicted and measured decode tok/s and their ratio."""
    check = model_check(agg, micro, target_step, k)
    return {m: {"schedule": r["schedule"], "mean_block": float(r["mean block"]), "skip_share": float(r["skip share"]),
                "append_share": float(r["append share"]),
                "predicted_tok_s": float(r["model tok/s"]), "measured_tok_s": float(r["measured tok/s"]),
                "ratio": float(r["model / measured"]), "rounds_predicted_tok_s": float(r["model rounds tok/s"]),
                "rounds_measured_tok_s": float(r["rounds tok/s"])} for m, r in check.iterrows()}


def thesis_emitted(k: int) -> dict[str, dict[str, float]]:
    """Mean emitted per round implied by the thesis's published statistics (params/thesis_tables.yaml):
    table 4.5's acceptance a gives 1 + a*K; tables 4.7 and 4.9 give mean emitted directly."""
    t = thesis_numbers()
    acc = {d: t["table_4_5"][modes.name(d, ORDINARY)]["acceptance"] for d in (modes.DENSE, modes.FLASH)}
    em7 = {d: t["table_4_7"][modes.name(d, ORDINARY)]["mean_emitted"] for d in (modes.DENSE, modes.FLASH)}
    em9 = {d: t["table_4_9"][modes.name(d, DEFERRED)]["mean_emitted"] for d in (modes.DENSE, modes.FLASH)}
    fmt = lambda v: "/".join(f"{x:.3f}" for x in v.values())
    return {f"table 4.5 (acceptance {fmt(acc)})": {d: 1 + a * k for d, a in acc.items()},
            f"table 4.7 (mean emitted {fmt(em7)})": em7,
            f"table 4.9 (mean emitted {fmt(em9)})": em9}


def projections(micro: dict, target_step: dict, k: int) -> pd.DataFrame:
    """PROJECTED decode tok/s on this machine's measured per-call costs for the thesis's acceptance
    statistics (the ordinary schedule's skipped verify calls at the per-token acceptance that gives the mean
    emitted). Leaves out the per-sample initial step and charges every round an append (long generations).
    Projections, not measurements."""
    rows = []
    for src, em in thesis_emitted(k).items():
        row = {"thesis statistics": src,
               modes.BASELINE: 1000 / tpot_ms(call_costs(micro, target_step), k, 1, modes.BASELINE)}
        for draft in (modes.DENSE, modes.FLASH):
            for schedule in (ORDINARY, DEFERRED):
                row[modes.name(draft, schedule)] = projected_tok_s(call_costs(micro, target_step, draft), k,
                                                                   em[draft], schedule)
        rows.append(row)
    return pd.DataFrame(rows).set_index("thesis statistics")


def projection_grid(micro: dict, target_step: dict, alphas=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                    ks=(1, 2, 3, 4, 5, 6, 7)) -> pd.DataFrame:
    """PROJECTED speedup of the FlashHead draft (deferred) over the baseline, over acceptance and K."""
    base = tpot_ms(call_costs(micro, target_step), 1, 1, modes.BASELINE)
    costs = call_costs(micro, target_step, modes.FLASH)
    return pd.DataFrame({k: [base / tpot_ms(costs, k, expected_emitted(a, k), DEFERRED) for a in alphas] for k in ks},
                        index=pd.Index(alphas, name="per-token acceptance")).rename_axis(columns="K")


def head_ratios(check: pd.DataFrame) -> pd.DataFrame:
    """FlashHead's draft over the dense one, per schedule: the measured and the modelled decode tok/s ratio
    (model_check's rows) and their difference in points; then the same two over the rounds alone where
    model_check gave them."""
    rows = {}
    for schedule in (s for s in check.schedule.unique() if s != modes.BASELINE):
        f, d = modes.name(modes.FLASH, schedule), modes.name(modes.DENSE, schedule)
        if f in check.index and d in check.index:
            ratio = lambda col: check.loc[f, col] / check.loc[d, col]
            measured, model = ratio("measured tok/s"), ratio("model tok/s")
            rows[schedule] = {"measured flash/dense": measured, "model flash/dense": model,
                              "difference (points)": 100 * (measured - model)}
            if "rounds tok/s" in check:
                rows[schedule].update({"rounds: measured flash/dense": ratio("rounds tok/s"),
                                       "rounds: model flash/dense": ratio("model rounds tok/s")})
    return pd.DataFrame(rows).T


def context_projection(ctx: dict, agg: pd.DataFrame) -> pd.DataFrame:
    """PROJECTED decode tok/s at each position of notebook 03's context study (context.json): the cost model fed
    with the calls measured there (T_q: each draft's proposal block a token; T_p(1), T_p(K), T_p(K+1)) and the
    end-to-end run's mean emitted per round of each draft and schedule (agg), as if the run's acceptance held at
    that context; each round charged an append (long generations) and the expected skip share, and the share of
    the run's rounds launched ahead (measured_ahead) the block fed two tokens where the study timed it at that
    position (context studies before it did not: T_q there). Beside them the measured draft-step ratio.
    Projections, not measurements."""
    k, rows = ctx["k"], []
    for r in ctx["rows"]:
        tp = {n: r["target"][name]["mean_ms"] for name, n in round_call_lengths(k).items()}
        row = {"position": r["position"], "baseline tok/s": 1000 / tp[1],
               "draft step dense/flash (measured)": r["draft_step_ratio"]}
        for schedule in (ORDINARY, DEFERRED, PIPELINED):
            tok = {}
            for draft in (modes.DENSE, modes.FLASH):
                mode = modes.name(draft, schedule)
                if mode in agg.index:
                    t_q = r["draft"][draft]["per_token_ms"]
                    costs = {"T_p": tp, "T_q": t_q, "T_q2": r.get("draft_fed_two", {}).get(draft, {}).get(
                        "per_token_ms", t_q)}
                    tok[draft] = row[f"{mode} tok/s"] = projected_tok_s(
                        costs, k, float(agg.loc[mode, "mean_emitted"]), schedule, measured_ahead(agg.loc[mode]))
            if len(tok) == 2:
                row[f"{schedule}: flash/dense"] = tok[modes.FLASH] / tok[modes.DENSE]
        rows.append(row)
    return pd.DataFrame(rows).set_index("position")
