"""Prompt sets in Spec-Bench's question.jsonl format: loading, grouping, subsetting, encoding.

Spec-Bench (https://github.com/hemingkx/Spec-Bench) has six task groups: the eight MT-Bench
sub-categories count as one group, "mt_bench"; the other five are categories of their own.
"""
import json
from dataclasses import dataclass
from pathlib import Path

GROUPS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
ROOT = Path(__file__).resolve().parent.parent
BUILTIN = ROOT / "params" / "prompts_builtin.jsonl"
SPEC_BENCH = ROOT / "data" / "spec_bench" / "question.jsonl"          # the one place the study reads it from
SPEC_BENCH_HELP = (
    f"Spec-Bench's question.jsonl goes to {SPEC_BENCH}: `make data` fetches it, or copy it there from "
    "https://github.com/hemingkx/Spec-Bench (data/spec_bench/question.jsonl); prompts.file: builtin needs none"
)


def resolve_file(file: str) -> Path:
    """A profile's prompts.file: 'spec_bench' (the one place above) or a path (relative to the repository)."""
    return SPEC_BENCH if file == "spec_bench" else ROOT / Path(file).expanduser()


def profile_prompt_file(file: str) -> tuple[Path, str]:
    """(question file, what was used): 'builtin', 'spec_bench', 'auto' (Spec-Bench if present, else
    built-in) or a path."""
    if file == "builtin" or (file == "auto" and not SPEC_BENCH.is_file()):
        return BUILTIN, "built-in prompt set" + (f" ({SPEC_BENCH} is absent)" if file == "auto" else "")
    path = SPEC_BENCH if file == "auto" else resolve_file(file)
    return path, f"questions from {path}"


@dataclass(frozen=True)
class Prompt:
    question_id: int
    group: str
    category: str
    text: str  # first turn only


def group_of(category: str) -> str:
    """Spec-Bench task group of a question category."""
    if category in MT_BENCH_CATEGORIES:
        return "mt_bench"
    if category in GROUPS and category != "mt_bench":
        return category
    known = MT_BENCH_CATEGORIES + GROUPS[1:]
    raise ValueError(f"unknown category {category!r}; known: {', '.join(known)}")


def _parse(line: str) -> Prompt:
    q = json.loads(line)
    qid, category, turns = q["question_id"], q["category"], q["turns"]
    if not isinstance(qid, int) or isinstance(qid, bool):
        raise ValueError(f"question_id must be an int, got {qid!r}")
    if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
        raise ValueError("turns must be a non-empty list of strings")
    return Prompt(qid, group_of(category), category, turns[0])


def load_questions(path: str | Path) -> list[Prompt]:
    """Read a Spec-Bench-format question.jsonl, keeping the first turn of each question."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no question file at {path}. {SPEC_BENCH_HELP}")
    prompts, seen = [], set()
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                prompts.append(_parse(line))
                if prompts[-1].question_id in seen:            # a sample is (iteration, question id, mode)
                    raise ValueError(f"question_id {prompts[-1].question_id} is given twice")
                seen.add(prompts[-1].question_id)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: malformed question: {e}") from e
    return prompts


def select(prompts: list[Prompt], per_group: int | None = None,
           groups: tuple[str, ...] = GROUPS, limit: int | None = None) -> list[Prompt]:
    """Fixed subset: the first per_group prompts of each group (file order), groups in order, then the first limit."""
    if (per_group is not None and per_group < 0) or (limit is not None and limit < 0):
        raise ValueError(f"per_group and limit must be >= 0, got {per_group}, {limit}")
    out = []
    for g in groups:
        if g not in GROUPS:
            raise ValueError(f"unknown group {g!r}; known: {', '.join(GROUPS)}")
        members = [p for p in prompts if p.group == g]
        if per_group is not None and per_group > len(members):
            raise ValueError(f"group {g!r}: asked for {per_group} prompts, only {len(members)} available")
        out += members if per_group is None else members[:per_group]
    return out if limit is None else out[:limit]


def encode(prompts: list[Prompt], tokenizer, max_tokens: int, chat_template: bool = False) -> list[list[int]]:
    """Token ids of each prompt (no special tokens), keeping the last max_tokens if longer. chat_template:
    the prompt as a user turn of the tokenizer's chat template, up to the assistant's turn (its special
    tokens come from the template text)."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    ids = []
    for p in prompts:
        text = p.text
        if chat_template:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        x = list(tokenizer(text, add_special_tokens=False)["input_ids"])
        if not x:
            raise ValueError(f"question {p.question_id}: prompt encodes to no tokens")
        ids.append(x[-max_tokens:])
    return ids
