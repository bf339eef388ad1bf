"""Exact speculative sampling (temperature > 0, optional top-p) with a dense or FlashHead sampling draft:
the decision rule Sampling for the shared round loop (lib/engine/rounds.py), and its pieces.

A round: the draft proposes d1..dK, each drawn from its proposal distribution q_i (kept whole, over the
vocabulary); the target gives p_1..p_{K+1} in one verify call; d_i is accepted with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection the round's final token is drawn from the normalised
residual max(0, p_i - q_i), and if every proposal is accepted from p_{K+1}. Each emitted token is then
distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023), whatever q is, so long as q is fixed
before its token is drawn. p is the target's softmax(logits / T), restricted to its top-p nucleus.

Schedules (lib/engine/rounds.py): ordinary and pipelined (the target append of the final token gives p_1 of
the next round, so a round whose d1 is rejected skips the verify call; pipelined runs that append beside the
draft) and deferred (the final token rides in the next verify batch [final, d1..dK], whose outputs are
p_1..p_{K+1}). Temperature 0 is greedy decoding (lib/engine/speculative.py). Every draw comes from a
torch.Generator seeded per request, one per device, in the same order under every schedule (the append draws
nothing): the same seed gives the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .heads import FlashHead
from .rounds import Draft, Sequence, Target, propose_stepwise, to_device


@dataclass(frozen=True)
class Dist:
    """How logits become a sampling distribution: softmax(logits / T), cut to the top-p nucleus
    (temperature > 0 and top_p in (0, 1]: a Request checks them)."""
    temperature: float
    top_p: float = 1.0

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


def draw_proposals(draft: Draft, sampler, s: Sequence, kk: int, rng: Rng) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft catches up and draws kk proposals (lib/engine/rounds.py propose_stepwise): tokens (kk,) and their
    proposal distributions q (kk,V), both on the target's device."""
    dev = draft.runner.device

    def pick(h: torch.Tensor):
        with draft.runner.clock.span("call_draft_head", dev):
            return sampler(h, rng(dev))

    props, qs = propose_stepwise(draft, s, kk, pick)
    q = torch.stack(qs) if qs else torch.zeros(0, 1, device=dev)              # (0,1): nothing proposed
    return props, to_device(q, draft, s.buf.device)


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


class Sampling:
    """Speculative sampling's decision rule (lib/engine/rounds.py): a proposal is drawn from the draft's q and
    carries it; the acceptance test judges it; the pending prediction is the target's distribution p_1 (V,).
    `request` gives the distribution, the seed and how FlashHead draws its probes (draw_probes)."""

    def __init__(self, request):
        self.dist, self.rng = Dist(request.temperature, request.top_p), Rng(request.seed)
        self.draw_probes = request.draw_probes
        self.samplers = {}                                                   # the draft's head -> its sampler

    def sampler(self, draft: Draft):
        """The sampling counterpart of the draft's head now (a bandit draft changes heads between rounds)."""
        if draft.head not in self.samplers:
            self.samplers[draft.head] = sampler_for(draft, self.dist, self.draw_probes)
        return self.samplers[draft.head]

    def first(self, target: Target, prompt) -> torch.Tensor:
        return first_token(target, prompt, self.dist, self.rng)

    def append(self, target: Target, ids: torch.Tensor, start: int) -> torch.Tensor:
        return target_probs(target, ids, start, self.dist)[-1]

    def token(self, p: torch.Tensor) -> torch.Tensor:
        return draw(p, self.rng(p.device))

    def propose(self, draft: Draft, s: Sequence, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
        return draw_proposals(draft, self.sampler(draft), s, kk, self.rng)

    def verify(self, target: Target, props: torch.Tensor, q: torch.Tensor, pending, s: Sequence, kk: int):
        """Judge the proposals and draw the final token. With the pending distribution p_1 (ordinary,
        pipelined, first deferred round) d1 is judged first and the verify call is skipped if it fails; else
        the deferred batch [final, d1..dk] gives p_1..p_{k+1}. Returns (accepted host ids, final id,
        final (1,), verified?)."""
        gen = self.rng(s.buf.device)
        u = torch.rand(kk, generator=gen, device=s.buf.device)
        if pending is None:
            n = len(s.seq)
            p = target_probs(target, torch.cat([s.buf[s.t_pos:n], props])[None], s.t_pos, self.dist)   # (kk+1,V)
        else:
            p = pending[None]
            if kk > 0 and accepted_count(props[:1], q[:1], p, u) == 1:      # d1 passes: verify the rest
                p = torch.cat([p, target_probs(target, props[None], s.t_pos, self.dist)])
        a = accepted_count(props, q, p, u)
        final = draw(final_dist(p, q, a, kk), gen)                           # residual at a rejection, else bonus
        return props[:a].tolist(), final.item(), final, p.shape[0] > 1 or pending is None
