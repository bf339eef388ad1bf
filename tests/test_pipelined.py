"""The pipelined ordinary schedule (thesis 3.6.1) emits the same tokens with the same counters as
the serial ordinary schedule: only the timing of the target append changes."""
import pytest

from lib import heads, speculative as sp
from lib.engines import make_draft, make_target

FIELDS = ("tokens", "rounds", "proposed", "accepted", "verify_calls", "append_calls", "skipped", "accepted_lengths")


@pytest.fixture(scope="module")
def engines(pair, draft_clustering):
    target, draft = pair
    W, cents, assign = draft_clustering
    flash = heads.FlashHead(W, cents, assign, 2, [0])                      # few probes: differs from dense
    mk = lambda head: make_draft(draft, head, 96)
    return make_target(target, 96), {"dense": mk(heads.DenseHead(W)), "flash": mk(flash)}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("head", ["dense", "flash"])
def test_pipelined_equals_serial_ordinary(engines, k, head):
    target, drafts = engines
    for prompt in ([5, 17, 200, 33], list(range(40, 71))):
        serial = sp.generate_speculative(target, drafts[head], prompt, 20, k, "ordinary")
        piped = sp.generate_speculative(target, drafts[head], prompt, 20, k, "pipelined")
        assert serial.tokens == sp.generate_baseline(target, prompt, 20).tokens
        for f in FIELDS:
            assert getattr(piped, f) == getattr(serial, f), f
        assert piped.spans_ms["finalize"] > 0                              # the append ran, on the worker
