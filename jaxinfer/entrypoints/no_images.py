"""Why a model refuses images: it has no vision tower, or jaxinfer runs its language model alone."""

from __future__ import annotations

from pathlib import Path

from jaxinfer.config.model import read_config_json

TOWER_FIELDS = ("vision_config", "vision_tower_config", "visual")  # where a checkpoint's config describes a tower


def no_images_reason(model_dir: Path) -> str:
    """What follows "this model takes no images" for the checkpoint in model_dir."""
    hf = read_config_json(model_dir)
    if not any(name in hf for name in TOWER_FIELDS):
        return "it has no vision tower"
    architecture = (hf.get("architectures") or ["this checkpoint"])[0]
    return f"jaxinfer runs {architecture}'s language model alone: its vision tower is not supported yet"
