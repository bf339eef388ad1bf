"""The fused single-token decode step (lib/engine/decode.py) against the reference path, on the CPU under Triton's
interpreter in float32, where the two differ only by summation order: the final hidden states and the K/V cache
agree to float32 rounding across several attention splits, for Qwen3 (q/k norms) and Llama; the runner checks it
when built and says which path runs; a fused draft keeps speculative output equal to greedy output.
Skipped where Triton is not installed (CI)."""
import pytest
import torch

from interpreted import interpreter_env, interpreter_or_skip  # noqa: F401 (interpreter_env: an autouse fixture)

interpreter_or_skip()
import lib.engine.decode as decode  # noqa: E402
from lib.engine.heads import DenseHead  # noqa: E402
from lib.engine.runner import Acceleration, Runner  # noqa: E402
from lib.engine.speculative import Request, generate_baseline, generate_speculative  # noqa: E402
from lib.models.build import make_draft, make_target  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from widen_cases import check_widen  # noqa: E402


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                      initializer_range=0.3)                                 # 3 query heads per KV head, as SmolLM2
    return LlamaForCausalLM(cfg).eval()


LEN = 80                                                                     # 5 attention splits of decode.SPLIT


@pytest.mark.parametrize("which", ["qwen3", "llama"])
def test_fused_step_is_the_reference_step(pair, llama, which):
    model = pair[1] if which == "qwen3" else llama
    ref, fused = Runner(model, LEN), Runner(model, LEN, Acceleration(fused=True))
    assert fused.decode_path == "fused" and fused.decode.checked["rel_error"] <= 1e-5
    ids = torch.randint(3, 200, (LEN,), generator=torch.Generator().manual_seed(1))
    for r in (ref, fused):
        r.prefill(ids[None, :5])
    for p in range(5, LEN):                                                  # through every split boundary
        a, b = ref.forward(ids[None, p:p + 1], p), fused.forward(ids[None, p:p + 1], p)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.cache.k, ref.cache.k, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused.cache.v, ref.cache.v, rtol=1e-5, atol=1e-5)


def test_a_two_token_call_of_a_fused_runner_is_two_fused_steps(pair):
    """A round's catch-up after a full acceptance (2 tokens) runs as one fused step that reads each weight once for
    both tokens: the bits of two 1-token calls, and the same cache."""
    a, b = Runner(pair[1], LEN, Acceleration(fused=True)), Runner(pair[1], LEN, Acceleration(fused=True))
    ids = torch.randint(3, 200, (12,), generator=torch.Generator().manual_seed(3))
    for r in (a, b):
        r.prefill(ids[None, :10])
    both = a.forward(ids[None, 10:12], 10)
    one = torch.cat([b.forward(ids[None, 10:11], 10).clone(), b.forward(ids[None, 11:12], 11)], dim=1)
    assert both.shape == (1, 2, pair[1].config.hidden_size) and torch.equal(both, one)
    assert torch.equal(a.cache.k, b.cache.k) and torch.equal(a.cache.v, b.cache.v)


