"""Qwen4-Exp (`Qwen4ExpForCausalLM`, and `Qwen4ExpForConditionalGeneration` text-only; transformers'
models/qwen4_exp).

Its layer is Qwen3.5-MoE's (models/qwen3_5: Gated DeltaNet on the `linear_attention` layers, gated attention with
a quarter of each head rotated on the others, Qwen3-Next's routed experts beside a sigmoid-gated shared expert)
with three parts of its own, each in its module:
- the residual is `hc_count` streams (models/gated_residual): each sublayer reads a gated mean of them through its
  own gate (`attn_hyper_connection`, `mlp_hyper_connection`, in place of the pre-norms) and writes its output
  back to each, weighted; after the last layer a last gate (`hyper_connection_mixer`) mixes them, no final norm;
- on the `ple_layer_ids` layers, hashed n-gram embeddings of the tokens are gated into the streams before the
  mixer (models/ngram_embedding, models/ngram_hash);
- attention layers (`indexed_attention`) keep per query only the key blocks their QSA indexer scores highest
  (models/qsa_attention).

The PLE and QSA layers keep per-token rows in their K pages (models/token_rows: a PLE layer's conv inputs and
token ids, a QSA layer's keys, values and raw index keys) and read back the positions they need, so whole sequences
and engine steps (chunked prefill, decode, preemption) run one code path; the DeltaNet layers keep their state in
the state pools as Qwen3.5's do (so prefix caching and speculation are off, as for every state-layer model).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError, ModelConfig, field
from jaxinfer.config.qwen4_exp import Qwen4ExpFields, ngram_tables
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gated_residual import (
    StreamGate,
    read_streams,
    stream_gate_hf_leaves,
    stream_gate_leaves,
    write_streams,
)
from jaxinfer.models.hybrid import token_mixer
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.layers import Weight
from jaxinfer.models.mixtral import moe_fields
from jaxinfer.models.moe import moe_block
from jaxinfer.models.ngram_embedding import add_ngram_embedding, ngram_hf_leaves, ngram_leaves
from jaxinfer.models.qsa_attention import qsa_attention
from jaxinfer.models.qwen3_5 import MoEDeltaNetLayer, abstract_moe_layer, fused_experts_hf_leaves, moe_hf_leaves
from jaxinfer.models.qwen3_next import GatedAttentionLayer, hybrid_fields, shared_expert_width
from jaxinfer.models.rope import RopeTables
from jaxinfer.models.shared_expert import shared_expert
from jaxinfer.models.token_rows import DIGITS, half_width
from jaxinfer.parallel.array_info import ArrayInfo

# the conditional-generation checkpoints run their language model alone (models/text_part): images refused
ARCHITECTURES = ("Qwen4ExpForCausalLM", "Qwen4ExpForConditionalGeneration")
LAYER = "model.layers.{i}."
QSA_KEYS = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")


@dataclasses.dataclass
class Qwen4ExpExtras:
    """What a Qwen4-Exp layer adds to Qwen3.5-MoE's (after its fields; None where the layer has none): the two
    stream gates, the final mixer (the last layer's), the PLE's leaves and the QSA indexer's."""

    attn_hc_norm: jax.Array | None = None  # [S * D]
    attn_hc_down: Weight | None = None  # [S * D, R]
    attn_hc_up: Weight | None = None  # [R, S * D]
    attn_hc_inject: Weight | None = None  # [S * D, S]
    mlp_hc_norm: jax.Array | None = None
    mlp_hc_down: Weight | None = None
    mlp_hc_up: Weight | None = None
    mlp_hc_inject: Weight | None = None
    out_hc_norm: jax.Array | None = None  # the last layer's: the streams' final mixer
    out_hc_down: Weight | None = None
    out_hc_up: Weight | None = None
    ple_table: jax.Array | None = None  # [parts, rows / parts, W / heads]
    ple_key: Weight | None = None  # [W, S * D]
    ple_value: Weight | None = None  # [W, D]
    ple_key_norm: jax.Array | None = None  # [S * D]
    ple_query_norm: jax.Array | None = None  # [S * D]
    ple_conv_norm: jax.Array | None = None  # [S * D]
    ple_conv: jax.Array | None = None  # [S * D, 1, ple_kernel]
    index_qk: Weight | None = None  # [D, (indexer_heads + 1) * indexer_dim]: the queries, then the one key
    index_q_norm: jax.Array | None = None  # [indexer_dim]
    index_k_norm: jax.Array | None = None  # [indexer_dim]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QsaLayer(Qwen4ExpExtras, GatedAttentionLayer):
    """An `indexed_attention` layer: gated attention with the indexer, the experts, the stream gates."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DeltaNetStreamsLayer(Qwen4ExpExtras, MoEDeltaNetLayer):
    """A `linear_attention` layer: the split DeltaNet, the experts, the stream gates (and a PLE's leaves)."""


def abstract_layer(cfg: ModelConfig, layer: int) -> QsaLayer | DeltaNetStreamsLayer:
    """Layer `layer`'s leaves: Qwen3.5-MoE's without its pre-norms, with the layer's own extras."""
    fields, D = cfg.qwen4_exp, cfg.hidden_size
    base = abstract_moe_layer(cfg, layer)
    leaves = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)} | dict(attn_norm=None, mlp_norm=None)
    gate = lambda prefix, writes=True: stream_gate_leaves(prefix, fields.streams, D, fields.stream_rank, writes)  # noqa: E731
    leaves |= gate("attn_hc") | gate("mlp_hc")
    if layer == cfg.num_layers - 1:
        leaves |= gate("out_hc", False)
    table = fields.table(layer)
    if table is not None:
        leaves |= ngram_leaves(fields, table, D, fields.table_parts)
    if cfg.is_state_layer(layer):
        return DeltaNetStreamsLayer(**leaves)
    I = fields.indexer_dim
    leaves |= dict(index_qk=ArrayInfo((D, (fields.indexer_heads + 1) * I), ("embed", None)),
                   index_q_norm=ArrayInfo((I,), (None,), init_value=0.0),
                   index_k_norm=ArrayInfo((I,), (None,), init_value=0.0))
    return QsaLayer(**leaves)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Qwen3.5-MoE's names (the experts one tensor each, as transformers saves them, or fused where the checkpoint
    stores them so: `qwen3_5.experts_as_stored`), the gates' and the indexer's."""
    fields, D, I = cfg.qwen4_exp, cfg.hidden_size, cfg.qwen4_exp.indexer_dim
    gate = lambda prefix, module, writes=True: stream_gate_hf_leaves(  # noqa: E731
        prefix, module, fields.streams, D, fields.stream_rank, writes)
    indexer = LAYER + "self_attn.indexer."
    experts = fused_experts_hf_leaves(cfg, LAYER + "mlp.experts.") if fields.fused_experts else {}
    return {
        **moe_hf_leaves(cfg), **experts,
        **gate("attn_hc", LAYER + "attn_hyper_connection."), **gate("mlp_hc", LAYER + "mlp_hyper_connection."),
        **gate("out_hc", "model.hyper_connection_mixer.", False),
        "index_qk": HFLeaf(indexer + "index_qk_proj.weight", "transpose", ((fields.indexer_heads + 1) * I, D)),
        "index_q_norm": HFLeaf(indexer + "q_layernorm.weight", "same", (I,)),
        "index_k_norm": HFLeaf(indexer + "k_layernorm.weight", "same", (I,)),
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A PLE layer's own tensors (its table's rows are its own primes')."""
    fields = cfg.qwen4_exp
    table = fields.table(layer)
    return {} if table is None else ngram_hf_leaves(fields, table, cfg.hidden_size, fields.table_parts)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array, rope: RopeTables,
    inputs: LayerInputs | None = None,
) -> tuple[jax.Array, Any]:
    """The n-gram embedding (a PLE layer), the mixer and the experts, each reading and writing the streams; x
    [B, T, D] on the first layer (the embeddings, copied into every stream), [B, T, S * D] after, [B, T, D] out
    of the last (the streams mixed)."""
    fields, eps = cfg.qwen4_exp, cfg.rms_norm_eps
    S = fields.streams
    if x.shape[-1] == cfg.hidden_size:
        x = jnp.tile(x, S)
    if lw.ple_table is not None:
        x, cache = add_ngram_embedding(lw, x, inputs.tokens, positions, cache, layer, fields, fields.table(layer), eps)
    h, weights = read_streams(StreamGate.of(lw, "attn_hc"), x, S, eps)
    if lw.index_qk is not None:
        out, cache = qsa_attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    else:
        out, cache = token_mixer(cfg, h, cache, lw, layer, positions, rope)
    x = write_streams(x, out, weights)
    h, weights = read_streams(StreamGate.of(lw, "mlp_hc"), x, S, eps)
    x = write_streams(x, moe_block(h, lw, cfg, cache.layout) + shared_expert(h, lw, cfg.activation), weights)
    if lw.out_hc_norm is not None:
        x = read_streams(StreamGate.of(lw, "out_hc"), x, S, eps)[0]
    return x, cache


