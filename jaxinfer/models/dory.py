"""NVIDIA Nemotron Labs Dory (`DoryForCausalLM`): a looped normalized transformer (nGPT).

As transformers' modular_dory has it:

- Every hidden state lives on the unit sphere: the norms are weightless L2 norms (`cfg.unit_norms`, eps 1e-6), and
  each sublayer moves the stream towards its normed output at a learned per-channel rate,
  h + |lambda * alpha_init / initializer_range| * (norm(out) - h), instead of adding to it (Gemma 2's sandwich).
- Attention (AFMoE's): q and k L2-normed per head, then rotated (each layer type its own base), q scaled per head
  and dim by (sqk * sqrt(head_dim) / initializer_range)^2; the output gated by sigmoid(gate_proj(h) * (s_gate *
  hidden^0.25 / initializer_range)^2), L2-normed across all heads, then o_proj. Sliding layers over
  `sliding_window`.
- The gated MLP's gate and up scaled per unit by suv * sqrt(hidden), its product L2-normed before down_proj.
- The decoder loops (config/looped_layers): `n_input_layers` once, the next `n_recurrent_layers`
  `n_recurrent_loops` times, each pass starting from norm(h) + norm(the input section's output), then the rest.
  The passes are unrolled, each recurrent layer's later passes borrowing its weights (`borrowed_leaves`) and keeping
  their own K/V pages: transformers' "per_loop" cache. Its "last_loop" mode (earlier passes attending over pages the
  last pass writes, plus their own tokens, without writing) has no paged form here and is refused by name.
- The output head multiplies each token's logit by logit_scale / initializer_range (`Weights.logit_scale`).

A pass's layers hand on the restart point with the stream (`LoopStream`); which layer restarts or leaves the loops is
a static flag its weights are handed with (`placed_layer.PlacedLayer`), so alike layers still share one trace.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, ClassVar, Collection, Mapping

import jax
import jax.numpy as jnp

from jaxinfer.config.layer_type_rope import layer_type_rope
from jaxinfer.config.looped_layers import LoopedLayers
from jaxinfer.config.model import LAYER_TYPES, ConfigError, ModelConfig, activation_name, common_fields
from jaxinfer.config.typed_windows import windows_by_type
from jaxinfer.models.attention import attend
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.layers import Weight, linear, linears
from jaxinfer.models.mlp import gate_product, mlp_hf_leaves, mlp_leaves
from jaxinfer.models.norms import l2_norm
from jaxinfer.models.placed_layer import PlacedLayer, placed
from jaxinfer.models.rope import CosSin, RopeTables, apply_rope
from jaxinfer.models.self_attention import HIDDEN, KV_HEADS, Q_HEADS, attention_hf_leaves, attention_leaves
from jaxinfer.parallel.array_info import ArrayInfo

ARCHITECTURES = ("DoryForCausalLM",)
L2_EPS = 1e-6  # DoryL2Norm's, fixed
THETAS = {"sliding_attention": 10_000.0, "full_attention": 10_000_000.0}  # DoryConfig's default bases per layer type
# The released checkpoints' two blocks a layer (transformers' LayerPairCollapse): `layers.{2i}.mixer.*` attention,
# `layers.{2i + 1}.mixer.*` the MLP, their rates as `attn_alpha` / `mlp_alpha`
RELEASED_BLOCK = re.compile(r"layers\.(\d+)\.(mixer|attn_alpha|mlp_alpha)(?=\.|$)")
RELEASED_RENAMES = ((".self_attn.g_proj.", ".self_attn.gate_proj."), (".embeddings.", ".embed_tokens."))
# DoryConfig's defaults for the fields a config may leave out (or null) where ours differ.
DEFAULTS = dict(vocab_size=131072, hidden_size=2560, intermediate_size=7168, num_hidden_layers=36,
                num_attention_heads=16, num_key_value_heads=4, head_dim=256, max_position_embeddings=8192,
                initializer_range=0.0177, sliding_window=1024, ngpt_alpha_init=0.05, n_input_layers=8,
                n_output_layers=8, n_recurrent_loops=2, recurrent_kv_cache_mode="per_loop", attention_bias=False)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class DoryLayer:
    """One Dory layer's weights (None in a later pass of a recurrent layer: it borrows the first pass's)."""

    wq: Weight | None = None  # [D, H, K]
    wk: Weight | None = None  # [D, KV, K]
    wv: Weight | None = None  # [D, KV, K]
    wo: Weight | None = None  # [H, K, D]
    attn_gate: Weight | None = None  # [D, H, K]
    w_gate: Weight | None = None  # [D, F]
    w_up: Weight | None = None  # [D, F]
    w_down: Weight | None = None  # [F, D]
    bq: jax.Array | None = None  # [H, K]
    bk: jax.Array | None = None  # [KV, K]
    bv: jax.Array | None = None  # [KV, K]
    bo: jax.Array | None = None  # [D]
    query_scale: jax.Array | None = None  # [H, K] sqk
    gate_scale: jax.Array | None = None  # [H, K] s_gate
    suv_gate: jax.Array | None = None  # [F]
    suv_up: jax.Array | None = None  # [F]
    attn_rate: jax.Array | None = None  # [D] lambda_1
    mlp_rate: jax.Array | None = None  # [D] lambda_2

    PROJECTIONS: ClassVar[dict[str, int]] = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "attn_gate": 1, "w_gate": 1,
                                             "w_up": 1, "w_down": 1}
    JOINED: ClassVar[tuple[tuple[str, ...], ...]] = (("wq", "wk", "wv"), ("w_gate", "w_up"))


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LoopStream:
    """What a layer inside the loops hands the next: the stream and the point each pass restarts from."""

    hidden: jax.Array  # [B, T, D]
    start: jax.Array  # [B, T, D] the input section's output, unit-normed


def abstract_layer(cfg: ModelConfig, layer: int = 0) -> DoryLayer:
    """Layer `layer`'s leaves: all of them where it holds its weights, none in a later pass (it borrows them)."""
    if not cfg.looped.holds(layer):
        return DoryLayer()
    D, F, H, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    scale = ArrayInfo((H, K), ("q_heads", "head_dim"), init_value=cfg.looped.init_scale)
    rate = ArrayInfo((D,), ("embed",), init_value=cfg.looped.init_scale)
    suv = ArrayInfo((F,), ("mlp",), init_value=1.0)
    attn = {name: leaf for name, leaf in attention_leaves(cfg).items() if leaf is not None}  # no q/k norm weights
    return DoryLayer(**attn, **mlp_leaves(D, F),
                     attn_gate=ArrayInfo((D, H, K), ("embed", "q_heads", "head_dim")), query_scale=scale,
                     gate_scale=scale, suv_gate=suv, suv_up=suv, attn_rate=rate, mlp_rate=rate)


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where a layer's fields live, under the checkpoint layer it runs (`{i}`)."""
    D, F, H, K = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.head_dim
    layer, attn, mlp = "model.layers.{i}.", "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    return {
        **attention_hf_leaves(cfg),
        **mlp_hf_leaves(D, F),
        "attn_gate": HFLeaf(attn + "gate_proj.weight", "in_heads", (H * K, D), H, K),
        "query_scale": HFLeaf(attn + "sqk", "bias_heads", (H * K,), H, K),
        "gate_scale": HFLeaf(attn + "s_gate", "bias_heads", (H * K,), H, K),
        "suv_gate": HFLeaf(mlp + "suv_gate", "same", (F,)),
        "suv_up": HFLeaf(mlp + "suv_up", "same", (F,)),
        "attn_rate": HFLeaf(layer + "lambda_1", "same", (D,)),
        "mlp_rate": HFLeaf(layer + "lambda_2", "same", (D,)),
    }


