"""Generation entry points: target-only decoding and speculative decoding, greedy or sampled, for a Request
(lib/engine/request.py); and greedy decoding's decision rule for the shared round loop (lib/engine/rounds.py).

Greedy speculative decoding emits exactly the target's greedy continuation, under every schedule, stopping
where it stops (a stop token, inclusive); speculative sampling (lib/engine/sampling.py) emits tokens
distributed exactly as the target's own sampling. A request's temperature picks the rule: 0 greedy, else sampling.

Timing: the prefill is the time to first token (TTFT), outside the decode clock; runners and heads record
their calls on the engine's clock, the loop its phases.
"""
from __future__ import annotations

import time

import torch

from ..bench import HostCopy, sync
from .request import Request, Result
from . import rounds
from .rounds import Draft, Rounds, Sequence, Target, propose_block, propose_stepwise
from .sampling import Sampling

__all__ = ["Draft", "Greedy", "Request", "Result", "Target", "accepted_prefix", "generate_baseline",
           "generate_speculative", "rule_for"]


def prefill(target: Target, prompt) -> torch.Tensor:
    """Target prompt prefill and first token (1,): TTFT, outside the decode clock."""
    ids = torch.tensor([prompt], device=target.runner.device)
    return target.runner.prefill(ids)[-1:]


class Greedy:
    """Greedy decoding's decision rule (lib/engine/rounds.py): a proposal is the draft head's argmax, judged
    by equality with the target's argmax; the pending prediction is the target's argmax token (1,). No softmax
    anywhere; tokens reach the host only in verify (one read, two where the target is called)."""
    ahead = True                       # a deferred verify can launch the next proposal block before its read

    def first(self, target: Target, prompt) -> torch.Tensor:
        return prefill(target, prompt)

    def append(self, target: Target, ids: torch.Tensor, start: int) -> torch.Tensor:
        return target.greedy(ids, start)

    def token(self, pending: torch.Tensor) -> torch.Tensor:
        return pending

    def propose(self, draft: Draft, s: Sequence, kk: int):
        """kk argmax proposals (kk,); nothing else is needed to judge them. One graph replay where the draft can."""
        if draft.chained:
            return propose_block(draft, s, kk), None
        return propose_stepwise(draft, s, kk, lambda h: (draft.head(h).clone(), None))[0], None

    def verify(self, target: Target, props: torch.Tensor, q, pending, s: Sequence, kk: int, then=None):
        """Against the pending prediction when the target is up to date (ordinary, pipelined, and the first
        deferred round), else the deferred batch (then: see verify_deferred)."""
        if pending is not None:
            return verify_with_pending(target, props, pending, s, kk, then)
        return verify_deferred(target, props, s, kk, then)


def verify_with_pending(target: Target, props: torch.Tensor, pending: torch.Tensor, s: Sequence, kk: int, then=None):
    """Ordinary/pipelined round: the target is up to date and `pending` (1,) is its next token.
    Returns (accepted proposals as host ids, final token id, final token (1,) on the device, verified?).
    then(props, preds, got) -> got as host ids, where given: the round loop launches the append of the final token
    before the host reads (lib/engine/rounds.py: Rounds.launch_append)."""
    got = torch.cat([props[:1], pending]).tolist()                          # one host sync: [d1, pending]
    if kk == 0 or got[0] != got[-1]:
        return [], got[-1], pending, False                                   # d1 rejected: skip the verify call
    preds = target.greedy(props[None], s.t_pos)                              # (kk,): p_i = argmax after d_i
    got = torch.cat([props, preds])
    got = then(props, preds, got) if then else got.tolist()                  # one sync: [d1..dk, p1..pk]
    # d1 == pending is accepted; d_{i+1} is accepted while it equals p_i.
    a = 1 + accepted_prefix(got[1:kk], got[kk:2 * kk - 1])
    # The final token is p_a, the prediction after the last accepted proposal (index kk + a - 1).
    return got[:a], got[kk + a - 1], preds[a - 1:a], True


