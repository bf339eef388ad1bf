"""The rules a profile must satisfy beyond its types (lib/config.py builds the typed profile, then calls
validate): each broken rule is a ConfigError naming the file and the setting."""
from __future__ import annotations

import re

from . import modes


class ConfigError(ValueError):
    """A profile file has an unknown key, a missing key, a value of the wrong type or one a rule refuses."""


def synthetic(p, need) -> None:
    s = p.models.synthetic
    need(1 <= s.n_families < s.draft.hidden_size, "models.synthetic.n_families must be >= 1 and below draft.hidden_size")
    need(-1 <= s.family_cos <= 1, f"models.synthetic.family_cos must be in [-1, 1] (a cosine), got {s.family_cos}")
    need(s.target.hidden_size >= s.draft.hidden_size, "models.synthetic: target.hidden_size must be >= draft.hidden_size")
    for nm, sh in (("target", s.target), ("draft", s.draft)):
        need(sh.intermediate_size >= 2 * sh.hidden_size, f"models.synthetic.{nm}.intermediate_size must be >= 2*hidden_size")
        shape(sh, f"models.synthetic.{nm}", need)
    need(s.target_quant in ("", "awq"), f"models.synthetic.target_quant must be '' or awq, got {s.target_quant!r}")
    if s.target_quant == "awq":
        t = s.target
        need(s.save_target, "models.synthetic.target_quant awq needs save_target: true (the int4 target is "
             "written and loaded back through gptqmodel)")
        need(p.dtype != "bfloat16", "models.synthetic.target_quant awq needs dtype float16 (or float32 on a CPU): "
             "transformers runs AWQ models in fp16 on CUDA")
        need(all(i % 128 == 0 for i in (t.hidden_size, t.intermediate_size, t.num_attention_heads * t.head_dim)),
             "models.synthetic.target_quant awq needs target hidden_size, intermediate_size and "
             "num_attention_heads*head_dim divisible by the group size 128")
        need(t.num_key_value_heads * t.head_dim % 8 == 0, "models.synthetic.target_quant awq needs "
             "num_key_value_heads*head_dim divisible by 8")
    need(p.clustering.n_clusters >= 1 and s.vocab_size % p.clustering.n_clusters == 0,
         f"clustering.n_clusters ({p.clustering.n_clusters}) must divide the vocabulary ({s.vocab_size})")
    bad = [b for b in p.clustering.size_sweep if b >= 1 and s.vocab_size % b]   # known here: refused before notebook 01
    need(not bad, f"clustering.size_sweep: {bad} do not divide the vocabulary ({s.vocab_size} tokens)")
    need(p.clustering.top_k <= s.vocab_size,
         f"clustering.top_k ({p.clustering.top_k}) must be at most the vocabulary ({s.vocab_size})")


def shape(sh, where: str, need) -> None:
    """What a Qwen3 body needs to run: grouped-query heads, rotary embeddings over pairs, a layer."""
    need(sh.num_hidden_layers >= 1, f"{where}.num_hidden_layers must be >= 1")
    need(sh.num_key_value_heads >= 1 and sh.num_attention_heads % sh.num_key_value_heads == 0,
         f"{where}.num_attention_heads ({sh.num_attention_heads}) must be a multiple of num_key_value_heads "
         f"({sh.num_key_value_heads})")
    need(sh.head_dim >= 2 and sh.head_dim % 2 == 0, f"{where}.head_dim must be even (rotary embeddings), got {sh.head_dim}")


def sampling(s, need) -> None:
    need(bool(s.temperatures) and all(t > 0 for t in s.temperatures),
         f"sampling.temperatures must be a non-empty list of values > 0 (greedy: decode), got {s.temperatures}")
    need(0 < s.top_p <= 1, f"sampling.top_p must be in (0, 1], got {s.top_p}")
    need(bool(s.schedules) and set(s.schedules) <= set(modes.SCHEDULES),
         f"sampling.schedules must be a non-empty subset of {list(modes.SCHEDULES)}, got {s.schedules}")
    need(bool(s.probes) and set(s.probes) <= {"drawn", "top"},
         f"sampling.probes must be a non-empty subset of ['drawn', 'top'], got {s.probes}")


