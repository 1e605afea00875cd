"""Zyphra Zamba2 (`Zamba2ForCausalLM`: Zamba2-1.2B, 2.7B, 7B): Mamba2 layers, some of them hybrid, each hybrid
layer running a shared transformer block first.

Every layer is a pre-norm Mamba2 mixer (`input_layernorm`, `mamba.*`; models/mamba2_mixer), its gated RMSNorm
grouped by `mamba_ngroups` and dt clamped from below at `time_step_min`. A hybrid layer (`layers_block_type`
"hybrid") first runs one of the shared blocks (config/shared_blocks: block j % num_mem_blocks for the j-th hybrid
layer, stored under the first layer running it): RMSNorm over the residual stream concatenated with the input
embeddings [2D] (handed to every layer: `Family.reads_embeddings`), attention over that (heads of 2D / heads dims,
scores scaled by (head_dim / 2) ** -0.5, rotary only with `use_mem_rope`; its K/V kept beside the mixer's state),
RMSNorm, then the gated MLP. Each use adds its own low-rank adapters to gate/up (and, with
`use_shared_attention_adapter`, to q, k and v). The block's output, through the layer's own `linear`, is added to
the mixer's input, not to the residual stream: x + mixer(norm(x + linear(block(x, embeddings)))). Each shared
block's weights are held once, by the first hybrid layer running it (where the checkpoint stores them); the others
hold their adapters and `linear` alone and are handed the block as they run (`borrowed_leaves`), so the device
holds the checkpoint's bytes, not a block per use (Zamba2-2.7B: ~1B parameters fewer). Refused by name:
`add_bias_linear` (biased projections and MLP; no release sets it), `use_long_context`, and q/k/v adapters over
grouped K/V heads (transformers' adapters are as wide as the queries).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, ClassVar, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.cache.state_pool import LayerState, read_state, write_state
from jaxinfer.config.model import ConfigError, ModelConfig, activation_name, common_fields, field
from jaxinfer.config.shared_blocks import SharedBlocks
from jaxinfer.config.state_space import StateSpace
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layer_calls import LayerInputs
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.mamba2_mixer import MixerWeights, mixer, mixer_hf_leaves, mixer_leaves
from jaxinfer.models.mlp import gate_product
from jaxinfer.models.norms import rms_norm
from jaxinfer.models.rope import RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("Zamba2ForCausalLM",)
LAYER = "model.layers.{i}."
HYBRID, MAMBA = "hybrid", ("mamba", "linear_attention")  # layers_block_type's names (transformers 5 renames mamba)
GATED_NORM_EPS = 1e-5  # Zamba2RMSNormGated's, fixed
# Zamba2Config's defaults for fields a config leaves out.
DEFAULTS = dict(mamba_d_state=64, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=8, use_conv_bias=True,
                chunk_size=256, time_step_min=0.001, hidden_act="gelu", rms_norm_eps=1e-5, num_mem_blocks=1,
                use_shared_attention_adapter=False, adapter_rank=128, use_mem_rope=False, max_position_embeddings=4096,
                tie_word_embeddings=True, add_bias_linear=False, use_long_context=False)


@dataclasses.dataclass
class SharedBlockFields:
    """The mixer's norm, and a hybrid layer's use of a shared block (None on the others; E = 2D its input, r the
    adapters' rank), after a mixer's fields (Zamba2's Mamba2, Zamba's Mamba-1). Defaults only because the mixer's
    fields have some: every layer sets mamba_norm."""

    mamba_norm: jax.Array | None = None  # [D]
    attn_norm: jax.Array | None = None  # [E]
    wq: Weight | None = None  # [E, H, K]
    wk: Weight | None = None  # [E, KV, K]
    wv: Weight | None = None  # [E, KV, K]
    wo: Weight | None = None  # [H, K, D]
    q_down: jax.Array | None = None  # [E, r]: the q/k/v adapters (use_shared_attention_adapter)
    q_up: jax.Array | None = None  # [r, H, K]
    k_down: jax.Array | None = None  # [E, r]
    k_up: jax.Array | None = None  # [r, KV, K]
    v_down: jax.Array | None = None  # [E, r]
    v_up: jax.Array | None = None  # [r, KV, K]
    mlp_norm: jax.Array | None = None  # [D]
    w_gate: Weight | None = None  # [D, F]
    w_up: Weight | None = None  # [D, F]
    w_down: Weight | None = None  # [F, D]
    mlp_adapter_down: jax.Array | None = None  # [D, r]: the gate/up adapter's shared down projection
    gate_adapter_up: jax.Array | None = None  # [r, F]
    up_adapter_up: jax.Array | None = None  # [r, F]
    block_out: Weight | None = None  # [D, D]: the hybrid layer's own `linear` after the block
    # The block's own fields (the rest are the use's): held by the first layer running it, borrowed by the others
    SHARED: ClassVar[tuple[str, ...]] = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")
    BLOCK_PROJECTIONS: ClassVar[dict[str, int]] = {
        "wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1, "block_out": 1,
    }
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Zamba2Layer(SharedBlockFields, MixerWeights):
    """A Mamba2 layer, with a hybrid layer's use of a shared block."""

    PROJECTIONS: ClassVar[dict[str, int]] = {**MixerWeights.PROJECTIONS, **SharedBlockFields.BLOCK_PROJECTIONS}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = SharedBlockFields.JOINED


def block_leaves(cfg: ModelConfig, holds_block: bool) -> dict[str, ArrayInfo | None]:
    """A hybrid layer's leaves of its block's use as ArrayInfos: its adapters and `linear`, and the block's own
    where it holds the block (`holds_block`: the first layer running it)."""
    D, F, H, KV, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    E, r, adapters = 2 * D, cfg.shared_blocks.adapter_rank, cfg.shared_blocks.attention_adapters
    norm = lambda n: ArrayInfo((n,), ("embed",), init_value=1.0)  # noqa: E731
    down = lambda n: ArrayInfo((n, r), ("embed", None)) if adapters else None  # noqa: E731
    up = lambda heads, axis: ArrayInfo((r, heads, K), (None, axis, "head_dim")) if adapters else None  # noqa: E731
    mlp_adapter = lambda shape, axes: ArrayInfo(shape, axes) if r else None  # noqa: E731
    block = dict(
        attn_norm=norm(E), mlp_norm=norm(D),
        wq=ArrayInfo((E, H, K), ("embed", "q_heads", "head_dim")),
        wk=ArrayInfo((E, KV, K), ("embed", "kv_heads", "head_dim")),
        wv=ArrayInfo((E, KV, K), ("embed", "kv_heads", "head_dim")),
        wo=ArrayInfo((H, K, D), ("q_heads", "head_dim", "embed")),
        w_gate=ArrayInfo((D, F), ("embed", "mlp")), w_up=ArrayInfo((D, F), ("embed", "mlp")),
        w_down=ArrayInfo((F, D), ("mlp", "embed")),
    )
    use = dict(
        q_down=down(E), q_up=up(H, "q_heads"), k_down=down(E), k_up=up(KV, "kv_heads"), v_down=down(E),
        v_up=up(KV, "kv_heads"),
        mlp_adapter_down=mlp_adapter((D, r), ("embed", None)), gate_adapter_up=mlp_adapter((r, F), (None, "mlp")),
        up_adapter_up=mlp_adapter((r, F), (None, "mlp")),
        block_out=ArrayInfo((D, D), ("embed", None)),
    )
    return use | (block if holds_block else {})


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> Zamba2Layer:
    """Layer `layer`'s leaves: the mixer's and its norm, and a hybrid layer's use of its block (and the block,
    in the first layer running it)."""
    D, blocks = cfg.hidden_size, cfg.shared_blocks
    block = block_leaves(cfg, blocks.stored_at(layer) == layer) if layer in blocks.layers else {}
    return Zamba2Layer(**mixer_leaves(cfg.state_space, D), mamba_norm=ArrayInfo((D,), ("embed",), init_value=1.0),
                       **block)


def _mamba_hf_leaves(cfg: ModelConfig, prefix: str) -> dict[str, HFLeaf]:
    """The mixer's and its norm's names under `prefix` (a Mamba2 layer's, or a hybrid layer's `mamba_decoder.`)."""
    return {"mamba_norm": HFLeaf(prefix + "input_layernorm.weight", "same", (cfg.hidden_size,)),
            **mixer_hf_leaves(cfg.state_space, cfg.hidden_size, prefix + "mamba.")}


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where a Mamba2 layer's fields live (a hybrid layer's: `layer_hf_leaves`)."""
    return _mamba_hf_leaves(cfg, LAYER)


def _adapter_leaves(cfg: ModelConfig, attn: str, j: int) -> dict[str, HFLeaf]:
    """Use j's q/k/v adapters: `linear_{q,k,v}_adapter_list.{j}.0` (down [r, E]), `.1` (up [H * K, r])."""
    H, KV, K, E, r = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, 2 * cfg.hidden_size, cfg.shared_blocks.adapter_rank
    leaves = {}
    for p, heads in (("q", H), ("k", KV), ("v", KV)):
        name = f"{attn}linear_{p}_adapter_list.{j}."
        leaves[f"{p}_down"] = HFLeaf(name + "0.weight", "transpose", (r, E))
        leaves[f"{p}_up"] = HFLeaf(name + "1.weight", "in_heads", (heads * K, r), heads, K)
    return leaves


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """A hybrid layer's fields: its mixer under `mamba_decoder.`, its block's own where it holds it, its adapters
    at its use's index under the layer holding the block, its own `linear`; a Mamba2 layer's as `hf_leaves` gives
    them."""
    blocks = cfg.shared_blocks
    if layer not in blocks.layers:
        return {}
    D, F, H, KV, K, r = (cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                         blocks.adapter_rank)
    E, j, own = 2 * D, blocks.use(layer), LAYER.format(i=layer)
    block = LAYER.format(i=blocks.stored_at(layer)) + "shared_transformer."
    attn, mlp = block + "self_attn.", block + "feed_forward."
    gate_up, adapter = mlp + "gate_up_proj.weight", f"{mlp}gate_up_proj_adapter_list.{j}."
    shared = {
        "attn_norm": HFLeaf(block + "input_layernorm.weight", "same", (E,)),
        "mlp_norm": HFLeaf(block + "pre_ff_layernorm.weight", "same", (D,)),
        "wq": HFLeaf(attn + "q_proj.weight", "in_heads", (H * K, E), H, K),
        "wk": HFLeaf(attn + "k_proj.weight", "in_heads", (KV * K, E), KV, K),
        "wv": HFLeaf(attn + "v_proj.weight", "in_heads", (KV * K, E), KV, K),
        "wo": HFLeaf(attn + "o_proj.weight", "out_heads", (D, H * K), H, K),
        "w_gate": HFLeaf(gate_up, "transpose", (2 * F, D)),
        "w_up": HFLeaf(gate_up, "transpose", (2 * F, D), row_offset=F),
        "w_down": HFLeaf(mlp + "down_proj.weight", "transpose", (D, F)),
    }
    leaves = {
        **_mamba_hf_leaves(cfg, own + "mamba_decoder."),
        **(shared if blocks.stored_at(layer) == layer else {}),
        "mlp_adapter_down": HFLeaf(adapter + "0.weight", "transpose", (r, D)),
        "gate_adapter_up": HFLeaf(adapter + "1.weight", "transpose", (2 * F, r)),
        "up_adapter_up": HFLeaf(adapter + "1.weight", "transpose", (2 * F, r), row_offset=F),
        "block_out": HFLeaf(own + "linear.weight", "transpose", (D, D)),
    }
    return leaves | (_adapter_leaves(cfg, attn, j) if blocks.attention_adapters else {})


