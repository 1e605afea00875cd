"""What an `LLM` call's arguments become: prompts as token ids checked against the model, one
SamplingParams and one priority per prompt, and the progress bar a call shows when asked (use_tqdm)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from tqdm import tqdm

from jaxinfer.config import validation
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.prompt_checks import check_prompt

Prompt = str | Sequence[int]


def encode(prompt: Prompt, tokenizer: Any | None, model_dir: Path, vocab_size: int) -> list[int]:
    """Token ids of a prompt (strings go through the model's tokenizer)."""
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError(f"{model_dir} has no tokenizer files; pass token ids instead of text")
        # verbose=False: the length check says what to change; HF's warning only adds noise.
        return list(tokenizer.encode(prompt, verbose=False))
    return validation.token_ids(prompt, "prompt", vocab_size)


def params_for(prompts: list[Prompt], params: SamplingParams | Sequence[SamplingParams] | None,
               defaults: SamplingParams, vocab_size: int) -> list[SamplingParams]:
    """One SamplingParams per prompt: the one given (or the model's defaults) for all, or one each."""
    if params is None or isinstance(params, SamplingParams):
        params_list = [params or defaults] * len(prompts)
    elif isinstance(params, (list, tuple)) and all(isinstance(p, SamplingParams) for p in params):
        params_list = list(params)
    else:
        raise TypeError(
            f"sampling_params must be a SamplingParams, a list of them (one per prompt) or None, got "
            f"{type(params).__name__}"
        )
    if len(params_list) != len(prompts):
        raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts; pass one or one each")
    for p in params_list:
        validation.token_ids(p.stop_token_ids, "stop_token_ids", vocab_size)
    return params_list


def priorities_for(priority: Sequence[int] | None, count: int) -> list[int]:
    """One priority per prompt (vLLM's `generate(priority=[...])`): 0 for all when None; each is checked as the
    engine queues it (an integer, and other than 0 only under scheduling_policy "priority")."""
    if priority is None:
        return [0] * count
    if isinstance(priority, (str, bytes)) or not isinstance(priority, Sequence):
        raise TypeError(f"priority must be a list of integers, one per prompt, or None, got {type(priority).__name__}")
    if len(priority) != count:
        raise ValueError(f"got {len(priority)} priorities for {count} prompts; pass one per prompt")
    return list(priority)


def checked_ids(prompts: list[Prompt], tokenizer: Any | None, model_dir: Path, vocab_size: int, max_seq_len: int,
                max_tokens: int) -> list[list[int]]:
    """Each prompt's ids, each checked to fit max_seq_len with max_tokens more (errors say what to change)."""
    all_ids = [encode(prompt, tokenizer, model_dir, vocab_size) for prompt in prompts]
    for ids in all_ids:
        check_prompt(ids, max_tokens, vocab_size, max_seq_len)
    return all_ids


def progress_bar(use_tqdm: bool, total: int, desc: str, unit: str) -> tqdm:
    """A bar on stderr when use_tqdm (checked to be a bool), else a silent one."""
    show = validation.boolean(use_tqdm, "use_tqdm")
    return tqdm(total=total, desc=desc, unit=unit, disable=not show, dynamic_ncols=True)
