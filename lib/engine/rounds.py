"""The round loop of speculative decoding, one for greedy decoding and speculative sampling.

Each model keeps its own static KV cache and a count of the tokens in it. The target also keeps its pending
prediction (what comes after the last token it has seen) while that is known.

A round: the draft catches up on the tokens it has not seen and proposes kk of them (the request's block-length
policy picks kk); the target judges them, against the pending prediction where it is known (a first proposal
it rejects then costs no verify call) or in the deferred batch [final, d1..dk]; the accepted proposals and the
round's final token are emitted; both caches roll back to the emitted tokens; then, unless the schedule
defers it, the target appends the final token, which gives the next round's pending prediction.
Schedules (thesis 3.3 and 3.6; names and labels in lib/modes.py):
  ordinary  the append runs inline after each round.
  deferred  no append: the final token rides in the next round's verify batch, whose first output replaces the
            pending prediction (known only in the first round, after the initial append).
  pipelined the ordinary append on its own CUDA stream (a CPU: a worker thread) while the draft catches up and
            proposes the next block (thesis 3.6.1): a round costs about max(append, draft), not their sum.

What greedy decoding and sampling do differently is a decision rule (Greedy in lib/engine/speculative.py,
Sampling in lib/engine/sampling.py): first(target, prompt) the prefill and first token (1,); append(target, ids,
start) one token fed, the pending prediction after it (greedy the argmax (1,), sampling p_1 (V,)); token(pending)
the next token of target-only generation; propose(draft, s, kk) the proposals (kk,) and what judging them needs
(greedy None, sampling their q); verify(target, props, q, pending, s, kk) -> (accepted proposals as host ids,
final token id, final token (1,) on the device, whether the target was called), pending None: the deferred batch.
Deferred greedy rounds of a plain draft at a fixed K on a GPU launch the next round's block before the verify
result is read (Rounds.launch_next; Result.launched_ahead counts the rounds that used it); ordinary greedy rounds on
a GPU launch the final token's append there (Rounds.launch_append), so the target's GPU goes from the verify to the
append.

Drafts may choose something per round (lib/engine/adaptive.py): the loop calls draft.begin_round() before each
round and draft.end_round(proposed, accepted) after it, and draft.begin_generation() / end_generation(result)
around the rounds. Timing: runners and heads record their calls on the engine's clock; the loop its phases.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..modes import DEFERRED, ORDINARY, PIPELINED
from ..bench import HostCopy
from .appender import Appender
from .heads import GraphedHead
from .request import Result
from .runner import Runner


@dataclass
class Draft:
    """A draft model: its runner and its greedy head (dense or FlashHead), graph-captured on CUDA.
    The hooks the round loop calls do nothing here; adaptive drafts choose and record in them.
    blocks: with CUDA graphs a round's greedy proposals are one graph replay (Runner.chain), not one per step;
    drafts that record something per step (adaptive probes) propose step by step.
    per_round: the draft chooses its head in begin_round (bandits), so no block can be launched before it."""
    runner: Runner
    head: GraphedHead
    blocks: ClassVar[bool] = True
    per_round: ClassVar[bool] = False

    @property
    def chained(self) -> bool:
        """Whether a round's greedy proposals are one graph replay (blocks, and the runner has CUDA graphs)."""
        return self.blocks and self.runner.graphs

    def warm(self, k_max: int) -> None:
        """Capture every proposal block a round can run: a catch-up of 1 or 2 tokens, 1..k_max proposals."""
        if self.chained:
            for m in (1, 2):
                for kk in range(1, k_max + 1):
                    self.runner.warm_chain(self.head.head, m, kk)

    def use_clock(self, clock) -> None:
        """Record this draft's calls on `clock` (the target's: one clock per generation)."""
        self.runner.clock = self.head.clock = clock

    def begin_generation(self) -> None:
        pass

    def begin_round(self) -> None:
        pass

    def end_round(self, proposed: int, accepted: int) -> None:
        pass

    def end_generation(self, res: "Result") -> None:
        pass


