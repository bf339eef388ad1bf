"""Peers measured in this study's harness: Hugging Face transformers' own generate() on the profile's target
(and dense draft), on the same prompts, device, token budget and stop tokens as this engine, timed the same
way, and compared token by token with this engine's target-only greedy output (generate_baseline).

Methods (lib.modes.PEERS): hf_greedy (greedy, the default dynamic cache), hf_static (greedy with
cache_implementation="static", sized as this engine's cache; on CUDA transformers then compiles its decode
step itself, once, in the warm-up), hf_assisted (assisted generation, greedy, the dense draft as
assistant_model) and hf_prompt_lookup (prompt-lookup decoding, peers.prompt_lookup_tokens). Each call runs under a generation config holding only what is set
here, swapped in for the model's own for the call, so nothing of a checkpoint's generation_config.json (its
eos, its sampling settings) leaks in: greedy, max_new_tokens = decode.max_new_tokens, and as eos exactly the
engine's stop tokens (study.stop_tokens: the tokenizer's eos when decode.stop_at_eos, else none, and then
neither stops early). Both keep the stop token as the last emitted token.

Timing: wall time of one generate() call (host clock, the device synchronised before and after). "With
prefill" is new tokens / wall time; "decode only" is (new tokens - 1) / (wall - prefill), where prefill is
the wall time of the same call with max_new_tokens=1 on the same prompt (prompt forward and first token,
plus the method's own per-call setup: cache allocation, the assistant's candidate generator), as this
engine's decode tok/s leaves out its prefill and first token (ttft_ms)."""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager, nullcontext

import torch
import transformers
from torch import nn
from transformers import GenerationConfig

from .. import bench, modes
from ..models import checkpoints, build as engines
from ..config import Profile
from ..progress import steps
from ..engine.speculative import Request, generate_baseline
from ..report.peers import aggregate, spread, table  # noqa: F401  (pure: lib/report/peers.py)


def check_methods(methods) -> None:
    bad = [m for m in methods if m not in modes.PEERS]
    if bad:
        raise ValueError(f"unknown peer method(s) {bad}: use {list(modes.PEERS)}")


# ---------------------------------------------------------------- the dense draft as a transformers model

def early_exit_model(model, n_layers: int):
    """A transformers model of `model`'s first n_layers layers, then its final norm and (tied) head: a gguf
    profile's dense draft as a model generate() can run. Built on the meta device, then every module is the
    target's own (no weight copied); layer i keeps layer_idx i, so its KV cache lines up."""
    cfg = copy.deepcopy(model.config)
    cfg.num_hidden_layers = n_layers
    if getattr(cfg, "layer_types", None):
        cfg.layer_types = cfg.layer_types[:n_layers]
    with torch.device("meta"):
        draft = type(model)(cfg)
    body, src = draft.model, model.model
    body.embed_tokens, body.norm, body.rotary_emb = src.embed_tokens, src.norm, src.rotary_emb
    body.layers = nn.ModuleList(src.layers[:n_layers])
    draft.lm_head = model.lm_head
    left = [n for n, t in [*draft.named_parameters(), *draft.named_buffers()] if t.is_meta]
    if left:
        raise RuntimeError(f"early_exit_model: {type(model).__name__} has modules not shared with the draft: {left}")
    return draft.eval()


def dense_draft(profile: Profile, target_model):
    """The assistant: the dense draft checkpoint, or for gguf profiles the early exit at models.exit_layer
    (the engine's dense draft: first exit_layer layers, final norm, tied head), on the target's weights
    when the target is on the draft device."""
    if profile.models.source != "gguf":
        return checkpoints.load_draft(profile)
    dev, on = torch.device(profile.draft_device), target_model.device
    same = (dev.type, dev.index or 0) == (on.type, on.index or 0)
    return early_exit_model(target_model if same else checkpoints.load_draft(profile), profile.models.exit_layer)


