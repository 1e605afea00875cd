"""vLLM's `LLM(...)` engine arguments that have no parameter of their own here, so code written for vLLM runs as
written where the argument changes nothing, and otherwise stops naming the argument, its value and why.

`block_size` is `page_size` under vLLM's name. The rest are inert at the values listed (vLLM's defaults and the
values that mean the same here); any other value is refused: a setting is never silently dropped. Unknown
names are a TypeError as Python gives for any function, with the closest known name.
"""

from __future__ import annotations

import difflib
import numbers
from typing import Any, Callable, Mapping

ANY_BOOL = (True, False)
NO_HUB = "there is no model hub here: give a local directory"
INERT: dict[str, tuple[tuple[Any, ...] | Callable[[Any], bool], str]] = {
    # argument: (the values that change nothing here, or a test of them; why the others cannot be served)
    "trust_remote_code": (ANY_BOOL, "never refused: jaxinfer runs no checkpoint code, its families are built in"),
    "tokenizer_mode": (("auto", "hf"), "tokenizers are transformers' (fast where one is saved)"),
    "revision": ((None,), NO_HUB),
    "tokenizer_revision": ((None,), NO_HUB),
    "code_revision": ((None,), NO_HUB),
    "download_dir": ((None,), NO_HUB),
    "hf_token": ((None, False), NO_HUB),
    "load_format": (("auto", "safetensors"), "weights are read from safetensors (or a converted orbax directory)"),
    "enforce_eager": ((False,), "every step is a compiled XLA program, there is no eager mode (the persistent "
                                "compilation cache, on by default, makes restarts fast)"),
    "max_seq_len_to_capture": (lambda v: isinstance(v, int), "there are no CUDA graphs to capture: XLA programs "
                                                             "cover every length"),
    "swap_space": (lambda v: isinstance(v, numbers.Real), "preempted requests are recomputed, never swapped (as "
                                                          "in vLLM V1)"),
    "cpu_offload_gb": ((0, 0.0), "weights stay on the devices; kv_offloading_size keeps evicted prefix pages "
                                 "in host memory"),
    "pipeline_parallel_size": ((1,), "models split over a jax mesh by tensor_parallel_size, data_parallel_size "
                                     "and expert_parallel_size"),
    "enable_expert_parallel": ((False,), "give expert_parallel_size=N (experts split over N devices)"),
    "distributed_executor_backend": ((None, "mp", "uni"), "one process per host under jax.distributed"),
    "disable_custom_all_reduce": (ANY_BOOL, "never refused: collectives are XLA's"),
    "enable_chunked_prefill": ((None, True), "prompts are always prefilled in chunks of at most "
                                             "max_num_batched_tokens, with decodes in the same step"),
    "disable_log_stats": (ANY_BOOL, "never refused: no stats are logged; LLM.metrics() returns them"),
    "compilation_config": ((None,), "XLA compiles every step program; there is nothing to configure"),
}
RENAMED = {"block_size": "page_size"}


def vllm_arguments(given: Mapping[str, Any], ours: Mapping[str, Any]) -> dict[str, Any]:
    """Our keyword arguments for vLLM's names in `given` (block_size -> page_size); `ours`: the values our own
    parameters hold, which a renamed argument must agree with unless they are at their defaults. Raises
    ValueError for an inert argument at a value that would change something, TypeError for an unknown name."""
    mapped: dict[str, Any] = {}
    for name, value in given.items():
        if name in RENAMED:
            mapped[RENAMED[name]] = value
        elif name in INERT:
            _check_inert(name, value)
        else:
            close = difflib.get_close_matches(name, [*INERT, *RENAMED, *ours], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"LLM() got an unexpected keyword argument {name!r}{hint}")
    for name, value in mapped.items():
        if ours.get(name) is not None and ours[name] != value:
            vllm_name = next(k for k, v in RENAMED.items() if v == name)
            raise ValueError(f"{vllm_name}={value!r} and {name}={ours[name]!r} disagree; {vllm_name} is vLLM's "
                             f"name for {name}, so give one of them (or the same value)")
    return mapped


def _check_inert(name: str, value: Any) -> None:
    accepted, why = INERT[name]
    ok = accepted(value) if callable(accepted) else any(value is a or (value == a and type(value) is type(a))
                                                        for a in accepted)
    if not ok:
        values = "" if callable(accepted) else f"; accepted: {' or '.join(repr(a) for a in accepted)}"
        raise ValueError(f"{name}={value!r} is not served ({why}){values}")
