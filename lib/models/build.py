"""The one engine builder: a profile's target and drafts as runners and heads, with the profile's
CUDA-graph and compile policy decided here and nowhere else, and one clock shared by all of them."""
from __future__ import annotations

import torch

from . import checkpoints, flash_checkpoint
from ..bench import Clock
from ..config import Profile
from ..engine.adaptive import AdaptiveFlashHead, AdaptiveProbeDraft, BanditDraft, Thompson, UCB1
from ..engine.heads import DenseHead, GraphedHead
from ..modes import (ADAPTIVE_DRAFTS, BANDIT_UCB, BASELINE, DENSE, DENSE_SHARED, FIXED, FLASH, FLASH_ADAPTIVE,
                     FLASH_FULL, probes_arm)
from ..engine.runner import FILL_CHUNK, Acceleration, Runner
from ..engine.speculative import Draft, Target


def acceleration(profile: Profile, role: str) -> Acceleration:
    """The profile's policy for role 'draft' or 'target': compile only on CUDA devices; the target's calls
    batch-invariant where decode.batch_invariant says (unset: on CUDA), at k_max + 1 rows (the longest verify);
    the draft's single-token steps fused (lib/engine/decode.py) where decode.fused_draft says (unset: on CUDA); the
    Triton layer kernels (lib/engine/layer_kernels.py) where decode.triton_layers says (unset: on CUDA)."""
    cuda = torch.device(getattr(profile, f"{role}_device")).type == "cuda"
    compile = cuda and getattr(profile.bench, f"compile_{role}")
    invariant = profile.decode.batch_invariant
    invariant = cuda if invariant is None else invariant
    rows = profile.decode.k_max + 1 if role == "target" and invariant else 0
    fused = profile.decode.fused_draft
    fused = role == "draft" and (cuda if fused is None else fused)
    layers = profile.decode.triton_layers
    return Acceleration(profile.bench.cuda_graphs, compile, rows, fused, cuda if layers is None else layers)


def cache_len(profile: Profile) -> int:
    """KV-cache positions a generation of this profile can need (with room for one block)."""
    d = profile.decode
    return d.max_prompt_tokens + d.max_new_tokens + d.k + 8


def make_target(model, max_len: int, accel: Acceleration = Acceleration(), clock=None) -> Target:
    clock = clock or Clock(model.get_output_embeddings().weight.device)
    return Target(Runner(model, max_len, accel, role="target", clock=clock))


def draft_runner(model, max_len: int, accel: Acceleration = Acceleration(), clock=None,
                 n_layers: int | None = None) -> Runner:
    """A draft body: `model`'s (its first n_layers if given), which several heads may share."""
    clock = clock or Clock(model.get_output_embeddings().weight.device)
    return Runner(model, max_len, accel, role="draft", n_layers=n_layers, clock=clock)


def make_draft(model, head, max_len: int, accel: Acceleration = Acceleration(), clock=None,
               n_layers: int | None = None) -> Draft:
    """A draft engine: `model`'s body (its first n_layers if given) and `head` (DenseHead or FlashHead)."""
    runner = draft_runner(model, max_len, accel, clock, n_layers)
    return Draft(runner, GraphedHead(head, accel.graphs, runner.clock))


def build_drafts(profile: Profile, which, clock=None, model=None) -> dict[str, Draft]:
    """Draft engines named in `which`: dense (dense checkpoint + dense head), flash (FlashHead checkpoint
    body + FlashHead), dense_shared (FlashHead checkpoint body + its dense head). gguf profiles: see
    gguf_drafts (`model`, the loaded target, is shared when given)."""
    accel, n, kernel = acceleration(profile, "draft"), cache_len(profile), profile.bench.head_kernel
    if profile.models.source == "gguf":
        return gguf_drafts(profile, which, accel, n, clock, model)
    out = {}
    if DENSE in which:
        m = checkpoints.load_draft(profile)
        out[DENSE] = make_draft(m, DenseHead(m.get_output_embeddings().weight, kernel), n, accel, clock)
    if {FLASH, DENSE_SHARED} & set(which):
        m, fh = flash_checkpoint.load_flash_draft(profile)
        runner = draft_runner(m, n, accel, clock)                            # one body for both heads
        for name, head in ((FLASH, fh), (DENSE_SHARED, DenseHead(m.get_output_embeddings().weight, kernel))):
            if name in which:
                out[name] = Draft(runner, GraphedHead(head, accel.graphs, runner.clock))
    return out


