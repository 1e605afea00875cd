"""`--reference hf`: HF transformers (PyTorch) on A's checkpoint and dtype, run as a comparison's side B.

Each request runs alone through a plain KV-cached loop (argmax, or softmax sampling at the
workload's temperature): no `generate` settings to line up with jaxinfer's, and EOS is ignored
as on the jaxinfer side. Token ids come from A's run, so both sides read the same tokens.
"""

from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from jaxinfer.entrypoints.compare.extras import MissingDependency
from jaxinfer.entrypoints.compare.quality import log_softmax
from jaxinfer.entrypoints.compare.runs import SAMPLE_SEED_STRIDE, Cost, Run
from jaxinfer.entrypoints.compare.workload import Workload

TORCH_DTYPES = ("float32", "bfloat16", "float16")


def import_torch() -> Any:
    """The torch module, or MissingDependency saying how to install it."""
    try:
        import torch
    except ImportError:
        raise MissingDependency("--reference hf runs HF transformers on PyTorch, which is not installed here; "
                                "install it (pip install torch) or compare two jaxinfer configurations") from None
    return torch


def load_hf_model(model_dir: Path, dtype: str) -> Any:
    """The checkpoint as an HF causal LM in `dtype`, in eval mode."""
    torch = import_torch()
    import transformers

    if dtype not in TORCH_DTYPES:
        raise ValueError(f"--reference hf runs in A's dtype, which must be one of {', '.join(TORCH_DTYPES)}; got {dtype}")
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"  # renamed in 4.56
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), **{dtype_key: getattr(torch, dtype)})
    return model.eval()


def continue_rows(model: Any, ids: list[int], rows: int, steps: int, pick: Callable[[Any], Any]
                  ) -> tuple[np.ndarray, float, float]:
    """Tokens [rows, steps] continuing `ids` in every row, with the time to the first token and per later token."""
    torch = import_torch()
    # transformers 5 calls the KV cache `cache`; 4.x `past_key_values` (5.x still takes it, with a warning).
    cache_name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    start = time.perf_counter()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids] * rows), use_cache=True)
        tokens, first = [], 0.0
        for step in range(steps):
            token = pick(out.logits[:, -1].float())
            tokens.append(token)
            if step == 0:
                first = time.perf_counter()
            if step + 1 < steps:
                out = model(input_ids=token[:, None], use_cache=True, **{cache_name: out[cache_name]})
    end = time.perf_counter()
    tpot = (end - first) / (steps - 1) if steps > 1 else 0.0
    return torch.stack(tokens, dim=1).numpy(), first - start, tpot


def sampler(temperature: float, seed: int) -> Callable[[Any], Any]:
    """Softmax sampling at `temperature` from a seeded generator."""
    torch = import_torch()
    generator = torch.Generator().manual_seed(seed)
    return lambda logits: torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1, generator=generator)[:, 0]


def run_hf(workload: Workload, a: Run, label: str) -> Run:
    """Side B as HF transformers: A's checkpoint, dtype, prompt ids and forced texts."""
    model_dir, dtype = Path(a.model_dir), a.dtype
    model = load_hf_model(model_dir, dtype)
    greedy, ttft, tpot, start = [], [], [], time.perf_counter()
    for ids in a.prompt_ids:
        tokens, first, per_token = continue_rows(model, ids, 1, workload.max_tokens, lambda x: x.argmax(-1))
        greedy.append(tokens[0].tolist())
        ttft.append(first)
        tpot.append(per_token)
    seconds = time.perf_counter() - start
    sampled = [continue_rows(model, ids, workload.samples, workload.sample_tokens,
                             sampler(workload.temperature, workload.seed + SAMPLE_SEED_STRIDE + i))[0]
               for i, ids in enumerate(a.prompt_ids[: workload.sample_prompts])]
    torch = import_torch()
    with torch.no_grad():
        logprobs = [log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float().numpy())
                    for ids in a.forced_texts]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cost = Cost(seconds, sum(map(len, greedy)), ttft, tpot, weight_bytes)
    config = {"reference": f"HF transformers {_version()} (PyTorch) on {model_dir}, {dtype}"}
    return Run(label, config, a.model_dir, dtype, a.prompt_ids, greedy, sampled, a.forced_texts, logprobs, a.held_out_count, cost)


def _version() -> str:
    import transformers

    return transformers.__version__