def layer_hf_leaves(cfg: ModelConfig, layer: int) -> dict[str, HFLeaf]:
    """An output-section layer's fields under its checkpoint index (the loops' later passes shift it)."""
    stored = cfg.looped.stored(layer)
    if stored == layer or not cfg.looped.holds(layer):
        return {}
    return {name: dataclasses.replace(leaf, name=leaf.name.replace("{i}", str(stored)))
            for name, leaf in hf_leaves(cfg).items()}


def _transformers_name(name: str) -> str:
    """A stored tensor's name as transformers names the parameter (its conversion mapping for "dory")."""

    def collapsed(block: re.Match) -> str:
        index, part = int(block[1]), block[2]
        part = {"attn_alpha": "lambda_1", "mlp_alpha": "lambda_2"}.get(part, ("self_attn", "mlp")[index % 2])
        return f"layers.{index // 2}.{part}"

    name = RELEASED_BLOCK.sub(collapsed, name)
    for stored, own in RELEASED_RENAMES:
        name = name.replace(stored, own)
    return "model." + name.removeprefix("backbone.") if name.startswith("backbone.") else name


def stored_names(names: Collection[str]) -> dict[str, str]:
    """Tensor name -> the name stored, for checkpoints under `backbone.` (the released ones, two blocks a layer,
    and what transformers saves, one); empty for one stored under transformers' own names."""
    if not any(name.startswith("backbone.") for name in names):
        return {}
    return {_transformers_name(name): name for name in names}