def verify_deferred(target: Target, props: torch.Tensor, s: Sequence, kk: int, then=None):
    """Deferred round: the last emitted token has not been fed, so the verify batch is [final, d1..dk]
    fed at t_pos; output i is the prediction after token i of the batch. Returns as verify_with_pending.
    then(batch, preds, got) -> got as host ids, where given: the round loop launches the next proposal block
    before the host reads (lib/engine/rounds.py: Rounds.launch_next)."""
    n = len(s.seq)
    batch = torch.cat([s.buf[s.t_pos:n], props])
    preds = target.greedy(batch[None], s.t_pos)                               # (1+kk,): p0..pk
    got = torch.cat([props, preds])
    got = then(batch, preds, got) if then else got.tolist()                   # one sync: [d1..dk, p0..pk]
    # p0 (after the previous final token) judges d1, p_i judges d_{i+1}: accept while d_{i+1} == p_i.
    a = accepted_prefix(got[:kk], got[kk:2 * kk])
    # The final token is p_a, the prediction after the last accepted token (index kk + a).
    return got[:a], got[kk + a], preds[a:a + 1], True


def accepted_prefix(proposed: list[int], predicted: list[int]) -> int:
    """Length of the longest prefix where the proposals equal the target's predictions."""
    a = 0
    for p, q in zip(proposed, predicted):
        if p != q:
            break
        a += 1
    return a


def rule_for(request: Request):
    """The request's decision rule: Greedy at temperature 0, else Sampling."""
    return Greedy() if request.greedy else Sampling(request)


@torch.no_grad()
def generate_baseline(target: Target, request: Request) -> Result:
    """Target-only decoding: prefill, then one single-token append per token, until max_new tokens or a stop
    token (inclusive); greedy or sampled as the request says. Reads each token on the host only when there
    are stop tokens; on a GPU one call behind: a token's append is launched before the host reads whether it was a
    stop token (the GPU runs it meanwhile), and thrown away when it was (a call past the output, not counted)."""
    request.check_cache(target.runner.max_len)
    rule, stop, clock, reader = rule_for(request), request.stop, target.runner.clock, HostCopy()
    behind = bool(stop) and target.runner.device.type in rounds.AHEAD_DEVICES
    t0 = time.perf_counter()
    tok = rule.first(target, request.prompt)
    out, pos, held = [tok], len(request.prompt), None
    t1 = time.perf_counter()
    clock.reset()                                                            # the prefill is TTFT, not decode
    with clock.span("decode"):
        while len(out) < request.max_new:
            if stop and held is None and tok.item() in stop:                 # the first token, and each on a CPU:
                break                                                        # read before its append, none wasted
            nxt = rule.token(rule.append(target, tok.view(1, 1), pos))
            if held is not None and reader.read(held)[0] in stop:          # tok's copy, queued behind its own call
                break
            out.append(nxt)
            tok, pos = nxt, pos + 1
            held = reader.queue(tok) if behind else None
    tokens = torch.cat(out).tolist()
    t2 = time.perf_counter()
    return Result(tokens, 1000 * (t1 - t0), 1000 * (t2 - t1), append_calls=len(tokens) - 1,
                  spans_ms=clock.totals(), stopped=bool(stop) and tokens[-1] in stop)


@torch.no_grad()
def generate_speculative(target: Target, draft: Draft, request: Request) -> Result:
    """Speculative decoding of the request (lib/engine/rounds.py): greedy, equal to target greedy decoding,
    or speculative sampling, distributed as target sampling. The draft's hooks (adaptive drafts) record
    what it chose in the result."""
    request.check_cache(min(target.runner.max_len, draft.runner.max_len))     # both caches, before any work
    rule, clock = rule_for(request), target.runner.clock
    draft.use_clock(clock)
    t0 = time.perf_counter()
    s = Sequence(request.prompt, rule.first(target, request.prompt), request.max_new, request.stop)
    t1 = time.perf_counter()
    clock.reset()                                                            # the prefill is TTFT, not decode
    res = Result([], 1000 * (t1 - t0), 0.0)
    Rounds(target, draft, rule, request, s, res).run()
    sync(target.runner.device)
    sync(draft.runner.device)
    res.decode_ms = 1000 * (time.perf_counter() - t1)
    res.tokens, res.stopped, res.spans_ms = s.seq[s.prompt_len:], s.stopped, clock.totals()
    return res
