"""Adaptive drafts (issue 14): a FlashHead that chooses its probe count per step, and a drafter chosen
online each round by a bandit among heads on one draft body. Both leave the output equal to greedy decoding.

  flash_adaptive   AdaptiveFlashHead: score the centroids, take the top p_max (best first), and keep the
                   smallest p whose softmax mass over those p_max scores reaches `threshold` (clamped to
                   [p_min, p_max]); candidates of probes beyond p get logit -inf. Shapes are static (it
                   computes at p_max), so it never synchronises with the host and can be graph-captured;
                   the count of steps per p is kept on the device and read after the generation.
  bandit_ucb       UCB1 / Gaussian Thompson sampling over arms = greedy heads on one shared draft body
  bandit_thompson  (the dense head and FlashHead at several probe counts). All arms share the body and its
                   KV cache, so switching arms between rounds costs nothing and every arm has seen the same
                   tokens. Reward: tokens emitted in a round per ms of that round's wall time (each round ends
                   with a host read of the verified tokens, so on a GPU the host clock is synchronised).
Both choose and record through the round loop's draft hooks (lib/engine/rounds.py): AdaptiveProbeDraft counts
its probes per generation (Result.probe_counts); BanditDraft picks the head before each round and rewards it after
(Result.choices). Early-exit drafts of other depths are not arms: a shallower body leaves the deeper layers' caches behind,
and catching them up would be a cost the other arms do not pay.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from .heads import FlashHead
from .request import Result
from .rounds import Draft


class AdaptiveFlashHead(FlashHead):
    """FlashHead whose probe count p is chosen per hidden state from the centroid scores (see module doc).
    counts[p] (device tensor) counts the steps that used p probes since the last reset().
    It runs torch ops only, on every device and whatever bench.head_kernel says (there is no Triton kernel for the
    masked probes): kernel_ran is "torch", and so its records say, beside a FlashHead draft that may run Triton."""

    def __init__(self, head: FlashHead, threshold: float, p_min: int, p_max: int, temperature: float = 1.0):
        c = head.n_clusters
        if not 1 <= p_min <= p_max <= c:
            raise ValueError(f"adaptive FlashHead: need 1 <= p_min <= p_max <= {c} clusters, got p_min={p_min}, p_max={p_max}")
        if not 0.0 <= threshold <= 1.0:
            raise ValueError(f"adaptive FlashHead: threshold must be in [0, 1], got {threshold}")
        if temperature <= 0:
            raise ValueError(f"adaptive FlashHead: temperature must be > 0, got {temperature}")
        self.__dict__.update(head.__dict__)
        self.kernel, self.threshold, self.p_min, self.temperature = "torch", threshold, p_min, temperature
        self.set_probes(p_max)                                              # computes at p_max, torch path only
        self.counts = torch.zeros(p_max + 1, dtype=torch.long, device=self.weight.device)

    def chosen(self, scores: torch.Tensor) -> torch.Tensor:
        """Probe counts (n,) from the top-p_max centroid scores (n,p_max), best first."""
        n, P = scores.shape
        if self.threshold >= 1.0:                                           # all the mass: every probe
            return torch.full((n,), P, dtype=torch.long, device=scores.device)
        mass = torch.softmax(scores.float() / self.temperature, -1).cumsum(-1)
        p = 1 + (mass[:, :-1] < self.threshold).sum(-1)                    # the first prefix reaching the threshold
        return p.clamp(self.p_min, P)

    def scored(self, h: torch.Tensor):
        """(candidate ids (n,m), which of them are scored (n,m) bool, probe counts (n,)) for h (n,d)."""
        v, probes = (h @ self.centroids.T).topk(self.n_probes, dim=-1)      # sorted: best cluster first
        p = self.chosen(v)
        n, b = h.shape[0], self.c2t.shape[1]
        cand = torch.cat([self.c2t[probes].flatten(1), self.special.expand(n, -1)], dim=1)
        rank = torch.arange(self.n_probes, device=h.device).repeat_interleave(b)
        keep = torch.cat([rank[None] < p[:, None], torch.ones_like(self.special, dtype=torch.bool).expand(n, -1)], dim=1)
        return cand, keep, p

    def reference(self, h: torch.Tensor) -> torch.Tensor:
        cand, keep, p = self.scored(h)
        cand, order = cand.sort(dim=1)                                      # argmax ties: the smallest id, as the dense head
        keep = keep.gather(1, order)
        self.counts.index_add_(0, p, torch.ones_like(p))                   # on the device: no host sync
        logits = torch.einsum("nmd,nd->nm", self.weight[cand], h).masked_fill(~keep, float("-inf"))
        return cand.gather(1, logits.argmax(-1, keepdim=True)).squeeze(1)

    def reset(self) -> None:
        self.counts.zero_()

    def probe_counts(self) -> list[int]:
        """Steps per probe count since reset() (index p); reads the device once."""
        return self.counts.tolist()


def mean_probes(counts: list[int]) -> float:
    steps = sum(counts)
    return sum(p * c for p, c in enumerate(counts)) / steps if steps else float("nan")


# ---------------------------------------------------------------- bandits

class UCB1:
    """UCB1 (Auer, Cesa-Bianchi and Fischer 2002): every arm once, then the arm maximising mean reward +
    c * scale * sqrt(2 ln t / n), with scale the largest reward seen (rewards are not bounded by 1)."""

    def __init__(self, arms: list[str], c: float = 1.0):
        if len(arms) < 2 or len(set(arms)) != len(arms):
            raise ValueError(f"a bandit needs at least two distinct arms, got {arms}")
        self.arms, self.c = list(arms), c
        self.n = {a: 0 for a in arms}
        self.sum = {a: 0.0 for a in arms}
        self.top = 0.0

    def untried(self) -> str | None:
        return next((a for a in self.arms if self.n[a] == 0), None)

    def choose(self) -> str:
        if self.untried() is not None:
            return self.untried()
        t = sum(self.n.values())
        bonus = lambda a: self.c * self.top * math.sqrt(2 * math.log(t) / self.n[a])
        return max(self.arms, key=lambda a: self.sum[a] / self.n[a] + bonus(a))

    def update(self, arm: str, reward: float) -> None:
        if arm not in self.n:
            raise ValueError(f"unknown arm {arm!r}; arms: {self.arms}")
        self.n[arm] += 1
        self.sum[arm] += reward
        self.top = max(self.top, reward)


class Thompson(UCB1):
    """Gaussian Thompson sampling: every arm once, then the arm whose draw from N(mean, s^2 / n) is largest,
    with s the pooled standard deviation of the rewards around their arms' means (flat prior)."""

    def __init__(self, arms: list[str], seed: int = 0):
        super().__init__(arms)
        self.sq, self.rng = {a: 0.0 for a in arms}, random.Random(seed)

    def choose(self) -> str:
        if self.untried() is not None:
            return self.untried()
        mean = {a: self.sum[a] / self.n[a] for a in self.arms}
        dof = sum(self.n.values()) - len(self.arms)
        ss = sum(self.sq[a] - self.n[a] * mean[a] ** 2 for a in self.arms)
        s = math.sqrt(max(ss, 0.0) / dof) if dof > 0 else self.top           # too few rounds: a wide posterior
        return max(self.arms, key=lambda a: mean[a] + s / math.sqrt(self.n[a]) * self.rng.gauss(0, 1))

    def update(self, arm: str, reward: float) -> None:
        super().update(arm, reward)
        self.sq[arm] += reward * reward