def borrowed_leaves(cfg: ModelConfig, layers: list[SharedBlockFields], layer: int) -> SharedBlockFields:
    """Layer `layer`'s weights with its block's own leaves (`SharedBlockFields.SHARED`) taken from the layer holding
    them, where that is another; the weights as they are elsewhere. Whatever each leaf is (joined, quantized,
    packed), the holder's are the block's, so the borrower runs them as the holder does."""
    lw, blocks = layers[layer], cfg.shared_blocks
    if layer not in blocks.layers or (holder := blocks.stored_at(layer)) == layer:
        return lw
    return dataclasses.replace(lw, **{name: getattr(layers[holder], name) for name in SharedBlockFields.SHARED})


def _adapted(h: jax.Array, base: jax.Array, down: jax.Array | None, up: jax.Array | None) -> jax.Array:
    """A projection's output plus its use's adapter up(down(h)), where it has one."""
    return base if down is None else base + linear(linear(h, down), up)


def shared_block(
    cfg: ModelConfig, x: jax.Array, embeds: jax.Array, cache: Any, lw: SharedBlockFields, layer: int,
    positions: jax.Array, rope: RopeTables,
) -> tuple[jax.Array, Any]:
    """The block over x and the input embeddings [B, T, D] each: attention (its K/V written), then the gated
    MLP, each behind an RMSNorm, with no residual of its own; its output [B, T, D]."""
    layout, eps = cache.layout, cfg.rms_norm_eps
    h = rms_norm(jnp.concatenate([x, embeds.astype(x.dtype)], axis=-1), lw.attn_norm, eps)
    q, k, v = linears(h, [lw.wq, lw.wk, lw.wv])
    q, k, v = (_adapted(h, *p) for p in ((q, lw.q_down, lw.q_up), (k, lw.k_down, lw.k_up), (v, lw.v_down, lw.v_up)))
    q, k, v = layout.constrain(q, Q_HEADS), layout.constrain(k, KV_HEADS), layout.constrain(v, KV_HEADS)
    tables = rope.for_layer(layer)
    if tables is not None:  # use_mem_rope
        q, k = apply_rope(q, *tables), apply_rope(k, *tables)
    cache = cache.write(layer, k, v, positions)
    attn = attend(q, cache, layer, positions, cfg.layer_windows[layer], scale=cfg.attn_scale)
    h = rms_norm(linear(layout.constrain(attn, Q_HEADS), lw.wo, contract=2), lw.mlp_norm, eps)
    g, u = linears(h, [lw.w_gate, lw.w_up])
    if lw.mlp_adapter_down is not None:  # Zamba v1's block has none
        a = linear(h, lw.mlp_adapter_down)
        g, u = g + linear(a, lw.gate_adapter_up), u + linear(a, lw.up_adapter_up)
    return linear(gate_product(cfg.activation, g, u), lw.w_down), cache


