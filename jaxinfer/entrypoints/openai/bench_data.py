"""Workloads for `jaxinfer bench serve`: random token ids, a JSONL file, or a ShareGPT JSON file.

Every file error is a ValueError naming the flag (`--dataset` / `--dataset-name`), so the CLI
prints it as one line. ShareGPT follows vLLM's serving benchmark: the prompt is the first human
turn, and the request asks for as many tokens as the gpt turn after it has (counted by the
server's tokenizer); entries without both turns are skipped.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Callable

DATASET_NAMES = ("random", "jsonl", "sharegpt")
HUMAN_ROLES = ("human", "user")
GPT_ROLES = ("gpt", "assistant")
JSONL_SHAPE = 'one {"prompt": ..., "max_tokens": ...} object per line'
SHAREGPT_SHAPE = 'a JSON list of {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}]}'


@dataclasses.dataclass
class Work:
    """One request of the workload."""

    prompt: str | list[int]
    max_tokens: int


def random_workload(
    num_prompts: int, input_len: int, output_len: int, range_ratio: float, max_token_id: int, rng: random.Random
) -> list[Work]:
    """Random token-id prompts and output lengths uniform in len * (1 ± range_ratio)."""

    def length(mean: int) -> int:
        return max(1, rng.randint(int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio))))

    return [Work([rng.randrange(10, max_token_id) for _ in range(length(input_len))], length(output_len))
            for _ in range(num_prompts)]


def resolve_dataset_name(name: str | None, path: Path | None) -> str:
    """The --dataset-name to use: as given (checked against --dataset), or detected from the file."""
    if name is None:
        return "random" if path is None else detect_format(path)
    if name not in DATASET_NAMES:
        raise ValueError(f"--dataset-name must be one of {', '.join(DATASET_NAMES)}, got {name!r}")
    if name == "random" and path is not None:
        raise ValueError(f"--dataset-name random takes no --dataset (got {path}); drop one of them")
    if name != "random" and path is None:
        raise ValueError(f"--dataset-name {name} needs --dataset PATH")
    return name


def detect_format(path: Path) -> str:
    """sharegpt when the file is one JSON list, else jsonl."""
    return "sharegpt" if _read(path).lstrip().startswith("[") else "jsonl"


def jsonl_workload(path: Path, limit: int) -> list[Work]:
    """The first `limit` requests of a JSONL file of {"prompt": ..., "max_tokens": ...} (64 when absent)."""
    lines = [(number, line) for number, line in enumerate(_read(path).splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError(f"--dataset {path}: no requests in the file; a JSONL dataset has {JSONL_SHAPE}")
    return [_jsonl_request(path, number, line) for number, line in lines[:limit]]


def _jsonl_request(path: Path, number: int, line: str) -> Work:
    """One JSONL line as a request; a ValueError naming the file and line otherwise."""
    where = f"--dataset {path}: line {number}"
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where} is not JSON ({error.msg}); a JSONL dataset has {JSONL_SHAPE}") from None
    prompt = entry.get("prompt") if isinstance(entry, dict) else None
    max_tokens = entry.get("max_tokens", 64) if isinstance(entry, dict) else None
    if not isinstance(prompt, (str, list)) or type(max_tokens) is not int or max_tokens < 1:
        raise ValueError(f"{where} is {line[:80]!r}; a JSONL dataset has {JSONL_SHAPE} (max_tokens >= 1)")
    return Work(prompt, max_tokens)


def sharegpt_pairs(path: Path) -> list[tuple[str, str]]:
    """(first human turn, the gpt turn after it) of every ShareGPT entry that has both."""
    try:
        entries = json.loads(_read(path))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--dataset {path}: not JSON ({error.msg} at line {error.lineno}); a ShareGPT dataset is {SHAREGPT_SHAPE}"
        ) from None
    if not isinstance(entries, list):
        raise ValueError(
            f"--dataset {path}: the file holds a {type(entries).__name__}; a ShareGPT dataset is {SHAREGPT_SHAPE}"
        )
    pairs = [pair for entry in entries if (pair := _first_exchange(entry)) is not None]
    if not pairs:
        raise ValueError(f"--dataset {path}: none of {len(entries)} entries has a human turn followed by a gpt turn; "
                         f"a ShareGPT dataset is {SHAREGPT_SHAPE}")
    return pairs


def sharegpt_workload(pairs: list[tuple[str, str]], limit: int, count_tokens: Callable[[str], int]) -> list[Work]:
    """The first `limit` pairs as requests for as many tokens as the gpt turn has (empty ones skipped)."""
    work = []
    for prompt, completion in pairs:
        if len(work) == limit:
            break
        if (output_len := count_tokens(completion)) > 0:
            work.append(Work(prompt, output_len))
    return work


def _first_exchange(entry: object) -> tuple[str, str] | None:
    """The first human turn and the gpt turn right after it, or None."""
    turns = entry.get("conversations") if isinstance(entry, dict) else None
    if not isinstance(turns, list):
        return None
    for turn, reply in zip(turns, turns[1:]):
        if _is_turn(turn, HUMAN_ROLES):
            return (turn["value"], reply["value"]) if _is_turn(reply, GPT_ROLES) else None
    return None


def _is_turn(turn: object, roles: tuple[str, ...]) -> bool:
    """A dict turn from one of roles with non-empty text."""
    if not isinstance(turn, dict) or turn.get("from") not in roles:
        return False
    return isinstance(turn.get("value"), str) and bool(turn["value"])


def _read(path: Path) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--dataset {path}: cannot read it ({error.__class__.__name__}: {error})") from None
