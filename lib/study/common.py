"""What every study step shares: the profile set up for a run, its prompts (encoded, and those of the side
studies), stop tokens, the devices, hidden states along greedy trajectories, and measured call costs."""
from __future__ import annotations

import random

import numpy as np
import torch

from .. import bench, modes, prompts as prompt_lib
from ..models import checkpoints
from . import exit_depth, preflight
from ..config import Profile, load_profile
from ..engine.runner import Runner
from ..results import read_json


def setup(profile_name: str, analysis_only: bool = False) -> Profile:
    """Load and validate the profile, check this machine can run it (analysis_only: reading result files
    needs no GPU), seed everything, make its output directory."""
    profile = load_profile(profile_name)
    if not analysis_only:
        preflight.check(profile)
    if profile.target_device == profile.draft_device == "cpu":
        torch.set_num_threads(1)                  # small decoders: one intra-op thread beats two contending ones
    random.seed(profile.seed)
    np.random.seed(profile.seed)
    torch.manual_seed(profile.seed)
    profile.out_dir.mkdir(parents=True, exist_ok=True)
    return profile


def prompt_set(profile: Profile) -> list[prompt_lib.Prompt]:
    p = profile.prompts
    path, _ = prompt_lib.profile_prompt_file(p.file)
    chosen = prompt_lib.select(prompt_lib.load_questions(path), p.per_group, limit=p.limit)
    if not chosen:                    # every step needs one (a run of no sample would be finished, and analysed)
        raise ValueError(f"{profile.name}: no prompt selected from {path} (prompts.per_group {p.per_group}, "
                         f"prompts.limit {p.limit}); every step runs on at least one")
    return chosen


def encoded_prompts(profile: Profile, tokenizer=None) -> list[tuple[prompt_lib.Prompt, list[int]]]:
    """The profile's prompts with their token ids (the draft's tokenizer unless one is given)."""
    tokenizer = tokenizer or checkpoints.load_tokenizer(profile)
    ps = prompt_set(profile)
    ids = prompt_lib.encode(ps, tokenizer, profile.decode.max_prompt_tokens, profile.prompts.chat_template)
    return list(zip(ps, ids))


def side_prompts(profile: Profile) -> list[tuple[prompt_lib.Prompt, list[int]]]:
    """The prompts of the side studies (peers, sampling, adaptive): the first prompts.side_prompts (0: all)."""
    return encoded_prompts(profile)[:profile.prompts.side_prompts or None]


def side_studies(profile: Profile, names: str = "") -> list[str]:
    """Notebook 03's side studies: the profile's, or instead the comma-separated `names` (its parameter)."""
    chosen = [n.strip() for n in names.split(",") if n.strip()] if names else list(profile.side_studies)
    unknown = sorted(set(chosen) - set(modes.SIDE_STUDIES))
    if unknown:
        raise ValueError(f"side_studies: unknown {unknown}; known: {list(modes.SIDE_STUDIES)}")
    if "context" in chosen and not profile.bench.context_lengths:                # the profile rule, for `names` too
        raise ValueError("side_studies: the context study needs bench.context_lengths (positions to time a round's "
                         "calls at)")
    return chosen


@torch.no_grad()
def hidden_states(model, seqs: list[list[int]], n_layers: int | None = None, skip: list[int] | None = None):
    """Final normed hidden states (sum of kept positions, d) of the model (its first n_layers: an early-exit
    draft) at every position of each sequence, after its first skip[i] positions."""
    runner = Runner(model, max(len(p) for p in seqs), n_layers=n_layers)
    dev, skip = runner.device, skip or [0] * len(seqs)
    return torch.cat([runner.forward(torch.tensor([p], device=dev), 0, graph=False)[0, s:] for p, s in zip(seqs, skip)])


def greedy_trajectories(profile: Profile, model, enc: list) -> tuple[list[list[int]], list[int]]:
    """Each prompt followed by the model's own greedy continuation (the positions a draft is asked about),
    and where each continuation starts (the last prompt position predicts its first token)."""
    stop, n = stop_tokens(profile), profile.decode.max_new_tokens
    seqs = [ids + exit_depth.greedy_trajectory(model, ids, n, stop)[:-1] for _, ids in enc]
    return seqs, [len(ids) - 1 for _, ids in enc]


def trajectories_and_states(profile: Profile, draft, enc: list) -> tuple[list[list[int]], list[int], torch.Tensor]:
    """greedy_trajectories of the prompts `enc` and the draft's hidden states along them at its own depth (the
    positions a draft is asked about): (seqs, starts, states)."""
    seqs, starts = greedy_trajectories(profile, draft, enc)
    return seqs, starts, hidden_states(draft, seqs, profile.models.exit_layer, starts)


def trajectory_states(profile: Profile, fh) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's hidden states along the greedy trajectories of the profile's prompts (trajectories_and_states)
    and the dense head's choice at each."""
    H = trajectories_and_states(profile, checkpoints.load_draft(profile), encoded_prompts(profile))[2].to(fh.weight)
    return H, (H @ fh.weight.T).argmax(-1)


def device_info(profile: Profile) -> dict:
    return {"target": bench.device_name(profile.target_device), "draft": bench.device_name(profile.draft_device),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def stop_tokens(profile: Profile, tokenizer=None) -> frozenset:
    """The end-of-sequence token ids generation stops at (none unless decode.stop_at_eos)."""
    if not profile.decode.stop_at_eos:
        return frozenset()
    tok = tokenizer or checkpoints.load_tokenizer(profile)
    ids = tok.eos_token_id
    return frozenset(ids if isinstance(ids, list) else [ids]) - {None}


def call_costs(profile: Profile, drafts=None) -> dict:
    """Per-draft call costs for the cost-model block policy, from notebooks 02-03's measurements, for `drafts`
    (default: the profile's)."""
    from .. import costmodel
    micro, steps = read_json(profile, "microbench.json"), read_json(profile, "target_step.json")
    return {d: costmodel.call_costs(micro, steps, d) for d in (drafts or profile.decode.modes) if d != modes.BASELINE}
