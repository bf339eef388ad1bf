"""The thesis profile (params/thesis.yaml) and the loading of its three model formats, offline.

Real-format tiny checkpoints (tests/fixtures_thesis.py) stand in for Qwen/Qwen3-32B-AWQ (AWQ GEMM, loaded
through transformers' AwqConfig and gptqmodel's torch_awq kernel), Qwen/Qwen3-0.6B (dense, tied) and
embedl/Qwen3-0.6B-FlashHead (FlashHeadQwen3ForCausalLM config + clustering assets).
"""
import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from lib.models import checkpoints, flash_checkpoint
from lib.config import load_profile
from lib.engine.heads import DenseHead, FlashHead
from lib.models.flash_checkpoint import read_flash_checkpoint
from lib.models.build import make_draft, make_target
from lib.engine.runner import Runner
from lib.engine.speculative import Request, generate_baseline, generate_speculative

import fixtures_thesis as fx

ASSETS = "flash_head_assets/clustering_cache.safetensors"
THESIS_MODELS = ("Qwen/Qwen3-32B-AWQ", "Qwen/Qwen3-0.6B", "embedl/Qwen3-0.6B-FlashHead")
ENV_KEYS = ("PYTORCH_ALLOC_CONF", "CUDA_DEVICE_ORDER")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def empty_hub(monkeypatch, tmp_path) -> Path:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "hf_home" / "hub"


# ---------------------------------------------------------------- the profile itself (no gptqmodel needed)

def test_thesis_profile_loads_and_validates():
    p = load_profile("thesis")
    assert (p.name, p.seed, p.dtype, p.target_device, p.draft_device) == ("thesis", 0, "float16", "cuda:0", "cuda:1")
    m = p.models
    assert (m.source, m.target, m.draft, m.flash_draft, m.awq_backend) == ("pretrained", *THESIS_MODELS, "marlin")
    assert m.synthetic is None
    c = p.clustering
    assert (c.n_clusters, c.n_probes, c.iterations, c.candidates, c.top_k, c.compare_shipped) == (9496, 256, 10, 32, 5, True)
    assert c.probe_sweep == [16, 32, 64, 128, 256, 512]
    assert (p.decode.k, p.decode.max_new_tokens, p.decode.max_prompt_tokens) == (6, 64, 1024)
    assert (p.prompts.file, p.prompts.per_group) == ("spec_bench", 2)                   # data/spec_bench/question.jsonl
    assert (p.bench.warmup, p.bench.iters, p.bench.e2e_warmup, p.bench.e2e_iters) == (20, 200, 1, 1)
    assert p.flash_dir == Path("embedl/Qwen3-0.6B-FlashHead")