def test_a_cache_of_more_splits_than_programs_loops_and_its_length_does_not_change_a_position(llama, pair):
    """2 attention programs a query head over 5 (a cache of 80) or 10 splits (160): each program folds several
    splits (FOLD of them loaded at once: 1 or 2, the same bits); a position's step is the reference's to fp32
    rounding and bitwise the same in both caches."""
    for model in (llama, pair[1]):
        ref, long = Runner(model, LEN), Runner(model, 2 * LEN)
        short = Runner(model, LEN, Acceleration(fused=True))
        assert short.decode.programs == 5 <= decode.PROGRAMS and short.decode.fold == 1     # no fold to make
        steps = {"short": decode.FusedDecode(short, programs=2), "long": decode.FusedDecode(long, programs=2),
                 "one_at_once": decode.FusedDecode(short, programs=2, fold=1)}
        assert steps["long"].fold == decode.FOLD == 2
        assert steps["long"].programs == 2 and steps["long"].part.shape[1] == 2
        ids = torch.randint(3, 200, (LEN,), generator=torch.Generator().manual_seed(2))
        for r in (ref, short, long):
            r.prefill(ids[None, :60])
        for p in range(60, 68):                                              # splits 3 and 4: programs 1 and 0
            at = torch.tensor(p)
            want = ref.forward(ids[None, p:p + 1], p)
            got = {name: f(ids[None, p:p + 1], at).clone() for name, f in steps.items()}
            assert torch.equal(got["short"], got["long"]) and torch.equal(got["short"], got["one_at_once"])
            torch.testing.assert_close(got["short"], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(long.cache.k[..., :68, :], ref.cache.k[..., :68, :], rtol=1e-5, atol=1e-5)


def test_the_check_leaves_a_fresh_cache_and_the_runner_names_its_path(pair):
    r = Runner(pair[1], LEN, Acceleration(fused=True))
    assert r.decode_path == "fused" and not r.cache.k.any() and not r.cache.v.any()
    assert r.decode.checked["argmax_equal"] == r.decode.checked["steps"]
    assert Runner(pair[1], LEN).decode_path == "reference"


def test_the_check_of_a_cache_shorter_than_its_steps_stays_inside_the_cache(pair):
    """A runner of fewer positions than the check's 8 steps checks as many as it holds (it wrote past its cache:
    on a GPU a device-side assert that breaks the CUDA context)."""
    r = Runner(pair[1], 5, Acceleration(fused=True))
    assert r.decode_path == "fused" and r.decode.checked["steps"] == 5 and r.decode.checked["from_position"] == 0


def test_a_failing_check_falls_back_to_the_reference_path(pair, monkeypatch):
    monkeypatch.setitem(decode.TOLERANCE, torch.float32, -1.0)               # nothing can pass
    r = Runner(pair[1], LEN, Acceleration(fused=True))
    assert r.decode is None and r.decode_path.startswith("reference (fused step off the reference")


def test_the_check_compares_with_the_reference_path_even_on_a_fused_runner(pair):
    """A fused runner's single-token forward is the fused step: the check must not compare the step with itself."""
    r = Runner(pair[1], LEN, Acceleration(fused=True))
    step, wrong = r.decode, decode.FusedDecode(r)
    wrong._step = lambda ids, start: torch.zeros_like(wrong.out[:, :ids.shape[1]])
    r.decode = wrong                                                          # installed, and wrong
    assert decode.check(r, step) == "" and step.checked["rel_error"] <= 1e-5
    assert step.checked["two_tokens_equal_single"]
    assert decode.check(r, wrong).startswith("fused step off the reference") and r.decode is wrong


def test_the_check_covers_the_two_token_step(pair):
    """A step right for one token and wrong for two (the second token's row zeroed) fails the check."""
    r = Runner(pair[1], LEN, Acceleration(fused=True))
    half = decode.FusedDecode(r)
    one = half._step
    half._step = lambda ids, start: one(ids, start) * torch.tensor([1.0, 0.0])[:ids.shape[1], None]
    assert decode.check(r, half).startswith("fused step off the reference")
    assert not half.checked["two_tokens_equal_single"]


def test_unsupported_runners_say_why(pair, monkeypatch):
    monkeypatch.setattr(decode, "INTERPRET", False)                           # a CPU outside the interpreter
    r = Runner(pair[1], LEN, Acceleration(fused=True))
    assert r.decode is None and r.decode_path == "reference (no GPU (and not under TRITON_INTERPRET=1))"


@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_a_fused_draft_keeps_speculative_output_greedy(pair, schedule):
    target = make_target(pair[0], 120)
    W = pair[1].get_output_embeddings().weight
    draft = make_draft(pair[1], DenseHead(W), 120, Acceleration(fused=True))
    reference = make_draft(pair[1], DenseHead(W), 120)
    prompt = tuple(torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist())
    greedy = generate_baseline(target, Request(prompt, 40)).tokens
    got = generate_speculative(target, draft, Request(prompt, 40, schedule, 4))
    want = generate_speculative(target, reference, Request(prompt, 40, schedule, 4))
    assert got.tokens == greedy and got.accepted == want.accepted            # float32: the same proposals


def test_the_draft_attention_widens_an_fp16_tile_by_bit_moves_to_its_values_over_2_to_112():
    """The interpreter's integer ops for what the GPU does in PTX (tests/test_kernels_cuda.py checks the PTX)."""
    check_widen("cpu")


def test_the_check_measures_each_element_against_its_own_size():
    """A trained model's few large dims (SmolLM2: 25-39 where the rms is 1.4-2.4) differ between two bf16 paths by
    units of their own last place; the same difference in a dim of the rms's size weighs 7x as much here."""
    ref = torch.ones(2, 64)
    ref[:, 5] = 30.0
    rms = ref.pow(2).mean(-1).sqrt()[0].item()                                 # 3.9
    big, small = ref.clone(), ref.clone()
    big[:, 5] += 0.25                                                          # 2 units of bf16's last place at 30
    small[1, 7] += 0.25
    assert decode._error(big, ref) == pytest.approx(0.25 / (rms + 30.0))
    assert decode._error(small, ref) == pytest.approx(0.25 / (rms + 1.0)) and decode._error(ref, ref) == 0.0