def shared_block_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: SharedBlockFields, layer: int, positions: jax.Array,
    rope: RopeTables, inputs: LayerInputs, state_mixer: Callable[..., tuple[jax.Array, LayerState]],
) -> tuple[jax.Array, Any]:
    """x + mixer(norm(x + linear(block))) on a hybrid layer (the weights tell: `layer` is 0 in a one-layer view),
    x + mixer(norm(x)) on the others; state_mixer(state_space, lw, h, positions, state) is the layer's mixer."""
    mixer_in = x
    if lw.wo is not None:
        block, cache = shared_block(cfg, x, inputs.embeds, cache, lw, layer, positions, rope)
        mixer_in = x + linear(block, lw.block_out)
    h = rms_norm(mixer_in, lw.mamba_norm, cfg.rms_norm_eps)
    state = read_state(cache, layer, cfg, h.shape[0], h.shape[1])
    out, state = state_mixer(cfg.state_space, lw, h, positions, state)
    return cache.layout.constrain(x + out, HIDDEN), write_state(cache, layer, state)


def decoder_layer(
    cfg: ModelConfig, x: jax.Array, cache: Any, lw: Zamba2Layer, layer: int, positions: jax.Array, rope: RopeTables,
    inputs: LayerInputs,
) -> tuple[jax.Array, Any]:
    """A Zamba2 layer: `shared_block_layer` over Mamba2's mixer."""
    return shared_block_layer(cfg, x, cache, lw, layer, positions, rope, inputs, mixer)


