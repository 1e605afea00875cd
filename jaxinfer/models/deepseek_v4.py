"""DeepSeek-V4 (DeepseekV4ForCausalLM; transformers' models/deepseek_v4): sliding and compressed attention, routed
experts (some layers hash-routed), all inside manifold-constrained hyper-connections.

- Residual: `hc_mult` streams (models/hyper_connections, mHC: Sinkhorn-mixed, write gate 2 sigmoid without eps);
  the first layer expands the embeddings, the last collapses them with the head's gate before the final norm.
- Attention (models/deepseek_v4_attention): a sliding window over one shared K=V head on every layer, plus
  compressed entries on CSA layers (the indexer's top k) and HCA layers (all), sinks, a grouped output projection.
- MLP: routed experts with sqrt(softplus) scores, each token's k experts the top k of scores plus the correction
  bias ("moe" layers) or the fixed `tid2eid[token]` ("hash_moe" layers); the chosen scores renormalised and times
  routed_scaling_factor; experts and the shared expert (moe_intermediate_size wide) gated by silu(min(gate, limit))
  * clip(up, -limit, limit) (`mlp.ClampedSiLU`).

Tensors are read as transformers 5.24 saves them (DeepSeek's own names under `model.`: `attn.wq_a`, `ffn.experts.{e}
.w1`, `hc_attn_fn`, ...) or as DeepSeek releases them (the same without `model.`: `Family.stored_names`). The MTP
layers (`mtp.*`) are not read, and method "mtp" is refused (cfg.mtp_layers 0): drafting with them is not supported.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Collection

import jax
import jax.numpy as jnp

from jaxinfer.config.deepseek_v4 import CSA, HCA, SLIDING
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.deepseek_v4_attention import v4_attention
from jaxinfer.models.deepseek_v4_config import read_config
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.grouped_matmul import Experts
from jaxinfer.models.hyper_connections import (
    STREAMS,
    HyperConnectionLayer,
    around,
    collapse_head,
    expand,
    gate_width,
    hyper_connection_leaves,
)
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.layers import Weight, linear
from jaxinfer.models.mlp import ClampedSiLU, gated_mlp, mlp_leaves
from jaxinfer.models.moe import DOWN_AXES, GATE_AXES, ROUTER_AXES, experts_hf_leaves, experts_output
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("DeepseekV4ForCausalLM",)
LAYER = "model.layers.{i}."
ATTN = LAYER + "attn."


@jax.tree_util.register_dataclass
@dataclasses.dataclass(kw_only=True)
class DeepseekV4Layer(HyperConnectionLayer):
    """One layer (K head dim, Q q_lora_rank, G groups of O, c = 2 on CSA layers, 1 on HCA; None where the kind has
    none: the compressor's fields on sliding layers, the indexer's off CSA layers)."""

    attn_norm: jax.Array  # [D] attn_norm
    mlp_norm: jax.Array  # [D] ffn_norm
    q_a: Weight  # [D, Q] wq_a
    q_a_norm: jax.Array  # [Q] q_norm
    q_b: Weight  # [Q, H, K] wq_b
    kv: Weight  # [D, K] wkv
    kv_norm: jax.Array  # [K] norm
    o_a: jax.Array  # [G, H * K / G, O] wo_a, one matrix per group
    o_b: Weight  # [G * O, D] wo_b
    sinks: jax.Array  # [H] float32 attn_sink
    router: jax.Array  # [D, E] float32 ffn.gate
    moe_gate: Experts  # [E, D, F] w1
    moe_up: Experts  # [E, D, F] w3
    moe_down: Experts  # [E, F, D] w2
    shared_gate: Weight  # [D, F]
    shared_up: Weight  # [D, F]
    shared_down: Weight  # [F, D]
    score_correction: jax.Array | None = None  # [E] float32 gate.bias: learned-routing layers
    tid2eid: jax.Array | None = None  # [V, k] float32 expert ids: hash-routed layers
    comp_kv: Weight | None = None  # [D, c * K] compressor.wkv
    comp_gate: Weight | None = None  # [D, c * K] compressor.wgate
    comp_bias: jax.Array | None = None  # [m, c * K] float32 compressor.ape
    comp_norm: jax.Array | None = None  # [K] compressor.norm
    index_kv: Weight | None = None  # [D, 2 * I] indexer.compressor.wkv
    index_gate: Weight | None = None  # [D, 2 * I]
    index_bias: jax.Array | None = None  # [m, 2 * I] float32
    index_norm: jax.Array | None = None  # [I]
    index_q: Weight | None = None  # [Q, Hi * I] indexer.wq_b
    index_weights: Weight | None = None  # [D, Hi] indexer.weights_proj

    PROJECTIONS: ClassVar[dict[str, int]] = {name: 1 for name in (
        "q_a", "q_b", "kv", "o_b", "shared_gate", "shared_up", "shared_down", "comp_kv", "comp_gate", "index_kv",
        "index_gate", "index_q", "index_weights")}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("shared_gate", "shared_up"),)
    EXPERTS: ClassVar[tuple[str, ...]] = ("moe_gate", "moe_up", "moe_down")


def _info(*shape: int, dtype: str | None = None) -> ArrayInfo:
    """A replicated leaf (its first axis `embed` where it is hidden_size wide)."""
    return ArrayInfo(shape, (None,) * len(shape), dtype=dtype)


def _compressor_leaves(cfg: ModelConfig, layer: int) -> dict[str, ArrayInfo]:
    """The compressor's leaves (and a CSA layer's indexer's) of `layer`."""
    fields, D, K = cfg.deepseek_v4, cfg.hidden_size, cfg.head_dim
    kind = fields.layer_kinds[layer]
    if kind == SLIDING:
        return {}
    c, m = (2, fields.csa_rate) if kind == CSA else (1, fields.hca_rate)
    leaves = dict(comp_kv=_info(D, c * K), comp_gate=_info(D, c * K), comp_bias=_info(m, c * K, dtype="float32"),
                  comp_norm=ArrayInfo((K,), (None,), init_value=0.0))
    if kind == CSA:
        I, Hi, Q = fields.index_dim, fields.index_heads, fields.q_lora_rank
        leaves |= dict(index_kv=_info(D, 2 * I), index_gate=_info(D, 2 * I),
                       index_bias=_info(m, 2 * I, dtype="float32"), index_norm=ArrayInfo((I,), (None,), init_value=0.0),
                       index_q=_info(Q, Hi * I), index_weights=_info(D, Hi))
    return leaves


