"""Databricks' DBRX (DbrxForCausalLM: dbrx-base, dbrx-instruct; 132B, 36B active): a pre-norm MoE decoder.

Every layer is `models.moe`'s pre-norm MoE layer with LayerNorms without a bias (the final `norm_f` too):
attention from one fused `Wqkv` (q, k, v rows, read as their parts at load, Phi-3's way) whose outputs are
clamped to [-clip_qkv, clip_qkv] (`cfg.clip_qkv`), rotary over the whole head with `attn_config.rope_theta`;
then `moe_top_k` of `moe_num_experts` experts by softmax, the chosen weights divided by their p-norm
(`moe_normalize_expert_weights`, `cfg.expert_weights_p_norm`; null: left as they are). The experts are stored
fused: `w1` (gate), `v1` (up) and `w2` (down) each [experts * ffn_hidden_size, d_model], every expert's rows
in turn (w1 and v1 as torch Linears [out, in], w2 already [in, out]), read per expert at load.

The config nests attention's and the MLP's fields (`attn_config`, `ffn_config`) under DBRX's own names.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.mixtral import abstract_layer, moe_fields
from jaxinfer.models.moe import MoELayerWeights, experts_output, pre_norm_layer, route
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.sharding import Layout

ARCHITECTURES = ("DbrxForCausalLM",)
REQUIRED = ("vocab_size", "d_model", "n_heads", "n_layers")
PREFIX = "transformer."
# DbrxAttentionConfig's and DbrxFFNConfig's defaults for fields a config leaves out.
ATTN_DEFAULTS = dict(kv_n_heads=1, clip_qkv=None, rope_theta=10000.0)
FFN_DEFAULTS = dict(ffn_hidden_size=3584, moe_num_experts=4, moe_top_k=1, moe_normalize_expert_weights=1.0,
                    ffn_act_fn={"name": "silu"})


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: q/k/v as row ranges of Wqkv; each expert's rows of the fused w1, v1, w2."""
    H, KV, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    E, F = cfg.num_experts, cfg.moe_intermediate_size
    block = PREFIX + "blocks.{i}."
    attn, experts = block + "norm_attn_norm.", block + "ffn.experts.mlp."
    qkv = (attn + "attn.Wqkv.weight", "in_heads", ((H + 2 * KV) * K, D))
    return {
        "attn_norm": HFLeaf(attn + "norm_1.weight", "same", (D,)),
        "mlp_norm": HFLeaf(attn + "norm_2.weight", "same", (D,)),
        "wq": HFLeaf(*qkv, heads=H, head_dim=K),
        "wk": HFLeaf(*qkv, heads=KV, head_dim=K, row_offset=H * K),
        "wv": HFLeaf(*qkv, heads=KV, head_dim=K, row_offset=(H + KV) * K),
        "wo": HFLeaf(attn + "attn.out_proj.weight", "out_heads", (D, H * K), H, K),
        "router": HFLeaf(block + "ffn.router.layer.weight", "transpose", (E, D)),
        # each expert's F rows: [E, D, F] for the gate and up (a torch Linear per expert), [E, F, D] for down
        "moe_gate": HFLeaf(experts + "w1", "head_rows_transposed", (E * F, D), E, F),
        "moe_up": HFLeaf(experts + "v1", "head_rows_transposed", (E * F, D), E, F),
        "moe_down": HFLeaf(experts + "w2", "head_rows", (E * F, D), E, F),
    }


def _flat_config(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The nested DBRX config under the names `common_fields` reads (LayerNorms' epsilon torch's default).

    The rotary base is attn_config's rope_theta, as the releases set it and vLLM reads it; transformers 5's
    DbrxConfig leaves it out of its rope_parameters (10000 there)."""
    attn = {**ATTN_DEFAULTS, **(hf.get("attn_config") or {})}
    ffn = {**FFN_DEFAULTS, **(hf.get("ffn_config") or {})}
    rope = {**(hf.get("rope_parameters") or {}), "rope_theta": float(field(attn, "rope_theta", 10000.0))}
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["d_model"], num_attention_heads=hf["n_heads"],
        num_hidden_layers=hf["n_layers"], num_key_value_heads=attn["kv_n_heads"],
        intermediate_size=ffn["ffn_hidden_size"], max_position_embeddings=field(hf, "max_seq_len", 2048),
        rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=hf.get("tie_word_embeddings", False),
        bos_token_id=hf.get("bos_token_id"), eos_token_id=hf.get("eos_token_id"),
        clip_qkv=attn["clip_qkv"], num_local_experts=ffn["moe_num_experts"], num_experts_per_tok=ffn["moe_top_k"],
        moe_normalize_expert_weights=ffn["moe_normalize_expert_weights"], hidden_act=ffn["ffn_act_fn"].get("name"),
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a DBRX HF config."""
    flat = _flat_config(hf)
    fields = common_fields(flat, arch)
    if fields["tie_word_embeddings"]:
        raise ConfigError(f"tie_word_embeddings=True is not supported for {arch}: its lm_head is its own")
    p = flat["moe_normalize_expert_weights"]
    if p is not None and float(p) <= 0:
        raise ConfigError(f"ffn_config.moe_normalize_expert_weights {p} must be a positive p (of a p-norm) or null")
    clip = flat["clip_qkv"]
    if clip is not None and float(clip) <= 0:
        raise ConfigError(f"attn_config.clip_qkv {clip} must be positive or null")
    return ModelConfig(
        **fields,
        layer_norm=True,
        clip_qkv=None if clip is None else float(clip),
        activation=activation_name(flat["hidden_act"] or "silu"),
        expert_weights_p_norm=0.0 if p is None else float(p),
        **moe_fields(flat, "num_local_experts", fields["intermediate_size"], experts=4, per_token=1),
    )


def p_normalised(weights: jax.Array, p: float) -> jax.Array:
    """The chosen experts' weights [N, k] divided by their p-norm (as torch.norm(p=p) over k); p 0: unchanged."""
    if not p:
        return weights
    return weights / jnp.sum(jnp.abs(weights) ** p, axis=-1, keepdims=True) ** (1 / p)


def moe_block(x: jax.Array, lw: MoELayerWeights, cfg: ModelConfig, layout: Layout) -> jax.Array:
    """The routed experts' output for x [B, T, D] in x's dtype: softmax, top k, p-normalised."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1])
    weights, experts = route(x2, lw.router, cfg.experts_per_token, renormalise=False)
    weights = p_normalised(weights, cfg.expert_weights_p_norm)
    return experts_output(x2, weights, experts, lw, layout, cfg.activation).astype(x.dtype).reshape(shape)


def decoder_layer(cfg: ModelConfig, x: jax.Array, cache: Any, lw: MoELayerWeights, layer: int, positions: jax.Array,
                  rope: RopeTables) -> tuple[jax.Array, Any]:
    """One pre-norm block (bias-free LayerNorms): attention over the clamped q/k/v, then the routed experts."""
    return pre_norm_layer(cfg, x, cache, lw, layer, positions, rope, lambda h, layout: moe_block(h, lw, cfg, layout))


FAMILY = Family("dbrx", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "norm_f.weight"), required=REQUIRED)
