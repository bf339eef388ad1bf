"""The early-exit draft's depth for a one-checkpoint (gguf) profile: for each exit depth N, how often the
exit-N dense head agrees with the full model along the full model's own greedy trajectory (the draft's
per-token acceptance, exactly: a draft that has agreed so far sees the target's own prefix), and the cost
model's PROJECTED speedup from this machine's measured per-call costs (projections, not measurements)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from .. import bench
from ..costmodel import expected_emitted, skip_share, tpot_ms
from ..modes import DEFERRED, ORDINARY
from ..engine.runner import Runner
from ..engine.speculative import Request, generate_baseline


def greedy_trajectory(model, prompt: list[int], max_new: int, stop: frozenset = frozenset()) -> list[int]:
    """The full model's greedy continuation (max_new tokens, or up to a stop token inclusive)."""
    from ..models.build import make_target
    return generate_baseline(make_target(model, len(prompt) + max_new), Request(prompt, max_new, stop=stop)).tokens


@torch.no_grad()
def exit_agreement(model, prompt: list[int], trajectory: list[int], depths) -> dict[int, np.ndarray]:
    """For each depth N: whether the exit-N dense argmax (first N layers, final norm, tied head) after
    prompt + trajectory[:j] equals trajectory[j], for j = 1..T-1 (trajectory[0] comes from the target's
    prefill). One forward: hidden_states[N] is layer N's output before the final norm (N < depth)."""
    W = model.get_output_embeddings().weight
    ids = torch.tensor([prompt + trajectory[:-1]], device=W.device)
    hs = model(ids, output_hidden_states=True).hidden_states
    want = torch.tensor(trajectory[1:], device=W.device)
    P = len(prompt)
    return {N: ((model.model.norm(hs[N][0, P:]) @ W.T).argmax(-1) == want).cpu().numpy() for N in depths}


def simulate_rounds(agree: np.ndarray, k: int) -> list[int]:
    """Accepted proposals per round of greedy speculative decoding (block length k) along a trajectory of
    len(agree) + 1 tokens with draft agreement `agree` (as lib.engine.speculative emits them, stop token included)."""
    T, j, out = len(agree) + 1, 1, []
    while j < T:
        a = 0
        while a < min(k, T - 1 - j) and agree[j - 1 + a]:
            a += 1
        out.append(a)
        j += a + 1                                                          # a accepted + the target's token
    return out


@torch.no_grad()
def measure_costs(model, k: int, context: int = 128, warmup: int = 3, iters: int = 10) -> dict:
    """Median per-call costs (ms) on this machine: T_p(n) target calls of n = 1..k+1 tokens after `context`
    tokens, and T_head the dense head (argmax over the vocabulary) on one hidden state."""
    W = model.get_output_embeddings().weight
    dev = W.device
    runner = Runner(model, context + k + 1)
    ids = torch.randint(0, W.shape[0], (1, context + k + 1), generator=torch.Generator().manual_seed(0)).to(dev)
    runner.prefill(ids[:, :context])
    med = lambda fn: float(np.median(bench.time_calls(fn, warmup, iters, dev)))
    T_p = {n: med(lambda n=n: runner.greedy(ids[:, context:context + n], context)) for n in range(1, k + 2)}
    h = torch.randn(1, W.shape[1], device=dev, dtype=W.dtype)
    return {"T_p": T_p, "T_head": med(lambda: (h @ W.T).argmax(-1))}


def agreements(model, prompts: list[list[int]], max_new: int, depths, stop: frozenset = frozenset()) -> dict:
    """{N: [exit_agreement per prompt]} along the full model's greedy trajectory of each prompt."""
    out = {n: [] for n in depths}
    for prompt in prompts:
        traj = greedy_trajectory(model, prompt, max_new, stop)
        for n, a in exit_agreement(model, prompt, traj, depths).items():
            out[n].append(a)
    return out


def depth_table(agree: dict, n_layers: int, k: int, costs: dict) -> pd.DataFrame:
    """The table of exit_depth_table from agreements() and measure_costs() (cheap: try several k)."""
    T1, head = costs["T_p"][1], costs["T_head"]
    rows = []
    for n, per_prompt in agree.items():
        alpha = float(np.concatenate(per_prompt).mean())
        rounds = [a for x in per_prompt for a in simulate_rounds(x, k)]
        step = {"T_p": costs["T_p"], "T_q": n / n_layers * (T1 - head) + head}             # draft step (ms)
        em = expected_emitted(alpha, k)
        rows.append({"exit_layer": n, "acceptance": alpha, "simulated_emitted": 1 + float(np.mean(rounds)),
                     "expected_emitted": em, "draft_step": step["T_q"] / T1,
                     **{f"speedup_{s}": T1 / tpot_ms(step, k, em, s, skip_share(alpha, s)) for s in (ORDINARY, DEFERRED)}})
    return pd.DataFrame(rows).set_index("exit_layer")


def exit_depth_table(model, prompts: list[list[int]], k: int, max_new: int = 48, depths=None,
                     stop: frozenset = frozenset(), costs: dict | None = None) -> pd.DataFrame:
    """Per exit depth N (default 4, 6, .. below the model's depth): the dense early-exit draft's acceptance
    (top-1 agreement with the full model along its greedy trajectories of `prompts`), mean tokens emitted
    per round (simulated exactly along those trajectories, and expected_emitted(acceptance, k)), the draft
    step's cost relative to a target step (N/L of the body plus the head) and the PROJECTED decode speedup
    over the target alone for the ordinary and deferred schedules. `costs` as measure_costs (measured if None)."""
    L = model.config.num_hidden_layers
    depths = list(depths or range(4, L, 2))
    if not all(1 <= n < L for n in depths):
        raise ValueError(f"exit depths must be in 1..{L - 1} (the model has {L} layers), got {depths}")
    agree = agreements(model, prompts, max_new, depths, stop)
    return depth_table(agree, L, k, costs or measure_costs(model, k))


def table_depths(n_layers: int) -> list[int]:
    """The depths notebook 02 tabulates: every second layer, and the last one below full depth."""
    return sorted(set(range(2, n_layers, 2)) | {n_layers - 1})