def abstract_layer(cfg: ModelConfig, layer: int) -> DeepseekV4Layer:
    """Layer `layer`'s leaves: attention (its kind's compressor), experts (a hash or learned router), the gates."""
    fields, D, H, K, E, F = (cfg.deepseek_v4, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_experts,
                             cfg.moe_intermediate_size)
    Q, G, O = fields.q_lora_rank, fields.o_groups, fields.o_lora_rank
    norm = lambda n: ArrayInfo((n,), (None,), init_value=0.0)  # noqa: E731
    shared = mlp_leaves(D, F)
    hashed = layer in fields.hash_layers
    return DeepseekV4Layer(
        attn_norm=norm(D), mlp_norm=norm(D), q_a=ArrayInfo((D, Q), ("embed", None)), q_a_norm=norm(Q),
        q_b=_info(Q, H, K), kv=ArrayInfo((D, K), ("embed", None)), kv_norm=norm(K), o_a=_info(G, H * K // G, O),
        o_b=ArrayInfo((G * O, D), (None, "embed")), sinks=ArrayInfo((H,), (None,), init_value=0.0, dtype="float32"),
        router=ArrayInfo((D, E), ROUTER_AXES, dtype="float32"), moe_gate=ArrayInfo((E, D, F), GATE_AXES),
        moe_up=ArrayInfo((E, D, F), GATE_AXES), moe_down=ArrayInfo((E, F, D), DOWN_AXES),
        shared_gate=shared["w_gate"], shared_up=shared["w_up"], shared_down=shared["w_down"],
        score_correction=None if hashed else ArrayInfo((E,), (None,), init_value=0.0, dtype="float32"),
        tid2eid=ArrayInfo((cfg.vocab_size, cfg.experts_per_token), (None, None), init_value=0.0, dtype="float32")
        if hashed else None,
        **_compressor_leaves(cfg, layer), **hyper_connection_leaves(cfg, layer),
    )


def _compressor_hf_leaves(cfg: ModelConfig, kind: str) -> dict[str, HFLeaf]:
    """The compressor's tensors on a layer of `kind` (CSA: with the indexer's)."""
    fields, D, K = cfg.deepseek_v4, cfg.hidden_size, cfg.head_dim
    c, m = (2, fields.csa_rate) if kind == CSA else (1, fields.hca_rate)
    comp = ATTN + "compressor."
    leaves = {"comp_kv": HFLeaf(comp + "wkv.weight", "transpose", (c * K, D)),
              "comp_gate": HFLeaf(comp + "wgate.weight", "transpose", (c * K, D)),
              "comp_bias": HFLeaf(comp + "ape", "same", (m, c * K)),
              "comp_norm": HFLeaf(comp + "norm.weight", "same", (K,))}
    if kind == CSA:
        I, Hi, index = fields.index_dim, fields.index_heads, ATTN + "indexer."
        leaves |= {"index_kv": HFLeaf(index + "compressor.wkv.weight", "transpose", (2 * I, D)),
                   "index_gate": HFLeaf(index + "compressor.wgate.weight", "transpose", (2 * I, D)),
                   "index_bias": HFLeaf(index + "compressor.ape", "same", (m, 2 * I)),
                   "index_norm": HFLeaf(index + "compressor.norm.weight", "same", (I,)),
                   "index_q": HFLeaf(index + "wq_b.weight", "transpose", (Hi * I, fields.q_lora_rank)),
                   "index_weights": HFLeaf(index + "weights_proj.weight", "transpose", (Hi, D))}
    return leaves


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each field lives as transformers 5.24 saves a DeepSeek-V4 (a CSA layer's compressor; HCA layers':
    `layer_hf_leaves`)."""
    fields, D, H, K, E = cfg.deepseek_v4, cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.num_experts
    Q, G, O, hc = fields.q_lora_rank, fields.o_groups, fields.o_lora_rank, cfg.hyper_connections
    flat, width, ffn = hc.mult * D, gate_width(hc), LAYER + "ffn."
    F, shared = cfg.moe_intermediate_size, ffn + "shared_experts."
    gates = {f"{sub}_hc_{name}": HFLeaf(f"{LAYER}hc_{hf_sub}_{name}", "transpose" if name == "fn" else "same", shape)
             for sub, hf_sub in (("attn", "attn"), ("mlp", "ffn"))
             for name, shape in (("fn", (width, flat)), ("base", (width,)), ("scale", (3,)))}
    return {
        "attn_norm": HFLeaf(LAYER + "attn_norm.weight", "same", (D,)),
        "mlp_norm": HFLeaf(LAYER + "ffn_norm.weight", "same", (D,)),
        "q_a": HFLeaf(ATTN + "wq_a.weight", "transpose", (Q, D)),
        "q_a_norm": HFLeaf(ATTN + "q_norm.weight", "same", (Q,)),
        "q_b": HFLeaf(ATTN + "wq_b.weight", "in_heads", (H * K, Q), H, K),
        "kv": HFLeaf(ATTN + "wkv.weight", "transpose", (K, D)),
        "kv_norm": HFLeaf(ATTN + "norm.weight", "same", (K,)),
        "o_a": HFLeaf(ATTN + "wo_a.weight", "head_rows_transposed", (G * O, H * K // G), G, O),
        "o_b": HFLeaf(ATTN + "wo_b.weight", "transpose", (D, G * O)),
        "sinks": HFLeaf(ATTN + "attn_sink", "same", (H,)),
        "router": HFLeaf(ffn + "gate.weight", "transpose", (E, D)),
        "score_correction": HFLeaf(ffn + "gate.bias", "same", (E,)),
        "tid2eid": HFLeaf(ffn + "gate.tid2eid", "same", (cfg.vocab_size, cfg.experts_per_token)),
        **experts_hf_leaves(cfg, ffn + "experts.", ("w1", "w3", "w2")),
        "shared_gate": HFLeaf(shared + "w1.weight", "transpose", (F, D)),
        "shared_up": HFLeaf(shared + "w3.weight", "transpose", (F, D)),
        "shared_down": HFLeaf(shared + "w2.weight", "transpose", (D, F)),
        **_compressor_hf_leaves(cfg, CSA),
        **gates,
        "head_hc_fn": HFLeaf("model.hc_head.hc_fn", "transpose", (hc.mult, flat)),
        "head_hc_base": HFLeaf("model.hc_head.hc_base", "same", (hc.mult,)),
        "head_hc_scale": HFLeaf("model.hc_head.hc_scale", "same", (1,)),
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """An HCA layer's compressor (one series of K, its own rate)."""
    kind = cfg.deepseek_v4.layer_kinds[layer]
    return _compressor_hf_leaves(cfg, kind) if kind == HCA else {}


def stored_names(names: Collection[str]) -> dict[str, str]:
    """Tensor name -> the name stored, for DeepSeek's release (no `model.` prefix, `embed`, `norm`, `hc_head_fn`);
    empty where the names are transformers' saved ones."""
    if "embed.weight" not in names:
        return {}
    top = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
           **{f"model.hc_head.hc_{part}": f"hc_head_{part}" for part in ("fn", "base", "scale")}}
    return {**{f"model.{name}": name for name in names if name.startswith("layers.")}, **top}