def test_check_pretrained_names_every_missing_model(monkeypatch, tmp_path):
    empty_hub(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        checkpoints.check_pretrained_available(load_profile("thesis"))
    msg = str(e.value)
    for name in THESIS_MODELS:
        assert name in msg
        assert f"huggingface-cli download {name}" in msg and f"hf download {name}" in msg
    assert not any((tmp_path / "hf_home").rglob("*.safetensors"))        # nothing was fetched


def test_check_pretrained_names_missing_local_directories(tmp_path):
    p = load_profile("thesis")
    gone = str(tmp_path / "nowhere" / "target")
    p = replace(p, models=replace(p.models, target=gone))
    with pytest.raises(FileNotFoundError, match="no model directory") as e:
        checkpoints.check_pretrained_available(p)
    assert gone in str(e.value) and "Qwen/Qwen3-0.6B" in str(e.value)


def test_missing_hub_model_is_a_clear_error(monkeypatch, tmp_path):
    empty_hub(monkeypatch, tmp_path)
    with pytest.raises(FileNotFoundError, match="hf download Qwen/Qwen3-0.6B"):
        checkpoints.load_model("Qwen/Qwen3-0.6B", "float32", "cpu")
    with pytest.raises(FileNotFoundError, match="local Hugging Face cache"):
        read_flash_checkpoint("embedl/Qwen3-0.6B-FlashHead")


def test_gpu_only_awq_backend_refused_on_cpu():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        checkpoints.awq_config({"quant_method": "awq", "bits": 4}, "marlin", "cpu")


# ---------------------------------------------------------------- the three formats, loaded through the profile

@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        return fx.thesis_pair(tmp_path_factory.mktemp("thesis"))


@pytest.fixture(scope="module")
def profile(ckpts):
    p = load_profile("thesis")
    return replace(p, dtype="float32", target_device="cpu", draft_device="cpu",
                   models=replace(p.models, target=str(ckpts["target"]), draft=str(ckpts["draft"]),
                                  flash_draft=str(ckpts["flash_draft"]), awq_backend="torch_awq"),
                   clustering=replace(p.clustering, n_clusters=fx.N_CLUSTERS, n_probes=fx.N_PROBES,
                                      probe_sweep=[1, 2, 4, 8]))


@pytest.fixture(scope="module")
def loaded(profile):
    """The AWQ target through load_target (needs gptqmodel), and the environment just after loading it."""
    pytest.importorskip("gptqmodel")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        for k in ENV_KEYS:
            mp.delenv(k, raising=False)
        checkpoints.check_pretrained_available(profile)                       # all three present: no error
        target = checkpoints.load_target(profile)
        env_after = {k: os.environ.get(k) for k in ENV_KEYS}
    return dict(target=target, env_after=env_after)


@pytest.fixture(scope="module")
def drafts(profile):
    """The dense draft (load_draft) and the FlashHead draft (load_flash_draft): no gptqmodel needed."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        draft = checkpoints.load_draft(profile)
        flash, head = flash_checkpoint.load_flash_draft(profile)
    return dict(draft=draft, flash=flash, head=head)


def test_fixture_formats_are_the_real_ones(ckpts):
    cfg = json.loads((ckpts["target"] / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128,
                                          "zero_point": True, "modules_to_not_convert": None}
    assert not cfg["tie_word_embeddings"]
    from safetensors import safe_open
    with safe_open(str(ckpts["target"] / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        q = "model.layers.0.self_attn.k_proj"
        assert f.get_tensor(f"{q}.qweight").dtype == torch.int32 and f.get_tensor(f"{q}.qweight").shape == (128, 64 // 8)
        assert f.get_tensor(f"{q}.qzeros").shape == (1, 64 // 8) and f.get_tensor(f"{q}.scales").dtype == torch.float16
    assert f"{q}.weight" not in keys and "lm_head.weight" in keys
    dcfg = json.loads((ckpts["draft"] / "config.json").read_text())
    assert dcfg["tie_word_embeddings"] and dcfg["vocab_size"] == cfg["vocab_size"] == fx.VOCAB
    fcfg = json.loads((ckpts["flash_draft"] / "config.json").read_text())
    assert fcfg["architectures"] == ["FlashHeadQwen3ForCausalLM"] and fcfg["n_clusters"] == fx.N_CLUSTERS
    assert (ckpts["flash_draft"] / ASSETS).is_file()
    for d in ("target", "draft", "flash_draft"):                         # one shared tokenizer
        assert (ckpts[d] / "tokenizer.json").read_text() == (ckpts["target"] / "tokenizer.json").read_text()


def test_awq_pack_order_round_trip():
    q = torch.randint(0, 16, (4, 16), generator=torch.Generator().manual_seed(0))
    p = fx.pack_int4_awq(q)
    assert p.dtype == torch.int32 and p.shape == (4, 2)
    assert torch.equal(fx.unpack_int4_awq(p), q)
    assert (p[0, 0].item() & 0xF) == q[0, 0] and ((p[0, 0].item() >> 4) & 0xF) == q[0, 2]   # nibble 1 = column 2


def test_awq_target_matches_dequantised_reference(loaded, ckpts):
    target, ref = loaded["target"], ckpts["reference"]
    qlin = target.model.layers[0].self_attn.q_proj
    assert type(qlin).__name__ == "AwqTorchLinear" and hasattr(qlin, "qweight")
    assert type(target.lm_head) is torch.nn.Linear                      # the head stays dense
    ids = torch.randint(0, fx.VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, want = target(ids).logits[0].float(), ref(ids).logits[0].float()
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert (got - want).abs().max() < 2e-3 * want.abs().max()           # the kernel's fp16 arithmetic, nothing more


def test_gptqmodel_leaves_the_environment_alone(loaded):
    assert loaded["env_after"] == {k: None for k in ENV_KEYS}


def test_runner_on_the_awq_target_matches_hf(loaded):
    target = loaded["target"]
    ids = torch.randint(0, fx.VOCAB, (1, 10), generator=torch.Generator().manual_seed(2))
    r = Runner(target, 16)
    got = torch.cat([r.greedy(ids[:, :6], 0, graph=False), r.greedy(ids[:, 6:], 6, graph=False)])
    with torch.no_grad():
        assert torch.equal(got, target(ids).logits[0].argmax(-1))


def test_flash_draft_is_qwen3_with_an_equal_size_flashhead(drafts):
    from transformers import Qwen3ForCausalLM
    flash, head, draft = drafts["flash"], drafts["head"], drafts["draft"]
    assert type(flash) is Qwen3ForCausalLM and flash.config.architectures == ["Qwen3ForCausalLM"]
    assert isinstance(head, FlashHead) and head.n_clusters == fx.N_CLUSTERS and head.n_probes == fx.N_PROBES
    assert head.c2t.shape == (fx.N_CLUSTERS, fx.VOCAB // fx.N_CLUSTERS)           # equal clusters
    assert torch.equal(head.c2t.flatten().sort().values, torch.arange(fx.VOCAB))
    assert head.weight is flash.get_output_embeddings().weight
    ids = torch.randint(0, fx.VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():                                               # same body as the dense draft
        assert torch.equal(flash(ids).logits, draft(ids).logits)
        h = flash.model(ids).last_hidden_state[0]
    exact = head.with_probes(fx.N_CLUSTERS)                             # all probes: the dense argmax
    assert torch.equal(exact(h), DenseHead(flash.get_output_embeddings().weight)(h))


def test_older_flash_model_type_loads_as_qwen3(profile, ckpts, tmp_path):
    d = shutil.copytree(ckpts["flash_draft"], tmp_path / "flash")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "flash_head_qwen3"                              # unknown to AutoConfig without remote code
    (d / "config.json").write_text(json.dumps(cfg))
    model, head = flash_checkpoint.load_flash_draft(replace(profile, models=replace(profile.models, flash_draft=str(d))))
    assert type(model).__name__ == "Qwen3ForCausalLM" and head.n_clusters == fx.N_CLUSTERS


def test_null_flash_config_entries_read_as_embedls_loader_reads_them(profile, ckpts, tmp_path):
    """Embedl's loader takes a null n_clusters from the centroids, a null n_probes as c // 16 and a null special-token
    list as none, and drops special ids outside the vocabulary; this reader had failed on each (TypeError)."""
    d = shutil.copytree(ckpts["flash_draft"], tmp_path / "flash")
    shipped = json.loads((d / "config.json").read_text())
    probing = replace(profile, models=replace(profile.models, flash_draft=str(d)),
                      clustering=replace(profile.clustering, n_probes=None))         # the checkpoint's own count

    def read_with(**entries):
        (d / "config.json").write_text(json.dumps({**shipped, **entries}))
        return read_flash_checkpoint(d)[0], flash_checkpoint.load_flash_draft(probing)[1]

    cfg, head = read_with(n_clusters=None, n_probes=None, flash_head_special_token_ids=None)
    assert cfg["n_clusters"] == head.n_clusters == fx.N_CLUSTERS
    assert cfg["n_probes"] == head.n_probes == max(1, fx.N_CLUSTERS // 16) and head.special.tolist() == []
    special = shipped["flash_head_special_token_ids"]
    cfg, head = read_with(flash_head_special_token_ids=special + [fx.VOCAB, -1, special[0]])
    assert cfg["flash_head_special_token_ids"] == head.special.tolist() == sorted(set(special))


def cache_repo(hub: Path, repo_id: str, src: Path) -> Path:
    """Lay a directory out as the hub cache does (models--org--name/{refs/main, snapshots/<commit>})."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(src, snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snap


def test_hub_ids_load_from_the_local_cache(monkeypatch, tmp_path, ckpts, profile, drafts):
    hub = empty_hub(monkeypatch, tmp_path)
    snap = cache_repo(hub, "fixture/tiny-draft", ckpts["draft"])
    cache_repo(hub, "fixture/tiny-draft-flashhead", ckpts["flash_draft"])
    assert checkpoints.is_available("fixture/tiny-draft") and not checkpoints.is_available("fixture/absent")
    assert checkpoints.resolve_model_dir("fixture/tiny-draft") == snap
    p = replace(profile, models=replace(profile.models, draft="fixture/tiny-draft",
                                        flash_draft="fixture/tiny-draft-flashhead"))
    checkpoints.check_pretrained_available(p)                               # target: local dir; drafts: cached hub ids
    cfg, _, assign = read_flash_checkpoint(p.flash_dir)               # notebook 01 reads the hub id like this
    assert cfg["n_clusters"] == fx.N_CLUSTERS and assign.numel() == fx.VOCAB
    draft = checkpoints.load_draft(p)
    flash, head = flash_checkpoint.load_flash_draft(p)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(draft(ids).logits, drafts["draft"](ids).logits)
        assert torch.equal(flash(ids).logits, drafts["flash"](ids).logits)
    assert torch.equal(head.c2t, drafts["head"].c2t)


# ---------------------------------------------------------------- corrupted FlashHead copies

def corrupt(ckpts, tmp_path, what: str) -> Path:
    d = shutil.copytree(ckpts["flash_draft"], tmp_path / f"flash-{what}")
    t = load_file(str(d / ASSETS))
    if what == "unequal":
        a = t["cluster_assignments"].clone()
        a[0] = (a[0] + 1) % fx.N_CLUSTERS
        save_file({"centroids": t["centroids"], "cluster_assignments": a}, str(d / ASSETS))
    elif what == "vocab":
        cfg = json.loads((d / "config.json").read_text())
        cfg["vocab_size"] = 2 * fx.VOCAB
        (d / "config.json").write_text(json.dumps(cfg))
    elif what == "assets":
        (d / ASSETS).unlink()
    return d


@pytest.mark.parametrize("what, error, message", [
    ("unequal", ValueError, "not of equal size"),
    ("vocab", ValueError, f"cluster_assignments has {fx.VOCAB} entries but the vocabulary is {2 * fx.VOCAB}"),
    ("assets", FileNotFoundError, "missing flash_head_assets/clustering_cache.safetensors"),
])
def test_corrupted_flash_checkpoint_refused(ckpts, tmp_path, what, error, message):
    d = corrupt(ckpts, tmp_path, what)
    with pytest.raises(error, match=message) as e:
        read_flash_checkpoint(d)
    assert str(d) in str(e.value)


# ---------------------------------------------------------------- end to end

@pytest.mark.parametrize("schedule", ["ordinary", "deferred"])
def test_speculative_with_awq_target_and_flash_draft_equals_baseline(loaded, drafts, profile, ckpts, schedule):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(ckpts["draft"]))
    prompt = tok("Write a short story about a robot learning to paint.")["input_ids"][:16]
    max_new, k = 24, profile.decode.k
    n = len(prompt) + max_new + k + 8
    target = make_target(loaded["target"], n)
    flash, head = drafts["flash"], drafts["head"]
    draft = make_draft(flash, head, n)
    base = generate_baseline(target, Request(prompt, max_new))
    spec = generate_speculative(target, draft, Request(prompt, max_new, schedule, k))
    assert spec.tokens == base.tokens and len(base.tokens) == max_new
    assert spec.rounds > 0 and spec.accepted > 0                         # the draft really is accepted sometimes