@dataclass
class AdaptiveProbeDraft(Draft):
    """A draft whose head is an AdaptiveFlashHead: each generation records its steps per probe count
    (Result.probe_counts), so it proposes step by step."""
    blocks: ClassVar[bool] = False

    def begin_generation(self) -> None:
        self.head.head.reset()

    def end_generation(self, res: Result) -> None:
        res.probe_counts = self.head.head.probe_counts()


@dataclass
class BanditDraft(Draft):
    """A draft whose head is one of `arms` (name -> GraphedHead, all on `runner`), chosen before each round by
    `bandit` (the round loop's begin_round); the bandit keeps learning across the generations of this draft.
    A round is rewarded with its emitted tokens per ms, its time running from its start to the next round's
    start (or to its own end, for the last round); Result.choices records the arm of each round."""
    per_round: ClassVar[bool] = True
    arms: dict = field(default_factory=dict)
    bandit: UCB1 | None = None
    choices: list = field(default_factory=list, init=False, repr=False, compare=False)
    open: list | None = field(default=None, init=False, repr=False, compare=False)   # [arm, start, emitted, end]

    def use_clock(self, clock) -> None:
        self.runner.clock = clock
        for h in self.arms.values():
            h.clock = clock

    def warm(self, k_max: int) -> None:
        for h in self.arms.values():                                         # every arm's proposal blocks
            Draft(self.runner, h).warm(k_max)

    @property
    def kernel_ran(self) -> str:
        """The arms' kernel path ("triton" or "torch"), or "mixed (<arm>: <path>, ...)" where the arms differ."""
        ran = {a: h.kernel_ran for a, h in self.arms.items()}
        paths = set(ran.values())
        return paths.pop() if len(paths) == 1 else "mixed (" + ", ".join(f"{a}: {k}" for a, k in ran.items()) + ")"

    def begin_generation(self) -> None:
        self.choices, self.open = [], None

    def begin_round(self) -> None:
        """Reward the previous round up to now, then let the bandit pick this round's head."""
        now = time.perf_counter()
        self.close(now)
        arm = self.bandit.choose()
        self.head = self.arms[arm]
        self.choices.append(arm)
        self.open = [arm, now, None, None]

    def end_round(self, proposed: int, accepted: int) -> None:
        if proposed:                                                         # a round with no room used no arm
            self.open[2:] = [accepted + 1, time.perf_counter()]

    def end_generation(self, res: Result) -> None:
        self.close()
        res.choices = self.choices

    def close(self, now: float | None = None) -> None:
        if self.open is not None and self.open[2] is not None:
            arm, t0, emitted, t1 = self.open
            self.bandit.update(arm, emitted / max(1000 * ((now or t1) - t0), 1e-9))
        self.open = None