@dataclass
class Target:
    """The target model: body and dense greedy head in one call (one CUDA graph per length)."""
    runner: Runner

    def greedy(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Target argmax after each of ids (1,n) fed at `start`: (n,) on the device (a copy)."""
        return self.runner.greedy(ids, start).clone()


class Sequence:
    """The emitted tokens of one generation, on the device (buf, model inputs are sliced from it) and
    on the host (seq), with the number of tokens in each model's KV cache."""

    def __init__(self, prompt, first: torch.Tensor, max_new: int, stop: frozenset):
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


def to_device(x: torch.Tensor, draft: Draft, device=None) -> torch.Tensor:
    """Tokens to the draft's device (or back to `device`); between two GPUs the copy is timed as 'transfer'."""
    device = device or draft.runner.device
    if x.device == device:
        return x
    with draft.runner.clock.span("transfer", x.device):
        return x.to(device)


def start(target: Target, draft: Draft, rule, s: Sequence):
    """Draft prefill and the target's append of the first token: returns the pending prediction."""
    P = s.prompt_len
    draft.runner.fill(to_device(s.buf[None, :P], draft))
    s.t_pos, s.d_pos = P + 1, P
    return rule.append(target, s.buf[None, P:P + 1], P)


def propose_stepwise(draft: Draft, s: Sequence, kk: int, pick) -> tuple[torch.Tensor, list]:
    """The draft catches up on the tokens it has not seen (buf[d_pos:n]), then proposes kk tokens, each
    chosen by pick(h) -> (token (1,), what judging it needs) from the draft's last hidden state (1,d).
    Returns the tokens (kk,) on the target's device and the list of what pick returned beside them.
    Feeds the catch-up and the first kk-1 proposals (the last is never fed); no host reads."""
    n = len(s.seq)
    if kk == 0:
        return s.buf[n:n], []                                                # (0,): nothing to propose
    x, pos, toks, extras = to_device(s.buf[None, s.d_pos:n], draft), s.d_pos, [], []
    for _ in range(kk):
        tok, extra = pick(draft.runner.forward(x, pos)[:, -1])
        toks.append(tok)
        extras.append(extra)
        pos += x.shape[1]
        x = tok.view(1, 1)
    s.d_pos = n + kk - 1
    return to_device(torch.cat(toks), draft, s.buf.device), extras


def propose_block(draft: Draft, s: Sequence, kk: int) -> torch.Tensor:
    """Greedy proposals as propose_stepwise makes them (the draft's head picks each), in one graph replay (Runner.chain)."""
    n = len(s.seq)
    if kk == 0:
        return s.buf[n:n]
    toks = draft.runner.chain(draft.head.head, to_device(s.buf[None, s.d_pos:n], draft), s.d_pos, kk)
    return block_proposals(draft, s, toks.clone(), kk)


def block_proposals(draft: Draft, s: Sequence, block: torch.Tensor, kk: int) -> torch.Tensor:
    """The first kk tokens of a proposal block the draft made (this round, or launched ahead: a greedy block's prefix
    is the shorter block), on the sequence's device; the draft's cache then holds the positions before the last."""
    s.d_pos = len(s.seq) + kk - 1
    return to_device(block[:kk], draft, s.buf.device)


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


def accepted_on_device(proposed: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """accepted_prefix (lib/engine/speculative.py) counted on the device: a 0-dim tensor, no host read."""
    return (proposed == predicted).cumprod(0).sum()


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


# Where launching ahead pays: a GPU runs the block while the host reads the verify result (and target-only decoding's
# next call while the host reads a token); on a CPU the work would only move earlier, fed a token more (tests add
# "cpu" to run the path there).
AHEAD_DEVICES = ("cuda",)


class Rounds:
    """The rounds of one speculative generation after the prefill, under `rule` (see the module doc): they
    fill s (the emitted tokens) and res (the counters). Tokens reach the host only in verify, never inside
    the proposal loop."""

    def __init__(self, target: Target, draft: Draft, rule, request, s: Sequence, res: Result):
        self.target, self.draft, self.rule, self.request, self.s, self.res = target, draft, rule, request, s, res
        self.policy, self.clock = request.policy(), target.runner.clock
        self.appender = Appender(target, rule, request.schedule == PIPELINED)
        self.pending = None                                                  # the target's pending prediction, if known
        # deferred greedy rounds of a block-proposing draft that chooses nothing per round, at a fixed K, on a device
        # that runs the launched block while the host waits (the target's GPU or its own): the next block launched ahead
        self.ahead = (request.schedule == DEFERRED and getattr(rule, "ahead", False) and draft.blocks
                      and not draft.per_round and not self.policy.varies and draft.runner.device.type in AHEAD_DEVICES)
        self.early = None                                                    # (kk, proposals) launched ahead
        self.reader = HostCopy()                           # the verify result read past what is launched after it
        self.append_ahead = (request.schedule == ORDINARY and getattr(rule, "ahead", False)
                             and target.runner.device.type in AHEAD_DEVICES)
        self.appended = False                                                # this round's append launched ahead
        self.verifying = None                                                # the verify phase's start mark

    def run(self) -> None:
        if self.s.done():       # the first token ended it (stop token, max_new 1): no call past the prefill
            return self.appender.close()
        self.draft.begin_generation()
        with self.clock.span("initial"):
            self.pending = start(self.target, self.draft, self.rule, self.s)
        self.res.append_calls += 1                                           # the first token's
        try:
            while not self.s.done():
                self.round()
        finally:
            self.appender.close()
        self.draft.end_generation(self.res)

    def round(self) -> None:
        """Propose, verify, emit, roll back, append the final token (unless deferred)."""
        s, clock, n = self.s, self.clock, len(self.s.seq)
        self.draft.begin_round()
        kk = min(self.policy.next(), s.max_new - s.emitted - 1)              # never overshoot max_new
        with clock.span("draft"):
            props, q = self.proposals(kk)
        if self.appender.in_flight:
            self.pending = self.appender.result()                            # join the overlapped append
        then = ({"then": self.launch_next} if self.ahead and self.pending is None else
                {"then": self.launch_append} if self.append_ahead and self.pending is not None else {})
        self.verifying = clock.mark()                            # launch_next or launch_append ends the phase early
        accepted, final, final_dev, verified = self.rule.verify(self.target, props, q, self.pending, s, kk, **then)
        if self.verifying is not None:
            clock.close("verify", self.verifying)
        a = accept(s, props, accepted, final, final_dev, self.request.stop)
        count_round(self.res, kk, a, verified)
        self.policy.update(kk, a)
        self.draft.end_round(kk, a)
        roll_back(s, n, a)
        self.pending = None                                                  # unknown until the final token is fed
        self.append()

    def proposals(self, kk: int):
        """This round's proposals: the first kk of the block launched ahead (launch_next), else the rule's. A
        greedy block's first kk proposals are those of a block of kk; its cache entries past them are written
        again before anything reads them, as after a rejection."""
        early, self.early = self.early, None
        if early is None or early[0] < kk:
            return self.rule.propose(self.draft, self.s, kk)
        self.res.launched_ahead += 1
        return block_proposals(self.draft, self.s, early[1], kk), None

    def launch_next(self, batch: torch.Tensor, preds: torch.Tensor, got: torch.Tensor) -> list[int]:
        """Deferred greedy rounds (rule.verify's `then`; batch [final, d1..dk] verified at t_pos, preds its argmaxes):
        launch the next round's block before the host reads this round's result (returned as host ids), fed two
        tokens at t_pos + a, a counted on the device: batch[a] (cached already, written again, unless all were
        accepted: the last proposal is never fed) and the final preds[a]: the next round's own block's catch-up, so
        its proposals where a two-token step is bitwise two one-token steps (the fused step's is). Only where a
        next round follows whatever a is (short of a stop token), so that no block is thrown away."""
        s, kk, runner = self.s, self.policy.k, self.draft.runner
        a = accepted_on_device(batch[1:], preds[:-1]).view(1)                # on the device: no host read (nor
        host = self.reader.queue(got)                                        # below: gathers, not indexing by a)
        self.clock.close("verify", self.verifying)                           # the block is the next round's draft
        self.verifying = None
        emits = s.emitted + len(batch)                                       # at most: all accepted, and the final
        if emits + 2 <= s.max_new and s.t_pos + 2 * kk + 1 <= runner.max_len:   # then a round of >= 1 proposal
            with self.clock.span("draft"):
                # on its own GPU: one copy, after which the draft's stream waits for the verify (no host read), so
                # the block's own span starts there; the target's GPU waits for the block where the next round
                # takes it, timed there as that round's draft
                fed = to_device(torch.cat([batch.index_select(0, a), preds.index_select(0, a), s.t_pos + a]),
                                self.draft)
                toks = runner.chain(self.draft.head.head, fed[None, :2], fed[2], kk)
                self.early = (kk, toks.clone())
        return self.reader.read(host)

    def launch_append(self, props: torch.Tensor, preds: torch.Tensor, got: torch.Tensor) -> list[int]:
        """Ordinary greedy rounds (rule.verify's `then` after a verify call: d1 accepted, preds p1..pk): launch the
        append of the final token p_a at t_pos + a, a counted on the device, before the host reads this round's result
        (returned as host ids). Only where the round cannot end the generation by its length; a stop token among its
        tokens is known only after the launch, and that append is then thrown away (see append)."""
        s = self.s
        host = self.reader.queue(got)
        kk, runner = len(props), self.target.runner
        if s.emitted + kk + 1 < s.max_new and s.t_pos + kk + 1 <= runner.max_len:   # the append's bound: a <= kk
            a = 1 + accepted_on_device(props[1:], preds[:-1])                # d_{i+1} accepted while it equals p_i
            self.clock.close("verify", self.verifying)
            self.verifying, self.appended = None, True
            self.res.appended_ahead += 1
            self.appender.submit(preds.index_select(0, (a - 1).view(1))[None], s.t_pos + a)
        return self.reader.read(host)

    def append(self) -> None:
        """Feed the round's final token to the target (ordinary, pipelined): its output is the next pending."""
        s, appended, self.appended = self.s, self.appended, False
        if appended and s.done():           # launched ahead in a round a stop token ended: its output is thrown away,
            return                          # so it is not one of the generation's append calls (appended_ahead has it)
        if not appended:                                                    # (else launched by launch_append)
            if self.request.schedule == DEFERRED or s.done():
                with self.clock.span("finalize"):                            # nothing to append
                    pass
                return
            self.appender.submit(s.buf[None, s.t_pos:s.t_pos + 1], s.t_pos)
        s.t_pos += 1
        self.res.append_calls += 1
