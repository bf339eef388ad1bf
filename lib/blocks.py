"""Block-length policies: how many tokens the draft proposes in each round (thesis 5.3, adaptive K).

A policy answers next() before each round and hears update(proposed, accepted) after it. All three
leave the output equal to greedy decoding; only the rounds change.
  fixed  K every round (the thesis).
  grow   Hugging Face's assisted-generation heuristic: K += 2 after a fully accepted round, K -= 1
         otherwise, at least 1 (and at most k_max).
  cost   the K that maximises expected tokens per millisecond under the study's cost model: E[R](a, K) /
         (T_p(K or K+1) + K T_q + T_o), with a the running acceptance estimate (a Beta(1,1) prior on the
         counts so far) and the per-call costs measured in notebooks 02-03.
"""
from __future__ import annotations

from .modes import COST, FIXED, GROW


class FixedK:
    def __init__(self, k: int):
        self.k = self.k_max = k

    def next(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        pass


class GrowK(FixedK):
    def __init__(self, k: int, k_max: int):
        self.k, self.k_max = min(k, k_max), k_max

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self.k = min(self.k + 2, self.k_max) if accepted == proposed else max(self.k - 1, 1)


class CostK(FixedK):
    def __init__(self, k: int, k_max: int, costs: dict, schedule: str):
        self.k, self.k_max, self.costs, self.schedule = k, k_max, costs, schedule
        self.accepted = self.proposed = 0

    def next(self) -> int:
        from .costmodel import expected_emitted, tpot_ms
        # Expected tokens per ms for each K, at the posterior-mean acceptance of the rounds so far.
        alpha = (self.accepted + 1) / (self.proposed + 2)
        rate = {k: 1 / tpot_ms(self.costs, k, expected_emitted(alpha, k), self.schedule) for k in range(1, self.k_max + 1)}
        self.k = max(rate, key=rate.get)
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted


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
