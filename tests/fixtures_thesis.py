"""Tiny checkpoints in the formats of the thesis profile's three models, written offline (their layouts, key names
and packing; not their sizes, bf16 storage or sharded safetensors, which from_pretrained reads as it reads one file).

  write_dense_qwen3   a dense Qwen3 (tied embeddings, like Qwen/Qwen3-0.6B): save_pretrained (safetensors)
                      plus a tokenizer.
  write_awq_qwen3     an AWQ GEMM Qwen3 (like Qwen/Qwen3-32B-AWQ): quant_method awq, version gemm, 4 bits,
                      group size 128, zero point; every decoder Linear stored as packed int32 qweight (in, out/8),
                      packed int32 qzeros (in/128, out/8) and fp16 scales (in/128, out); everything else fp16.
                      Returns an fp32 reference model holding exactly the dequantised weights.
  write_flash_qwen3   a FlashHead checkpoint (like embedl/Qwen3-0.6B-FlashHead) made from a dense directory with
                      lib.models.flash_checkpoint.save_flash_checkpoint and an equal-size spherical k-means of its output embeddings
                      (config keys and flash_head_assets/clustering_cache.safetensors as Embedl's loader reads them; the
                      clustering_config.json an older Embedl loader also read is not written).

The AWQ packing follows gptqmodel 7.6.0 (gptqmodel/quantization/awq/utils/packing_utils.py: AWQ_ORDER,
pack_awq, dequantize_gemm; gptqmodel/nn_modules/qlinear/gemm_awq.py AwqGEMMLinear.pack): nibble i (bits
4i..4i+3) of packed column c holds output column 8c + [0, 2, 4, 6, 1, 3, 5, 7][i], for qweight and qzeros alike,
and the kernel computes W[in, out] = (q - z) * s per group of 128 input rows. Packing in plain order instead
gives logits off by about their own size, so the reference comparison in the tests checks the order.

thesis_pair() gives a target/draft pair in these formats: lib.models.synthetic's pair (shared vocabulary and
'language', so speculative decoding accepts tokens) with AWQ-compatible shapes (every quantised in_features a
multiple of 128, every out_features a multiple of 8).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from lib.models import clustering as cl
from lib import prompts as prompt_lib
from lib.config import Shape, Synthetic
from lib.models.flash_checkpoint import save_flash_checkpoint, special_token_ids
from lib.models.synthetic import make_pair, make_tokenizer

BITS = 4
GROUP = 128
PACK = 32 // BITS                                      # nibbles per int32
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
QUANTISED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VOCAB = 512
N_CLUSTERS = 32                                        # 16 tokens per cluster, as in the real checkpoint
N_PROBES = 4


def tiny_synthetic() -> Synthetic:
    """A synthetic pair whose target is AWQ-quantisable with group size 128."""
    return Synthetic(vocab_size=VOCAB, n_families=16, family_cos=0.8, draft_noise=0.3, target_noise=0.3,
                     target=Shape(hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=32, intermediate_size=256),
                     draft=Shape(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=16, intermediate_size=128))


def tokenizer(vocab: int = VOCAB):
    """The shared tokenizer: an offline byte-level BPE on the built-in prompts, padded to `vocab`."""
    corpus = [p.text for p in prompt_lib.load_questions(prompt_lib.BUILTIN)]
    return make_tokenizer(vocab, corpus)


def random_qwen3(vocab: int = VOCAB, tied: bool = True, seed: int = 0) -> Qwen3ForCausalLM:
    """A tiny random Qwen3 (weights ~ N(0, 0.05), so logits are informative) with AWQ-compatible shapes."""
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=tied, bos_token_id=None, eos_token_id=0, pad_token_id=0)
    model = Qwen3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.05)
    return model


# ---------------------------------------------------------------- dense

def write_dense_qwen3(out_dir: str | Path, model: Qwen3ForCausalLM | None = None, tok=None) -> Path:
    """save_pretrained (safetensors) of a dense Qwen3 with tied embeddings, plus its tokenizer."""
    out = Path(out_dir)
    model = model if model is not None else random_qwen3(tied=True)
    assert model.config.tie_word_embeddings, "the dense draft has tied embeddings, like Qwen3-0.6B"
    model.save_pretrained(out, safe_serialization=True)
    (tok or tokenizer(model.config.vocab_size)).save_pretrained(out)
    assert (out / "model.safetensors").is_file()
    return out


# ---------------------------------------------------------------- AWQ GEMM

def pack_int4_awq(q: torch.Tensor) -> torch.Tensor:
    """q (rows, cols) ints in 0..15 -> int32 (rows, cols/8), AWQ GEMM nibble order."""
    rows, cols = q.shape
    assert cols % PACK == 0
    q = q.to(torch.int64).view(rows, cols // PACK, PACK)[..., AWQ_ORDER]
    packed = torch.zeros(rows, cols // PACK, dtype=torch.int64)
    for i in range(PACK):
        packed |= (q[..., i] & 0xF) << (BITS * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)               # two's complement int32
    return packed.to(torch.int32)


def unpack_int4_awq(p: torch.Tensor) -> torch.Tensor:
    """Inverse of pack_int4_awq, written independently (slots, then the reverse order)."""
    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    slots = (p[:, :, None] >> shifts[None, None, :]) & 0xF
    return slots[..., AWQ_REVERSE_ORDER].reshape(p.shape[0], -1)


def quantize_linear(w: torch.Tensor):
    """Asymmetric 4-bit, per group of 128 input rows, of a Linear weight (out, in).
    Returns qweight, qzeros, scales (AWQ GEMM layout) and the dequantised weight (out, in) in fp32."""
    out_f, in_f = w.shape
    assert in_f % GROUP == 0 and out_f % PACK == 0, (out_f, in_f)
    ng = in_f // GROUP
    wg = w.t().contiguous().float().view(ng, GROUP, out_f)
    wmax, wmin = wg.amax(dim=1), wg.amin(dim=1)                                   # (ng, out)
    qmax = 2**BITS - 1
    scales = ((wmax - wmin).clamp(min=1e-5) / qmax).to(torch.float16)
    s = scales.float()
    zeros = torch.clamp(torch.round(-wmin / s), 0, qmax).to(torch.int32)
    q = torch.clamp(torch.round(wg / s[:, None, :]) + zeros[:, None, :], 0, qmax).to(torch.int32).view(in_f, out_f)
    qweight, qzeros = pack_int4_awq(q), pack_int4_awq(zeros)
    deq = ((q.view(ng, GROUP, out_f) - zeros[:, None, :]).float() * s[:, None, :]).view(in_f, out_f).t().contiguous()
    assert torch.equal(unpack_int4_awq(qweight), q) and torch.equal(unpack_int4_awq(qzeros), zeros)
    return qweight, qzeros, scales, deq


def write_awq_qwen3(out_dir: str | Path, model: Qwen3ForCausalLM | None = None, tok=None) -> Qwen3ForCausalLM:
    """Quantise `model` (default: a tiny random untied Qwen3) into an AWQ GEMM checkpoint in out_dir, with
    a tokenizer. Returns the fp32 reference: the same architecture holding the dequantised decoder weights
    and every other tensor rounded through fp16 exactly as saved."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else random_qwen3(tied=False)
    cfg = model.config
    tensors, ref_sd = {}, {}
    for k, v in model.state_dict().items():
        mod, _, leaf = k.rpartition(".")
        if ".layers." in k and mod.split(".")[-1] in QUANTISED and leaf == "weight":
            qweight, qzeros, scales, deq = quantize_linear(v)
            tensors.update({f"{mod}.qweight": qweight, f"{mod}.qzeros": qzeros, f"{mod}.scales": scales})
            ref_sd[k] = deq
        else:
            tensors[k] = v.detach().to(torch.float16).contiguous().clone()
            ref_sd[k] = tensors[k].float()
    if cfg.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg_dict = cfg.to_dict()
    cfg_dict.update(architectures=["Qwen3ForCausalLM"], dtype="float16", torch_dtype="float16",
                    quantization_config={"quant_method": "awq", "version": "gemm", "bits": BITS,
                                         "group_size": GROUP, "zero_point": True, "modules_to_not_convert": None})
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2))
    (tok or tokenizer(cfg.vocab_size)).save_pretrained(out)
    ref = Qwen3ForCausalLM(copy.deepcopy(cfg)).float().eval()
    ref.load_state_dict(ref_sd, strict=True)
    return ref


