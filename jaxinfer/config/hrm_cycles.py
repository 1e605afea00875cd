"""HRM-Text's cycles, as a config holds them (`ModelConfig.hrm_cycles`; models/hrm_text).

HRM-Text has two stacks of `stack_layers` layers, L (fast) and H (slow), and two states. Each of `high_cycles` H
cycles runs the L stack `low_cycles` times on (low + high), replacing low, then the H stack once on (high + low),
replacing high. jaxinfer unrolls the cycles: stack run k (of high_cycles * (low_cycles + 1)) layer j is decoder
layer k * stack_layers + j, with its own K/V pages, as transformers' cache slots number them; the runs after each
stack's first borrow its weights.
"""

from __future__ import annotations

import dataclasses

from jaxinfer.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class HrmCycles:
    """The stacks' depth and the cycle counts (HF names in comments)."""

    stack_layers: int  # num_layers_per_stack
    high_cycles: int  # H_cycles
    low_cycles: int  # L_cycles

    def __post_init__(self) -> None:
        """Refuse counts that describe no model."""
        if min(self.stack_layers, self.high_cycles, self.low_cycles) < 1:
            raise ConfigError(f"num_layers_per_stack {self.stack_layers}, H_cycles {self.high_cycles} and L_cycles "
                              f"{self.low_cycles} must each be >= 1")

    @property
    def num_layers(self) -> int:
        """Decoder layers once the cycles are unrolled (transformers' inflated num_hidden_layers)."""
        return self.stack_layers * self.high_cycles * (self.low_cycles + 1)

    def run(self, layer: int) -> int:
        """The stack run decoder layer `layer` belongs to, in order."""
        return layer // self.stack_layers

    def in_high(self, layer: int) -> bool:
        """Whether decoder layer `layer` runs the H stack (else the L stack)."""
        return self.run(layer) % (self.low_cycles + 1) == self.low_cycles

    def stored(self, layer: int) -> int:
        """The index within its stack of the layer decoder layer `layer` runs."""
        return layer % self.stack_layers

    def holder(self, layer: int) -> int:
        """The decoder layer holding `layer`'s weights: its stack's first run's."""
        first_run = self.low_cycles if self.in_high(layer) else 0
        return first_run * self.stack_layers + self.stored(layer)

    def starts_run(self, layer: int) -> bool:
        """Whether decoder layer `layer` begins a stack run (it reads the sum of the two states)."""
        return self.stored(layer) == 0

    def ends_run(self, layer: int) -> bool:
        """Whether decoder layer `layer` ends a stack run (its normed output replaces that stack's state)."""
        return self.stored(layer) == self.stack_layers - 1
