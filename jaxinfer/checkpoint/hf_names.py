"""Where each jaxinfer weight leaf lives in an HF checkpoint, and how to reshape it.

The families describe their layers' tensors (`models.family.HFLeaf`); this module turns each
description into the transforms between the two layouts and `hf_index`, the HF slice holding
a slice of the jaxinfer array (so each shard reads only its own part).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import numpy as np

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.models.mllama import ARCHITECTURES as MLLAMA
from jaxinfer.models.registry import family_of
from jaxinfer.models.text_part import stored_name

Index = tuple[slice, ...]
Transforms = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray], Callable[[Index], Index]]
MTP_PREFIX = "model.mtp_"  # ERNIE 4.5's multi-token-prediction block, norms and projection
# Multi-token-prediction modules transformers skips too: Qwen3-Next's beside `model.`, MiMo-V2-Flash's inside it,
# Mistral Large 4's `mtp_dspark.*`
MTP_MODULE = ("mtp.", "model.mtp.", "mtp_dspark.")
SHARED_BLOCK_TENSOR = re.compile(r"model\.layers\.(\d+)\.shared_transformer\.")  # Zamba2's block under a layer
# a layer's K/V projections and norms, wherever the checkpoint keeps its layers (`model.language_model.layers.*`)
KV_TENSOR = re.compile(r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:k_proj|v_proj|k_norm|v_norm)\.")


@dataclasses.dataclass(frozen=True)
class HFTensor:
    """An HF tensor name (with `{i}` for the layer, `{e}` for the expert), the transforms to and from
    jaxinfer's layout, and `hf_index`: the HF slice holding a slice of the jaxinfer array (so shards
    read only theirs). A leaf of `experts` > 0 stacks one stored tensor per expert on axis 0; the
    transforms and hf_index then describe one expert's tensor."""

    name: str
    to_jax: Callable[[np.ndarray], np.ndarray]
    to_hf: Callable[[np.ndarray], np.ndarray]
    hf_index: Callable[[Index], Index]
    hf_shape: tuple[int, ...]
    per_layer: bool = True
    experts: int = 0


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _heads_rows(heads: slice, dims: slice, head_dim: int, offset: int = 0) -> slice:
    """HF rows (heads * head_dim flattened, after `offset` rows) of a slice of heads; head_dim is never split."""
    if (dims.start, dims.stop) != (0, head_dim):
        raise ValueError(f"head_dim slices are not read from HF checkpoints, got {dims}")
    return slice(offset + heads.start * head_dim, offset + heads.stop * head_dim)


def _shifted(rows: slice, offset: int) -> slice:
    return slice(rows.start + offset, rows.stop + offset)


def _same(leaf: HFLeaf) -> Transforms:
    return _identity, _identity, lambda index: index


def _transpose(leaf: HFLeaf) -> Transforms:
    """torch Linear [out, in] <-> [in, out], the last two axes (experts stacked in one tensor [E, out, in] keep
    their leading axis); the out rows may sit after `row_offset` rows of a fused tensor."""

    def swap(w: np.ndarray) -> np.ndarray:
        return w.swapaxes(-1, -2)

    def hf_index(index: Index) -> Index:
        return (*index[:-2], _shifted(index[-1], leaf.row_offset), index[-2])

    return swap, swap, hf_index


def _in_heads(leaf: HFLeaf) -> Transforms:
    """torch Linear [heads*K, D] <-> jaxinfer [D, heads, K] (to_jax also takes a slice of heads)."""
    heads, head_dim = leaf.heads, leaf.head_dim

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(w.shape[1], -1, head_dim)

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], heads * head_dim).T

    def hf_index(index: Index) -> Index:
        return _heads_rows(index[1], index[2], head_dim, leaf.row_offset), index[0]

    return to_jax, to_hf, hf_index


def _out_heads(leaf: HFLeaf) -> Transforms:
    """torch Linear [D, heads*K] <-> jaxinfer [heads, K, D]."""
    heads, head_dim = leaf.heads, leaf.head_dim

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.T.reshape(-1, head_dim, w.shape[0])

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(heads * head_dim, w.shape[-1]).T

    def hf_index(index: Index) -> Index:
        return index[2], _heads_rows(index[0], index[1], head_dim)

    return to_jax, to_hf, hf_index


def _bias_heads(leaf: HFLeaf) -> Transforms:
    heads, head_dim = leaf.heads, leaf.head_dim
    return (
        lambda b: b.reshape(-1, head_dim),
        lambda b: b.reshape(heads * head_dim),
        lambda index: (_heads_rows(index[0], index[1], head_dim, leaf.row_offset),),
    )


