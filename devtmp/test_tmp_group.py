import pytest
import torch

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401

interpreter_or_skip()
import lib.engine.decode as decode  # noqa: E402
from lib.engine.runner import Acceleration, Runner  # noqa: E402
from test_decode import llama, LEN  # noqa: E402,F401


@pytest.mark.parametrize("which", ["qwen3", "llama"])
@pytest.mark.parametrize("programs", [2, 64])
def test_group(pair, llama, which, programs):
    model = pair[1] if which == "qwen3" else llama
    ref, a, b = Runner(model, 2 * LEN), Runner(model, 2 * LEN), Runner(model, 2 * LEN)
    sa, sb = decode.FusedDecode(a, programs=programs), decode.FusedDecode(b, programs=programs, group_heads=True)
    ids = torch.randint(3, 200, (2 * LEN,), generator=torch.Generator().manual_seed(2))
    for r in (ref, a, b):
        r.prefill(ids[None, :60])
    for p in list(range(60, 66)) + [100]:
        at = torch.tensor(p)
        want = ref.forward(ids[None, p:p + 1], p)
        x, y = sa(ids[None, p:p + 1], at).clone(), sb(ids[None, p:p + 1], at).clone()
        torch.testing.assert_close(y, x, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(b.cache.k, a.cache.k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(b.cache.v, a.cache.v, rtol=1e-6, atol=1e-6)
