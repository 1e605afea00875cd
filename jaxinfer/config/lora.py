"""LoRA settings with no jax: the engine's adapter limits and a request's adapter (vLLM's names)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from jaxinfer.config import validation


@dataclasses.dataclass(frozen=True)
class LoRARequest:
    """An adapter a request runs with: a PEFT LoRA directory (adapter_config.json and
    adapter_model.safetensors) known by `lora_name` (vLLM's LoRARequest; lora_int_id is kept for
    its signature, adapters are told apart by name)."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name.strip():
            raise ValueError(f"LoRARequest lora_name must be a non-empty string, got {self.lora_name!r}")
        validation.positive_int(self.lora_int_id, "LoRARequest lora_int_id")
        if not isinstance(self.lora_path, (str, Path)):
            raise ValueError(f"LoRARequest lora_path must be a directory path, got {self.lora_path!r}")


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """How many adapters one step serves at once (`max_loras` slots on the device) and their largest rank."""

    max_loras: int = 1
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        validation.positive_int(self.max_loras, "max_loras")
        validation.positive_int(self.max_lora_rank, "max_lora_rank")


def adapter_key(name: str, registration: int) -> str:
    """The key of one registration of an adapter name: what requests, device slots and prefix-cache
    hashes carry, so an adapter removed and loaded again under its name meets nothing of the old one."""
    return f"{name}#{registration}"


def adapter_name(key: str) -> str:
    """The name a key was registered under."""
    return key.rpartition("#")[0]
