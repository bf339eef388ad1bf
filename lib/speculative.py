"""Greedy speculative decoding with separate target and draft states.

Each model keeps its own static KV cache and a count of the tokens in it. The target also keeps its
pending greedy prediction (the argmax after the last token it has seen) when it is up to date.

Schedules (thesis 3.3 and 3.6; names and labels in lib/modes.py):
  ordinary  after each round a single-token target append feeds the round's final token, so the
            pending prediction is always known and a round whose first proposal disagrees with it
            skips the verify call.
  deferred  the final token is not appended; it is prepended to the next round's verify batch
            [final, d1..dK], whose first output replaces the pending prediction. The skip can only
            fire where the pending prediction exists (the first round, after the initial append).
  pipelined the ordinary schedule with the target append of the final token running on a worker
            thread (its own CUDA stream) while the draft catches up and proposes the next block
            (thesis 3.6.1): a round costs about max(append, draft) instead of their sum.
All emit exactly the target's greedy continuation, stopping where it stops (a `stop` token, inclusive).

Timing: runners and heads record their calls on the engine's clock; the engine records only its phases.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .bench import sync
from .blocks import FixedK
from .heads import GraphedHead
from .modes import DEFERRED, PIPELINED, SCHEDULES
from .runner import Runner


@dataclass
class Draft:
    """A draft model: its runner and its greedy head (dense or FlashHead), graph-captured on CUDA."""
    runner: Runner
    head: GraphedHead

    def use_clock(self, clock) -> None:
        """Record this draft's calls on `clock` (the target's: one clock per generation)."""
        self.runner.clock = self.head.clock = clock

    def propose(self, catch_up: torch.Tensor, start: int, k: int) -> torch.Tensor:
        """Feed catch_up (1,m) at `start`, then propose k tokens greedily; returns (k,) on the device.
        Feeds catch_up and the first k-1 proposals (the k-th proposal is never fed)."""
        x, pos, out = catch_up, start, []
        for _ in range(k):
            tok = self.head(self.runner.forward(x, pos)[:, -1]).clone()       # (1,)
            out.append(tok)
            pos += x.shape[1]
            x = tok.view(1, 1)
        return torch.cat(out)


@dataclass
class Target:
    """The target model: body and dense greedy head in one call (one CUDA graph per length)."""
    runner: Runner

    def greedy(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Target argmax after each of ids (1,n) fed at `start`: (n,) on the device (a copy)."""
        return self.runner.greedy(ids, start).clone()


@dataclass
class Result:
    tokens: list[int]
    ttft_ms: float
    decode_ms: float
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    verify_calls: int = 0
    append_calls: int = 0
    skipped: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    block_lengths: list[int] = field(default_factory=list)                  # proposals per round
    choices: list[str] = field(default_factory=list)                        # bandit drafts: the arm of each round
    probe_counts: list[int] = field(default_factory=list)                   # adaptive FlashHead: steps per probe count
    spans_ms: dict = field(default_factory=dict)
    stopped: bool = False                                                   # ended at a stop token

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - 1                                         # tokens after the first


def check_args(target: Target, prompt: list[int], max_new: int, k: int = 1) -> None:
    """Reject impossible requests before any work, with the reason."""
    if max_new < 1:
        raise ValueError(f"max_new must be >= 1, got {max_new}")
    if k < 1:
        raise ValueError(f"block length k must be >= 1, got {k}")
    if not prompt or len(prompt) + max_new > target.runner.max_len:
        raise ValueError(f"a prompt of {len(prompt)} tokens and {max_new} new tokens need {len(prompt) + max_new} "
                         f"cache positions (at least 1 prompt token); the runner holds {target.runner.max_len}")


def prefill(target: Target, prompt: list[int]) -> torch.Tensor:
    """Target prompt prefill and first token (1,): TTFT, outside the decode clock."""
    ids = torch.tensor([prompt], device=target.runner.device)
    return target.runner.prefill(ids)[-1:]


def generate_baseline(target: Target, prompt: list[int], max_new: int, stop: frozenset = frozenset(),
                      first=None, step=None) -> Result:
    """Target-only decoding: prefill, then one single-token append per token, until max_new tokens or a
    stop token (inclusive). Greedy unless first() (the prefill's token) and step(tok, pos) (the token after
    tok fed at pos) say otherwise (lib/sampling.py draws them). Reads each token on the host only when
    there are stop tokens."""
    check_args(target, prompt, max_new)
    first = first or (lambda: prefill(target, prompt))
    step = step or (lambda tok, pos: target.greedy(tok.view(1, 1), pos))
    clock = target.runner.clock
    t0 = time.perf_counter()
    tok = first()
    out, pos = [tok], len(prompt)
    t1 = time.perf_counter()
    clock.reset()                                                            # the prefill is TTFT, not decode
    with clock.span("decode"):
        while len(out) < max_new and not (stop and out[-1].item() in stop):
            tok = step(tok, pos)
            out.append(tok)
            pos += 1
    tokens = torch.cat(out).tolist()
    t2 = time.perf_counter()
    return Result(tokens, 1000 * (t1 - t0), 1000 * (t2 - t1), append_calls=len(tokens) - 1,
                  spans_ms=clock.totals(), stopped=bool(stop) and tokens[-1] in stop)


