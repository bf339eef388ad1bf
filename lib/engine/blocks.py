"""Block-length policies: how many tokens the draft proposes in each round (thesis 5.3, adaptive K).

A policy answers next() before each round and hears update(proposed, accepted) after it. All three
leave the output equal to greedy decoding; only the rounds change.
  fixed  K every round (the thesis).
  grow   Hugging Face's assisted-generation heuristic: K += 2 after a fully accepted round, K -= 1
         otherwise, at least 1 (and at most k_max).
  cost   the K that maximises expected tokens per millisecond under the study's cost model: E[R](a, K) /
         ((1 - s) T_p(K or K+1) + K T_q + T_o), with a the running estimate of the per-token acceptance,
         s = 1 - a the chance that the ordinary schedule skips the verify call (0 when deferred), and the
         per-call costs measured in notebooks 02-03.
"""
from __future__ import annotations

from typing import ClassVar

from ..modes import COST, FIXED, GROW


class FixedK:
    varies: ClassVar[bool] = False                     # K may change from round to round (GrowK, CostK)

    def __init__(self, k: int):
        self.k = self.k_max = k

    def next(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        pass


class GrowK(FixedK):
    varies: ClassVar[bool] = True

    def __init__(self, k: int, k_max: int):
        self.k, self.k_max = max(min(k, k_max), 1), k_max                  # in 1..k_max, as after update

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.k = min(self.k + 2, self.k_max) if accepted == proposed else max(self.k - 1, 1)


class CostK(FixedK):
    """The cost model's K, at the posterior-mean per-token acceptance alpha (the probability that the
    target accepts a proposal it judges; costmodel.expected_emitted's alpha). The target judges a round's
    proposals only up to the first rejection: a round of K proposals with a accepted judged a + 1 of them
    if a < K (the last one rejected, including the ordinary schedule's early skip: 1 judged, 0 accepted)
    and K if a = K; the proposals after a rejection say nothing. So alpha is estimated as accepted /
    judged (with a Beta(1, 1) prior), not accepted / proposed, which counts the unjudged ones as failures
    and underestimates it (0.70 accepted / proposed at K = 6 is a per-token rate near 0.9)."""

    varies: ClassVar[bool] = True

    def __init__(self, k: int, k_max: int, costs: dict, schedule: str):
        self.k, self.k_max, self.costs, self.schedule = k, k_max, costs, schedule
        self.accepted = self.judged = 0

    def alpha(self) -> float:
        """Posterior mean of the per-token acceptance under a Beta(1, 1) prior."""
        return (self.accepted + 1) / (self.judged + 2)

    def next(self) -> int:
        from ..costmodel import expected_emitted, skip_share, tpot_ms
        alpha = self.alpha()                                               # expected tokens per ms for each K
        skip = skip_share(alpha, self.schedule)
        rate = {k: 1 / tpot_ms(self.costs, k, expected_emitted(alpha, k), self.schedule, skip)
                for k in range(1, self.k_max + 1)}
        self.k = max(rate, key=rate.get)
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        self.accepted += accepted
        self.judged += accepted + (accepted < proposed)                  # up to and including the first rejection


def make_policy(name: str, k: int, k_max: int, schedule: str, costs: dict | None = None):
    """The policy `name` ('fixed', 'grow' or 'cost'; lib.modes.K_POLICIES) for one generation."""
    if name == FIXED:
        return FixedK(k)
    if name == GROW:
        return GrowK(k, k_max)
    if name == COST:
        if costs is None:
            raise ValueError("block policy 'cost' needs measured call costs (notebooks 02 and 03 write them)")
        top = max(costs["T_p"]) - 1                                          # deferred verifies K+1 tokens
        return CostK(k, min(k_max, top), costs, schedule)
    raise ValueError(f"unknown block policy {name!r}")