def test_notebook01_compares_with_the_shipped_clustering(profile, monkeypatch, tmp_path):
    """Notebook 01 on a pretrained profile: re-cluster the draft's embeddings and compare with the
    checkpoint's own clustering (objectives, ARI/NMI agreement, containment of each)."""
    from lib.study import reclustering
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path / "outputs"))        # outputs/ under tmp_path
    p = replace(profile, prompts=replace(profile.prompts, file="builtin", per_group=1),
                clustering=replace(profile.clustering, iterations=3))
    res = reclustering.recluster(p, progress=False)
    s = res["shipped"]
    assert res["equal_sizes"] and s["n_clusters"] == fx.N_CLUSTERS
    assert -1 <= s["adjusted_rand_index"] <= 1 and 0 <= s["nmi"] <= 1
    assert 0 < s["mean_cosine_shipped"] <= 1 and s["mean_cosine_ours"] == pytest.approx(res["mean_cosine"])
    assert 0 <= s["top1_containment_shipped"] <= 1 and s["top1_containment_ours"] == pytest.approx(res["top1_containment"])
    assert (tmp_path / "outputs" / p.name / "clustering.json").exists()


def test_notebook_01_probes_as_the_checkpoint_says_where_the_profile_sets_no_probe_count(profile, tmp_path, monkeypatch):
    """A pretrained profile may leave clustering.n_probes to the FlashHead checkpoint (the draft's head takes the
    checkpoint's then): notebook 01's containment is at that count too, ours and the shipped clustering's."""
    from lib.study import reclustering
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    p = replace(profile, clustering=replace(profile.clustering, n_probes=None),
                decode=replace(profile.decode, max_new_tokens=4), prompts=replace(profile.prompts, file="builtin", per_group=1))
    res = reclustering.recluster(p, progress=False)
    at = {r["n_probes"]: r["top1"] for r in res["probe_sweep"]}
    assert res["n_probes"] == fx.N_PROBES and res["top1_containment"] == at[fx.N_PROBES]
    assert res["shipped"]["top1_containment_ours"] == at[fx.N_PROBES]