def block_types(hf: Mapping[str, Any], layers: int) -> tuple[str, ...]:
    """`layers_block_type` ("mamba" / "linear_attention" or "hybrid" per layer), checked; Zamba2Config's default
    pattern (its 54 layers) where absent."""
    types = field(hf, "layers_block_type", None) or field(hf, "layer_types", None)
    if types is None:
        types = [MAMBA[0]] + ([MAMBA[0]] * 5 + [HYBRID]) * 7 + [MAMBA[0]] * 4 + [HYBRID] + [MAMBA[0]] * 3 + \
            [HYBRID] + [MAMBA[0]] * 2
    if len(types) != layers or any(t not in (HYBRID, *MAMBA) for t in types):
        raise ConfigError(f"layers_block_type {list(types)} is not supported: give one of 'mamba' or 'hybrid' for "
                          f"each of the {layers} layers")
    return tuple(types)


def _refuse(hf: Mapping[str, Any], arch: str) -> None:
    """ConfigError naming the first setting not run."""
    for name in ("add_bias_linear", "use_long_context"):
        if hf[name]:
            raise ConfigError(f"{name}={hf[name]} is not supported for {arch}; supported: false")
    if int(hf["adapter_rank"]) < 1:
        raise ConfigError(f"adapter_rank {hf['adapter_rank']} is not supported for {arch}; supported: a positive rank")
    heads, kv = int(hf["num_attention_heads"]), int(field(hf, "num_key_value_heads", hf["num_attention_heads"]))
    if hf["use_shared_attention_adapter"] and kv != heads:
        raise ConfigError(f"num_key_value_heads {kv} is not supported for {arch} with use_shared_attention_adapter "
                          f"(its k/v adapters are as wide as the queries); supported: num_attention_heads ({heads})")