def borrowed_leaves(cfg: ModelConfig, layers: list[DoryLayer], layer: int) -> PlacedLayer:
    """Layer `layer`'s weights (the first pass's, for a later pass of a recurrent layer) with its place in the
    loops."""
    looped = cfg.looped
    holder = layer if looped.holds(layer) else looped.stored(layer)
    return placed(layers[holder], restart=looped.restarts(layer), leave=looped.leaves_loops(layer))


def _rate(rate: jax.Array, cfg: ModelConfig) -> jax.Array:
    """A sublayer's interpolation rate [D]: |lambda * alpha_init / initializer_range|."""
    return jnp.abs(rate * (cfg.looped.alpha_init / cfg.looped.init_scale))


def _squared_scale(scale: jax.Array, factor: float) -> jax.Array:
    """nGPT's scaled parameter, squared: (s * factor)^2."""
    return jnp.square(scale * factor)


def attention(
    cfg: ModelConfig, h: jax.Array, cache: Any, lw: DoryLayer, layer: int, positions: jax.Array, rope: CosSin | None,
) -> tuple[jax.Array, Any]:
    """Unit-normed, rotated, per-channel scaled queries over the cache; the gated output normed across heads before
    o_proj: [B, T, D]."""
    layout, init = cache.layout, cfg.looped.init_scale
    q, k, v = linears(h, [lw.wq, lw.wk, lw.wv])
    if lw.bq is not None:
        q, k, v = q + lw.bq, k + lw.bk, v + lw.bv
    q, k = l2_norm(layout.constrain(q, Q_HEADS), L2_EPS), l2_norm(layout.constrain(k, KV_HEADS), L2_EPS)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q = q * _squared_scale(lw.query_scale, math.sqrt(cfg.head_dim) / init).astype(q.dtype)
    cache = cache.write(layer, k, layout.constrain(v, KV_HEADS), positions)
    out = attend(q, cache, layer, positions, cfg.layer_windows[layer])
    gate = linear(h, lw.attn_gate)
    gate_scale = _squared_scale(lw.gate_scale, cfg.hidden_size ** 0.25 / init).astype(gate.dtype)
    out = layout.constrain(out * jax.nn.sigmoid(gate * gate_scale), Q_HEADS)
    out = l2_norm(out.reshape(*out.shape[:2], -1), L2_EPS).reshape(out.shape)
    out = linear(out, lw.wo, contract=2)
    return (out if lw.bo is None else out + lw.bo), cache


def mlp(cfg: ModelConfig, h: jax.Array, lw: DoryLayer) -> jax.Array:
    """down(norm(act(gate * suv_gate * sqrt(D)) * up * suv_up * sqrt(D)))."""
    g, u = linears(h, [lw.w_gate, lw.w_up])
    scale = math.sqrt(cfg.hidden_size)
    g, u = g * (lw.suv_gate * scale).astype(g.dtype), u * (lw.suv_up * scale).astype(u.dtype)
    return linear(l2_norm(gate_product(cfg.activation, g, u), L2_EPS), lw.w_down)


def _entered(x: jax.Array | LoopStream, place: PlacedLayer) -> tuple[jax.Array, jax.Array | None]:
    """(the stream this layer reads, the loops' restart point or None outside them); a layer beginning a pass
    reads norm(h) + the restart point (the first pass takes its own input, normed, as that point)."""
    hidden, start = (x, None) if isinstance(x, jax.Array) else (x.hidden, x.start)
    if not place.at("restart"):
        return hidden, start
    normed = l2_norm(hidden, L2_EPS)
    start = normed if start is None else start
    return normed + start, start


