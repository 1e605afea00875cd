"""Which LoRA adapter each device slot holds, and who runs with it (host only, no jax).

A step serves at most `max_loras` adapters (the slots the device keeps beside the weights,
models/lora_weight). A request takes its adapter's slot when it is admitted and gives it back
when it finishes or is preempted; an adapter no running request uses stays in its slot (a
later request reuses it without a load) until a new adapter needs the slot, the least recently
used first. A request whose adapter finds no slot waits, as one that finds no pages does.
Slots hold adapters by key (`config.lora.adapter_key`: a name and its registration).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING

from jaxinfer.config.lora import adapter_name

if TYPE_CHECKING:
    from jaxinfer.engine.scheduler import Scheduler


class AdapterSlots:
    """Slots 0 .. max_loras-1: the adapter each holds, its users, and the loads not yet done."""

    def __init__(self, max_loras: int):
        self.held: list[str | None] = [None] * max_loras
        self.users = [0] * max_loras
        self.recent: collections.OrderedDict[int, None] = collections.OrderedDict()  # unused slots, oldest first
        self.loads: dict[int, str] = {}  # slot -> adapter to write before the next call
        self.num_loads = 0

    def acquire(self, adapter: str) -> int | None:
        """The slot `adapter` runs in (loaded there if it was not), or None while every slot is in use."""
        if adapter in self.held:
            slot = self.held.index(adapter)
        else:
            free = [s for s, name in enumerate(self.held) if name is None]
            idle = free or list(self.recent)
            if not idle:
                return None
            slot = idle[0]
            self.held[slot] = adapter
            self.loads[slot] = adapter
            self.num_loads += 1
        self.users[slot] += 1
        self.recent.pop(slot, None)
        return slot

    def release(self, slot: int) -> None:
        """One user of `slot` is done; with none left it becomes the newest idle slot."""
        self.users[slot] -= 1
        if self.users[slot] == 0:
            self.recent[slot] = None

    def forget(self, adapter: str) -> None:
        """Empty the slot holding `adapter` (a removed one) unless a request still runs with it."""
        if adapter in self.held and self.users[self.held.index(adapter)] == 0:
            slot = self.held.index(adapter)
            self.held[slot] = None
            self.recent.pop(slot, None)
            self.loads.pop(slot, None)

    def take_loads(self) -> dict[int, str]:
        """The adapters to write into their slots before the next call (and forget them)."""
        loads, self.loads = self.loads, {}
        return loads


def adapter_metrics(scheduler: "Scheduler") -> dict:
    """Slot loads so far, and which adapters run and wait (vLLM's lora_requests_info)."""
    def names(requests) -> list[str]:
        return sorted({adapter_name(r.adapter) for r in requests if r.adapter is not None})

    info = dict(running=names(scheduler.running), waiting=names(scheduler.waiting),
                max_lora=len(scheduler.adapters.held))
    return {"lora_slot_loads": scheduler.adapters.num_loads, "lora_requests_info": info}