def moe(h: jax.Array, lw: DeepseekV4Layer, cfg: ModelConfig, layout: Any, tokens: jax.Array) -> jax.Array:
    """The routed experts plus the shared expert of the normed h [B, T, D]; tokens [B, T] pick a hash layer's."""
    x2 = h.reshape(-1, h.shape[-1])
    scores = jnp.sqrt(jax.nn.softplus(linear(x2.astype(jnp.float32), lw.router)))
    if lw.tid2eid is not None:
        ids = jnp.clip(tokens.reshape(-1), 0, lw.tid2eid.shape[0] - 1)
        experts = jnp.round(jnp.take(lw.tid2eid, ids, axis=0)).astype(jnp.int32)
    else:
        experts = jax.lax.top_k(scores + lw.score_correction, cfg.experts_per_token)[1]
    weights = jnp.take_along_axis(scores, experts, axis=1)
    weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20) * cfg.routed_scaling_factor
    gate = ClampedSiLU(cfg.swiglu_limit)
    routed = experts_output(x2, weights, experts, lw, layout, gate).astype(h.dtype).reshape(h.shape)
    return routed + gated_mlp(h, lw.shared_gate, lw.shared_up, lw.shared_down, gate)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: DeepseekV4Layer, layer: int, positions: jax.Array,
    rope: RopeTables, inputs: LayerInputs | None = None,
) -> tuple[jax.Array, Any]:
    """Attention, then the experts, each between its hyper-connection gates; x [B, T, D] into the first layer (the
    embeddings), the streams [B, T, N, D] between layers, [B, T, D] out of the last (collapsed by the head's gate)."""
    layout, hc, eps = cache.layout, cfg.hyper_connections, cfg.rms_norm_eps
    streams = layout.constrain(expand(x, hc), STREAMS) if x.ndim == 3 else x

    def attention(h: jax.Array) -> jax.Array:
        nonlocal cache
        out, cache = v4_attention(cfg, rms_norm(h, lw.attn_norm, eps), cache, lw, layer, positions,
                                  rope.for_layer(layer))
        return out

    def mlp(h: jax.Array) -> jax.Array:
        return moe(rms_norm(h, lw.mlp_norm, eps), lw, cfg, layout, inputs.tokens)

    streams = layout.constrain(around(streams, lw.attn_hc_fn, lw.attn_hc_base, lw.attn_hc_scale, hc, attention),
                               STREAMS)
    streams = layout.constrain(around(streams, lw.mlp_hc_fn, lw.mlp_hc_base, lw.mlp_hc_scale, hc, mlp), STREAMS)
    if lw.head_hc_fn is not None:
        return collapse_head(streams, lw, hc), cache
    return streams, cache


FAMILY = Family("deepseek_v4", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                head_name="head", required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
                stored_names=stored_names, layer_hf_leaves=layer_hf_leaves, reads_embeddings=True)
