"""An MllamaForConditionalGeneration checkpoint's vision tower, projector (models/mllama_vision) and cross-attention
layers (models/mllama_cross), read in Meta's layout (`vision_model.*`, `multi_modal_projector.*`,
`language_model.model.layers.{i}.*`) as float32 NumPy trees. Not loaded by `LLM` yet (it runs the language model
on text: models/mllama); tests/test_mllama_vision.py reads them."""

from __future__ import annotations

import numpy as np

from jaxinfer.checkpoint.whisper_weights import Read
from jaxinfer.models.mllama_cross import CrossLayer
from jaxinfer.models.mllama_vision import MllamaVisionConfig, MllamaVisionWeights, VisionLayer

TEXT_LAYERS = "language_model.model.layers."


def _heads_in(w: np.ndarray, heads: int) -> np.ndarray:
    """torch Linear [H*K, D] -> [D, H, K]."""
    return w.T.reshape(w.shape[1], heads, -1)


def _vision_layer(read: Read, p: str, heads: int, gated: bool) -> VisionLayer:
    """One vision encoder layer under prefix `p` (a global one with its gates)."""
    a = p + "self_attn."
    o = read(a + "o_proj.weight")
    return VisionLayer(
        attn_norm=read(p + "input_layernorm.weight"), attn_norm_bias=read(p + "input_layernorm.bias"),
        wq=_heads_in(read(a + "q_proj.weight"), heads), wk=_heads_in(read(a + "k_proj.weight"), heads),
        wv=_heads_in(read(a + "v_proj.weight"), heads), wo=o.T.reshape(heads, -1, o.shape[0]),
        mlp_norm=read(p + "post_attention_layernorm.weight"),
        mlp_norm_bias=read(p + "post_attention_layernorm.bias"),
        w_up=read(p + "mlp.fc1.weight").T, b_up=read(p + "mlp.fc1.bias"), w_down=read(p + "mlp.fc2.weight").T,
        b_down=read(p + "mlp.fc2.bias"),
        gate_attn=read(p + "gate_attn") if gated else None, gate_ffn=read(p + "gate_ffn") if gated else None,
    )


def vision_weights(read: Read, cfg: MllamaVisionConfig) -> MllamaVisionWeights:
    """The tower and the projector."""
    v = "vision_model."
    local = [_vision_layer(read, f"{v}transformer.layers.{i}.", cfg.heads, False) for i in range(cfg.layers)]
    glob = [_vision_layer(read, f"{v}global_transformer.layers.{i}.", cfg.heads, True)
            for i in range(cfg.global_layers)]
    pos = v + "gated_positional_embedding."
    return MllamaVisionWeights(
        patch=read(v + "patch_embedding.weight"), class_embedding=read(v + "class_embedding"),
        positions=read(pos + "embedding"), position_gate=read(pos + "gate"),
        tile_positions=read(pos + "tile_embedding.weight"),
        pre_tile=read(v + "pre_tile_positional_embedding.embedding.weight"),
        pre_tile_gate=read(v + "pre_tile_positional_embedding.gate"),
        post_tile=read(v + "post_tile_positional_embedding.embedding.weight"),
        post_tile_gate=read(v + "post_tile_positional_embedding.gate"),
        pre_norm=read(v + "layernorm_pre.weight"), pre_norm_bias=read(v + "layernorm_pre.bias"),
        post_norm=read(v + "layernorm_post.weight"), post_norm_bias=read(v + "layernorm_post.bias"),
        layers=local, global_layers=glob,
        projector=read("multi_modal_projector.weight").T, projector_bias=read("multi_modal_projector.bias"),
    )


def cross_layer(read: Read, layer: int, heads: int, kv_heads: int) -> CrossLayer:
    """Text layer `layer`, a cross-attention layer."""
    p = f"{TEXT_LAYERS}{layer}."
    a = p + "cross_attn."
    o = read(a + "o_proj.weight")
    return CrossLayer(
        attn_norm=read(p + "input_layernorm.weight"), wq=_heads_in(read(a + "q_proj.weight"), heads),
        wk=_heads_in(read(a + "k_proj.weight"), kv_heads), wv=_heads_in(read(a + "v_proj.weight"), kv_heads),
        wo=o.T.reshape(heads, -1, o.shape[0]), q_norm=read(a + "q_norm.weight"), k_norm=read(a + "k_norm.weight"),
        attn_gate=read(p + "cross_attn_attn_gate"), mlp_norm=read(p + "post_attention_layernorm.weight"),
        w_gate=read(p + "mlp.gate_proj.weight").T, w_up=read(p + "mlp.up_proj.weight").T,
        w_down=read(p + "mlp.down_proj.weight").T, mlp_gate=read(p + "cross_attn_mlp_gate"),
    )