def gguf_drafts(profile: Profile, which, accel: Acceleration, n: int, clock=None, model=None) -> dict[str, Draft]:
    """Drafts from the one checkpoint of a gguf profile, all on one loaded model (the target's when given
    and on the draft device): dense and flash share one early-exit runner (the first exit_layer layers)
    with the dense head or FlashHead; flash_full runs the full depth with FlashHead. Every runner keeps
    its own KV cache, so none disturbs the target's."""
    dev, on = torch.device(profile.draft_device), model.get_output_embeddings().weight.device if model else None
    if on is None or (on.type, on.index or 0) != (dev.type, dev.index or 0):           # "cuda" is "cuda:0"
        model = checkpoints.load_draft(profile)
    depth = model.config.num_hidden_layers
    exit_layer = profile.models.exit_layer
    if not 1 <= exit_layer < depth:
        raise ValueError(f"{profile.name}: models.exit_layer is {exit_layer}, the model has {depth} layers (use 1..{depth - 1})")
    W = model.get_output_embeddings().weight
    fh = flash_checkpoint.load_flash_head(profile, W) if {FLASH, FLASH_FULL} & set(which) else None
    out = {}
    if {DENSE, FLASH} & set(which):
        runner = draft_runner(model, n, accel, clock, n_layers=exit_layer)   # one early-exit body, two heads
        for name, head in ((DENSE, DenseHead(W, profile.bench.head_kernel)), (FLASH, fh)):
            if name in which:
                out[name] = Draft(runner, GraphedHead(head, accel.graphs, runner.clock))
    if FLASH_FULL in which:
        out[FLASH_FULL] = make_draft(model, fh, n, accel, clock)
    return out


def build_target(profile: Profile, model=None, clock=None) -> Target:
    model = model if model is not None else checkpoints.load_target(profile)
    return make_target(model, cache_len(profile), acceleration(profile, "target"), clock)


def build_engines(profile: Profile, which=None, target_model=None, adaptive_k: bool = False) -> tuple[Target, dict[str, Draft]]:
    """The target and the drafts `which` (default: the profile's), sharing one clock; adaptive_k: ready for
    blocks up to decode.k_max whatever the profile's own block policies."""
    which = [m for m in (which or profile.decode.modes) if m != BASELINE]
    target = build_target(profile, target_model)
    drafts = build_all_drafts(profile, which, target.runner.clock, target.runner.model)
    # Capture (and compile) every call length a round can use now, so none is built inside a timed generation.
    adaptive_k = adaptive_k or bool(set(profile.decode.k_policies) - {FIXED})
    longest = max(profile.decode.k, profile.decode.k_max if adaptive_k else 0) + 1
    target.runner.warm("greedy", range(1, longest + 1))
    target.runner.warm("hidden", range(1, longest + 1))                  # speculative sampling's target calls
    for runner in {id(d.runner): d.runner for d in drafts.values()}.values():
        runner.warm("hidden", [*range(1, longest + 1), min(FILL_CHUNK, runner.max_len)])   # + the prompt's fill
    for d in drafts.values():
        d.warm(longest - 1)                                                  # one graph per round's proposals
    return target, drafts


# The target picks its tokens with its own dense head inside its runner's call (Runner._argmax: a matmul and an
# argmax in torch ops, in the target's CUDA graph on CUDA): the torch path on every device.
TARGET_KERNEL = "torch"


