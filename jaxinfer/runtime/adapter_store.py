"""The engine's LoRA adapters on the host: read and checked once by name, laid out per device slot.

Each registration of a name gets its own key (`config.lora.adapter_key`), which requests, slots
and prefix-cache hashes carry: an adapter removed and loaded again under its name (retrained
in place, or another path) never meets the slot or cached pages of the one before it. A removed
adapter stops being served by name at once; its factors stay until no request runs with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.checkpoint.lora_adapter import Adapter, read_adapter
from jaxinfer.config.lora import LoRAConfig, LoRARequest, adapter_key
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.adapter_slots import SlotTarget, slot_factors


class AdapterStore:
    """Adapters by key, each read from its PEFT directory when its name is registered."""

    def __init__(self, config: LoRAConfig, model_config: ModelConfig, targets: list[SlotTarget], dtype: Any):
        self.config, self.model_config, self.targets, self.dtype = config, model_config, targets, dtype
        self.known: dict[str, Adapter] = {}  # by key: served ones and removed ones some request still runs with
        self.requests: dict[str, LoRARequest] = {}  # by key, as registered
        self.current: dict[str, str] = {}  # served name -> its key
        self.retired: set[str] = set()  # keys of removed adapters not dropped yet
        self.registrations = 0

    def register(self, request: LoRARequest) -> str:
        """The key of the request's adapter, read and checked when its name is not served yet; a name
        served from another path is refused, as its slot and cached pages belong to the first."""
        key = self.current.get(request.lora_name)
        if key is None:
            adapter = read_adapter(request, self.model_config, self.config.max_lora_rank)
            self.registrations += 1
            key = adapter_key(request.lora_name, self.registrations)
            self.known[key], self.requests[key], self.current[request.lora_name] = adapter, request, key
        elif self.known[key].path.resolve() != Path(request.lora_path).expanduser().resolve():
            raise ValueError(f"LoRA adapter name {request.lora_name!r} is already served from "
                             f"{self.known[key].path}; give the adapter at {request.lora_path} another lora_name")
        return key

    def remove(self, lora: str | int) -> str | None:
        """Stop serving the adapter of this name (or lora_int_id); its key, None when none is served so.
        Its factors stay (`drop`) while requests run with it."""
        name = lora if isinstance(lora, str) else next(
            (self.requests[key].lora_name for key in self.current.values() if self.requests[key].lora_int_id == lora),
            None)
        key = self.current.pop(name, None)
        if key is not None:
            self.retired.add(key)
        return key

    def drop(self, key: str) -> None:
        """Forget a removed adapter's factors (no request runs with it any more)."""
        del self.known[key], self.requests[key]
        self.retired.discard(key)

    def served(self) -> list[LoRARequest]:
        """The adapters served by name, in the order they were registered."""
        return [self.requests[key] for key in self.current.values()]

    def slot_shapes(self) -> list[tuple[int, int]]:
        """The shapes of `slot_values`' arrays."""
        rank = self.config.max_lora_rank
        return [shape for t in self.targets
                for shape in ((t.in_size, len(t.fields) * rank), (len(t.fields) * rank, sum(t.out_sizes)))]

    def slot_values(self, key: str) -> list[np.ndarray]:
        """The adapter of this key as one slot's factors, in `lora_weight.adapter_factors` order."""
        adapter, rank = self.known[key], self.config.max_lora_rank
        return [f for target in self.targets for f in slot_factors(target, adapter.factors, rank, self.dtype)]