# ---------------------------------------------------------------- one generate() call

def generation_config(profile: Profile, method: str, max_new: int, stop: frozenset) -> GenerationConfig:
    """Greedy, max_new tokens, eos = the engine's stop tokens (None: no early stop), plus the method's setting."""
    check_methods([method])
    eos = sorted(stop) or None
    kw = dict(max_new_tokens=max_new, do_sample=False, num_beams=1, eos_token_id=eos,
              pad_token_id=eos[0] if eos else None)
    if method == "hf_static":                      # one cache size for every call (the engine's): no re-allocation,
        kw.update(cache_implementation="static", max_cache_len=engines.cache_len(profile))  # no CUDA recompile
    if method == "hf_prompt_lookup":
        kw["prompt_lookup_num_tokens"] = profile.peers.prompt_lookup_tokens
    return GenerationConfig(**kw)


def assistant_config(profile: Profile) -> GenerationConfig:
    """The assistant's own settings: decode.k proposals a round, no confidence stop (as this engine's fixed-K
    ordinary mode), or transformers' defaults (hf_default: 20 tokens, confidence threshold 0.4, adapted)."""
    if profile.peers.assistant_schedule == "hf_default":
        return GenerationConfig()
    return GenerationConfig(num_assistant_tokens=profile.decode.k, num_assistant_tokens_schedule="constant",
                            assistant_confidence_threshold=0.0)


def assistant_settings(profile: Profile) -> dict:
    return {k: v for k, v in assistant_config(profile).to_diff_dict().items() if k != "transformers_version"}


@contextmanager
def own_generation_config(model, config: GenerationConfig):
    """generate() fills unset options from model.generation_config: swap ours in for the call."""
    saved, model.generation_config = model.generation_config, config
    try:
        yield
    finally:
        model.generation_config = saved


class Harness:
    """The profile's target (and its dense draft as assistant) under generate(), and this engine's target."""

    def __init__(self, profile: Profile, stop: frozenset, target_model=None):
        self.profile, self.stop = profile, stop
        self.model = target_model if target_model is not None else checkpoints.load_target(profile)
        self.assistant = dense_draft(profile, self.model) if "hf_assisted" in profile.peers.methods else None
        self.engine = engines.build_target(profile, self.model)
        self.device = self.model.device

    @torch.no_grad()
    def generate(self, method: str, ids: list[int], max_new: int) -> list[int]:
        """New tokens of one generate() call of `method` (stop token included)."""
        gc = generation_config(self.profile, method, max_new, self.stop)
        x = torch.tensor([ids], device=self.device)
        helper = self.assistant if method == "hf_assisted" else None
        extra = {"assistant_model": helper} if helper is not None else {}
        settings = own_generation_config(helper, assistant_config(self.profile)) if helper is not None else nullcontext()
        with own_generation_config(self.model, gc), settings:
            out = self.model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc, **extra)
        return out[0, len(ids):].tolist()

    def measure(self, method: str, ids: list[int]) -> dict:
        """Tokens, wall time and prefill time (ms) of one sample; this engine's own clock for its baseline."""
        n = self.profile.decode.max_new_tokens
        if method == modes.ENGINE_BASELINE:
            res = generate_baseline(self.engine, Request(ids, n, stop=self.stop))
            tokens, wall, prefill = res.tokens, res.ttft_ms + res.decode_ms, res.ttft_ms
        else:
            tokens, wall = timed(lambda: self.generate(method, ids, n), self.device)
            _, prefill = timed(lambda: self.generate(method, ids, 1), self.device)
        return {"tokens": tokens, "wall_ms": wall, "prefill_ms": prefill, "stopped": tokens[-1] in self.stop}


def timed(fn, device) -> tuple[object, float]:
    """fn() and its wall time (ms), the device synchronised before and after."""
    bench.sync(device)
    t = time.perf_counter()
    out = fn()
    bench.sync(device)
    return out, 1000 * (time.perf_counter() - t)


