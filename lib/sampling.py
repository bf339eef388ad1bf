"""Exact speculative sampling (temperature > 0, optional top-p) with a dense or FlashHead sampling draft.

A round: the draft proposes d1..dK, each drawn from its proposal distribution q_i (kept whole, over the
vocabulary); the target gives p_1..p_{K+1} in one verify call; d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection the round's final token is drawn from the normalised
residual max(0, p_i - q_i), and if every proposal is accepted from p_{K+1}. Each emitted token is then
distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023), whatever q is, so long as q is fixed
before its token is drawn. p is the target's softmax(logits / T), restricted to its top-p nucleus.

Schedules (as in lib/speculative.py): ordinary (a single-token target append after each round gives p_1 of
the next round, so a round whose d1 is rejected skips the verify call) and deferred (the final token rides
in the next verify batch [final, d1..dK], whose outputs are p_1..p_{K+1}). Temperature 0 is greedy decoding
(lib/speculative.py). Every draw comes from a torch.Generator seeded per sample, one per device: the same
seed gives the same tokens.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .blocks import FixedK
from .bench import sync
from .heads import FlashHead
from .modes import DEFERRED, SAMPLING_SCHEDULES
from .speculative import (Draft, Result, Sequence, Target, accept, check_args, count_round, generate_baseline,
                          generate_speculative, roll_back, to_device)


@dataclass(frozen=True)
class Dist:
    """How logits become a sampling distribution: softmax(logits / T), cut to the top-p nucleus."""
    temperature: float
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0 for sampling (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits (..., V) -> probabilities (..., V) in float32."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        return probs if self.top_p >= 1 else nucleus(probs, self.top_p)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose mass reaches top_p (at least one), renormalised."""
    sorted_p, order = probs.sort(dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p                                   # mass of the more likely tokens
    kept = torch.where(before < top_p, sorted_p, torch.zeros_like(sorted_p))
    out = torch.zeros_like(probs).scatter(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


class Rng:
    """One torch.Generator per device, each seeded with the sample's seed."""

    def __init__(self, seed: int):
        self.seed, self.gens = seed, {}

    def __call__(self, device: torch.device) -> torch.Generator:
        key = str(device)
        if key not in self.gens:
            self.gens[key] = torch.Generator(device).manual_seed(self.seed)
        return self.gens[key]


def draw(probs: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """One token (1,) from probs (V,) (need not sum to 1), on the device."""
    return torch.multinomial(probs, 1, generator=gen)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Where a rejected position draws from: max(0, p - q) (normalised by draw); p itself if p == q."""
    r = (p - q).clamp_min(0)
    return torch.where(r.sum() > 0, r, p)


class DenseSampler:
    """The dense draft's proposal: softmax(h W^T / T) over the whole vocabulary (top-p cut)."""

    def __init__(self, weight: torch.Tensor, dist: Dist):
        self.weight, self.dist = weight, dist

    @torch.no_grad()
    def __call__(self, h: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """h (1,d) -> (token (1,), q (V,)), q the distribution the token was drawn from."""
        q = self.dist(h[0] @ self.weight.T)
        return draw(q, gen), q


class FlashSampler:
    """FlashHead's sampling draft. Draw p probe clusters from the centroid softmax softmax(h C^T / T)
    without replacement (Gumbel-top-p: the p largest of score / T + Gumbel noise), then a token from the
    softmax of the exact logits / T of the drawn clusters' tokens (and the special tokens), zero elsewhere.
    draw_probes=False probes FlashHead's own top-p clusters instead (a function of the context: also exact).

    Why the output stays exact: the acceptance rule emits tokens distributed as p for *any* proposal
    distribution q that is fixed before the proposal is drawn from it. Given the context, the probe set S
    is drawn independently of the token (the token is drawn after S, from q_S), so q_S, the softmax over
    S's candidates, is such a distribution: a random one, but fixed before the token. For every S the
    round emits p, hence also averaged over S. The acceptance test must use q_S (the distribution the
    token was really drawn from), not FlashHead's marginal over probe sets, which has no closed form.
    """

    def __init__(self, head: FlashHead, dist: Dist, draw_probes: bool = True):
        self.head, self.dist, self.draw_probes = head, dist, draw_probes

    def probes(self, h: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """p clusters (p,) drawn without replacement from softmax(centroid scores / T) (or the top p)."""
        if not self.draw_probes:
            return self.head.probes(h)[0]
        scores = (h[0] @ self.head.centroids.T).float() / self.dist.temperature
        u = torch.rand(scores.shape, generator=gen, device=scores.device).clamp_min(1e-20)
        return (scores - (-u.log()).log()).topk(self.head.n_probes).indices     # + Gumbel(0,1) noise

    @torch.no_grad()
    def __call__(self, h: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """h (1,d) -> (token (1,), q (V,)), q the softmax over the drawn clusters' candidates."""
        head = self.head
        cand = torch.cat([head.c2t[self.probes(h, gen)].flatten(), head.special])
        logits = torch.full((head.weight.shape[0],), float("-inf"), device=h.device)
        logits[cand] = (head.weight[cand] @ h[0]).float()                      # a special token twice: one entry
        q = self.dist(logits)
        return draw(q, gen), q


def sampler_for(draft: Draft, dist: Dist, draw_probes: bool = True):
    """The sampling counterpart of the draft's greedy head (FlashHead or dense)."""
    head = draft.head.head
    return FlashSampler(head, dist, draw_probes) if isinstance(head, FlashHead) else DenseSampler(head.weight, dist)


@torch.no_grad()
def target_probs(target: Target, ids: torch.Tensor, start: int, dist: Dist, graph: bool = True) -> torch.Tensor:
    """The target's sampling distribution after each of ids (1,n) fed at `start`: (n,V) float32."""
    h = target.runner.forward(ids, start, graph)[0]
    return dist(h @ target.runner.model.get_output_embeddings().weight.T)


def first_token(target: Target, prompt: list[int], dist: Dist, rng: Rng) -> torch.Tensor:
    """Prompt prefill and the first token (1,) drawn from p after the prompt (TTFT)."""
    ids = torch.tensor([prompt], device=target.runner.device)
    return draw(target_probs(target, ids, 0, dist, graph=False)[-1], rng(target.runner.device))


@torch.no_grad()
def sample_baseline(target: Target, prompt: list[int], max_new: int, temperature: float, top_p: float = 1.0,
                    seed: int = 0, stop: frozenset = frozenset()) -> Result:
    """Target-only sampling: each token drawn from p; temperature 0 is greedy decoding."""
    if temperature == 0:
        return generate_baseline(target, prompt, max_new, stop)
    dist, rng = Dist(temperature, top_p), Rng(seed)
    gen = rng(target.runner.device)
    return generate_baseline(target, prompt, max_new, stop, first=lambda: first_token(target, prompt, dist, rng),
                             step=lambda tok, pos: draw(target_probs(target, tok.view(1, 1), pos, dist)[0], gen))


def propose(draft: Draft, sampler, s: Sequence, kk: int, rng: Rng) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft catches up on buf[d_pos:n], then draws kk proposals: tokens (kk,) and their proposal
    distributions q (kk,V), both on the target's device. It has fed everything but its last proposal."""
    n, dev = len(s.seq), draft.runner.device
    if kk == 0:
        return s.buf[n:n], torch.zeros(0, 1, device=s.buf.device)            # nothing to propose
    x, pos, toks, qs = to_device(s.buf[None, s.d_pos:n], draft), s.d_pos, [], []
    for _ in range(kk):
        h = draft.runner.forward(x, pos)[:, -1]
        with draft.runner.clock.span("call_draft_head", dev):
            tok, q = sampler(h, rng(dev))
        toks.append(tok)
        qs.append(q)
        pos += x.shape[1]
        x = tok.view(1, 1)
    s.d_pos = n + kk - 1
    return to_device(torch.cat(toks), draft, s.buf.device), to_device(torch.stack(qs), draft, s.buf.device)


def accepted_count(props: torch.Tensor, q: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> int:
    """Proposals accepted before the first rejection: d_i passes when u_i q_i(d_i) < p_i(d_i), that is with
    probability min(1, p_i(d_i) / q_i(d_i)). Only the rows of p present are judged (one host sync)."""
    m = min(len(props), p.shape[0])
    i = torch.arange(m, device=p.device)
    ok = u[:m] * q[i, props[:m]] < p[i, props[:m]]
    return int(ok.cumprod(0).sum().item()) if m else 0


def final_dist(p: torch.Tensor, q: torch.Tensor, a: int, kk: int) -> torch.Tensor:
    """Where the round's final token is drawn from: the residual at the first rejection (a < kk), else the
    bonus row p_{kk+1}. p (rows p_1.., V), q (kk,V), a accepted of kk."""
    return residual(p[a], q[a]) if a < kk else p[kk]


def verify(target: Target, props: torch.Tensor, q: torch.Tensor, pending: torch.Tensor | None, s: Sequence,
           kk: int, dist: Dist, gen: torch.Generator):
    """Judge the proposals and draw the final token. With the pending distribution p_1 (ordinary, first
    deferred round) d1 is judged first and the verify call is skipped if it fails; else the deferred batch
    [final, d1..dk] gives p_1..p_{k+1}. Returns (accepted host ids, final id, final (1,), verified?)."""
    u = torch.rand(kk, generator=gen, device=s.buf.device)
    if pending is None:
        n = len(s.seq)
        p = target_probs(target, torch.cat([s.buf[s.t_pos:n], props])[None], s.t_pos, dist)   # (kk+1,V)
    else:
        p = pending[None]
        if kk > 0 and accepted_count(props[:1], q[:1], p, u) == 1:          # d1 passes: verify the rest
            p = torch.cat([p, target_probs(target, props[None], s.t_pos, dist)])
    a = accepted_count(props, q, p, u)
    final = draw(final_dist(p, q, a, kk), gen)                               # residual at a rejection, else bonus
    return props[:a].tolist(), final.item(), final, p.shape[0] > 1 or pending is None


def start(target: Target, draft: Draft, s: Sequence, dist: Dist) -> torch.Tensor:
    """Draft prefill and the target's append of the first token: p after it (V,)."""
    P = s.prompt_len
    draft.runner.prefill(to_device(s.buf[None, :P], draft))
    s.t_pos, s.d_pos = P + 1, P
    return target_probs(target, s.buf[None, P:P + 1], P, dist)[0]


@torch.no_grad()
def sample_speculative(target: Target, draft: Draft, prompt: list[int], max_new: int, k, schedule: str,
                       temperature: float, top_p: float = 1.0, seed: int = 0, stop: frozenset = frozenset(),
                       draw_probes: bool = True) -> Result:
    """Speculative sampling (ordinary or deferred schedule): every token distributed as target sampling
    with the same temperature and top-p. Temperature 0 is greedy speculative decoding (lib/speculative.py).
    k: the block length or a block-length policy (lib/blocks.py); draw_probes: see FlashSampler."""
    if temperature == 0:
        return generate_speculative(target, draft, prompt, max_new, k, schedule, stop)
    if schedule not in SAMPLING_SCHEDULES:
        raise ValueError(f"speculative sampling supports schedules {list(SAMPLING_SCHEDULES)}, got {schedule!r}")
    dist, rng, policy = Dist(temperature, top_p), Rng(seed), FixedK(k) if isinstance(k, int) else k
    check_args(target, prompt, max_new, policy.k_max)
    clock, sampler = target.runner.clock, sampler_for(draft, dist, draw_probes)
    draft.use_clock(clock)
    t0 = time.perf_counter()
    s = Sequence(prompt, first_token(target, prompt, dist, rng), max_new, stop)
    t1 = time.perf_counter()
    clock.reset()                                                            # the prefill is TTFT, not decode
    res = Result([], 1000 * (t1 - t0), 0.0, append_calls=1)
    with clock.span("initial"):
        pending = start(target, draft, s, dist)
    while not s.done():
        pending = sampling_round(target, draft, sampler, s, pending, policy, schedule, dist, rng, res, stop)
    sync(target.runner.device)
    sync(draft.runner.device)
    res.decode_ms = 1000 * (time.perf_counter() - t1)
    res.tokens, res.stopped, res.spans_ms = s.seq[len(prompt):], s.stopped, clock.totals()
    return res


def sampling_round(target: Target, draft: Draft, sampler, s: Sequence, pending, policy, schedule: str,
                   dist: Dist, rng: Rng, res: Result, stop: frozenset):
    """One round: propose, verify, emit, roll back; ordinary: append the final token. Returns the next
    round's pending distribution p_1 (None under the deferred schedule)."""
    clock, n = target.runner.clock, len(s.seq)
    kk = min(policy.next(), s.max_new - s.emitted - 1)                       # never overshoot max_new
    with clock.span("draft"):
        props, q = propose(draft, sampler, s, kk, rng)
    with clock.span("verify"):
        accepted, final, final_dev, verified = verify(target, props, q, pending, s, kk, dist, rng(s.buf.device))
    a = accept(s, props, accepted, final, final_dev, stop)
    count_round(res, kk, a, verified)
    policy.update(kk, a)
    roll_back(s, n, a)
    if schedule == DEFERRED or s.done():
        return None
    with clock.span("finalize"):                                             # feed the final token: p_1 of the next round
        pending = target_probs(target, s.buf[None, s.t_pos:s.t_pos + 1], s.t_pos, dist)[0]
    s.t_pos += 1
    res.append_calls += 1
    return pending
