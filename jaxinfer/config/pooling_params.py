"""vLLM's `PoolingParams`: what one `LLM.encode` call asks of the pooled vector. No jax."""

from __future__ import annotations

import dataclasses

POOLING_TASKS = ("embed", "classify")  # what `LLM.encode` runs; vLLM's per-token tasks are refused by name
PER_TOKEN_TASKS = ("token_embed", "token_classify", "plugin")


@dataclasses.dataclass(frozen=True)
class PoolingParams:
    """dimensions: an embedding cut to its first `dimensions` values (a Matryoshka model's), then normalized;
    normalize: unit-length embeddings (None: the model's pooler setting); use_activation: a classifier's
    softmax (or sigmoid for one label) over its logits (None or True), or the raw logits (False)."""

    dimensions: int | None = None
    normalize: bool | None = None
    use_activation: bool | None = None

    def __post_init__(self) -> None:
        if self.dimensions is not None and (isinstance(self.dimensions, bool) or not isinstance(self.dimensions, int)
                                            or self.dimensions < 1):
            raise ValueError(f"PoolingParams.dimensions must be a positive int or None, got {self.dimensions!r}")
        for name in ("normalize", "use_activation"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"PoolingParams.{name} must be True, False or None, got {value!r}")


def check_task(task: object) -> str:
    """The pooling task `LLM.encode` runs; a ValueError naming the accepted tasks (vLLM requires one too)."""
    if task in POOLING_TASKS:
        return str(task)
    if task in PER_TOKEN_TASKS:
        raise ValueError(f"pooling_task {task!r} (a vector per token, or a plugin's) is not supported; "
                         f"accepted: {', '.join(POOLING_TASKS)} (one vector per prompt)")
    raise ValueError(f"pooling_task must be one of {', '.join(POOLING_TASKS)} (LLM.encode needs it, as vLLM's "
                     f"does; LLM.embed and LLM.classify set it), got {task!r}")
