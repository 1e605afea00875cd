"""A looped decoder's layout, as a config holds it (`ModelConfig.looped`; models/dory).

Dory (a looped nGPT) runs its checkpoint's layers as three sections: `input_layers` once, the next
`recurrent_layers` `loops` times over, then the rest once. jaxinfer unrolls the loops: each pass of a recurrent layer
is a decoder layer of its own, with its own K/V pages (transformers' "per_loop" cache), running the weights of the
checkpoint layer it repeats. Each pass restarts from the input section's unit-normed output (`restart`).

The nGPT scalars that turn stored parameters into the rates and scales the layers use are the model's, not a
layer's: `init_scale` (initializer_range: a stored scale s means s / init_scale times its "s_init") and `alpha_init`
(the residual interpolation rates' s_init).
"""

from __future__ import annotations

import dataclasses

from jaxinfer.config.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class LoopedLayers:
    """The sections of a looped decoder (checkpoint layers) and the nGPT scalars (HF names in comments)."""

    stored_layers: int  # num_hidden_layers: the checkpoint's layers
    input_layers: int  # n_input_layers: run once, before the loops
    recurrent_layers: int  # n_recurrent_layers: run `loops` times
    loops: int  # n_recurrent_loops
    init_scale: float  # initializer_range
    alpha_init: float  # ngpt_alpha_init

    def __post_init__(self) -> None:
        """Refuse sections that do not tile the checkpoint's layers."""
        output = self.stored_layers - self.input_layers - self.recurrent_layers
        if min(self.input_layers, self.recurrent_layers, output) < 0 or self.loops < 1:
            raise ConfigError(f"n_input_layers {self.input_layers}, n_recurrent_layers {self.recurrent_layers} and "
                              f"n_recurrent_loops {self.loops} must split the {self.stored_layers} layers into "
                              "sections of >= 0 layers each, with >= 1 loop")
        if self.init_scale <= 0:
            raise ConfigError(f"initializer_range {self.init_scale} must be > 0: nGPT's scales are divided by it")

    @property
    def num_layers(self) -> int:
        """Decoder layers once the loops are unrolled."""
        return self.stored_layers + (self.loops - 1) * self.recurrent_layers

    def stored(self, layer: int) -> int:
        """The checkpoint layer decoder layer `layer` runs."""
        start, passes = self.input_layers, self.loops * self.recurrent_layers
        if layer < start:
            return layer
        if layer < start + passes:
            return start + (layer - start) % self.recurrent_layers
        return layer - passes + self.recurrent_layers

    def holds(self, layer: int) -> bool:
        """Whether decoder layer `layer` holds its weights (the first to run them: all but the recurrent section's
        later passes); the others borrow them."""
        start = self.input_layers + self.recurrent_layers
        return not start <= layer < self.input_layers + self.loops * self.recurrent_layers

    def restarts(self, layer: int) -> bool:
        """Whether decoder layer `layer` begins a pass of the recurrent section."""
        offset = layer - self.input_layers
        return 0 <= offset < self.loops * self.recurrent_layers and offset % self.recurrent_layers == 0

    def leaves_loops(self, layer: int) -> bool:
        """Whether decoder layer `layer` ends the last pass (what it hands on needs no restart point any more)."""
        return self.recurrent_layers > 0 and layer == self.input_layers + self.loops * self.recurrent_layers - 1
