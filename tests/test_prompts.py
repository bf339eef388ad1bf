import json
from collections import Counter
from pathlib import Path

import pytest

from lib.prompts import SPEC_BENCH as SPEC_BENCH_PLACE
from lib.prompts import (BUILTIN, GROUPS, MT_BENCH_CATEGORIES, Prompt, encode, group_of,
                         load_questions, select)

# The study reads Spec-Bench from data/spec_bench/ only; the tests fall back to ../shared's copy.
SHARED = Path(__file__).resolve().parents[2] / "shared" / "spec_bench" / "question.jsonl"
SPEC_BENCH = SPEC_BENCH_PLACE if SPEC_BENCH_PLACE.is_file() else SHARED


@pytest.fixture(scope="module")
def builtin() -> list[Prompt]:
    return load_questions(BUILTIN)


@pytest.fixture(scope="module")
def tokenizer(builtin):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({w for p in builtin for w in p.text.split()})
    vocab = {"[UNK]": 0} | {w: i for i, w in enumerate(words, 1)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# builtin set

def test_builtin_has_four_per_group(builtin):
    assert len(builtin) == 24
    assert Counter(p.group for p in builtin) == {g: 4 for g in GROUPS}
    assert [p.question_id for p in builtin] == list(range(1, 25))
    assert {p.category for p in builtin if p.group == "mt_bench"} == {"writing", "reasoning", "coding", "humanities"}


def test_builtin_is_plain_ascii_spec_bench_schema():
    raw = BUILTIN.read_bytes()
    raw.decode("ascii")
    for line in raw.decode().splitlines():
        q = json.loads(line)
        assert set(q) == {"question_id", "category", "turns"}
        assert 1 <= len(q["turns"]) <= 2
        assert 15 <= len(q["turns"][0].split()) <= 150


def test_builtin_text_is_first_turn(builtin):
    first = json.loads(BUILTIN.read_text().splitlines()[0])
    assert builtin[0].text == first["turns"][0]
    assert all(p.group == "translation" and p.text.startswith("Translate German to English: ")
               for p in builtin if p.category == "translation")


# group_of

def test_group_of_maps_mt_bench_subcategories():
    assert all(group_of(c) == "mt_bench" for c in MT_BENCH_CATEGORIES)
    assert [group_of(g) for g in GROUPS[1:]] == list(GROUPS[1:])


@pytest.mark.parametrize("bad", ["mt_bench", "poetry", "", "Writing"])
def test_group_of_rejects_unknown(bad):
    with pytest.raises(ValueError, match="unknown category") as e:
        group_of(bad)
    assert repr(bad) in str(e.value) and "roleplay" in str(e.value) and "rag" in str(e.value)


# select

def test_select_order_and_determinism(builtin):
    got = select(builtin, per_group=2)
    assert [p.group for p in got] == [g for g in GROUPS for _ in range(2)]
    for g in GROUPS:
        in_file = [p for p in builtin if p.group == g]
        assert [p for p in got if p.group == g] == in_file[:2]
    assert select(builtin, per_group=2) == got
    assert select(list(reversed(builtin)), per_group=1)[0] == [p for p in builtin if p.group == "mt_bench"][-1]


def test_select_all_groups_subset_and_limit(builtin):
    assert len(select(builtin)) == 24
    assert [p.group for p in select(builtin)] == sorted((p.group for p in builtin), key=GROUPS.index)
    got = select(builtin, per_group=1, groups=("rag", "qa"))
    assert [p.group for p in got] == ["rag", "qa"]
    assert select(builtin, per_group=3, limit=5) == select(builtin, per_group=3)[:5]
    assert select(builtin, limit=0) == []


def test_select_errors(builtin):
    with pytest.raises(ValueError, match=r"'mt_bench'.*5.*4"):
        select(builtin, per_group=5)
    with pytest.raises(ValueError, match=r"'qa'.*5.*4"):
        select(builtin, per_group=5, groups=("qa",))
    with pytest.raises(ValueError, match="unknown group"):
        select(builtin, groups=("writing",))
    with pytest.raises(ValueError):
        select(builtin, per_group=-1)


# load_questions errors

def test_missing_file_says_where_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        load_questions(tmp_path / "question.jsonl")
    msg = str(e.value)
    assert "https://github.com/hemingkx/Spec-Bench" in msg
    assert "data/spec_bench/question.jsonl" in msg
    assert str(SPEC_BENCH_PLACE) in msg and "shared/" not in msg          # one place, named


@pytest.mark.parametrize("bad", [
    "{not json",
    '{"question_id": 3, "category": "qa"}',
    '{"question_id": 3, "category": "poetry", "turns": ["hi"]}',
    '{"question_id": 3, "category": "qa", "turns": []}',
    '{"question_id": "3", "category": "qa", "turns": ["hi"]}',
])
def test_malformed_line_names_file_and_line(tmp_path, bad):
    good = json.dumps({"question_id": 1, "category": "qa", "turns": ["What is two plus two?"]})
    path = write_lines(tmp_path / "q.jsonl", [good, bad])
    with pytest.raises(ValueError, match=r"q\.jsonl:2:"):
        load_questions(path)


def test_a_question_id_given_twice_is_refused_naming_file_and_line(tmp_path):
    """A sample is (iteration, question id, mode): a second prompt of the same id had its samples taken for the
    first's on resume and dropped as duplicates when the run finished."""
    q = lambda text: json.dumps({"question_id": 5, "category": "qa", "turns": [text]})
    path = write_lines(tmp_path / "q.jsonl", [q("first"), q("second")])
    with pytest.raises(ValueError, match=r"q\.jsonl:2: malformed question: question_id 5 is given twice"):
        load_questions(path)


def test_load_skips_blank_lines_and_keeps_first_turn(tmp_path):
    q = {"question_id": 7, "category": "stem", "turns": ["first turn", "second turn"]}
    path = write_lines(tmp_path / "q.jsonl", [json.dumps(q), ""])
    assert load_questions(str(path)) == [Prompt(7, "mt_bench", "stem", "first turn")]


# encode

def test_encode_matches_tokenizer_and_truncates_left(builtin, tokenizer):
    ps = select(builtin, per_group=1)
    full = [tokenizer(p.text, add_special_tokens=False)["input_ids"] for p in ps]
    assert encode(ps, tokenizer, max_tokens=10_000) == full
    assert all(0 not in ids for ids in full)  # every builtin word is in the vocab
    cut = encode(ps, tokenizer, max_tokens=8)
    assert cut == [ids[-8:] for ids in full]
    assert all(len(ids) == 8 for ids in cut)


def test_encode_errors(tokenizer):
    with pytest.raises(ValueError, match="question 42"):
        encode([Prompt(42, "qa", "qa", "   ")], tokenizer, max_tokens=8)
    with pytest.raises(ValueError, match="max_tokens"):
        encode([Prompt(1, "qa", "qa", "hi")], tokenizer, max_tokens=0)


# real Spec-Bench file, when present

@pytest.mark.skipif(not SPEC_BENCH.is_file(), reason=f"Spec-Bench question.jsonl not at {SPEC_BENCH}")
def test_spec_bench_file():
    prompts = load_questions(SPEC_BENCH)
    assert len(prompts) == 480
    assert Counter(p.group for p in prompts) == {g: 80 for g in GROUPS}
    got = select(prompts, per_group=2)
    assert len(got) == 12
    assert [p.group for p in got] == [g for g in GROUPS for _ in range(2)]