# ---------------------------------------------------------------- FlashHead

def write_flash_qwen3(dense_dir: str | Path, out_dir: str | Path, n_clusters: int = N_CLUSTERS,
                      n_probes: int = N_PROBES, seed: int = 0) -> Path:
    """A FlashHead checkpoint from a dense directory: equal-size spherical k-means of its (tied) output
    embeddings, written by lib.models.flash_checkpoint.save_flash_checkpoint."""
    from transformers import AutoTokenizer
    model = Qwen3ForCausalLM.from_pretrained(dense_dir, dtype=torch.float32)
    W = model.get_output_embeddings().weight.detach()
    assign = cl.spherical_kmeans(W, n_clusters, 8, seed=seed, equal=True, candidates=8, progress=False)
    cents = cl.centroids_of(cl.unit(W.float()), assign, n_clusters)
    tok = AutoTokenizer.from_pretrained(dense_dir)
    return save_flash_checkpoint(dense_dir, out_dir, cents, assign, n_probes, special_token_ids(tok))


def thesis_pair(root: str | Path, seed: int = 0) -> dict:
    """Write the three thesis-format checkpoints under root: target-awq, draft, draft-flashhead.
    Returns their directories and the target's dequantised fp32 reference model."""
    root = Path(root)
    target, draft = make_pair(tiny_synthetic(), seed, "float32", "cpu")
    tok = tokenizer(VOCAB)
    ref = write_awq_qwen3(root / "target-awq", target, tok)
    dense = write_dense_qwen3(root / "draft", draft, tok)
    flash = write_flash_qwen3(dense, root / "draft-flashhead", seed=seed)
    return {"target": root / "target-awq", "draft": dense, "flash_draft": flash, "reference": ref}