def _head_rows(order: tuple[int, int, int]) -> Callable[[HFLeaf], Transforms]:
    """torch Linear [heads*S, D] -> jaxinfer [heads, K, D] with its axes in `order` ((0, 2, 1): [heads, D, K];
    (2, 0, 1): [D, heads, K]): the K rows from row_offset of each head's S. A slice of heads with all their K rows
    reads those heads' rows whole and keeps its part; with a part of the K rows (tp splitting DBRX's experts'
    hidden units, one "head" per expert) it reads one run of rows, from the first head's part to the last's, whose
    length (heads - 1) * S + part (part < S) tells to_jax the part it keeps of each head."""

    def transforms(leaf: HFLeaf) -> Transforms:
        rows, first = leaf.head_dim, leaf.row_offset
        stride = leaf.hf_shape[0] // leaf.heads

        def to_jax(w: np.ndarray) -> np.ndarray:
            part = w.shape[0] % stride
            if not part:  # whole heads (every device-side read: the whole tensor)
                return w.reshape(-1, stride, w.shape[-1])[:, first : first + rows].transpose(order)
            tail = np.zeros((stride - part, w.shape[-1]), w.dtype)  # the last head's rows past its part
            whole = np.concatenate([np.asarray(w), tail]).reshape(-1, stride, w.shape[-1])
            return whole[:, :part].transpose(order)

        def to_hf(w: np.ndarray) -> np.ndarray:
            raise NotImplementedError("a part of each head's rows is not written back on its own")

        def hf_index(index: Index) -> Index:
            heads, part, columns = (index[order.index(axis)] for axis in range(3))
            if (part.start, part.stop) == (0, rows):
                return slice(heads.start * stride, heads.stop * stride), columns
            start = heads.start * stride + first + part.start
            return slice(start, (heads.stop - 1) * stride + first + part.stop), columns

        return to_jax, to_hf, hf_index

    return transforms


def _group_rows(leaf: HFLeaf) -> Transforms:
    """torch Linear [groups*S, D] -> jaxinfer [D, heads, K]: heads / groups heads of K rows from row_offset of each
    group's S (a slice of heads reads whole groups' rows and keeps its part)."""
    first, head_dim, per_group = leaf.row_offset, leaf.head_dim, leaf.heads // leaf.groups
    stride = leaf.hf_shape[0] // leaf.groups

    def to_jax(w: np.ndarray) -> np.ndarray:
        rows = w.reshape(-1, stride, w.shape[-1])[:, first : first + per_group * head_dim]
        return rows.reshape(-1, head_dim, w.shape[-1]).transpose(2, 0, 1)

    def to_hf(w: np.ndarray) -> np.ndarray:
        raise NotImplementedError("a part of each group's rows is not written back on its own")

    def hf_index(index: Index) -> Index:
        columns, heads, part = index
        if (part.start, part.stop) != (0, head_dim) or heads.start % per_group or heads.stop % per_group:
            raise ValueError(f"in_group_rows leaves are read whole groups of {per_group} heads at a time, got {heads}")
        return slice(heads.start // per_group * stride, heads.stop // per_group * stride), columns

    return to_jax, to_hf, hf_index


def _bias_head_rows(leaf: HFLeaf) -> Transforms:
    """A bias [heads*S] -> [heads, K]: the K entries from row_offset of each head's S (as `_head_rows`' rows)."""
    rows, first = leaf.head_dim, leaf.row_offset
    stride = leaf.hf_shape[0] // leaf.heads

    def to_hf(b: np.ndarray) -> np.ndarray:
        raise NotImplementedError("a part of each head's bias is not written back on its own")

    def hf_index(index: Index) -> Index:
        heads, part = index
        if (part.start, part.stop) != (0, rows):
            raise ValueError(f"bias_head_rows leaves are read a whole head at a time, got {part}")
        return (slice(heads.start * stride, heads.stop * stride),)

    return (lambda b: b.reshape(-1, stride)[:, first : first + rows]), to_hf, hf_index


def _in_head_columns(leaf: HFLeaf) -> Transforms:
    """Conv1D [D, heads*K] (stored [in, out]) <-> jaxinfer [D, heads, K], the columns from row_offset on."""
    heads, head_dim = leaf.heads, leaf.head_dim

    def to_jax(w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], -1, head_dim)

    def to_hf(w: np.ndarray) -> np.ndarray:
        return w.reshape(w.shape[0], heads * head_dim)

    def hf_index(index: Index) -> Index:
        return index[0], _heads_rows(index[1], index[2], head_dim, leaf.row_offset)

    return to_jax, to_hf, hf_index


