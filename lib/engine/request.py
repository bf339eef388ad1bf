"""One generation request: what to generate and how, checked before any work; and what it produced (Result).

Every generation entry point (lib/engine/speculative.py) takes (target[, draft], request). A request needs no
model to be checked, except whether its tokens fit a runner's KV cache (check_cache, asked by the engine)."""
from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Integral

from .blocks import FixedK
from ..modes import ORDINARY, SCHEDULES


@dataclass(frozen=True)
class Request:
    """prompt: token ids (at least one). max_new: tokens to emit, the first (the prefill's) included.
    schedule: a round schedule of lib.modes.SCHEDULES (target-only generation has no rounds: it ignores it, and k).
    k: the block length, or a block-length policy (lib/engine/blocks.py) asked before and told after each round;
       a policy keeps state, so each generation needs its own.
    stop: tokens that end the generation where one is emitted (it is emitted too).
    temperature: 0 is greedy decoding; above 0 each token is sampled from softmax(logits / temperature),
       cut to the top_p nucleus, with torch generators seeded with `seed` (the same seed, the same tokens).
    draw_probes: FlashHead's sampling proposal draws its probe clusters, or probes its own top ones
       (lib/engine/sampling.py, FlashSampler)."""
    prompt: tuple
    max_new: int
    schedule: str = ORDINARY
    k: object = 1
    stop: frozenset = frozenset()
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    draw_probes: bool = True

    def __post_init__(self):
        prompt = tuple(self.prompt)                                          # frozen: held as tuple and frozenset
        need(all(isinstance(t, Integral) or getattr(t, "ndim", None) == 0 and isinstance(t.item(), Integral)
                 for t in prompt), f"the prompt must be a flat sequence of token ids, got {str(self.prompt)[:60]}")
        object.__setattr__(self, "prompt", tuple(int(t) for t in prompt))    # a tensor's or an array's ids too
        object.__setattr__(self, "stop", frozenset(int(t) for t in self.stop))  # ints: a tensor hashes by identity
        need(len(self.prompt) >= 1, "a request needs at least 1 prompt token")
        need(isinstance(self.max_new, Integral), f"max_new must be an integer, got {self.max_new!r}")
        object.__setattr__(self, "max_new", int(self.max_new))
        need(self.max_new >= 1, f"max_new must be >= 1, got {self.max_new}")
        need(self.schedule in SCHEDULES, f"unknown schedule {self.schedule!r}: use one of {list(SCHEDULES)}")
        if isinstance(self.k, Integral):
            object.__setattr__(self, "k", int(self.k))                      # numpy's integers too
        need(isinstance(self.k, int) or all(hasattr(self.k, a) for a in ("next", "update", "k_max")),
             f"k must be a block length (an integer) or a block-length policy (lib/engine/blocks.py), got {self.k!r}")
        k = self.k if isinstance(self.k, int) else self.k.k_max
        need(k >= 1, f"block length k must be >= 1, got {k}")
        need(self.temperature >= 0, f"temperature must be > 0 for sampling (0 is greedy), got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def policy(self):
        """The block-length policy of this request's rounds (a fixed K where k is a number)."""
        return FixedK(self.k) if isinstance(self.k, int) else self.k

    def check_cache(self, max_len: int) -> None:
        """Refuse a request whose prompt and new tokens do not fit a KV cache of max_len positions."""
        n = len(self.prompt) + self.max_new
        need(n <= max_len, f"a prompt of {len(self.prompt)} tokens and {self.max_new} new tokens need {n} "
                           f"cache positions; the runner holds {max_len}")


def need(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class Result:
    """What a generation produced: its tokens, times (ms) and round counters, and the engine's spans."""
    tokens: list[int]
    ttft_ms: float
    decode_ms: float
    rounds: int = 0
    proposed: int = 0
    accepted: int = 0
    verify_calls: int = 0
    append_calls: int = 0
    skipped: int = 0
    launched_ahead: int = 0                                                 # rounds whose block was launched ahead
    appended_ahead: int = 0                                                 # rounds whose append was launched ahead
    accepted_lengths: list[int] = field(default_factory=list)
    block_lengths: list[int] = field(default_factory=list)                  # proposals per round
    choices: list[str] = field(default_factory=list)                        # bandit drafts: the arm of each round
    probe_counts: list[int] = field(default_factory=list)                   # adaptive FlashHead: steps per probe count
    spans_ms: dict = field(default_factory=dict)
    stopped: bool = False                                                   # ended at a stop token

    @property
    def decode_tokens(self) -> int:
        return len(self.tokens) - 1                                         # tokens after the first
