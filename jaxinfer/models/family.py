"""What a model family provides to the shared decoder, the loader and the registry.

A family is one module: how it reads its HF config, the leaves of each layer (as ArrayInfos),
where each leaf lives in an HF checkpoint (`HFLeaf`, a description the checkpoint package
turns into reads), and one decoder layer as a pure function. Everything else (the layer loop,
embedding, output head, quantization, packing, sharding, the engine) is shared.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Collection, Mapping, Protocol

import jax

from jaxinfer.config.model import REQUIRED_FIELDS, ModelConfig
from jaxinfer.models.rope import RopeTables

HF_KINDS = ("same", "transpose", "in_heads", "out_heads", "bias_heads", "head_rows", "head_rows_transposed",
            "in_head_rows", "bias_head_rows", "in_head_columns", "even_columns", "odd_columns", "columns",
            "in_group_rows")


@dataclasses.dataclass(frozen=True)
class HFLeaf:
    """One layer leaf in an HF checkpoint: tensor name ({i} the layer, {e} the expert) and layout.

    kind: "same" (as stored), "transpose" (torch Linear [out, in] -> [in, out]; experts stored in one tensor
    [E, out, in] -> [E, in, out]), "in_heads"
    (Linear [heads*K, D] -> [D, heads, K]), "out_heads" ([D, heads*K] -> [heads, K, D]),
    "bias_heads" ([heads*K] -> [heads, K]), "head_rows" (Linear [heads*S, D] -> [heads, K, D]: K = head_dim rows
    from row_offset of each head's S = hf_shape[0] / heads; DeepSeek's kv_b_proj holds each head's key rows, then its
    value rows), "head_rows_transposed" (the same as [heads, D, K]), "in_head_rows" (the same as [D, heads, K]:
    Qwen3-Next's q_proj holds each head's query rows, then its output gate's; GPT-NeoX's query_key_value each
    head's q, k and v rows), "bias_head_rows" (a bias [heads*S] -> [heads, K] alike), "in_head_columns" (Conv1D
    [D, heads*K], stored [in, out], -> [D, heads, K], from column row_offset: GPT-2's c_attn), "even_columns" /
    "odd_columns" (the even or odd entries of the last axis: GPT-OSS interleaves gate and up units in one tensor),
    "columns" (as stored, the last axis from row_offset on: Llama 4's experts hold gate then up columns in one
    [E, D, 2F] tensor), "in_group_rows" (Linear [groups*S, D] -> [D, heads, K]: heads / groups heads of K rows
    from row_offset of each group's S = hf_shape[0] / groups; Falcon-40B's query_key_value holds each KV group's
    query heads, then its key, then its value).
    row_offset: rows of a fused tensor (columns for "columns") before this leaf's (Phi-3's qkv_proj and
    gate_up_proj, Granite-MoE's input_linear, are split at load this way);
    head_rows: rows of each head before it. experts > 0:
    one stored tensor per expert, stacked on a new leading axis. hf_shape is one stored tensor's.
    """

    name: str
    kind: str
    hf_shape: tuple[int, ...]
    heads: int = 0
    head_dim: int = 0
    row_offset: int = 0
    experts: int = 0
    groups: int = 0  # "in_group_rows": the groups the stored rows fall into

    def __post_init__(self) -> None:
        if self.kind not in HF_KINDS:
            raise ValueError(f"HFLeaf kind {self.kind!r} is not one of {HF_KINDS}")


class DecoderLayer(Protocol):
    """One layer: (cfg, x [B,T,D], cache, layer weights, index, positions [B,T], rope) -> (x, cache)."""

    def __call__(self, cfg: ModelConfig, x: jax.Array, cache: Any, lw: Any, layer: int, positions: jax.Array,
                 rope: RopeTables) -> tuple[jax.Array, Any]: ...


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family: its architectures and the four functions the shared code calls (and, where they differ
    from the Llama-like families', its top-level tensor names and required config keys)."""

    name: str
    architectures: tuple[str, ...]
    read_config: Callable[[Mapping[str, Any], str], ModelConfig]  # (HF config, architecture) -> ModelConfig
    abstract_layer: Callable[[ModelConfig, int], Any]  # layer index -> its leaves as ArrayInfos
    hf_leaves: Callable[[ModelConfig], dict[str, HFLeaf]]  # layer field name -> HF location
    layer: DecoderLayer
    # HF names of the embedding and the final norm (Mamba2 keeps its decoder under `backbone.`)
    top_names: tuple[str, str] = ("model.embed_tokens.weight", "model.norm.weight")
    head_name: str = "lm_head"  # HF module of the untied output head (`.weight`, Phi's `.bias`); GPT-NeoX: embed_out
    positions_name: str = ""  # HF name of the learned position table (GPT-2's wpe), read where cfg.learned_positions
    required: tuple[str, ...] = REQUIRED_FIELDS  # HF config keys a checkpoint of the family must set
    # (stored tensor names) -> {hf_leaves' name: the name stored} where a checkpoint writes some tensors under other
    # names (Kimi Linear's as transformers saves it); empty: every name as hf_leaves gives it
    stored_names: Callable[[Collection[str]], dict[str, str]] = lambda names: {}
    # (cfg, layer) -> the layer's fields whose HF tensors differ from hf_leaves' (Gemma 4: its global layers' head
    # dims, its per-layer inputs' slices); None: every layer as hf_leaves says
    layer_hf_leaves: Callable[[ModelConfig, int], dict[str, HFLeaf]] | None = None
    # whether every layer is handed the step's LayerInputs (tokens, input embeddings) as an eighth argument:
    # Zamba2's shared blocks read the input embeddings beside the residual stream (Gemma 4's per-layer inputs are
    # the config's `per_layer_input_size`)
    reads_embeddings: bool = False
    # (cfg, layers, i) -> layer i's weights with the leaves it runs but another layer holds put in (Zamba2's shared
    # blocks: each held once, by the first layer running it, as its checkpoint stores it, so a block's bytes are on
    # the device once however many layers run it; MiniMax's decay rates and DiffLlama's lambda_init, derived from
    # the config and held by none; Dory's and HRM-Text's later passes running an earlier layer's weights, handed
    # with their place as a `placed_layer.PlacedLayer`, as Beam's depth scales and ZAYA's last-layer mark are);
    # None: every layer holds all its own leaves
    borrowed_leaves: Callable[[ModelConfig, list[Any], int], Any] | None = None