def _interleaved(phase: int) -> Callable[[HFLeaf], Transforms]:
    """The entries phase, phase + 2, ... of the last axis (a slice of them reads their span of the stored one)."""

    def to_hf(w: np.ndarray) -> np.ndarray:
        raise NotImplementedError("an interleaved half is not written back on its own")

    def transforms(leaf: HFLeaf) -> Transforms:
        def hf_index(index: Index) -> Index:
            last = index[-1]
            return (*index[:-1], slice(2 * last.start, 2 * last.stop))

        return (lambda w: w[..., phase::2]), to_hf, hf_index

    return transforms


def _columns(leaf: HFLeaf) -> Transforms:
    """The last axis from row_offset on, as stored (a slice of it reads its span of the stored one)."""

    def to_hf(w: np.ndarray) -> np.ndarray:
        raise NotImplementedError("a part of a fused tensor's columns is not written back on its own")

    def hf_index(index: Index) -> Index:
        return (*index[:-1], _shifted(index[-1], leaf.row_offset))

    return _identity, to_hf, hf_index


KINDS: dict[str, Callable[[HFLeaf], Transforms]] = {
    "same": _same, "transpose": _transpose, "in_heads": _in_heads, "out_heads": _out_heads, "bias_heads": _bias_heads,
    "head_rows": _head_rows((0, 1, 2)), "head_rows_transposed": _head_rows((0, 2, 1)),
    "in_head_rows": _head_rows((2, 0, 1)), "bias_head_rows": _bias_head_rows, "in_head_columns": _in_head_columns,
    "even_columns": _interleaved(0), "odd_columns": _interleaved(1), "columns": _columns, "in_group_rows": _group_rows,
}


def hf_tensor(leaf: HFLeaf) -> HFTensor:
    """The transforms and slicing of one described leaf (`HFLeaf`)."""
    return HFTensor(leaf.name, *KINDS[leaf.kind](leaf), leaf.hf_shape, experts=leaf.experts)


def hf_tensor_map(cfg: ModelConfig) -> dict[str, HFTensor]:
    """jaxinfer leaf path ('layers.wq', 'embed', ...) -> HF tensor; only leaves the config has (under the
    language model's prefix in a vision-language checkpoint run as text: `text_part`)."""
    D, V, E = cfg.hidden_size, cfg.vocab_size, cfg.embedding_size
    family = family_of(cfg)
    out = {f"layers.{name}": hf_tensor(leaf) for name, leaf in family.hf_leaves(cfg).items()}
    if family.layer_hf_leaves is not None:  # one layer's own (read first: `layer_tensor`)
        out |= {f"layers.{i}.{name}": hf_tensor(leaf) for i in range(cfg.num_layers)
                for name, leaf in family.layer_hf_leaves(cfg, i).items()}
    same = (_identity, _identity, lambda index: index)
    embed, final_norm = family.top_names
    out["embed"] = HFTensor(embed, *same, (cfg.stored_vocab_size or V, E), per_layer=False)  # its first V rows
    # OPT-350M's post-norm layers: transformers builds no final norm; nor Qwen4-Exp's (its streams' mixer instead)
    final = not cfg.post_norm and cfg.final_norm
    if final and not cfg.weightless_norms:
        out["final_norm"] = HFTensor(final_norm, *same, (D,), per_layer=False)
    if cfg.norm_bias and final:
        out["final_norm_bias"] = HFTensor(final_norm.removesuffix("weight") + "bias", *same, (D,), per_layer=False)
    transposed = ((lambda w: w.T), (lambda w: w.T), (lambda i: i[::-1]))
    if not cfg.tie_word_embeddings:
        out["lm_head"] = HFTensor(family.head_name + ".weight", *transposed, (V, E), per_layer=False)
    if E != D:  # OPT-350M's Linear project_in [D, E] and project_out [E, D], beside the embedding
        prefix = embed.removesuffix("embed_tokens.weight")
        out["project_in"] = HFTensor(prefix + "project_in.weight", *transposed, (D, E), per_layer=False)
        out["project_out"] = HFTensor(prefix + "project_out.weight", *transposed, (E, D), per_layer=False)
    if cfg.lm_head_bias:
        out["lm_head_bias"] = HFTensor(family.head_name + ".bias", *same, (V,), per_layer=False)
    if cfg.logit_scale:
        out["logit_scale"] = HFTensor(family.head_name + ".logit_scale", *same, (V,), per_layer=False)
    if cfg.learned_positions:
        rows = cfg.max_position_embeddings + cfg.position_offset  # OPT's first two rows unused
        out["position_embed"] = HFTensor(family.positions_name, *same, (rows, D), per_layer=False)
    return {path: dataclasses.replace(t, name=stored_name(cfg.architecture, t.name)) for path, t in out.items()}