def validate(p, where: str) -> None:
    """Check every rule of the Profile p; the first broken one raises ConfigError("<where>: <what>")."""
    def need(cond: bool, msg: str):
        if not cond:
            raise ConfigError(f"{where}: {msg}")
    need(p.dtype in ("float32", "bfloat16", "float16"), f"dtype must be float32, bfloat16 or float16, got {p.dtype!r}")
    need(0 <= p.seed < 2**32, f"seed must be in 0..2**32 - 1, got {p.seed}")   # numpy's range (common.setup seeds it)
    for key in ("target_device", "draft_device"):                 # torch.device would stop preflight, naming neither
        dev = getattr(p, key)
        need(re.fullmatch(r"cpu|cuda(:\d+)?", dev) is not None, f"{key} must be cpu, cuda or cuda:<index>, got {dev!r}")
    for rules in (models, clustering, decode, other, adaptive):
        rules(p, need)
    sampling(p.sampling, need)


def models(p, need) -> None:
    """Where the weights come from, and what each source needs."""
    m = p.models
    need(m.source in ("synthetic", "pretrained", "gguf"), f"models.source must be synthetic, pretrained or gguf, got {m.source!r}")
    if m.source == "synthetic":
        need(m.synthetic is not None, "models.synthetic is required when models.source is synthetic")
        synthetic(p, need)
    elif m.source == "gguf":
        need(bool(m.gguf_package and m.gguf_file), "models.gguf_package and models.gguf_file are required when models.source is gguf")
        need("==" in m.gguf_package, f"models.gguf_package must pin a version (name==version), got {m.gguf_package!r}")
        need(len(m.gguf_sha256) == 64 and all(ch in "0123456789abcdef" for ch in m.gguf_sha256),
             "models.gguf_sha256 must be 64 lower-case hex digits")
        need(m.exit_layer is not None and m.exit_layer >= 1, "models.exit_layer (>= 1) is required when models.source is gguf")
        need(modes.DENSE_SHARED not in p.decode.modes, f"decode.modes: {modes.DENSE_SHARED} needs a separate FlashHead "
             "checkpoint body (pretrained or synthetic); a gguf profile has none")
    else:
        need(bool(m.target and m.draft and m.flash_draft),
             "models.target, models.draft and models.flash_draft are required when models.source is pretrained")
    need(modes.FLASH_FULL not in p.decode.modes or m.source == "gguf",
         f"decode.modes: {modes.FLASH_FULL} (the full-depth model as its own FlashHead draft) needs models.source gguf")


def clustering(p, need) -> None:
    c = p.clustering
    need(c.n_probes is not None or p.models.source == "pretrained",
         "clustering.n_probes is required for synthetic and gguf profiles (pretrained ones may use the checkpoint's)")
    need(c.n_probes is None or 0 < c.n_probes <= c.n_clusters,
         f"clustering.n_probes ({c.n_probes}) must be in 1..n_clusters ({c.n_clusters})")
    need(bool(c.probe_sweep) and all(0 < q <= c.n_clusters for q in c.probe_sweep),
         f"clustering.probe_sweep must be a non-empty list of values in 1..n_clusters, got {c.probe_sweep}")
    need(c.iterations >= 1, "clustering.iterations must be >= 1")
    need(c.candidates >= 1, f"clustering.candidates must be >= 1, got {c.candidates}")
    need(c.top_k >= 1, f"clustering.top_k must be >= 1, got {c.top_k}")
    need(all(b >= 1 for b in c.size_sweep), f"clustering.size_sweep must be cluster sizes >= 1, got {c.size_sweep}")


