"""Where the installed transformers computes a reference otherwise than the model and jaxinfer (transformers 5.17,
the GPU machines', before later fixes): the test that would compare with it skips, naming the version and why."""

from __future__ import annotations

import pytest
import torch
import transformers


def ungrouped_gated_norm(model: torch.nn.Module) -> str | None:
    """The class of a Mamba2 mixer's gated RMSNorm where it normalises the mixer's whole width at once, though the
    mixer has groups (transformers 5.17's Mamba2, Bamba and Granite 4.0-H norms have no group_size), else None."""
    for mixer in model.modules():
        norm = getattr(mixer, "norm", None)
        grouped = getattr(mixer, "n_groups", 1) > 1
        if grouped and type(norm).__name__.endswith("Gated") and not hasattr(norm, "group_size"):
            return type(norm).__name__
    return None


def skip_ungrouped_gated_norm(model: torch.nn.Module) -> None:
    """Skip the calling test where the model's gated norm ignores its groups (see `ungrouped_gated_norm`)."""
    if (norm := ungrouped_gated_norm(model)) is not None:
        pytest.skip(f"transformers {transformers.__version__}'s {norm} normalises the mixer's whole width, not each "
                    "of its groups' (n_groups 2) as the model and jaxinfer do")


def skip_layer_counted_blocks(model: torch.nn.Module) -> None:
    """Skip the calling test where Zamba2's hybrid layers pick their shared block (and its adapters) by their layer
    index rather than by their count among the hybrid layers, as the checkpoints and jaxinfer do (transformers 5.24
    fixed the count; its comment in Zamba2Model.get_layers says why)."""
    layers = getattr(getattr(model, "model", None), "layers", [])
    used = [layer.shared_transformer.block_id for layer in layers if hasattr(layer, "shared_transformer")]
    blocks = getattr(model.config, "num_mem_blocks", 1)
    if used != [j % blocks for j in range(len(used))]:
        pytest.skip(f"transformers {transformers.__version__}'s Zamba2 gives its hybrid layers blocks {used}, not "
                    f"each its count among them modulo num_mem_blocks ({blocks})")