def decoder_layer(
    cfg: ModelConfig, x: jax.Array | LoopStream, cache: Any, place: PlacedLayer, layer: int, positions: jax.Array,
    rope: RopeTables,
) -> tuple[jax.Array | LoopStream, Any]:
    """norm -> attention -> norm -> interpolate, then the same around the MLP; inside the loops the restart point
    rides along."""
    layout, lw = cache.layout, place.weights
    x, start = _entered(x, place)
    h = l2_norm(x, L2_EPS)
    out, cache = attention(cfg, h, cache, lw, layer, positions, rope.for_layer(layer))
    h = h + _rate(lw.attn_rate, cfg).astype(h.dtype) * (l2_norm(out, L2_EPS) - h)
    h = l2_norm(layout.constrain(h, HIDDEN), L2_EPS)
    h = h + _rate(lw.mlp_rate, cfg).astype(h.dtype) * (l2_norm(mlp(cfg, h, lw), L2_EPS) - h)
    h = layout.constrain(h, HIDDEN)
    return (h if start is None or place.at("leave") else LoopStream(h, start)), cache


def _sections(hf: Mapping[str, Any], arch: str) -> tuple[dict[str, Any], list[str]]:
    """The config with released checkpoints' block list read as transformers reads it (each "mlp" entry the second
    half of the layer before it: every layer count halved), and each layer's type."""
    hf = {**DEFAULTS, **{key: value for key, value in hf.items() if value is not None}}
    kinds = hf.get("layer_types")
    if kinds is not None and "mlp" in kinds:
        halved = {key: int(hf[key]) // 2 for key in ("num_hidden_layers", "n_input_layers", "n_output_layers")}
        if hf.get("n_recurrent_layers") is not None:
            halved["n_recurrent_layers"] = int(hf["n_recurrent_layers"]) // 2
        hf, kinds = {**hf, **halved}, kinds[::2]
    layers = int(hf["num_hidden_layers"])
    kinds = kinds or ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(layers)]
    if len(kinds) != layers or not set(kinds) <= set(LAYER_TYPES):
        raise ConfigError(f"layer_types {kinds!r} must give one of {list(LAYER_TYPES)} for each of the {layers} "
                          f"layers of {arch}")
    return hf, kinds


def looped_layers(hf: Mapping[str, Any], arch: str) -> LoopedLayers:
    """The loops' sections and the nGPT scalars; transformers' "last_loop" cache refused by name."""
    mode = hf["recurrent_kv_cache_mode"]
    if mode != "per_loop":
        raise ConfigError(f"recurrent_kv_cache_mode {mode!r} is not supported for {arch}: 'per_loop' only (each pass "
                          "of the loops its own K/V pages); 'last_loop' has earlier passes attend over pages only the "
                          "last pass writes, beside their own unwritten keys, which the paged cache has no form for")
    layers, first, last = (int(hf[key]) for key in ("num_hidden_layers", "n_input_layers", "n_output_layers"))
    recurrent = hf.get("n_recurrent_layers")
    recurrent = layers - first - last if recurrent is None else int(recurrent)
    if first + recurrent + last != layers:
        raise ConfigError(f"n_input_layers {first} + n_recurrent_layers {recurrent} + n_output_layers {last} must "
                          f"equal num_hidden_layers {layers} for {arch}")
    return LoopedLayers(stored_layers=layers, input_layers=first, recurrent_layers=recurrent,
                        loops=int(hf["n_recurrent_loops"]), init_scale=float(hf["initializer_range"]),
                        alpha_init=float(hf["ngpt_alpha_init"]))


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a Dory HF config, its loops unrolled (fields it leaves out or nulls take DoryConfig's
    defaults)."""
    hf, kinds = _sections(hf, arch)
    looped = looped_layers(hf, arch)
    fields = common_fields(hf, arch)
    theta, scaling, local_theta = layer_type_rope(hf, THETAS, "rope_local_base_freq", arch)
    windows = windows_by_type(kinds, int(hf["sliding_window"]), arch)
    bias = bool(hf["attention_bias"])
    return ModelConfig(
        **{**fields, "num_layers": looped.num_layers, "rms_norm_eps": L2_EPS, "rope_theta": theta,
           "rope_scaling": scaling},
        local_rope_theta=local_theta,
        layer_windows=tuple(windows[looped.stored(i)] for i in range(looped.num_layers)),
        qkv_bias=bias, o_bias=bias, activation=activation_name(hf.get("hidden_act") or "silu"),
        weightless_norms=True, unit_norms=True, logit_scale=True, logits_scaling=looped.init_scale, looped=looped,
    )


FAMILY = Family("dory", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                layer_hf_leaves=layer_hf_leaves, borrowed_leaves=borrowed_leaves, stored_names=stored_names)