class Appender:
    """The ordinary schedule's single-token target append, run inline or on a worker thread with its
    own CUDA stream (pipelined). result() returns the pending prediction (1,) on the main stream."""

    def __init__(self, target: Target, pipelined: bool):
        self.target, self.clock = target, target.runner.clock
        self.pool = ThreadPoolExecutor(1) if pipelined else None
        cuda = target.runner.device.type == "cuda"
        self.stream = torch.cuda.Stream(target.runner.device) if pipelined and cuda else None
        self.future, self.in_flight = None, False

    def submit(self, ids: torch.Tensor, start: int) -> None:
        self.in_flight = True
        if self.pool is None:
            with self.clock.span("finalize"):
                self.value = self.target.greedy(ids, start)
            return
        ready = torch.cuda.Event() if self.stream is not None else None
        if ready is not None:
            ready.record()                                                  # ids were written on the main stream
        self.future = self.pool.submit(self._append_on_stream, ids, start, ready)

    def _append_on_stream(self, ids: torch.Tensor, start: int, ready):
        if self.stream is None:                                             # CPU: a thread, no stream
            with self.clock.span("finalize"):
                return self.target.greedy(ids, start), None
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            with self.clock.span("finalize"):
                out = self.target.greedy(ids, start)
            done = torch.cuda.Event()
            done.record()
        return out, done

    def result(self) -> torch.Tensor:
        self.in_flight = False
        if self.pool is None:
            return self.value
        out, done = self.future.result()
        if done is not None:                                                # the append's stream finished it
            torch.cuda.current_stream(self.target.runner.device).wait_event(done)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


class Sequence:
    """The emitted tokens of one generation, on the device (buf, model inputs are sliced from it) and
    on the host (seq), with the number of tokens in each model's KV cache."""

    def __init__(self, prompt: list[int], first: torch.Tensor, max_new: int, stop: frozenset):
        P = self.prompt_len = len(prompt)
        self.buf = torch.zeros(P + max_new, dtype=torch.long, device=first.device)   # prompt + emitted tokens
        self.buf[:P], self.buf[P] = torch.tensor(prompt), first[0]
        self.seq = list(prompt) + [first.item()]                             # host copy of buf
        self.t_pos, self.d_pos = P, 0                                        # tokens in the target / draft caches
        self.max_new, self.stopped = max_new, self.seq[-1] in stop

    @property
    def emitted(self) -> int:
        return len(self.seq) - self.prompt_len

    def done(self) -> bool:
        return self.stopped or self.emitted >= self.max_new


def verify_with_pending(target: Target, props: torch.Tensor, pending: torch.Tensor, s: Sequence, kk: int):
    """Ordinary/pipelined round: the target is up to date and `pending` (1,) is its next token.
    Returns (accepted proposals as host ids, final token id, final token (1,) on the device, verified?)."""
    got = torch.cat([props[:1], pending]).tolist()                          # one host sync: [d1, pending]
    if kk == 0 or got[0] != got[-1]:
        return [], got[-1], pending, False                                   # d1 rejected: skip the verify call
    preds = target.greedy(props[None], s.t_pos)                              # (kk,): p_i = argmax after d_i
    got = torch.cat([props, preds]).tolist()                                 # one sync: [d1..dk, p1..pk]
    # d1 == pending is accepted; d_{i+1} is accepted while it equals p_i.
    a = 1 + accepted_prefix(got[1:kk], got[kk:2 * kk - 1])
    # The final token is p_a, the prediction after the last accepted proposal (index kk + a - 1).
    return got[:a], got[kk + a - 1], preds[a - 1:a], True


def verify_deferred(target: Target, props: torch.Tensor, s: Sequence, kk: int):
    """Deferred round: the last emitted token has not been fed, so the verify batch is [final, d1..dk]
    fed at t_pos; output i is the prediction after token i of the batch. Returns as verify_with_pending."""
    n = len(s.seq)
    preds = target.greedy(torch.cat([s.buf[s.t_pos:n], props])[None], s.t_pos)   # (1+kk,): p0..pk
    got = torch.cat([props, preds]).tolist()                                  # one sync: [d1..dk, p0..pk]
    # p0 (after the previous final token) judges d1, p_i judges d_{i+1}: accept while d_{i+1} == p_i.
    a = accepted_prefix(got[:kk], got[kk:2 * kk])
    # The final token is p_a, the prediction after the last accepted token (index kk + a).
    return got[:a], got[kk + a], preds[a:a + 1], True


def accept(s: Sequence, props: torch.Tensor, accepted: list[int], final: int, final_dev: torch.Tensor,
           stop: frozenset) -> int:
    """Emit the accepted proposals and the final token. A stop token among them ends the generation
    there; a stopping proposal becomes the round's final token. Returns the accepted count after the cut."""
    emitted, a = accepted + [final], len(accepted)
    cut = next((i for i, t in enumerate(emitted) if t in stop), None)
    if cut is not None:
        s.stopped = True
        if cut < a:
            emitted, a, final_dev = emitted[:cut + 1], cut, props[cut:cut + 1]
    n = len(s.seq)
    s.buf[n:n + a] = props[:a]                                               # device-side copies, no host tokens
    s.buf[n + a:n + a + 1] = final_dev
    s.seq += emitted
    return a


