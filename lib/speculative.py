"""Greedy speculative decoding with separate target and draft states.

Each model keeps its own static KV cache and a count of the tokens in it. The target also keeps its
pending greedy prediction (the argmax after the last token it has seen) when it is up to date.

Schedules (thesis 3.3 and 3.6.2):
  ordinary  after each round a single-token target append feeds the round's final token, so the
            pending prediction is always known and a round whose first proposal disagrees with it
            skips the verify call.
  deferred  the final token is not appended; it is prepended to the next round's verify batch
            [final, d1..dK], whose first output replaces the pending prediction. The skip can only
            fire where the pending prediction exists (the first round, after the initial append).
  pipelined the ordinary schedule with the target append of the final token running on a worker
            thread (its own CUDA stream) while the draft catches up and proposes the next block
            (thesis 3.6.1): a round costs about max(append, draft) instead of their sum.
All emit exactly the target's greedy continuation.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from .bench import Clock, sync
from .models import GraphedHead, Runner


@dataclass
class Draft:
    """A draft model: its runner and its greedy head (dense or FlashHead), graph-captured on CUDA."""
    runner: Runner
    head: GraphedHead

    def propose(self, clock: Clock, catch_up: torch.Tensor, start: int, k: int) -> torch.Tensor:
        """Feed catch_up (1,m) at `start`, then propose k tokens greedily; returns (k,) on the device.

        Feeds catch_up and the first k-1 proposals (the k-th proposal is never fed).
        """
        x, pos, out = catch_up, start, []
        for i in range(k):
            with clock.span("call_draft_body", self.runner.device):
                h = self.runner.forward(x, pos)                             # (1,n,d)
            with clock.span("call_draft_head", self.runner.device):
                tok = self.head(h[:, -1]).clone()                           # (1,)
            out.append(tok)
            pos += x.shape[1]
            x = tok.view(1, 1)
        return torch.cat(out)


@dataclass
class Target:
    """The target model: body and dense greedy head in one call (one CUDA graph per length)."""
    runner: Runner

    def greedy(self, clock: Clock, ids: torch.Tensor, start: int, graph: bool = True) -> torch.Tensor:
        """Target argmax after each of ids (1,n) fed at `start`: (n,) on the device (a copy)."""
        with clock.span("call_target"):
            return self.runner.greedy(ids, start, graph).clone()


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
    spans_ms: dict = field(default_factory=dict)

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - 1                                         # tokens after the first


def prefill(target: Target, prompt: list[int]) -> torch.Tensor:
    """Target prompt prefill and first token (1,): TTFT, outside the decode clock."""
    ids = torch.tensor([prompt], device=target.runner.device)
    return target.runner.greedy(ids, 0, graph=False)[-1:]


def generate_baseline(target: Target, prompt: list[int], max_new: int) -> Result:
    """Target-only greedy decoding: prefill, then one single-token append per token."""
    dev = target.runner.device
    clock = Clock(dev)
    t0 = time.perf_counter()
    tok = prefill(target, prompt)
    first = tok.item()
    t1 = time.perf_counter()
    out, pos = [tok], len(prompt)
    with clock.span("decode"):
        for _ in range(max_new - 1):
            tok = target.greedy(clock, tok.view(1, 1), pos)
            out.append(tok)
            pos += 1
    tokens = torch.cat(out).tolist()
    t2 = time.perf_counter()
    assert tokens[0] == first
    return Result(tokens, 1000 * (t1 - t0), 1000 * (t2 - t1), append_calls=max_new - 1, spans_ms=clock.totals())


SCHEDULES = ("ordinary", "deferred", "pipelined")


class Appender:
    """The ordinary schedule's single-token target append, run inline or on a worker thread with its
    own CUDA stream (pipelined). result() returns the pending prediction (1,) on the main stream."""

    def __init__(self, target: Target, clock: Clock, pipelined: bool):
        self.target, self.clock = target, clock
        self.pool = ThreadPoolExecutor(1) if pipelined else None
        cuda = target.runner.device.type == "cuda"
        self.stream = torch.cuda.Stream(target.runner.device) if pipelined and cuda else None
        self.future = None

    def submit(self, ids: torch.Tensor, start: int) -> None:
        if self.pool is None:
            self.value = self._append(ids, start, None)
            return
        ready = None
        if self.stream is not None:
            ready = torch.cuda.Event()
            ready.record()                                                  # ids were written on the main stream
        self.future = self.pool.submit(self._append, ids, start, ready)

    def _append(self, ids: torch.Tensor, start: int, ready) -> torch.Tensor:
        if self.stream is None:
            with self.clock.span("finalize"):
                return self.target.greedy(self.clock, ids, start)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(ready)
            with self.clock.span("finalize"):
                out = self.target.greedy(self.clock, ids, start)
            done = torch.cuda.Event()
            done.record()
        return out, done

    def result(self) -> torch.Tensor:
        if self.pool is None:
            return self.value
        out = self.future.result()
        if self.stream is None:
            return out
        out, done = out
        torch.cuda.current_stream(self.target.runner.device).wait_event(done)
        return out

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()


def generate_speculative(target: Target, draft: Draft, prompt: list[int], max_new: int, k: int,
                         schedule: str) -> Result:
    """Greedy speculative decoding (one of SCHEDULES); output equals target greedy decoding.

    Emitted tokens live in a device buffer, so model inputs are sliced on the device; the host
    reads tokens once per round (the accepted length), never inside the proposal loop.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: use one of {SCHEDULES}")
    tdev, ddev = target.runner.device, draft.runner.device
    clock = Clock(tdev)
    P = len(prompt)
    t0 = time.perf_counter()
    buf = torch.zeros(P + max_new, dtype=torch.long, device=tdev)                  # prompt + emitted tokens
    buf[:P] = torch.tensor(prompt)
    seq = list(prompt)                                                              # host copy of buf
    first = prefill(target, prompt)
    seq.append(first.item())
    buf[P] = first[0]
    t1 = time.perf_counter()
    res = Result([], 1000 * (t1 - t0), 0.0)

    with clock.span("initial"):
        with clock.span("call_draft_prefill", ddev):
            draft.runner.forward(buf[None, :P].to(ddev), 0, graph=False)           # draft prefill
        pending = target.greedy(clock, buf[None, P:P + 1], P)                       # initial target append
    t_pos, d_pos = P + 1, P                                                         # tokens in each cache
    res.append_calls = 1
    appender = Appender(target, clock, schedule == "pipelined")
    appending = False                                                               # an append is in flight

    while len(seq) - P < max_new:
        n = len(seq)
        kk = min(k, max_new - (n - P) - 1)                                          # never overshoot max_new
        props = buf[n:n]                                                            # (0,) until proposed
        with clock.span("draft"):
            if kk > 0:
                props = draft.propose(clock, buf[None, d_pos:n].to(ddev), d_pos, kk).to(tdev)
                d_pos = n + kk - 1
        if appending:
            pending, appending = appender.result(), False                           # join the overlapped append
        with clock.span("verify"):
            if pending is not None:                                                 # target is up to date
                got = torch.cat([props[:1], pending]).tolist()                      # one sync
                if kk == 0 or got[0] != got[-1]:
                    res.skipped += kk > 0
                    a, final, new = 0, got[-1], pending
                else:
                    preds = target.greedy(clock, props[None], t_pos)                # (kk,) after each proposal
                    res.verify_calls += 1
                    got = torch.cat([props, preds]).tolist()                        # one sync
                    a = 1 + accepted_prefix(got[1:kk], got[kk:2 * kk - 1])
                    final, new = got[kk + a - 1], preds[a - 1:a]
            else:                                                                   # deferred: [final, d1..dK]
                preds = target.greedy(clock, torch.cat([buf[t_pos:n], props])[None], t_pos)   # (1+kk,)
                res.verify_calls += 1
                got = torch.cat([props, preds]).tolist()
                a = accepted_prefix(got[:kk], got[kk:2 * kk])
                final, new = got[kk + a], preds[a:a + 1]
        buf[n:n + a] = props[:a]
        buf[n + a:n + a + 1] = new
        seq += got[:a] + [final]
        t_pos = n + a                                                               # drop rejected positions
        d_pos = min(d_pos, n + a)
        res.rounds += 1
        res.proposed += kk
        res.accepted += a
        res.accepted_lengths.append(a)
        if schedule != "deferred" and len(seq) - P < max_new:
            appender.submit(buf[None, t_pos:t_pos + 1], t_pos)                      # single-token append
            pending, appending = None, True
            t_pos += 1
            res.append_calls += 1
        else:
            with clock.span("finalize"):                                            # nothing to append
                pending = None
    appender.close()
    sync(tdev)
    sync(ddev)
    res.decode_ms = 1000 * (time.perf_counter() - t1)
    res.tokens = seq[P:]
    res.spans_ms = clock.totals()
    return res


def accepted_prefix(proposed: list[int], predicted: list[int]) -> int:
    """Length of the longest prefix where the proposals equal the target's predictions."""
    a = 0
    for p, q in zip(proposed, predicted):
        if p != q:
            break
        a += 1
    return a
