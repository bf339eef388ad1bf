# The cost block-length policy's acceptance estimate (lib/engine/blocks.py CostK, issue 22 item 2).
import random

import pytest

from lib.engine.blocks import CostK
from lib.costmodel import expected_emitted, skip_share

COSTS = {"T_p": {n: 10.0 + n for n in range(1, 9)}, "T_q": 1.0}


def simulate(policy: CostK, alpha: float, rounds: int, seed: int, k: int | None = None) -> tuple[int, int]:
    """Rounds of a draft whose proposals the target accepts independently with probability alpha, up to
    the first rejection (the rest of the block is discarded unjudged); returns (accepted, proposed)."""
    rng = random.Random(seed)
    accepted = proposed = 0
    for _ in range(rounds):
        kk = k or policy.next()
        a = 0
        while a < kk and rng.random() < alpha:
            a += 1
        policy.update(kk, a)
        accepted, proposed = accepted + a, proposed + kk
    return accepted, proposed


@pytest.mark.parametrize("alpha", [0.3, 0.7, 0.9])
@pytest.mark.parametrize("k", [6, None])                                 # a fixed block, or the policy's own K
def test_cost_policy_estimates_the_per_token_acceptance(alpha, k):
    p = CostK(6, 7, COSTS, "deferred")
    accepted, proposed = simulate(p, alpha, 2000, seed=int(alpha * 10), k=k)
    assert p.alpha() == pytest.approx(alpha, abs=0.02)
    if k is not None:       # (the policy's own K is 1 at low acceptance, where the two estimates agree)
        # the old estimate, accepted / proposed (Beta(1, 1) prior), counts the unjudged proposals as failures
        assert abs((accepted + 1) / (proposed + 2) - alpha) > 0.02


def test_an_early_skip_counts_one_judged_proposal():
    p = CostK(6, 6, COSTS, "ordinary")
    p.update(6, 0)                                                       # first proposal rejected: verify skipped
    p.update(6, 6)                                                       # all accepted: no rejection judged
    p.update(6, 2)                                                       # two accepted, the third rejected
    p.update(0, 0)                                                       # nothing left to propose
    assert (p.accepted, p.judged) == (8, 1 + 6 + 3)
    assert p.alpha() == pytest.approx(9 / 12)


def test_cost_policy_counts_the_ordinary_schedules_skipped_verify():
    # Ordinary schedule: a round skips its verify call when the first proposal is rejected (probability
    # 1 - alpha), so a round costs alpha T_p(K) + K T_q + T_o, not T_p(K) + K T_q + T_o.
    costs = {"T_p": {n: 30.0 for n in range(1, 9)}, "T_q": 1.0}
    p = CostK(4, 7, costs, "ordinary")
    for _ in range(20):
        p.update(2, 1)                                                   # one accepted, one rejected: alpha 1/2
    assert p.alpha() == pytest.approx(0.5)
    rate = lambda skip: {k: expected_emitted(0.5, k) / ((1 - skip) * 30 + k + 30) for k in range(1, 8)}
    with_skip, without = rate(skip_share(0.5, "ordinary")), rate(0.0)
    assert max(with_skip, key=with_skip.get) == 4 and max(without, key=without.get) == 5
    assert p.next() == 4
    assert skip_share(0.5, "deferred") == 0                              # only a deferred first round can skip