def layer_tensor(tensors: dict[str, HFTensor], layer: int, name: str) -> HFTensor:
    """The HF tensor of field `name` in `layer`: the layer's own where the family gives one, else every layer's."""
    return tensors.get(f"layers.{layer}.{name}") or tensors[f"layers.{name}"]


def stored_names(t: HFTensor, layer: int | None) -> list[str]:
    """The stored tensor names behind one leaf (one per expert for stacked leaves)."""
    name = t.name if layer is None else t.name.replace("{i}", str(layer))
    return [name.replace("{e}", str(e)) for e in range(t.experts)] if t.experts else [name]


def in_mtp_layer(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` belongs to a multi-token-prediction layer stored after the decoder's
    (GLM-4.5's `model.layers.{num_hidden_layers}.*`) or beside it (ERNIE 4.5's `model.mtp_block.0.*`,
    `model.mtp_emb_norm.0.weight`, ...; Qwen3-Next's `mtp.*`, MiMo-V2-Flash's `model.mtp.*`): not run, so not read
    (transformers skips them too)."""
    if (cfg.mtp_layers and name.startswith(MTP_PREFIX)) or name.startswith(MTP_MODULE):
        return True
    layer = re.match(r"model\.layers\.(\d+)\.", name)
    return layer is not None and cfg.num_layers <= int(layer.group(1)) < cfg.num_layers + cfg.mtp_layers


def in_kv_sharing_layer(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` is a K/V projection or norm of a layer that reads another layer's K/V (Gemma 4's and
    Gemma 3n's last `num_kv_shared_layers`): Google's releases ship them, transformers neither builds nor reads them
    (its `_keys_to_ignore_on_load_unexpected`), so neither does jaxinfer."""
    match = KV_TENSOR.search(name) if cfg.kv_sources else None
    if match is None:
        return False
    layer = int(match.group(1))
    return layer < cfg.num_layers and cfg.kv_source(layer) != layer


def unread_tensor(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` is one a checkpoint may hold that the model never reads (an MTP layer's, a KV-sharing
    layer's K/V, Qwen4-Exp's derived n-gram constants, a Zamba2 block's other names in a state dict)."""
    return (in_mtp_layer(cfg, name) or in_kv_sharing_layer(cfg, name) or in_zero_expert(cfg, name)
            or in_borrowed_block(cfg, name) or (cfg.qwen4_exp is not None and name.endswith(NGRAM_CONSTANTS))
            or in_skipped_cross_layer(cfg, name))


def in_skipped_cross_layer(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` is an Mllama cross-attention layer's, which text runs skip (models/mllama)."""
    layer = re.match(r"(?:language_model\.)?model\.layers\.(\d+)\.", name)
    return cfg.architecture in MLLAMA and layer is not None and int(layer.group(1)) in cfg.mlp_only_layers


def in_borrowed_block(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` is a Zamba2 shared block's under a hybrid layer that runs it but does not hold it:
    a model's `state_dict()` names each block under every layer running it (a trainer's update), save_pretrained
    under the first alone. The same tensor as the holder's, read there."""
    blocks = cfg.shared_blocks
    match = SHARED_BLOCK_TENSOR.match(name) if blocks is not None else None
    return match is not None and (layer := int(match.group(1))) in blocks.layers and blocks.stored_at(layer) != layer


# Qwen4-Exp's hash multipliers and head sizes, saved as buffers: derived from the config (config/qwen4_exp), not read
NGRAM_CONSTANTS = tuple(f".ple_embedding.{name}" for name in ("layer_multipliers", "ngram_heads_vocab_sizes",
                                                                "ngram_heads_offsets"))


def in_zero_expert(cfg: ModelConfig, name: str) -> bool:
    """Whether tensor `name` is a gate or up projection of a LongCat-Flash identity expert (`cfg.zero_experts`):
    transformers 5.24 keeps gate_up rows for them and saves them, though the experts never read them."""
    expert = re.match(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\.(gate|up)_proj\.weight$", name)
    return cfg.zero_experts > 0 and expert is not None and int(expert.group(1)) >= cfg.num_experts


def expected_hf_names(cfg: ModelConfig, layer_fields: list[list[str]]) -> set[str]:
    """Every tensor name a complete checkpoint holds, given each layer's leaf field names."""
    tensors = hf_tensor_map(cfg)
    names = {n for t in tensors.values() if not t.per_layer for n in stored_names(t, None)}
    for i, fields in enumerate(layer_fields):
        names.update(n for field in fields for n in stored_names(layer_tensor(tensors, i, field), i))
    return names
