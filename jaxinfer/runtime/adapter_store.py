"""The engine's LoRA adapters on the host: read and checked once by name, laid out per device slot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.checkpoint.lora_adapter import Adapter, read_adapter
from jaxinfer.config.lora import LoRAConfig, LoRARequest
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.adapter_slots import SlotTarget, slot_factors


class AdapterStore:
    """Adapters by name, each read from its PEFT directory on first use."""

    def __init__(self, config: LoRAConfig, model_config: ModelConfig, targets: list[SlotTarget], dtype: Any):
        self.config, self.model_config, self.targets, self.dtype = config, model_config, targets, dtype
        self.known: dict[str, Adapter] = {}

    def register(self, request: LoRARequest) -> None:
        """Read and check the request's adapter (once per name); a name already known with another
        path is refused, as its slot and cached pages belong to the first."""
        known = self.known.get(request.lora_name)
        if known is None:
            self.known[request.lora_name] = read_adapter(request, self.model_config, self.config.max_lora_rank)
        elif known.path.resolve() != Path(request.lora_path).expanduser().resolve():
            raise ValueError(f"LoRA adapter name {request.lora_name!r} is already served from {known.path}; "
                             f"give the adapter at {request.lora_path} another lora_name")

    def slot_shapes(self) -> list[tuple[int, int]]:
        """The shapes of `slot_values`' arrays."""
        rank = self.config.max_lora_rank
        return [shape for t in self.targets
                for shape in ((t.in_size, len(t.fields) * rank), (len(t.fields) * rank, sum(t.out_sizes)))]

    def slot_values(self, name: str) -> list[np.ndarray]:
        """The named adapter as one slot's factors, in `lora_weight.adapter_factors` order."""
        adapter, rank = self.known[name], self.config.max_lora_rank
        return [f for target in self.targets for f in slot_factors(target, adapter.factors, rank, self.dtype)]
