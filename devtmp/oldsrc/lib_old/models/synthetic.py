"""A synthetic Qwen3 target/draft pair with a built-in 'language' both models follow.

Construction (draft hidden size d, vocabulary V, F token families):
  * Token embeddings e_j = sqrt(d) * unit(const * u0 + cos * mu_f(j) + sin * eps_j): a constant
    component u0, a family direction mu_f (F orthonormal directions) and a private direction eps_j.
    So the embedding matrix has cluster structure, as real token families do.
  * Layer 0's MLP is set to a linear map (silu(z) - silu(-z) = z, with the 'up' branch reading the
    constant component), which turns e_x into P e_x: P sends family f to family pi(f) (one long
    cycle) and rotates the private part. The tied head then scores family pi(f(x)) highest and picks
    the member whose private direction best matches P eps_x: a deterministic 'next token' rule.
  * Every other weight is random and small ('noise'): it makes the choice inside a family depend on
    the context, differently in target and draft. The noise scales set how often they agree.
The target is the same rule lifted isometrically into its wider hidden size, with untied head.
Acceptance between such a pair is artificial: it says nothing about real models.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from ..config import Shape, Synthetic

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def qwen3_config(shape: Shape, vocab_size: int, tied: bool, dtype: str) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab_size, hidden_size=shape.hidden_size, num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads, num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim, intermediate_size=shape.intermediate_size, tie_word_embeddings=tied,
        max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=None, eos_token_id=0, pad_token_id=0,
        dtype=dtype,
    )


def family_embeddings(syn: Synthetic, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit token embeddings around family directions. Returns (E (V,d), basis (d,d), family (V,))."""
    d, V, F = syn.draft.hidden_size, syn.vocab_size, syn.n_families
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))   # columns orthonormal
    u0, mu = basis[:, 0], basis[:, 1:F + 1]
    family = torch.randperm(V, generator=g) % F                                         # (V,)
    eps = torch.randn(V, d, generator=g, dtype=torch.float64)
    eps = eps - (eps @ mu) @ mu.T - (eps @ u0)[:, None] * u0                            # private part, off the family span
    eps = eps / eps.norm(dim=1, keepdim=True)
    c = syn.family_cos
    E = 0.5 * u0 + c * mu.T[family] + math.sqrt(1 - c * c) * eps
    return E / E.norm(dim=1, keepdim=True), basis, family


def successor_map(basis: torch.Tensor, n_families: int, g: torch.Generator) -> torch.Tensor:
    """P (d,d): keeps u0, sends mu_f -> mu_{pi(f)} on one long cycle, rotates the rest at random."""
    d = basis.shape[0]
    F = n_families
    perm = torch.randperm(F, generator=g)
    pi = torch.empty(F, dtype=torch.long)
    pi[perm] = perm.roll(-1)                                                            # one cycle through all families
    inner = torch.zeros(d, d, dtype=torch.float64)
    inner[0, 0] = 1.0
    inner[1 + pi, 1 + torch.arange(F)] = 1.0
    r = d - F - 1
    if r:
        rot, _ = torch.linalg.qr(torch.randn(r, r, generator=g, dtype=torch.float64))
        inner[F + 1:, F + 1:] = rot
    return basis @ inner @ basis.T                                                      # in model coordinates


@dataclass(frozen=True)
class Rule:
    """The greedy rule both models of a pair share, and where they are built: E (V,d0) unit embeddings,
    P (d0,d0) the successor map, u0 (d0,) the constant component."""
    E: torch.Tensor
    P: torch.Tensor
    u0: torch.Tensor
    dtype: str
    device: str = "cpu"