def _required(hf: Mapping[str, Any], keys: tuple[str, ...], why: str) -> None:
    missing = [key for key in keys if hf.get(key) is None]
    if missing:
        raise ConfigError(f"Qwen4ExpForCausalLM needs {', '.join(missing)} ({why})")


def qwen4_exp_fields(hf: Mapping[str, Any], linear: tuple[int, ...]) -> Qwen4ExpFields:
    """The streams', n-gram embeddings' and indexer's settings, checked as transformers checks them."""
    _required(hf, QSA_KEYS, "every attention layer runs the QSA indexer")
    if int(hf["indexer_kv_heads"]) != 1:
        raise ConfigError(f"indexer_kv_heads {hf['indexer_kv_heads']!r} is not supported; supported: 1")
    budget, block = int(hf["indexer_budget"]), int(hf["indexer_compress_ratio"])
    if budget % block:
        raise ConfigError(f"indexer_budget {budget} must be a multiple of indexer_compress_ratio {block}")
    vocab, hidden = int(hf["vocab_size"]), int(hf["hidden_size"])
    ple = tuple(sorted({int(i) - 1 for i in field(hf, "ple_layer_ids", None) or []}))
    if any(i not in linear for i in ple):
        raise ConfigError(f"ple_layer_ids {hf['ple_layer_ids']!r} must name linear_attention layers (one-indexed)")
    eos = field(hf, "eos_token_id", None)
    eos = eos[0] if isinstance(eos, list) and eos else eos
    if ple and eos is None:
        raise ConfigError("eos_token_id must be set where ple_layer_ids are (n-grams stop at it)")
    size, per_order = int(field(hf, "ngram_size", 3)), int(field(hf, "heads_per_ngram", 8))
    width, heads = int(field(hf, "ple_embed_dim", None) or hidden), (size - 1) * per_order
    if heads < 1 or width % heads:
        raise ConfigError(f"ple_embed_dim {width} must be a multiple of the {heads} n-gram heads "
                          f"((ngram_size - 1) * heads_per_ngram)")
    tables = ngram_tables(vocab, size, heads, len(ple), int(field(hf, "ngram_vocab_size_base", 20_000_000)),
                          int(field(hf, "make_ngram_vocab_size_divisible_by", 128)), int(field(hf, "seed", 1234)))
    parts = int(field(hf, "split_ngram_parts", 512))
    if any(t.rows % parts for t in tables):
        raise ConfigError(f"split_ngram_parts {parts} must divide every n-gram table's rows "
                          f"{[t.rows for t in tables]} (each shard as many rows)")
    return Qwen4ExpFields(
        streams=int(field(hf, "hc_count", 4)), stream_rank=int(field(hf, "hc_lowrank", 320)), ple_layers=ple,
        ple_width=width, ple_kernel=int(field(hf, "ple_conv_kernel_size", 4)), ngram_size=size,
        heads_per_ngram=per_order, tables=tables, table_parts=parts, eos_token_id=int(eos or 0),
        indexer_heads=int(hf["indexer_n_heads"]), indexer_dim=int(hf["indexer_head_dim"]), indexer_budget=budget,
        indexer_block=block)


