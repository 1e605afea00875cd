"""`LLM`'s LoRA knobs (vLLM's names) checked, and a call's lora_request spread over its prompts."""

from __future__ import annotations

from typing import Sequence

from jaxinfer.config import validation
from jaxinfer.config.lora import LoRAConfig, LoRARequest


def lora_setting(enable_lora: bool, max_loras: int, max_lora_rank: int, batch_invariant: bool) -> LoRAConfig | None:
    """The engine's adapter slots, or None without enable_lora."""
    if not validation.boolean(enable_lora, "enable_lora"):
        return None
    config = LoRAConfig(max_loras, max_lora_rank)
    if batch_invariant:
        raise ValueError("enable_lora=True does not combine with batch_invariant=True yet (the adapters' products "
                         "are not computed in fixed row blocks); pass one of them")
    return config


def lora_requests_for(lora_request: LoRARequest | Sequence[LoRARequest | None] | None,
                      count: int) -> list[LoRARequest | None]:
    """One adapter (or None) per prompt: the same for all, or one each."""
    if lora_request is None or isinstance(lora_request, LoRARequest):
        return [lora_request] * count
    if isinstance(lora_request, (list, tuple)) and all(r is None or isinstance(r, LoRARequest) for r in lora_request):
        if len(lora_request) != count:
            raise ValueError(f"got {len(lora_request)} lora_requests for {count} prompts; pass one or one each")
        return list(lora_request)
    raise TypeError(f"lora_request must be a LoRARequest, a list of them (one per prompt, None for the base model) "
                    f"or None, got {type(lora_request).__name__}")