def state_space(hf: Mapping[str, Any], layers: int, hidden: int) -> StateSpace:
    """Every layer's Mamba2 mixer: mamba_expand x hidden_size wide in n_mamba_heads heads."""
    inner, heads, groups = int(hf["mamba_expand"]) * hidden, int(hf["n_mamba_heads"]), int(hf["mamba_ngroups"])
    if inner % heads or heads % groups:
        raise ConfigError(f"n_mamba_heads ({heads}) must divide mamba_expand x hidden_size ({inner}) and be a "
                          f"multiple of mamba_ngroups ({groups})")
    return StateSpace(
        layers=tuple(range(layers)), num_heads=heads, head_dim=inner // heads, state_size=int(hf["mamba_d_state"]),
        n_groups=groups, conv_kernel=int(hf["mamba_d_conv"]), conv_bias=bool(hf["use_conv_bias"]),
        norm_eps=GATED_NORM_EPS, time_step_limit=(float(hf["time_step_min"]), math.inf),
        chunk_size=int(hf["chunk_size"]),
    )


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Zamba2 HF config (Zamba2Config's defaults where a key is absent)."""
    hf = {**DEFAULTS, **hf}
    _refuse(hf, arch)
    D, H, layers = int(hf["hidden_size"]), int(hf["num_attention_heads"]), int(hf["num_hidden_layers"])
    if 2 * D % H:
        raise ConfigError(f"2 x hidden_size ({2 * D}) must be a multiple of num_attention_heads ({H}) for {arch}")
    intermediate = int(field(hf, "intermediate_size", None) or 4 * D)
    fields = common_fields({**hf, "intermediate_size": intermediate, "head_dim": 2 * D // H}, arch)
    types = block_types(hf, layers)
    hybrid = tuple(i for i, t in enumerate(types) if t == HYBRID)
    return ModelConfig(
        **{**fields, "rms_norm_eps": float(hf["rms_norm_eps"]),
           "max_position_embeddings": int(hf["max_position_embeddings"]),
           "tie_word_embeddings": bool(hf["tie_word_embeddings"])},
        activation=activation_name(hf["hidden_act"]),
        attn_scale=(fields["head_dim"] / 2) ** -0.5,
        nope_layers=tuple(i for i in range(layers) if not (hf["use_mem_rope"] and i in hybrid)),
        state_space=state_space(hf, layers, D),
        shared_blocks=SharedBlocks(layers=hybrid, num_blocks=int(hf["num_mem_blocks"]),
                                   adapter_rank=int(hf["adapter_rank"]),
                                   attention_adapters=bool(hf["use_shared_attention_adapter"])),
    )


FAMILY = Family("zamba2", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=("model.embed_tokens.weight", "model.final_layernorm.weight"),
                layer_hf_leaves=layer_hf_leaves, reads_embeddings=True, borrowed_leaves=borrowed_leaves)