def row_widths(fields: Mapping[str, Any], extras: Qwen4ExpFields) -> tuple[int, ...]:
    """Each layer's K and V head width: half its cached row's (models/token_rows): a QSA layer's keys, values and raw
    index key; a PLE layer's conv input and token digits; other DeltaNet layers keep none (their head_dim, unused)."""
    qsa = half_width(2 * fields["num_kv_heads"] * fields["head_dim"] + extras.indexer_dim)
    ple = half_width(extras.streams * fields["hidden_size"] + DIGITS)
    linear = fields["state_space"].layers
    return tuple(ple if i in extras.ple_layers else fields["head_dim"] if i in linear else qsa
                 for i in range(fields["num_layers"]))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Qwen4-Exp text config: Qwen3.5-MoE's fields (`indexed_attention` layers read as its
    `full_attention` ones) with the streams, n-gram embeddings and indexer (`ModelConfig.qwen4_exp`)."""
    gate = field(hf, "output_gate_type", None) or field(hf, "hidden_act", "silu")
    if gate != "silu":
        raise ConfigError(f"output_gate_type {gate!r} is not supported for {arch}; supported: 'silu'")
    if int(field(hf, "hc_count", 4)) < 2:
        raise ConfigError(f"hc_count {hf['hc_count']!r} must be at least 2 (transformers' requirement)")
    types = field(hf, "layer_types", None)
    if types is not None:
        types = ["full_attention" if t in ("indexed_attention", "full_attention") else t for t in types]
    experts_width = int(field(hf, "moe_intermediate_size", 512))
    fields = hybrid_fields({**hf, "intermediate_size": experts_width, "layer_types": types}, arch)
    extras = qwen4_exp_fields(hf, fields["state_space"].layers)
    return ModelConfig(
        **fields,
        layer_kv_heads=(1,) * fields["num_layers"],
        layer_head_dims=row_widths(fields, extras),
        norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
        shared_expert_intermediate_size=shared_expert_width(hf),
        **moe_fields(hf, "num_experts", experts_width, experts=512, per_token=10),
        final_norm=False,
        qwen4_exp=extras,
    )


FAMILY = Family("qwen4_exp", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                required=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"),
                layer_hf_leaves=layer_hf_leaves)