# ---------------------------------------------------------------- the study

def matched_prefix(tokens: list[int], ref: list[int]) -> float:
    """Length of the common prefix over the longer of the two (1.0 exactly when they are equal)."""
    n = next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), min(len(tokens), len(ref)))
    return n / max(len(tokens), len(ref), 1)


def row(method: str, prompt, ids: list[int], it: int, m: dict, ref: list[int]) -> dict:
    """One raw per-sample record."""
    n, decode_ms = len(m["tokens"]), m["wall_ms"] - m["prefill_ms"]
    return {"method": method, "question_id": prompt.question_id, "group": prompt.group, "iteration": it,
            "prompt_tokens": len(ids), "new_tokens": n, "wall_ms": m["wall_ms"], "prefill_ms": m["prefill_ms"],
            "decode_ms": decode_ms, "tok_s": 1000 * n / m["wall_ms"],
            "decode_tok_s": 1000 * (n - 1) / decode_ms if n > 1 and decode_ms > 0 else None,
            "stopped": m["stopped"], "exact_match": m["tokens"] == ref, "prefix_frac": matched_prefix(m["tokens"], ref), "tokens": m["tokens"]}


def run(profile: Profile, enc: list, stop: frozenset, target_model=None) -> dict:
    """Every peer method and this engine's baseline on every prompt, e2e_iters times (method order rotated
    per sample, as notebook 03's modes are), after e2e_warmup calls of each on the first prompt (at least
    one). Returns the configuration, the raw rows and the aggregate per method."""
    check_methods(profile.peers.methods)
    h = Harness(profile, stop, target_model)
    order = [modes.ENGINE_BASELINE, *profile.peers.methods]
    refs = [generate_baseline(h.engine, Request(ids, profile.decode.max_new_tokens, stop=stop)).tokens for _, ids in enc]
    for method in steps(order * max(1, profile.bench.e2e_warmup), "peers warm-up", "calls"):
        h.measure(method, enc[0][1])
    work = [(it, i, m) for it in range(profile.bench.e2e_iters) for i in range(len(enc))
            for r in [(it * len(enc) + i) % len(order)] for m in order[r:] + order[:r]]
    rows = [row(m, enc[i][0], enc[i][1], it, h.measure(m, enc[i][1]), refs[i])
            for it, i, m in steps(work, "peers study", "calls")]
    return {"config": config(profile, h, stop, [p.question_id for p, _ in enc]), "rows": rows,
            "aggregate": aggregate(rows)}


def config(profile: Profile, h: Harness, stop: frozenset, question_ids: list) -> dict:
    """What the peers ran with, written beside their rows."""
    from ..results import git_commit
    d, p = profile.decode, profile.peers
    gguf = profile.models.source == "gguf"
    return {"profile": profile.name, "commit": git_commit(), "device": bench.device_name(h.device),
            "dtype": profile.dtype, "transformers": transformers.__version__, "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(), "methods": [modes.ENGINE_BASELINE, *p.methods],
            "max_new_tokens": d.max_new_tokens, "eos_token_ids": sorted(stop), "stop_at_eos": d.stop_at_eos,
            "static_cache_len": engines.cache_len(profile), "prompt_lookup_num_tokens": p.prompt_lookup_tokens, "assistant_schedule": p.assistant_schedule,
            "assistant": assistant_settings(profile) | {"model": (
                f"the target's first {profile.models.exit_layer} layers, final norm and tied head (weights shared)"
                if gguf else "the dense draft checkpoint")},
            "iterations": profile.bench.e2e_iters, "warmup": max(1, profile.bench.e2e_warmup), "prompts": question_ids,
            "timing": "wall time of generate() (device synchronised); prefill: the same call with max_new_tokens=1",
            "agreement": "against this engine's generate_baseline tokens; prefix_frac: common prefix / longer length"}