@torch.no_grad()
def build_model(shape: Shape, rule: Rule, lift: torch.Tensor, noise: float, tied: bool,
                g: torch.Generator) -> Qwen3ForCausalLM:
    """A Qwen3 whose greedy rule is 'next = argmax_j <e_j, P e_x>' plus context noise of size `noise`;
    lift (D,d0) is the isometry into this model's width D."""
    E, P, u0, dtype, device = rule.E, rule.P, rule.u0, rule.dtype, rule.device
    vocab, D, L = E.shape[0], shape.hidden_size, shape.num_hidden_layers
    cfg = qwen3_config(shape, vocab, tied, dtype)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(cfg, dtype=getattr(torch, dtype))
    def rnd(w: torch.Tensor, scale: float):
        w.copy_(torch.randn(w.shape, generator=g, device=device).mul_(scale / math.sqrt(w.shape[1])))
    emb = math.sqrt(D) * (E.to(device, torch.float32) @ lift.to(device, torch.float32).T)   # (V,D), rms 1 per coordinate
    model.model.embed_tokens.weight.copy_(emb.to(model.dtype))
    if not tied:
        model.lm_head.weight.copy_(emb.to(model.dtype))
    out_scale = noise / math.sqrt(2 * L)
    for i, layer in enumerate(model.model.layers):
        att, mlp = layer.self_attn, layer.mlp
        for w in (att.q_proj.weight, att.k_proj.weight, att.v_proj.weight):
            rnd(w, 1.0)
        rnd(att.o_proj.weight, out_scale)
        if i == 0:
            linear_mlp(mlp, lift, P, u0, D)
        else:
            rnd(mlp.gate_proj.weight, 1.0)
            rnd(mlp.up_proj.weight, 1.0)
            rnd(mlp.down_proj.weight, out_scale)
    return model


def linear_mlp(mlp, lift: torch.Tensor, P: torch.Tensor, u0: torch.Tensor, D: int) -> None:
    """Set a SwiGLU MLP to the linear map n -> lift (P - I) lift^T n on its RMS-normed input n.

    Input n = sqrt(D) * unit(h); wanted output sqrt(D) * (P - I) unit(h). Units come in pairs with gates
    +w_i.n and -w_i.n, a shared constant 'up' read from the u0 component, and down columns +-v_i:
    silu(z) - silu(-z) = z makes the pair exactly linear.
    """
    d0 = lift.shape[1]
    A = lift @ (P - torch.eye(d0, dtype=P.dtype)) @ lift.T                             # (D,D), rank <= d0
    const_dir = lift @ u0                                                               # (D,) the constant component
    n_const = math.sqrt(D) * 0.5 / math.sqrt(1.25)                                      # n . const_dir, see family_embeddings
    W = lift.T                                                                          # (d0,D): read the lifted coordinates
    V = A @ lift                                                                        # (D,d0): A = V W
    gate = torch.zeros_like(mlp.gate_proj.weight, dtype=torch.float64)
    up = torch.zeros_like(mlp.up_proj.weight, dtype=torch.float64)
    down = torch.zeros_like(mlp.down_proj.weight, dtype=torch.float64)
    gate[:d0], gate[d0:2 * d0] = W, -W
    up[:2 * d0] = const_dir
    down[:, :d0], down[:, d0:2 * d0] = V / n_const, -V / n_const
    for p, v in ((mlp.gate_proj.weight, gate), (mlp.up_proj.weight, up), (mlp.down_proj.weight, down)):
        p.copy_(v.to(p))


def make_pair(syn: Synthetic, seed: int, dtype: str, device: str = "cpu", which=("target", "draft")):
    """(target, draft) built from one seed; the draft has tied embeddings like Qwen3-0.6B.
    `which` skips building one of them (returned as None)."""
    g = torch.Generator().manual_seed(seed)
    E, basis, _ = family_embeddings(syn, g)
    P = successor_map(basis, syn.n_families, g)
    rule = Rule(E, P, basis[:, 0], dtype, device)
    d0, D = syn.draft.hidden_size, syn.target.hidden_size
    lift_t, _ = torch.linalg.qr(torch.randn(D, d0, generator=g, dtype=torch.float64))   # (D,d0), orthonormal columns
    draft = target = None
    if "draft" in which:
        gd = torch.Generator(device).manual_seed(seed + 1)
        draft = build_model(syn.draft, rule, torch.eye(d0, dtype=torch.float64), syn.draft_noise, True, gd).eval()
    if "target" in which:
        gt = torch.Generator(device).manual_seed(seed + 2)
        target = build_model(syn.target, rule, lift_t, syn.target_noise, False, gt).eval()
    return target, draft


def make_tokenizer(vocab_size: int, corpus: list[str]) -> PreTrainedTokenizerFast:
    """An offline byte-level BPE trained on `corpus`, padded with filler tokens to exactly vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab_size, 4096), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    spec = json.loads(tok.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    if len(vocab) > vocab_size:
        raise ValueError(f"tokenizer needs {len(vocab)} entries but the model vocabulary is {vocab_size}")
    for i in range(len(vocab), vocab_size):
        vocab[f"<|filler_{i}|>"] = i                                                   # never produced by encoding
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    full = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    full.pre_tokenizer, full.decoder = tok.pre_tokenizer, tok.decoder
    full.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(tokenizer_object=full, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
