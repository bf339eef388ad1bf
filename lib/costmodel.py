"""The thesis's cost model of a speculative round, fed with this machine's measured per-call costs:
checked against the measured runs, then used for labelled PROJECTIONS (never measurements)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import modes
from .modes import DEFERRED, ORDINARY
from .report import thesis_numbers


def expected_emitted(alpha: float, k: int) -> float:
    """E[R], tokens emitted per round when each proposal is accepted independently with prob. alpha."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


COSTED = ("dense", "dense_shared", "flash")      # drafts whose step notebook 02 measures (dense_shared: the dense step)


def call_costs(micro: dict, target_step: dict, draft: str = "flash") -> dict:
    """Per-call costs (ms) measured in notebooks 02-03: T_p(n) target call with n tokens, T_q draft step
    (the FlashHead model's step for FlashHead drafts, the dense model's otherwise). Lengths between the
    measured ones (a profile may time only some) are interpolated linearly."""
    measured = sorted((int(n), v) for n, v in target_step["verify_ms"].items())
    n, ms = zip(*measured)
    return {"T_p": {i: float(np.interp(i, n, ms)) for i in range(1, n[-1] + 1)},
            "T_q": micro["model_step"]["flash" if draft == "flash" else "dense"]["mean_ms"]}


def tpot_ms(costs: dict, k: int, emitted: float, schedule: str) -> float:
    """TPOT ~ (T_p(K) + K*T_q + T_o) / E[R]; T_o is the single-token append (ordinary, pipelined served
    serially) or nothing (deferred, whose verify batch carries one more token: T_p(K+1))."""
    tp, tq = costs["T_p"], costs["T_q"]
    if schedule == modes.BASELINE:
        return tp[1]
    verify = tp[min(k + 1, max(tp))] if schedule == DEFERRED else tp[k]
    append = 0.0 if schedule == DEFERRED else tp[1]
    return (verify + k * tq + append) / emitted


def model_check(agg: pd.DataFrame, micro: dict, target_step: dict, k: int) -> pd.DataFrame:
    """Measured decode tok/s beside the cost model fed with the measured mean emitted per round."""
    rows = []
    for mode, r in agg.iterrows():
        if r.draft not in (modes.BASELINE, *COSTED) or r.k_policy != modes.FIXED:
            continue                                                     # no measured step cost, or no fixed K
        em = 1.0 if r.schedule == modes.BASELINE else r.mean_emitted
        tokens = r.decode_tok_s * r.decode_total_ms / 1000
        initial = r.initial_ms / tokens                                  # I: draft prefill + first append, per token
        pred = 1000 / (tpot_ms(call_costs(micro, target_step, r.draft), k, em, r.schedule) + initial)
        rows.append({"mode": mode, "measured tok/s": r.decode_tok_s, "model tok/s": pred,
                     "model / measured": pred / r.decode_tok_s})
    return pd.DataFrame(rows).set_index("mode")


def thesis_emitted(k: int) -> dict[str, dict[str, float]]:
    """Mean emitted per round implied by the thesis's published statistics (params/thesis_tables.yaml):
    table 4.5's acceptance a gives 1 + a*K; tables 4.7 and 4.9 give mean emitted directly."""
    t = thesis_numbers()
    acc = {d: t["table_4_5"][modes.name(d, ORDINARY)]["acceptance"] for d in ("dense", "flash")}
    em7 = {d: t["table_4_7"][modes.name(d, ORDINARY)]["mean_emitted"] for d in ("dense", "flash")}
    em9 = {d: t["table_4_9"][modes.name(d, DEFERRED)]["mean_emitted"] for d in ("dense", "flash")}
    fmt = lambda v: "/".join(f"{x:.3f}" for x in v.values())
    return {f"table 4.5 (acceptance {fmt(acc)})": {d: 1 + a * k for d, a in acc.items()},
            f"table 4.7 (mean emitted {fmt(em7)})": em7,
            f"table 4.9 (mean emitted {fmt(em9)})": em9}


def projections(micro: dict, target_step: dict, k: int) -> pd.DataFrame:
    """PROJECTED decode tok/s on this machine's measured per-call costs for the thesis's acceptance
    statistics. Leaves out the per-sample initial step. Projections, not measurements."""
    rows = []
    for src, em in thesis_emitted(k).items():
        row = {"thesis statistics": src,
               modes.BASELINE: 1000 / tpot_ms(call_costs(micro, target_step), k, 1, modes.BASELINE)}
        for draft in ("dense", "flash"):
            for schedule in (ORDINARY, DEFERRED):
                cost = tpot_ms(call_costs(micro, target_step, draft), k, em[draft], schedule)
                row[modes.name(draft, schedule)] = 1000 / cost
        rows.append(row)
    return pd.DataFrame(rows).set_index("thesis statistics")


def projection_grid(micro: dict, target_step: dict, alphas=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9),
                    ks=(1, 2, 3, 4, 5, 6, 7)) -> pd.DataFrame:
    """PROJECTED speedup of the FlashHead draft (deferred) over the baseline, over acceptance and K."""
    base = tpot_ms(call_costs(micro, target_step), 1, 1, modes.BASELINE)
    costs = call_costs(micro, target_step, "flash")
    return pd.DataFrame({k: [base / tpot_ms(costs, k, expected_emitted(a, k), DEFERRED) for a in alphas] for k in ks},
                        index=pd.Index(alphas, name="per-token acceptance")).rename_axis(columns="K")
