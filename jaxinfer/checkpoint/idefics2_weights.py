"""Idefics2's connector tensors by name: transformers 5.24 saves them as `model.connector.modality_projection.*`
(a gated MLP) and `model.connector.perceiver_resampler.*` (learned latents [L, D], stored as used, the layers, the
last norm); its tower is SigLIP's under `model.vision_model.`, read as the other towers' (checkpoint/vision_weights)."""

from __future__ import annotations

PROJECTION_NAMES = {"w_gate": "modality_projection.gate_proj.weight", "w_up": "modality_projection.up_proj.weight",
                    "w_down": "modality_projection.down_proj.weight"}
RESAMPLER = "perceiver_resampler."
LATENTS = RESAMPLER + "latents"  # a Parameter, not a Linear: never transposed
LAYER_NAMES = {  # PerceiverLayer field -> tensor under perceiver_resampler.layers.{i}.
    "latents_norm": "input_latents_norm.weight", "context_norm": "input_context_norm.weight",
    "wq": "self_attn.q_proj.weight", "wk": "self_attn.k_proj.weight", "wv": "self_attn.v_proj.weight",
    "wo": "self_attn.o_proj.weight", "mlp_norm": "post_attention_layernorm.weight", "w_gate": "mlp.gate_proj.weight",
    "w_up": "mlp.up_proj.weight", "w_down": "mlp.down_proj.weight",
}


def connector_name(leaf: str) -> str:
    """A connector leaf path ('w_gate', 'perceiver.latents', 'perceiver.layers.1.wq') -> its tensor name under the
    connector's prefix."""
    parts = leaf.split(".")
    if parts[0] != "perceiver":
        return PROJECTION_NAMES[leaf]
    if parts[1] == "layers":
        return f"{RESAMPLER}layers.{parts[2]}.{LAYER_NAMES[parts[3]]}"
    return LATENTS if parts[1] == "latents" else RESAMPLER + "norm.weight"