def head_kernel(engine) -> str:
    """Which kernel path picks an engine's tokens: "triton" or "torch" (a bandit draft: its arms' path, or
    "mixed (...)"), as the built heads report it (lib/engine/heads.py: kernel_ran)."""
    if isinstance(engine, Target):
        return TARGET_KERNEL
    ran = getattr(engine, "kernel_ran", None)                               # a bandit draft: over its arms
    return ran if ran is not None else getattr(engine.head, "kernel_ran", "unrecorded")


def _runner_says(engine, attr: str) -> str:
    return getattr(getattr(engine, "runner", None), attr, "unrecorded")


def body_path(engine) -> str:
    """Which path runs an engine's single-token body (Runner.decode_path: "fused", or "reference" with the reason
    the fused step does not run)."""
    return _runner_says(engine, "decode_path")


def kernels(target: Target, drafts: dict[str, Draft], of=head_kernel) -> dict[str, str]:
    """{"target": path, <draft name>: path, ...} of built engines, what a run records in its config.json: the head
    kernels (of=head_kernel), or the single-token bodies (of=body_path, `bodies`)."""
    return {"target": of(target), **{name: of(d) for name, d in drafts.items()}}


def bodies(target: Target, drafts: dict[str, Draft]) -> dict[str, str]:
    return kernels(target, drafts, body_path)


def layer_path(engine) -> str:
    """How an engine's multi-token calls attend and normalise (Runner.layer_path: "triton", or "torch" with the
    reason)."""
    return _runner_says(engine, "layer_path")


def layer_paths(target: Target, drafts: dict[str, Draft]) -> dict[str, str]:
    return kernels(target, drafts, layer_path)


def shared_dense(profile: Profile) -> str:
    """The draft whose dense head runs on the FlashHead draft's body: dense (gguf: one early-exit body) or dense_shared."""
    return DENSE if profile.models.source == "gguf" else DENSE_SHARED


def build_all_drafts(profile: Profile, which, clock=None, model=None) -> dict[str, Draft]:
    """build_drafts, plus the adaptive drafts (lib/engine/adaptive.py) made from the FlashHead draft's body and heads."""
    adaptive = [w for w in which if w in ADAPTIVE_DRAFTS]
    plain = [w for w in which if w not in ADAPTIVE_DRAFTS]
    need = {FLASH, shared_dense(profile)} if adaptive else set()
    base = build_drafts(profile, set(plain) | need, clock, model)
    return {**{w: base[w] for w in plain},
            **{w: adaptive_draft(profile, w, base[FLASH], base[shared_dense(profile)]) for w in adaptive}}


def bandit_probes(profile: Profile, n_probes: int, n_clusters: int) -> list[int]:
    """FlashHead probe counts among the bandit's arms: the draft's own and decode.bandit.probes (default p/4, 4p)."""
    other = profile.decode.bandit.probes or [max(1, n_probes // 4), min(n_clusters, 4 * n_probes)]
    return sorted({n_probes, *other})


def adaptive_draft(profile: Profile, name: str, flash: Draft, dense: Draft) -> Draft:
    """flash_adaptive (AdaptiveFlashHead on the FlashHead draft's body) or a bandit draft over heads on that body:
    the dense head (decode.bandit.dense_arm) and FlashHead at bandit_probes, named dense and flash_p<probes>."""
    graphed = lambda head: GraphedHead(head, acceleration(profile, "draft").graphs, flash.runner.clock)
    fh = flash.head.head
    if name == FLASH_ADAPTIVE:
        a = profile.clustering.adaptive
        head = AdaptiveFlashHead(fh, a.threshold, a.p_min, a.p_max or fh.n_probes, a.temperature)
        return AdaptiveProbeDraft(flash.runner, graphed(head))
    b = profile.decode.bandit
    arms = {probes_arm(p): flash.head if p == fh.n_probes else graphed(fh.with_probes(p))
            for p in bandit_probes(profile, fh.n_probes, fh.n_clusters)}
    if b.dense_arm:
        arms[DENSE] = dense.head
    bandit = UCB1(list(arms), b.ucb_c) if name == BANDIT_UCB else Thompson(list(arms), profile.seed)
    return BanditDraft(flash.runner, flash.head, arms, bandit)
