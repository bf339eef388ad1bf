"""lib/models/quantize.py: AWQ int4 (GEMM layout) round-to-nearest quantiser and checkpoint writer, checked against
the independent packing of tests/fixtures_thesis.py and loaded back through the study's real path
(checkpoints.load_model -> AwqConfig -> gptqmodel's torch_awq kernel on a CPU)."""
import json
from dataclasses import replace

import pytest
import torch

from lib.models import checkpoints, quantize as qz
from lib.config import ConfigError, Shape, load_profile
from lib.profile_rules import validate as _validate
from lib.models.synthetic import make_pair

import fixtures_thesis as fx


def test_pack_round_trip_and_nibble_order():
    q = torch.randint(0, 16, (16, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    p = qz.pack(q)
    assert p.dtype == torch.int32 and p.shape == (16, 8)
    assert torch.equal(qz.unpack(p), q)
    assert torch.equal(p, fx.pack_int4_awq(q)) and torch.equal(fx.unpack_int4_awq(p), q)   # independent packer
    v = p[0, 0].item() & 0xFFFFFFFF
    assert [(v >> (4 * j)) & 0xF for j in range(8)] == [q[0, c].item() for c in qz.AWQ_ORDER]  # [0,2,4,6,1,3,5,7]


def test_quantised_weights_within_half_a_step():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 384, generator=g) * 0.05
    w[:8, :128] = torch.rand(8, 128, generator=g) + 0.5                        # all-positive groups: range widened to 0
    t = qz.quantize_weight(w.to(torch.bfloat16))
    wb = w.to(torch.bfloat16).float()
    assert (t["qweight"].shape, t["qzeros"].shape, t["scales"].shape) == ((384, 8), (3, 8), (3, 64))
    assert (t["qweight"].dtype, t["qzeros"].dtype, t["scales"].dtype) == (torch.int32, torch.int32, torch.float16)
    step = t["scales"].float().repeat_interleave(qz.GROUP, 0).t()                # (out, in)
    err = (qz.dequantize(**t) - wb).abs()
    assert (err <= step * (0.5 + 1e-3)).all()
    z = qz.unpack(t["qzeros"])
    assert z.min() >= 0 and z.max() <= 15


def test_shapes_off_the_group_size_are_refused():
    with pytest.raises(ValueError, match="divisible by the group size 128"):
        qz.quantize_weight(torch.randn(64, 100))
    with pytest.raises(ValueError, match="out_features divisible by 8"):
        qz.quantize_weight(torch.randn(60, 128))
    model = make_pair(fx.tiny_synthetic(), 0, "float32", "cpu", ("draft",))[1]     # hidden 64: not a multiple of 128
    with pytest.raises(ValueError, match="layer 0 self_attn.q_proj"):
        qz.write_awq_model(model, "/nonexistent/never-written")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """The tiny synthetic target written in shards by write_awq_model; its dense reference decoded here."""
    target = make_pair(fx.tiny_synthetic(), 0, "float32", "cpu", ("target",))[0]
    out = qz.write_awq_model(target, tmp_path_factory.mktemp("awq") / "target", shard_bytes=100_000)
    return out, qz.dequantized_model(out)


def test_checkpoint_format(written):
    out, _ = written
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == qz.QUANT_CONFIG and cfg["dtype"] == "float16"
    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and all((out / f).is_file() for f in files) and not (out.parent / "target.part").exists()
    tensors = dict(qz.read_tensors(out))
    assert set(tensors) == set(index["weight_map"])
    q = "model.layers.1.mlp.down_proj"                                           # (out 128, in 256)
    assert tensors[f"{q}.qweight"].shape == (256, 16) and tensors[f"{q}.qzeros"].shape == (2, 16)
    assert tensors[f"{q}.scales"].shape == (2, 128) and f"{q}.weight" not in tensors
    assert all(v.dtype == torch.float16 for k, v in tensors.items() if not k.endswith(("qweight", "qzeros")))
    assert "lm_head.weight" in tensors and "model.layers.0.self_attn.q_norm.weight" in tensors
    assert sum((out / f).stat().st_size for f in files) == pytest.approx(
        qz.checkpoint_bytes(fx.tiny_synthetic().target, fx.VOCAB), rel=0.05)


def test_written_checkpoint_loads_through_gptqmodel_and_matches(written):
    pytest.importorskip("gptqmodel")
    out, ref = written
    model = checkpoints.load_model(str(out), "float32", "cpu", "torch_awq")
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "AwqTorchLinear"
    ids = torch.randint(0, fx.VOCAB, (1, 16), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got, want = model(ids).logits[0], ref(ids).logits[0]
    assert (got - want).abs().max() < 2e-3 * want.abs().max()                   # the kernel's fp16 arithmetic
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


def test_writer_frees_the_dense_layers(tmp_path):
    target = make_pair(fx.tiny_synthetic(), 0, "float32", "cpu", ("target",))[0]
    qz.write_awq_model(target, tmp_path / "target")
    assert all(p.is_meta for p in target.model.layers.parameters())              # GPU memory only falls


def test_profile_validation():
    p = load_profile("h100awq")
    s = p.models.synthetic
    assert (s.target_quant, s.save_target, p.dtype, p.models.awq_backend) == ("awq", True, "float16", "triton_w4a16")
    assert s.target == Shape(5120, s.target.num_hidden_layers, 64, 8, 128, 25600)
    for bad, msg in [(replace(p, dtype="bfloat16"), "needs dtype float16"),
                     (replace(p, models=replace(p.models, synthetic=replace(s, save_target=False))), "save_target"),
                     (replace(p, models=replace(p.models, synthetic=replace(s, target_quant="gptq"))), "target_quant"),
                     (replace(p, models=replace(p.models, synthetic=replace(
                         s, target=replace(s.target, intermediate_size=25664)))), "group size 128")]:
        with pytest.raises(ConfigError, match=msg):
            _validate(bad, "h100awq.yaml")


def test_ensure_synthetic_writes_the_awq_target(monkeypatch, tmp_path):
    """A tiny awq profile through ensure_synthetic and load_target (torch_awq on a CPU)."""
    pytest.importorskip("gptqmodel")
    monkeypatch.setenv("STUDY_MODELS", str(tmp_path))
    p = load_profile("h100awq")
    syn = replace(fx.tiny_synthetic(), target=Shape(128, 2, 4, 2, 32, 256), save_target=True, target_quant="awq")
    p = replace(p, dtype="float32", target_device="cpu", draft_device="cpu",
                models=replace(p.models, synthetic=syn, awq_backend="torch_awq"))
    root = checkpoints.ensure_synthetic(p)
    assert json.loads((root / "target" / "config.json").read_text())["quantization_config"]["quant_method"] == "awq"
    assert (root / "target" / "tokenizer.json").is_file() and (root / "draft" / "model.safetensors").is_file()
    target = checkpoints.load_target(p)
    assert hasattr(target.model.layers[0].self_attn.q_proj, "qweight")
    ref = qz.dequantized_model(root / "target")
    ids = torch.randint(0, fx.VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, want = target(ids).logits[0], ref(ids).logits[0]
    assert (got - want).abs().max() < 2e-3 * want.abs().max()


def test_runner_compiles_around_quantised_projections(written):
    """The AWQ modules are called opaquely (lib.engine.layer.project): the compiled layer function, graph-broken
    at each of them, gives the eager runner's hidden states and tokens."""
    pytest.importorskip("gptqmodel")
    from lib.engine.runner import Acceleration, Runner
    model = checkpoints.load_model(str(written[0]), "float32", "cpu", "torch_awq")
    ids = torch.randint(0, fx.VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    eager, compiled = Runner(model, 32), Runner(model, 32, Acceleration(compile=True))
    assert not any(compiled.fused)                                              # quantised: nothing fused
    for r in (eager, compiled):
        r.prefill(ids[:, :8])
    start = torch.tensor(8)
    with torch.no_grad():                                                       # graphs are CUDA-only: call the
        want = eager._forward(ids[:, 8:], start, compiled=False)               # layer function both ways
        got = compiled._forward(ids[:, 8:], start, compiled=True)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(compiled._argmax(got), eager._argmax(want))
