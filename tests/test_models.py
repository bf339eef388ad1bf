import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lib.models import flash_checkpoint
from lib.models.checkpoints import load_model
from lib.models.flash_checkpoint import read_flash_checkpoint, save_flash_checkpoint
from lib.engine.runner import Acceleration, Runner

from conftest import DRAFT_D, N_CLUSTERS, SPECIAL_IDS, VOCAB

ASSETS = "flash_head_assets/clustering_cache.safetensors"


def ids_of(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def hf_logits(model, ids: torch.Tensor) -> torch.Tensor:
    return model(ids).logits[0].float()


def runner_logits(model, runner: Runner, ids: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    """Logits from Runner.forward over ids fed in chunks split at `cuts` (increasing start positions)."""
    W = model.get_output_embeddings().weight
    bounds = [0, *cuts, ids.shape[1]]
    hs = [runner.forward(ids[:, a:b], a, graph=False) for a, b in zip(bounds, bounds[1:])]
    h = torch.cat(hs, dim=1)[0]
    assert h.shape == (ids.shape[1], W.shape[1])
    return (h @ W.T).float()


# Runner against the Hugging Face forward

@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
@pytest.mark.parametrize("cuts", [[5], [5, 6, 7], [1, 12]])
def test_runner_chunks_match_hf(pair, which, cuts):
    model = pair[which]
    ids = ids_of(17, seed=which + 10)
    ref = hf_logits(model, ids)
    got = runner_logits(model, Runner(model, 32), ids, cuts)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_runner_greedy_matches_hf(pair, which):
    model = pair[which]
    ids = ids_of(12, seed=3)
    r = Runner(model, 16)
    got = torch.cat([r.greedy(ids[:, :7], 0, graph=False), r.greedy(ids[:, 7:], 7, graph=False)])
    assert torch.equal(got, hf_logits(model, ids).argmax(-1))


@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_runner_rewind_overwrites_stale_cache(pair, which):
    # Speculative decoding rewinds after a rejection: positions past the rewind point hold stale K/V
    # that must be overwritten (and never attended to).
    model = pair[which]
    a, b = ids_of(16, seed=1), ids_of(16, seed=2)
    r = Runner(model, 24)
    runner_logits(model, r, a, [8])                                   # fill the cache with sequence a
    mixed = torch.cat([a[:, :6], b[:, 6:]], dim=1)
    W = model.get_output_embeddings().weight
    h = torch.cat([r.forward(mixed[:, 6:9], 6, graph=False), r.forward(mixed[:, 9:], 9, graph=False)], dim=1)[0]
    got = (h @ W.T).float()
    ref = hf_logits(model, mixed)[6:]
    assert torch.equal(got.argmax(-1), ref.argmax(-1))
    assert torch.allclose(got, ref, atol=1e-4, rtol=0)


def test_runner_leaves_the_model_intact(syn, tmp_path):
    # A Runner may re-lay the model's weights out in memory, but the model must behave the same:
    # same state, same outputs, and it can still be saved and reloaded (with a fresh model, so the
    # test does not depend on which runners other tests built on the shared pair).
    from lib.models.synthetic import make_pair
    _, model = make_pair(syn, 0, "float32", "cpu", ("draft",))
    ids = ids_of(9, 8)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ref = hf_logits(model, ids)
    runners = [Runner(model, 16) for _ in range(2)]        # two runners on one model
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert torch.equal(hf_logits(model, ids), ref)
    for r in runners:
        assert torch.allclose(runner_logits(model, r, ids, [4]), ref, atol=1e-4, rtol=0)
    model.save_pretrained(tmp_path / "m")
    assert torch.equal(hf_logits(load_model(str(tmp_path / "m"), "float32", "cpu"), ids), ref)


def test_a_runner_after_the_model_moved_fuses_its_weights_again(syn):
    # A first runner fuses q/k/v and gate/up (the modules keep views); moving or casting the model afterwards gives
    # every module a tensor of its own, so a second runner must fuse those, not reuse the first fusion (left behind
    # in the old dtype: float32 weights against float64 activations would stop it).
    from lib.models.synthetic import make_pair
    _, model = make_pair(syn, 0, "float32", "cpu", ("draft",))
    ids = ids_of(9, 6)
    runner_logits(model, Runner(model, 16), ids, [4])
    model.double()
    assert torch.allclose(runner_logits(model, Runner(model, 16), ids, [4]), hf_logits(model, ids), atol=1e-6, rtol=0)
    att = model.model.layers[0].self_attn
    fused, sizes = model.model.layers[0].__dict__["fused_qkv"]
    assert fused.dtype == torch.float64 and att.k_proj.weight.data_ptr() == fused.split(sizes)[1].data_ptr()


def test_runner_cache_overflow(pair):
    model = pair[1]
    r = Runner(model, 16)
    r.forward(ids_of(16, 0), 0, graph=False)                           # exactly full is fine
    with pytest.raises(ValueError, match="16"):
        r.forward(ids_of(17, 0), 0, graph=False)
    with pytest.raises(ValueError):
        r.forward(ids_of(1, 0), 16, graph=False)
    with pytest.raises(ValueError):
        r.greedy(ids_of(4, 0), 13, graph=False)


def test_runner_on_cpu_ignores_graphs(pair):
    model = pair[1]
    ids = ids_of(9, 4)
    r = Runner(model, 16, Acceleration(graphs=True))                                 # CPU: graphs silently off
    assert not r.graphs
    assert torch.equal(r.greedy(ids, 0), hf_logits(model, ids).argmax(-1))


# make_pair(which=...) builds one model of the pair, identical to the full build

@pytest.mark.parametrize("which", [("target",), ("draft",)])
def test_make_pair_partial(pair, syn, which):
    from lib.models.synthetic import make_pair
    got = make_pair(syn, 0, "float32", "cpu", which)
    for i, name in enumerate(("target", "draft")):
        if name in which:
            want = pair[i].state_dict()
            have = got[i].state_dict()
            assert have.keys() == want.keys() and all(torch.equal(have[k], want[k]) for k in want)
        else:
            assert got[i] is None


# save_pretrained / load_model

@pytest.mark.parametrize("which", [0, 1], ids=["target", "draft"])
def test_save_and_load_round_trip(pair, tmp_path, which):
    model = pair[which]
    model.save_pretrained(tmp_path / "m")
    loaded = load_model(str(tmp_path / "m"), "float32", "cpu")
    assert not loaded.training
    ids = ids_of(11, 5)
    assert torch.equal(hf_logits(loaded, ids), hf_logits(model, ids))


# FlashHead checkpoint format

@pytest.fixture(scope="module")
def draft_dir(pair, tmp_path_factory):
    d = tmp_path_factory.mktemp("draft")
    pair[1].save_pretrained(d)
    return d


@pytest.fixture
def flash_dir(draft_dir, draft_clustering, tmp_path):
    _, cents, assign = draft_clustering
    return save_flash_checkpoint(draft_dir, tmp_path / "flash", cents, assign, 4, SPECIAL_IDS)


def rewrite_assets(path, **tensors):
    file = path / ASSETS
    t = load_file(str(file))
    t.update(tensors)
    save_file({k: v.contiguous() for k, v in t.items()}, str(file))


def edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            del cfg[k]
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_flash_checkpoint_round_trip(flash_dir, draft_clustering):
    _, cents, assign = draft_clustering
    cfg, c2, a2 = read_flash_checkpoint(flash_dir)
    assert cfg["architectures"] == ["FlashHeadQwen3ForCausalLM"]
    assert cfg["flash_head_cache_dir"] == "flash_head_assets"
    assert cfg["n_clusters"] == N_CLUSTERS and cfg["n_probes"] == 4
    assert cfg["flash_head_special_token_ids"] == SPECIAL_IDS
    assert cfg["hidden_size"] == DRAFT_D and cfg["vocab_size"] == VOCAB        # the draft's own keys kept
    assert c2.shape == (N_CLUSTERS, DRAFT_D) and c2.dtype == torch.float32
    assert a2.shape == (VOCAB,) and a2.dtype == torch.int64
    assert torch.allclose(c2, cents.float(), atol=1e-6) and torch.equal(a2, assign)   # unit rows, re-normalised
    assert (flash_dir / ASSETS).is_file() and (flash_dir / "model.safetensors").is_file()


def test_flash_checkpoint_body_loads_as_the_draft(flash_dir, pair):
    loaded = load_model(str(flash_dir), "float32", "cpu")
    ids = ids_of(10, 6)
    assert torch.equal(hf_logits(loaded, ids), hf_logits(pair[1], ids))


def test_save_flash_checkpoint_replaces_existing_dir(flash_dir, draft_dir, draft_clustering):
    _, cents, assign = draft_clustering
    (flash_dir / "stale.txt").write_text("old")
    out = save_flash_checkpoint(draft_dir, flash_dir, cents, assign, 8, [])
    assert not (out / "stale.txt").exists()
    cfg, _, _ = read_flash_checkpoint(out)
    assert cfg["n_probes"] == 8 and cfg["flash_head_special_token_ids"] == []


def test_written_in_embedls_layout(flash_dir, draft_clustering):
    stored = load_file(str(flash_dir / ASSETS))["centroids"]
    assert stored.shape == (1, 1, DRAFT_D, N_CLUSTERS)                     # (1, 1, d, c), as Embedl ships it


@pytest.mark.parametrize("layout", ["cd", "11dc"])
def test_read_accepts_both_layouts(flash_dir, draft_clustering, layout):
    _, cents, assign = draft_clustering
    stored = {"cd": cents, "11dc": cents.T[None, None]}[layout]
    rewrite_assets(flash_dir, centroids=stored.float())
    _, c2, a2 = read_flash_checkpoint(flash_dir)
    assert c2.shape == (N_CLUSTERS, DRAFT_D)
    assert torch.allclose(c2, cents.float(), atol=1e-6) and torch.equal(a2, assign)


@pytest.mark.parametrize("layout", ["dc", "1cd", "11cd"])
def test_orientation_comes_from_the_layout_not_the_shape(flash_dir, draft_clustering, layout):
    # (d,c) in two dimensions or (c,d) in Embedl's four is a wrong layout, refused rather than guessed.
    _, cents, _ = draft_clustering
    stored = {"dc": cents.T, "1cd": cents[None], "11cd": cents[None, None]}[layout]
    rewrite_assets(flash_dir, centroids=stored.contiguous().float())
    with pytest.raises(ValueError, match="centroids"):
        read_flash_checkpoint(flash_dir)


def test_square_centroids_are_read_the_right_way(pair, tmp_path):
    """c == d: only the layout can tell the orientation; the shape cannot."""
    from lib.models import clustering as cl
    W = pair[1].get_output_embeddings().weight.detach()
    c = W.shape[1]                                                          # 32 clusters of 16 over d = 32
    assign = cl.spherical_kmeans(W, c, 4, seed=0, equal=True, candidates=8, progress=False)
    cents = cl.centroids_of(cl.unit(W.float()), assign, c)
    pair[1].save_pretrained(tmp_path / "draft")
    out = save_flash_checkpoint(tmp_path / "draft", tmp_path / "flash", cents, assign, 4, [])
    _, c2, _ = read_flash_checkpoint(out)
    assert c2.shape == (c, c) and torch.allclose(c2, cents, atol=1e-6)
    assert not torch.allclose(c2, cents.T, atol=1e-3)


def test_centroids_are_normalised_when_read(flash_dir, draft_clustering):
    _, cents, _ = draft_clustering
    scale = torch.linspace(0.5, 3.0, N_CLUSTERS)[:, None]
    rewrite_assets(flash_dir, centroids=(cents * scale).T[None, None].contiguous().float())
    _, c2, _ = read_flash_checkpoint(flash_dir)
    assert torch.allclose(c2.norm(dim=-1), torch.ones(N_CLUSTERS), atol=1e-6)
    assert torch.allclose(c2, cents.float(), atol=1e-6)


def test_checkpoint_probes_used_when_the_profile_sets_none(flash_dir):
    from dataclasses import replace
    from lib.config import load_profile
    p = load_profile("smoke")
    p = replace(p, models=replace(p.models, source="pretrained", target="x", draft="x", flash_draft=str(flash_dir)),
                clustering=replace(p.clustering, n_probes=None))
    _, head = flash_checkpoint.load_flash_draft(p)
    assert head.n_probes == 4                                               # the checkpoint's n_probes
    _, head = flash_checkpoint.load_flash_draft(replace(p, clustering=replace(p.clustering, n_probes=7)))
    assert head.n_probes == 7


def test_read_missing_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        read_flash_checkpoint(tmp_path)


def test_read_missing_assets(flash_dir):
    (flash_dir / ASSETS).unlink()
    with pytest.raises(FileNotFoundError, match="clustering_cache.safetensors"):
        read_flash_checkpoint(flash_dir)


@pytest.mark.parametrize("key", ["flash_head_cache_dir", "n_clusters", "n_probes", "flash_head_special_token_ids"])
def test_read_missing_flash_key(flash_dir, key):
    edit_config(flash_dir, **{key: None})
    with pytest.raises(ValueError, match=key):
        read_flash_checkpoint(flash_dir)


def test_read_missing_tensor(flash_dir):
    t = load_file(str(flash_dir / ASSETS))
    save_file({"centroids": t["centroids"]}, str(flash_dir / ASSETS))
    with pytest.raises(ValueError, match="cluster_assignments"):
        read_flash_checkpoint(flash_dir)


def test_read_unequal_cluster_sizes(flash_dir, draft_clustering):
    assign = draft_clustering[2].clone()
    assign[0] = (assign[0] + 1) % N_CLUSTERS
    rewrite_assets(flash_dir, cluster_assignments=assign)
    with pytest.raises(ValueError, match="equal size"):
        read_flash_checkpoint(flash_dir)


def test_read_cluster_ids_out_of_range(flash_dir, draft_clustering):
    assign = draft_clustering[2].clone()
    assign[assign == 0] = N_CLUSTERS                                   # sizes still equal, ids wrong
    rewrite_assets(flash_dir, cluster_assignments=assign)
    with pytest.raises(ValueError, match="outside"):
        read_flash_checkpoint(flash_dir)


def test_read_assignments_length_mismatch(flash_dir, draft_clustering):
    assign = draft_clustering[2]
    b = VOCAB // N_CLUSTERS
    keep = assign < N_CLUSTERS - 1                                     # drop one whole cluster: sizes stay equal
    assert keep.sum() == VOCAB - b
    rewrite_assets(flash_dir, cluster_assignments=assign[keep])
    with pytest.raises(ValueError, match=f"{VOCAB - b} entries"):
        read_flash_checkpoint(flash_dir)


def test_read_vocab_size_argument_overrides_config(flash_dir):
    with pytest.raises(ValueError, match="vocabulary"):
        read_flash_checkpoint(flash_dir, vocab_size=VOCAB * 2)
    assert read_flash_checkpoint(flash_dir, hidden_size=DRAFT_D, vocab_size=VOCAB)[2].numel() == VOCAB


def test_read_centroids_wrong_hidden_size(flash_dir, draft_clustering):
    with pytest.raises(ValueError, match="centroids"):
        read_flash_checkpoint(flash_dir, hidden_size=DRAFT_D + 8)
    cents = draft_clustering[1]
    rewrite_assets(flash_dir, centroids=cents[:, :DRAFT_D - 4].float())
    with pytest.raises(ValueError, match="hidden_size"):
        read_flash_checkpoint(flash_dir)


def test_read_centroids_wrong_cluster_count(flash_dir, draft_clustering):
    cents = draft_clustering[1]
    rewrite_assets(flash_dir, centroids=cents[:-1].float())
    with pytest.raises(ValueError, match="n_clusters"):
        read_flash_checkpoint(flash_dir)
    rewrite_assets(flash_dir, centroids=cents.float())
    edit_config(flash_dir, n_clusters=N_CLUSTERS // 2)
    with pytest.raises(ValueError, match="n_clusters"):
        read_flash_checkpoint(flash_dir)


def test_read_centroids_not_a_matrix(flash_dir, draft_clustering):
    rewrite_assets(flash_dir, centroids=draft_clustering[1].reshape(N_CLUSTERS, 4, DRAFT_D // 4).float())
    with pytest.raises(ValueError, match="centroids"):
        read_flash_checkpoint(flash_dir)


# the synthetic pair on disk

def test_the_synthetic_pair_is_made_again_when_its_tokenizers_corpus_changes(syn, tmp_path, monkeypatch):
    """The synthetic tokenizer is trained on the built-in prompts: with other prompts there, the saved pair (its
    stamp) is not current, so every machine encodes prompts with the tokenizer the current corpus gives."""
    from dataclasses import replace
    from lib import prompts as prompt_lib
    from lib.config import load_profile
    from lib.models import checkpoints
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    p = load_profile("smoke")
    p = replace(p, models=replace(p.models, synthetic=replace(syn, save_target=False)))
    corpus = tmp_path / "prompts.jsonl"
    monkeypatch.setattr(prompt_lib, "BUILTIN", corpus)
    line = lambda i, text: json.dumps({"question_id": i, "category": "qa", "turns": [text]}) + "\n"
    text = "the quick brown fox jumps over the lazy dog " * 4
    corpus.write_text(line(1, "aaaa aaaa aaaa"))
    root = checkpoints.ensure_synthetic(p)
    corpus.write_text(line(1, text))
    assert not checkpoints.synthetic_current(p)
    checkpoints.ensure_synthetic(p)
    encode = lambda tok: tok("quick fox")["input_ids"]
    assert encode(checkpoints.load_tokenizer(p)) == encode(checkpoints.make_tokenizer(syn.vocab_size, [text]))
    assert (root / "draft" / "model.safetensors").is_file()


def test_a_models_stamp_holds_the_code_that_made_it(syn, tmp_path, monkeypatch):
    """A synthetic pair made by other code (lib/models/synthetic.py, quantize.py for an int4 target) is made again,
    and a GGUF conversion's stamp holds its conversion code: their stamps had held inputs and settings only."""
    from dataclasses import replace
    from lib import prompts as prompt_lib
    from lib.config import load_profile
    from lib.models import checkpoints
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path / "models"))
    p = load_profile("smoke")
    p = replace(p, models=replace(p.models, synthetic=replace(syn, save_target=False)))
    checkpoints.ensure_synthetic(p)
    assert checkpoints.synthetic_current(p)
    monkeypatch.setattr(checkpoints, "synthetic", prompt_lib)                  # stands in for changed code
    assert not checkpoints.synthetic_current(p)
    gguf = load_profile("smollm2")
    before = checkpoints.gguf_stamp(gguf)
    monkeypatch.setattr(checkpoints, "convert_gguf", checkpoints.ensure_gguf)
    changed = checkpoints.code_digest(checkpoints.ensure_gguf, checkpoints.ensure_gguf)
    assert checkpoints.gguf_stamp(gguf) == {**before, "code": changed}
    assert checkpoints.gguf_stamp(gguf)["code"] != before["code"]


def test_code_without_source_at_hand_still_has_a_digest():
    """A function made by exec (or a .pyc-only install) has no source: its compiled code is digested instead."""
    from lib.models import checkpoints
    scope = {}
    exec("def made(x):\n    return x + 1\n", scope)
    exec("def other(x):\n    return x + 2\n", scope)
    assert checkpoints.code_digest(scope["made"]) != checkpoints.code_digest(scope["other"])
    assert checkpoints.code_digest(scope["made"]) == checkpoints.code_digest(scope["made"])


def test_a_relative_model_directory_is_the_repositorys_whatever_the_working_directory(pair, tmp_path, monkeypatch):
    """models.* given as local directories relative to the repository: preflight (run in the repository) found
    them, then the notebooks (run in notebooks/) did not."""
    import os
    from lib.config import ROOT
    from lib.models.checkpoints import is_available
    pair[1].save_pretrained(tmp_path / "draft")
    name = os.path.relpath(tmp_path / "draft", ROOT)
    for cwd in (ROOT, ROOT / "notebooks"):
        monkeypatch.chdir(cwd)
        assert is_available(name)
        assert torch.equal(hf_logits(load_model(name, "float32", "cpu"), ids_of(5, 1)), hf_logits(pair[1], ids_of(5, 1)))