def decode(p, need) -> None:
    d = p.decode
    need(d.k >= 1, "decode.k must be >= 1")
    need(d.max_new_tokens >= 2, "decode.max_new_tokens must be >= 2")
    need(d.max_prompt_tokens >= 1, "decode.max_prompt_tokens must be >= 1")
    known = [modes.BASELINE, *modes.DRAFTS]
    need(set(d.modes) <= set(known), f"decode.modes: unknown mode in {d.modes}; known: {known}")
    need(modes.BASELINE in d.modes and len(set(d.modes)) > 1,
         f"decode.modes must hold {modes.BASELINE} (what every speculative output is checked against) and a draft, "
         f"got {d.modes}")
    need(set(d.k_policies) <= set(modes.K_POLICIES),
         f"decode.k_policies: unknown policy in {d.k_policies}; known: {list(modes.K_POLICIES)}")
    need(d.k_max >= d.k, "decode.k_max must be >= decode.k")
    need(bool(d.schedules) and set(d.schedules) <= set(modes.SCHEDULES),      # none: no draft would run
         f"decode.schedules must be a non-empty subset of {list(modes.SCHEDULES)}, got {d.schedules}")


def other(p, need) -> None:
    """Benchmarks, peers, prompts and side studies."""
    need(p.bench.head_kernel in ("torch", "triton"), f"bench.head_kernel must be torch or triton, got {p.bench.head_kernel!r}")
    need(p.bench.iters >= 1 and p.bench.e2e_iters >= 1, "bench.iters and bench.e2e_iters must be >= 1")
    need(all(B >= 1 for B in p.bench.head_batches), f"bench.head_batches must be batch sizes >= 1, got {p.bench.head_batches}")
    need(all(n >= 1 for n in p.bench.verify_lengths),                    # prompt[-0:] would feed the whole prompt
         f"bench.verify_lengths must be call lengths >= 1, got {p.bench.verify_lengths}")
    need(set(p.peers.methods) <= set(modes.PEERS),
         f"peers.methods: unknown method in {p.peers.methods}; known: {list(modes.PEERS)}")
    need(p.peers.assistant_schedule in ("constant", "hf_default") and p.peers.prompt_lookup_tokens >= 1,
         "peers: assistant_schedule must be constant or hf_default, prompt_lookup_tokens >= 1")
    need(p.slurm.shards >= 1, f"slurm.shards must be >= 1 (array tasks), got {p.slurm.shards}")
    need(p.prompts.side_prompts >= 0, f"prompts.side_prompts must be >= 0 (0: every prompt), got {p.prompts.side_prompts}")
    for key in ("per_group", "limit"):                                   # 0 selects no prompt, below it fails in select
        n = getattr(p.prompts, key)
        need(n is None or n >= 1, f"prompts.{key} must be >= 1 (or left out: all), got {n}")
    need(set(p.side_studies) <= set(modes.SIDE_STUDIES),
         f"side_studies: unknown study in {p.side_studies}; known: {list(modes.SIDE_STUDIES)}")
    need(all(n >= 1 for n in p.bench.context_lengths), f"bench.context_lengths must be positions >= 1, got {p.bench.context_lengths}")
    need("context" not in p.side_studies or p.bench.context_lengths,
         "side_studies: the context study needs bench.context_lengths (positions to time a round's calls at)")


def adaptive(p, need) -> None:
    """Settings of the adaptive drafts (lib/engine/adaptive.py), checked even when no adaptive mode runs."""
    a, c, b = p.clustering.adaptive, p.clustering.n_clusters, p.decode.bandit
    p_max = a.p_max if a.p_max is not None else p.clustering.n_probes
    need(all(0.0 <= t <= 1.0 for t in [a.threshold, *a.sweep]), "clustering.adaptive: threshold and sweep values must be in [0, 1]")
    need(p_max is None or 1 <= a.p_min <= p_max <= c, f"clustering.adaptive: need 1 <= p_min ({a.p_min}) <= p_max ({p_max}) <= n_clusters ({c})")
    need(a.temperature > 0, f"clustering.adaptive.temperature must be > 0, got {a.temperature}")
    need(all(1 <= q <= c for q in b.probes), f"decode.bandit.probes values must be in 1..n_clusters ({c})")
    need(b.ucb_c >= 0, f"decode.bandit.ucb_c must be >= 0, got {b.ucb_c}")
    adaptive = sorted(set(p.decode.modes) & set(modes.ADAPTIVE_DRAFTS))
    need(not adaptive or modes.FIXED in p.decode.k_policies, f"decode.modes: {adaptive} run at fixed K only; add fixed to decode.k_policies")