def start(target: Target, draft: Draft, s: Sequence) -> torch.Tensor:
    """Draft prefill and the target's append of the first token: returns the pending prediction (1,)."""
    P = s.prompt_len
    draft.runner.prefill(to_device(s.buf[None, :P], draft))
    s.t_pos, s.d_pos = P + 1, P
    return target.greedy(s.buf[None, P:P + 1], P)


def propose(draft: Draft, s: Sequence, kk: int) -> torch.Tensor:
    """The draft catches up on the tokens it has not seen (buf[d_pos:n]), then proposes kk tokens (kk,);
    afterwards it has fed everything but its last proposal."""
    n = len(s.seq)
    if kk == 0:
        return s.buf[n:n]                                                    # (0,): nothing to propose
    props = draft.propose(to_device(s.buf[None, s.d_pos:n], draft), s.d_pos, kk)
    s.d_pos = n + kk - 1
    return to_device(props, draft, s.buf.device)


def to_device(x: torch.Tensor, draft: Draft, device=None) -> torch.Tensor:
    """Tokens to the draft's device (or back to `device`); between two GPUs the copy is timed as 'transfer'."""
    device = device or draft.runner.device
    if x.device == device:
        return x
    with draft.runner.clock.span("transfer", x.device):
        return x.to(device)


def verify(target: Target, props: torch.Tensor, pending: torch.Tensor | None, s: Sequence, kk: int):
    """The round's verification: against the pending prediction when the target is up to date
    (ordinary, pipelined, and the first deferred round), else the deferred batch."""
    if pending is not None:
        return verify_with_pending(target, props, pending, s, kk)
    return verify_deferred(target, props, s, kk)


def roll_back(s: Sequence, n: int, a: int) -> None:
    """Caches keep only accepted tokens: positions from n + a on held rejected proposals (or will hold
    the final token, not fed yet), so the next writes overwrite them."""
    s.t_pos = n + a
    s.d_pos = min(s.d_pos, n + a)


def count_round(res: Result, kk: int, a: int, verified: bool) -> None:
    res.rounds += 1
    res.proposed += kk
    res.accepted += a
    res.accepted_lengths.append(a)
    res.block_lengths.append(kk)
    res.verify_calls += verified
    res.skipped += not verified and kk > 0


def generate_speculative(target: Target, draft: Draft, prompt: list[int], max_new: int, k,
                         schedule: str, stop: frozenset = frozenset()) -> Result:
    """Greedy speculative decoding (one of lib.modes.SCHEDULES); output equals target greedy decoding.
    k: the block length, or a block-length policy (lib/blocks.py) asked before and told after each round.

    Emitted tokens live in a device buffer, so model inputs are sliced on the device; the host
    reads tokens once per round (the accepted length), never inside the proposal loop.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {list(SCHEDULES)}")
    policy = FixedK(k) if isinstance(k, int) else k
    check_args(target, prompt, max_new, policy.k_max)
    clock = target.runner.clock
    draft.use_clock(clock)
    t0 = time.perf_counter()
    s = Sequence(prompt, prefill(target, prompt), max_new, stop)
    t1 = time.perf_counter()
    clock.reset()                                                            # the prefill is TTFT, not decode
    res, P = Result([], 1000 * (t1 - t0), 0.0, append_calls=1), len(prompt)
    with clock.span("initial"):
        pending = start(target, draft, s)
    appender = Appender(target, schedule == PIPELINED)
    while not s.done():
        n = len(s.seq)
        kk = min(policy.next(), max_new - s.emitted - 1)                     # never overshoot max_new
        with clock.span("draft"):
            props = propose(draft, s, kk)
        if pending is None and appender.in_flight:
            pending = appender.result()                                      # join the overlapped append
        with clock.span("verify"):
            accepted, final, final_dev, verified = verify(target, props, pending, s, kk)
        a = accept(s, props, accepted, final, final_dev, stop)
        count_round(res, kk, a, verified)
        policy.update(kk, a)
        roll_back(s, n, a)
        pending = None
        if schedule != DEFERRED and not s.done():
            appender.submit(s.buf[None, s.t_pos:s.t_pos + 1], s.t_pos)        # feed the final token
            s.t_pos += 1
            res.append_calls += 1
        else:
            with clock.span("finalize"):                                     # deferred: nothing to append
                pass
    appender.close()
    sync(target.runner.device)
    sync(draft.runner.device)
    res.decode_ms = 1000 * (time.perf_counter() - t1)
    res.tokens, res.stopped, res.spans_ms = s.seq[P:], s.stopped, clock.totals()
    return res


def accepted_prefix(proposed: list[int], predicted: list[int]) -> int:
    """Length of the longest prefix where the proposals equal the target's predictions."""
    a = 0
    for p, q in zip(proposed, predicted):
        if p != q:
            break
        a += 1
    return a
