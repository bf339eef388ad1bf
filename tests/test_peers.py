"""Peers in the same harness (lib/study/peers.py): Hugging Face generate() greedy, static cache, assisted and
prompt-lookup decoding on the smoke pair and on a tiny random Llama with an early-exit assistant, against
this engine's greedy output; stop-token handling; the table and summary section; bad method names."""
from contextlib import contextmanager
from dataclasses import replace

import pandas as pd
import pytest
import torch
import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from lib import modes
from lib.study import peers, speculative
from lib import report
from lib.config import ROOT, ConfigError, load_profile
from lib.engine.speculative import Request, generate_baseline

MAX_NEW = 12
PROMPTS = [[3, 14, 15, 92, 65, 35, 89, 79, 32, 38], [7, 1, 8, 2, 8, 1, 8]]


@pytest.fixture(scope="module")
def smoke():
    p = load_profile("smoke")
    return replace(p, prompts=replace(p.prompts, per_group=1, limit=3),
                   decode=replace(p.decode, max_new_tokens=MAX_NEW), bench=replace(p.bench, e2e_warmup=1, e2e_iters=1))


@pytest.fixture(scope="module")
def smoke_data(smoke):
    return speculative.peer_study(smoke)


@pytest.fixture(scope="module")
def llama():
    """A tiny random Llama (3 layers, tied head) standing in for a gguf profile's model, fp32 on the CPU."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
                      initializer_range=0.3)                                 # large weights: varied greedy text
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def llama_profile(smoke):
    """The smoke profile read as a gguf one (the early-exit assistant at layer 2); validation is not re-run."""
    return replace(smoke, models=replace(smoke.models, source="gguf", exit_layer=2))


def test_smoke_peers_equal_engine_greedy(smoke, smoke_data):
    agg, rows = smoke_data["aggregate"], smoke_data["rows"]
    assert list(agg) == [modes.ENGINE_BASELINE, *modes.PEERS]
    for m, a in agg.items():
        assert a["samples"] == 3 and a["exact_match_rate"] == 1.0 and a["mean_prefix_frac"] == 1.0, m
        assert a["tok_s"] > 0 and a["decode_tok_s"] > 0
    by = {(r["method"], r["question_id"]): r for r in rows}
    for r in rows:
        assert r["new_tokens"] == MAX_NEW and not r["stopped"]                 # smoke: no eos, fixed length
        assert 0 < r["prefill_ms"] < r["wall_ms"] and r["decode_ms"] == pytest.approx(r["wall_ms"] - r["prefill_ms"])
        assert r["tokens"] == by[("hf_greedy", r["question_id"])]["tokens"]    # assisted, lookup, static == greedy
    assert smoke_data["config"]["eos_token_ids"] == [] and smoke_data["config"]["max_new_tokens"] == MAX_NEW


def test_summary_and_table(smoke, smoke_data):
    section = report.extra_summary(smoke)["peers"]
    assert set(section) == {"config", "aggregate", "written"}                   # raw rows stay in peers.json
    agg = pd.DataFrame({"decode_tok_s": [100.0, 150.0, 120.0], "decode_total_ms": [1000.0, 600.0, 800.0],
                        "ttft_ms": [10.0, 10.0, 10.0], "samples": [10, 10, 10], "exact_match_rate": [1.0, 1.0, 1.0]},
                       index=[modes.BASELINE, "dense_ordinary", "flash_ordinary"])
    t = report.peers_table(smoke_data, agg, "card of the e2e run")
    assert set(t.loc[[modes.BASELINE, "dense_ordinary"], "device"]) == {"card of the e2e run"}
    assert set(t.loc[[modes.ENGINE_BASELINE, *modes.PEERS], "device"]) == {smoke_data["config"]["device"]}
    assert list(t.index) == [modes.ENGINE_BASELINE, *modes.PEERS, modes.BASELINE, "dense_ordinary"]
    # baseline: 100 decode tokens + 10 first tokens in 1000 ms + 10 x 10 ms of prefill
    assert t.loc[modes.BASELINE, "tok_s"] == pytest.approx(100.0)
    assert t.loc["hf_greedy", "tok_s"] == smoke_data["aggregate"]["hf_greedy"]["tok_s"]


def test_notebook_03s_rows_beside_the_peers_come_from_the_prompts_the_peers_ran(smoke, smoke_data, tmp_path,
                                                                                monkeypatch):
    """The peers run the first prompts.side_prompts prompts; notebook 03's run all of them. Given the run's records,
    its rows in the peers table are its samples of the peers' prompts (they were the whole run's)."""
    from lib.results import save_json
    from lib.study import analysis
    from test_report import fake
    monkeypatch.setenv("STUDY_OUTPUTS", str(tmp_path))
    save_json(smoke, "peers.json", smoke_data)
    asked = smoke_data["config"]["prompts"]
    recs = [fake(mode, "deferred" if mode != modes.BASELINE else modes.BASELINE, 10, ms, [3, 3], 8, question_id=q)
            for q in range(1, max(asked) + 2) for mode, ms in ((modes.BASELINE, 100.0 if q in asked else 400.0),
                                                   ("dense_deferred", 50.0))]
    df = report.records_frame(recs)
    whole = analysis.peers(smoke, report.aggregate(df), "card", None)
    ours = analysis.peers(smoke, report.aggregate(df), "card", df)
    assert ours.loc[modes.BASELINE, "samples"] == len(asked) and whole.loc[modes.BASELINE, "samples"] == max(asked) + 1
    assert ours.loc[modes.BASELINE, "decode_tok_s"] == pytest.approx(1000 * 10 / 100.0)
    assert whole.loc[modes.BASELINE, "decode_tok_s"] < ours.loc[modes.BASELINE, "decode_tok_s"]
    assert ours.loc[modes.BASELINE, "source"] == "notebook 03 run"
    assert whole.loc[modes.BASELINE, "source"] == "notebook 03 run (all prompts)"


def test_early_exit_model_shares_the_targets_layers(llama):
    draft = peers.early_exit_model(llama, 2)
    assert len(draft.model.layers) == 2 and draft.model.layers[1] is llama.model.layers[1]
    assert draft.lm_head.weight.data_ptr() == llama.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[5, 17, 42, 9, 100]])
    with torch.no_grad():
        h = llama(ids, output_hidden_states=True).hidden_states[2]               # layer 2's output, before the norm
        want = llama.model.norm(h) @ llama.lm_head.weight.T
        torch.testing.assert_close(draft(ids).logits, want)


def test_early_exit_assistant_and_lookup_equal_engine_greedy(llama, llama_profile):
    h = peers.Harness(llama_profile, frozenset(), target_model=llama)
    calls = {m: 0 for m in modes.PEERS}
    for prompt in PROMPTS:
        ref = generate_baseline(h.engine, Request(prompt, MAX_NEW)).tokens
        for m in modes.PEERS:
            with target_calls(llama) as n:
                assert h.generate(m, prompt, MAX_NEW) == ref, m
            calls[m] += len(n)
    assert calls["hf_greedy"] == calls["hf_static"] == len(PROMPTS) * MAX_NEW     # prefill + one call a token
    assert calls["hf_assisted"] < len(PROMPTS) * MAX_NEW                          # the draft's proposals were accepted
    assert calls["hf_prompt_lookup"] < len(PROMPTS) * MAX_NEW                     # so were looked-up n-grams


def test_stop_tokens_are_the_engines_not_the_checkpoints(llama, llama_profile):
    prompt = PROMPTS[1]
    free = peers.Harness(llama_profile, frozenset(), target_model=llama)
    ref = generate_baseline(free.engine, Request(prompt, MAX_NEW)).tokens
    assert len(set(ref[:4])) == 4                                               # varied text: a stop at index 3
    llama.generation_config.eos_token_id = ref[0]                               # the checkpoint's eos: ignored
    try:
        assert free.generate("hf_greedy", prompt, MAX_NEW) == ref
        stop = frozenset([ref[3]])                                             # the engine's stop token: honoured
        stopping = peers.Harness(llama_profile, stop, target_model=llama)
        assert generate_baseline(stopping.engine, Request(prompt, MAX_NEW, stop=stop)).tokens == ref[:4]
        for m in modes.PEERS:
            assert stopping.generate(m, prompt, MAX_NEW) == ref[:4], m
        assert stopping.measure("hf_greedy", prompt)["stopped"]
    finally:
        llama.generation_config.eos_token_id = None


@contextmanager
def target_calls(model):
    """The list of the model's own forward calls (not its early-exit assistant's) during the block."""
    n = []
    hook = model.register_forward_hook(lambda *a: n.append(1))
    try:
        yield n
    finally:
        hook.remove()


def test_bad_method_names(smoke, llama, llama_profile, tmp_path):
    with pytest.raises(ValueError, match=r"unknown peer method\(s\) \['hf_beam'\]: use \['hf_greedy'"):
        peers.Harness(llama_profile, frozenset(), target_model=llama).generate("hf_beam", [1, 2, 3], 4)
    with pytest.raises(ValueError, match="unknown peer method"):                # before any model is loaded
        peers.run(replace(smoke, peers=replace(smoke.peers, methods=["hf_greedy", "speculative"])), [], frozenset())
    data = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())
    data["peers"] = {"methods": ["hf_greedy", "hf_beam"]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"bad.yaml: peers.methods: unknown method in \['hf_greedy', 'hf_beam'\]"):
        load_profile(str(tmp_path / "bad.yaml"))
