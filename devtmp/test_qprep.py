"""Interpreter check of devtmp/qprep.py: the variant layer equals the library's Triton-layer path to fp32 rounding, and
a target through it keeps speculative output greedy. Run alone: TRITON_INTERPRET=1 python -m pytest devtmp/test_qprep.py"""
import os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
sys.path.insert(0, os.path.dirname(__file__))
import torch
from conftest import pair, syn  # noqa: F401
from lib.engine.runner import Acceleration, Runner
from lib.engine.heads import DenseHead
from lib.engine.speculative import Request, generate_baseline, generate_speculative
from lib.models.build import make_draft, make_target
import qprep


def test_variant_equals_the_library_path(pair):
    target = pair[0]
    ref = Runner(target, 40, Acceleration(triton_layers=True))
    qprep.install(target, 40, 0)
    try:
        var = Runner(target, 40, Acceleration(triton_layers=True))
        ids = torch.randint(3, 500, (1, 20), generator=torch.Generator().manual_seed(3))
        for r in (ref, var):
            r.prefill(ids[:, :10])
        for p in (10, 14):
            torch.testing.assert_close(var.forward(ids[:, p:p + 4], p), ref.forward(ids[:, p:p + 4], p), rtol=1e-5, atol=1e-5)
        target_engine = make_target(target, 120, Acceleration(rows=5, triton_layers=True))
        qprep.install(target, 120, 5)
        target_engine = make_target(target, 120, Acceleration(rows=5, triton_layers=True))
        draft = make_draft(pair[1], DenseHead(pair[1].get_output_embeddings().weight), 120)
        prompt = tuple(torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(2)).tolist())
        greedy = generate_baseline(target_engine, Request(prompt, 30)).tokens
        assert generate_speculative(target_engine, draft, Request(prompt, 30, "deferred", 4)).tokens == greedy
    finally:
        qprep.R.layer_forward = qprep.ORIGINAL


def test_the_variant_runs(pair, monkeypatch):
    calls = []
    op = qprep.attention_q
    monkeypatch.setattr(qprep, "attention_q", lambda *a: calls.append(1) or op(*a))
    qprep.install(pair[0], 40, 0)
    try:
        r = Runner(pair[0], 40, Acceleration(triton_layers=True))
        r.forward(torch.tensor([[5, 6, 7]]), 0)
        assert len(calls) == len(r.layers)
    finally:
        qprep.R.layer_forward = qprep.ORIGINAL
