"""What both configurations run: prompts (a JSONL or ShareGPT file, or the built-in sample), the sampling
settings, and the held-out text scored under teacher forcing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Callable

from jaxinfer.config import validation
from jaxinfer.entrypoints.openai.bench_data import detect_format, jsonl_workload, sharegpt_pairs

ASSETS = Path(__file__).parents[2] / "assets" / "compare"
SAMPLE_PROMPTS = ASSETS / "sample_prompts.jsonl"  # short Python-source prompts: the demo is code-trained
SAMPLE_HELD_OUT = ASSETS / "held_out.txt"  # the text of the quantization gates' held-out windows
HELD_OUT_SHAPE = 'a text file, or a JSON file {"windows": [[token ids], ...]}'


@dataclasses.dataclass(frozen=True)
class Workload:
    """The requests and texts both sides run (counts already checked)."""

    prompts: list[str]  # greedy prompts; the first `sample_prompts` of them are also sampled
    max_tokens: int = 64  # greedy tokens per prompt (EOS ignored, so every position is compared)
    sample_prompts: int = 4
    samples: int = 32  # sampled completions per sampled prompt and side
    sample_tokens: int = 16
    temperature: float = 0.8
    held_out: Path = SAMPLE_HELD_OUT
    held_out_data: str | list[list[int]] | None = None  # held_out's text or windows (None: read it here)
    window: int = 256  # tokens per held-out window
    max_windows: int = 8
    seed: int = 0

    def __post_init__(self) -> None:
        validation.positive_int(self.max_tokens, "max_tokens")
        validation.integer(self.sample_prompts, "sample_prompts", 0)
        validation.integer(self.samples, "samples", 2 if self.sample_prompts else 0)
        validation.positive_int(self.sample_tokens, "sample_tokens")
        validation.number(self.temperature, "temperature", 0.0)
        validation.integer(self.window, "window", 2)
        validation.integer(self.max_windows, "max_windows", 0)
        validation.integer(self.seed, "seed", 0)
        if not self.prompts:
            raise ValueError("the comparison has no prompts")
        if self.sample_prompts and self.temperature == 0:
            raise ValueError("temperature 0 makes the sampled run greedy; give temperature > 0 or sample_prompts=0")
        if self.held_out_data is None:  # read now: a bad file fails before any model loads
            object.__setattr__(self, "held_out_data", read_held_out(self.held_out))

    @property
    def sampled(self) -> list[str]:
        """The prompts of the sampled run."""
        return self.prompts[: self.sample_prompts]


def load_prompts(path: str | Path | None, limit: int) -> list[str]:
    """Up to `limit` prompts from a JSONL file ({"prompt": ...} per line), a ShareGPT file, or the sample."""
    validation.positive_int(limit, "max_prompts")
    path = SAMPLE_PROMPTS if path is None else Path(path)
    if detect_format(path) == "sharegpt":
        prompts: list = [human for human, _ in sharegpt_pairs(path)[:limit]]
    else:
        prompts = [work.prompt for work in jsonl_workload(path, limit)]
    bad = [p for p in prompts if not isinstance(p, str) or not p]
    if bad:
        raise ValueError(f"--dataset {path}: prompts must be non-empty text, got {bad[0]!r}")
    return prompts


def read_held_out(path: str | Path) -> str | list[list[int]]:
    """A held-out file's text, or its stored token windows (.json); read before any model loads."""
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--held-out {path}: cannot read it ({type(error).__name__}: {error})") from None
    if Path(path).suffix != ".json":
        return text
    try:
        windows = json.loads(text).get("windows")
    except (json.JSONDecodeError, AttributeError):
        windows = None
    if not isinstance(windows, list) or not windows:
        raise ValueError(f"--held-out {path}: not {HELD_OUT_SHAPE}")
    return [validation.token_ids(w, f"--held-out {path} window {i}") for i, w in enumerate(windows)]


def held_out_windows(workload: Workload, encode: Callable[[str], list[int]]) -> list[list[int]]:
    """Up to max_windows windows: stored ones as they are, a text cut into windows after encoding."""
    if not isinstance(workload.held_out_data, str):
        return workload.held_out_data[: workload.max_windows]
    ids, size = encode(workload.held_out_data), workload.window
    windows = [ids[start : start + size] for start in range(0, len(ids) - size + 1, size)][: workload.max_windows]
    if workload.max_windows and not windows:
        raise ValueError(f"--held-out {workload.held_out}: {len(ids)} tokens, fewer than one window of {size}; "
                         "give a longer text or a smaller window")
    return windows
