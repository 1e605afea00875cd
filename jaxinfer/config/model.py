"""Model configuration: one frozen, hashable dataclass, and the HF `config.json` fields every family reads.

Which architectures exist and how each reads its own fields is the model registry's
(`jaxinfer.models.registry`); this module holds what they share, so the config package
imports nothing from the models.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.config.deepseek_v4 import DeepseekV4Fields
from jaxinfer.config.errors import CheckpointError, ConfigError
from jaxinfer.config.gemma3n import Gemma3nFields
from jaxinfer.config.generation import token_ids
from jaxinfer.config.hf_field import field
from jaxinfer.config.hrm_cycles import HrmCycles
from jaxinfer.config.hyper_connections import HyperConnections
from jaxinfer.config.inkling import InklingFields
from jaxinfer.config.latent_attention import LatentAttention
from jaxinfer.config.looped_layers import LoopedLayers
from jaxinfer.config.minimax import MiniMaxFields
from jaxinfer.config.minimax_m3 import BlockIndexer
from jaxinfer.config.multipliers import SublayerMultipliers
from jaxinfer.config.qwen4_exp import Qwen4ExpFields
from jaxinfer.config.rope_scaling import ROPE_TYPES, RopeScaling, rope_fields
from jaxinfer.config.shared_blocks import SharedBlocks
from jaxinfer.config.state_space import StateSpace
from jaxinfer.config.zaya import ZayaFields

# HF activation name -> ours. "gelu" is exact (erf) GELU, as transformers' ACT2FN has it (Gemma
# families read it as the tanh approximation themselves).
SUPPORTED_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu2": "relu2",
                         "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh"}
# gelu_new (GPT-2's, Phi's) and gelu_fast (GPT-NeoX-20B's) are transformers' names for the tanh approximation too
# relu2: relu(x) ** 2 (Arcee, Nemotron); xielu: Apertus' own MLP (models/xielu.py), set by it alone; relu: OPT's,
# set by it alone (other families' configs naming relu stay refused: none released runs it)
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu2", "xielu", "relu")
LAYER_TYPES = ("full_attention", "sliding_attention")
OUTPUT_GATES = ("sigmoid", "softplus")
# Read without a default: a config without them describes no model.
REQUIRED_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of one decoder; hashable so it can be a jit static arg.

    The architecture names the family (`models.registry`) that gives the fields meaning;
    fields a family does not use keep their defaults.
    """

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    # Gemma 4: per-layer kv heads and head dims where layers differ (its global layers'); () = the fields above
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    # Gemma 4's KV sharing: the layer whose K/V pages each layer attends over (a "reuse" layer reads an earlier
    # "store" layer's and keeps none); () = each its own
    kv_sources: tuple[int, ...] = ()
    # Gemma 4's per-layer inputs (PLE): their width; > 0 hands every layer the step's tokens and input embeddings
    per_layer_input_size: int = 0
    layer_intermediate_sizes: tuple[int, ...] = ()  # Gemma 4: per-layer dense MLP widths; () = intermediate_size
    values_from_keys: tuple[int, ...] = ()  # Gemma 4's attention_k_eq_v: layers without v_proj (values = raw keys)
    layer_sparsity: tuple[float, ...] = ()  # Gemma 3n: each MLP gate's activation_sparsity; () = none
    gemma3n: Gemma3nFields | None = None  # Gemma 3n's AltUp streams, LAuReL rank, per-layer inputs' vocabulary
    qwen4_exp: Qwen4ExpFields | None = None  # Qwen4-Exp's residual streams, n-gram embeddings and QSA indexer
    block_indexer: BlockIndexer | None = None  # MiniMax-M3's sparse layers: per-K/V-head key blocks chosen
    minimax: MiniMaxFields | None = None  # MiniMax-Text-01's residual weights
    inkling: InklingFields | None = None  # Inkling's relative position bias, sink-routed experts, log scaling
    v_head_dim: int = 0  # MiMo-V2-Flash: value heads narrower than head_dim (cached zero-padded to it); 0 = head_dim
    value_scale: float = 1.0  # MiMo-V2-Flash's attention_value_scale: values multiplied by it before the cache
    rms_norm_eps: float = 1e-6  # the norms' epsilon (Cohere's layer_norm_eps)
    layer_norm: bool = False  # Cohere: bias-free LayerNorms (mean subtracted) in place of RMSNorms
    norm_bias: bool = False  # StarCoder2, Nemotron: the LayerNorms add a bias (the final norm's too)
    weightless_norms: bool = False  # OLMo 1: LayerNorms with neither weight nor bias (no final_norm leaf either)
    unit_norms: bool = False  # Dory (nGPT): the config's norms scale to unit L2 norm, not unit RMS
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    rotary_dim: int = 0  # leading head dims that rotate; 0 = all (Phi's partial_rotary_factor)
    local_rotary_dim: int = 0  # Laguna: the sliding layers' own rotated dims; 0 = rotary_dim's
    rope_interleaved: bool = False  # rotary pairs are adjacent dims (GLM), not dims i and i + rotated/2
    nope_layers: tuple[int, ...] = ()  # layers without rotary embeddings (SmolLM3's `no_rope_layers` zeros)
    local_rope_theta: float | None = None  # Gemma 3: sliding layers' own base, unscaled
    # Qwen2-VL's M-RoPE: rotary frequencies per (temporal, height, width) position stream; () for one stream
    mrope_section: tuple[int, ...] = ()
    mrope_interleaved: bool = False  # Qwen3-VL: frequencies owned t, h, w in turn (its sections from the front)
    # Ministral 3 (Llama 4's attention temperature): queries scaled by 1 + beta * log(1 + floor(position / period))
    query_scale_beta: float = 0.0
    query_scale_period: int = 1
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    # Apertus 1.5: the embedding rows stored past vocab_size (its pruned head's ids), input-only multimodal codes not
    # read; 0 = vocab_size
    stored_vocab_size: int = 0
    qkv_bias: bool = False
    clip_qkv: float | None = None  # DBRX: q, k and v clamped to [-clip_qkv, clip_qkv] after their projection
    o_bias: bool = False
    mlp_bias: bool = False  # StarCoder2: biases on the ungated MLP's two projections
    parallel_residual: bool = False  # GPT-NeoX, Phi: x + attention(norm(x)) + MLP(norm'(x)), not one after the other
    one_norm: bool = False  # Falcon-7B: the parallel layer's one norm feeds both (Phi's and GPT-J's families fix it)
    lm_head_bias: bool = False  # Phi: the output head adds a bias [V]
    logit_scale: bool = False  # Dory: the output head multiplies each token's logit by a learned scale [V]
    learned_positions: bool = False  # GPT-2: a learned table [max_position_embeddings, D] added to the embeddings
    position_offset: int = 0  # OPT: the table's first rows unused, position p reading row p + offset (its 2)
    output_norms: bool = False  # HyperCLOVA X (Peri-LN): each sublayer's output RMS-normed before its residual add
    post_norm: bool = False  # OPT-350M: each sublayer's sum normed, LN(x + f(x)), not its input; no final norm
    # OPT-350M: the embeddings (and the tied head) this wide, projected to hidden_size before the layers and back
    # after them (project_in / project_out); 0 = hidden_size
    word_embed_proj_dim: int = 0
    qk_norm: bool = False
    qk_norm_whole: bool = False  # the q/k norms span all heads' dims at once (OLMo 2), not one head's
    qk_l2_norm: bool = False  # Llama 4: rotary layers' q and k RMS-normalised without a weight, after the rotation
    qk_norm_after_rope: bool = False  # HunYuan: the q/k norms apply to the rotated q and k, not before the rotation
    qk_weightless_norm: bool = False  # Muse Glimmer: q and k RMS-normed per head without a weight, before the rotation
    post_norm_eps: float = 0.0  # Muse Glimmer: its sandwich layers' output norms' epsilon; 0: rms_norm_eps
    attn_out_norm: bool = False  # Muse Spark: each head's attention output RMS-normed without a weight, before the gate
    # Muse Spark: the experts' width (projected to and from hidden_size around them), the residual gates' temperature
    # and the router logits' multiplier
    moe_hidden_size: int = 0
    residual_gate_temperature: float = 0.0
    router_logit_multiplier: float = 1.0
    activation: str = "silu"
    norm_weight_offset: float = 0.0  # Gemma and Nemotron store norm weights as (w - 1).
    final_norm: bool = True  # the decoder's output normed; Qwen4-Exp's last layer mixes its streams instead
    norm_scale_first: bool = False  # Gemma 4: RMSNorms scale by w in float32, then cast (Gemma's order, no 1 +)
    scale_embeddings: bool = False  # Gemma multiplies embeddings by sqrt(hidden_size).
    embedding_multiplier: float = 1.0  # Granite: embeddings scaled by it
    embed_norm: bool = False  # NanoChat: the embeddings RMS-normed without a weight before the first layer
    residual_multiplier: float = 1.0  # Granite: each sublayer's output scaled by it before the residual add
    logits_scaling: float = 1.0  # Granite: output logits divided by it
    # Per-layer sliding window in tokens; 0 means full attention.
    layer_windows: tuple[int, ...] = ()
    # Per-layer attention chunk in tokens (Llama 4): a query sees only its own chunk's keys; 0 = none.
    layer_chunks: tuple[int, ...] = ()
    attn_scale: float | None = None  # None: head_dim ** -0.5 (Gemma 2/3: query_pre_attn_scalar ** -0.5)
    attn_soft_cap: float | None = None  # scores -> cap * tanh(scores / cap)
    final_soft_cap: float | None = None  # the same on the output logits
    attn_sinks: bool = False  # a learned per-head sink logit in each softmax (GPT-OSS)
    output_gate: str = "sigmoid"  # the attention output gate's function (attn_gate, head_gate): sigmoid, softplus
    # ALiBi (BLOOM, MPT; models.alibi): each head's scores plus slope * (key - query position); () = none
    alibi_slopes: tuple[float, ...] = ()
    # DeepSeek's multi-head latent attention (models.latent_attention): num_kv_heads 1 and head_dim its cached dims
    latent_attention: LatentAttention | None = None
    gated_norm_rank: int = 0  # A.X-K2: its gated RMSNorms' gate MLP width (models.axk2); 0: plain norms
    # Hyper-connections (HY-V4; models.hyper_connections): several residual streams per token; None: one
    hyper_connections: HyperConnections | None = None
    # DeepSeek-V4's sliding and compressed attention (models.deepseek_v4): its layers' kinds and sizes; None: none
    deepseek_v4: DeepseekV4Fields | None = None
    # Mamba2 state-space layers (models.mamba2_mixer): their dims and which layers they are; None: attention only
    state_space: StateSpace | None = None
    shared_blocks: SharedBlocks | None = None  # Zamba2's: transformer blocks its hybrid layers share
    looped: LoopedLayers | None = None  # Dory's: checkpoint layers run several times over (the loops unrolled)
    hrm_cycles: HrmCycles | None = None  # HRM-Text's: two stacks run in cycles (unrolled), two states between them
    zaya: ZayaFields | None = None  # ZAYA's router width and CCA conv taps
    # Whisper: the encoder's output frames every layer cross-attends (kept per row slot: cache/cross_pool); 0: none
    encoder_frames: int = 0
    mlp_only_layers: tuple[int, ...] = ()  # hybrid layers that neither attend nor keep a state (Nemotron-H's "-")
    multipliers: SublayerMultipliers = SublayerMultipliers()  # Falcon-H1's muP scalars on each sublayer
    swiglu_alpha: float = 1.702  # GPT-OSS experts' gate: see models.mlp.ClampedSwiGLU
    swiglu_limit: float = 7.0
    # Step 3.7: per layer, the routed experts' and the shared or dense MLP's clamp after the SiLU (0: none); () none
    expert_swiglu_limits: tuple[float, ...] = ()
    mlp_swiglu_limits: tuple[float, ...] = ()
    num_experts: int = 0  # mixture of experts: 0 = every layer dense
    zero_experts: int = 0  # LongCat-Flash: identity experts routed after the num_experts (their output: the input)
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the chosen experts' probabilities to sum to 1
    expert_weights_p_norm: float = 0.0  # DBRX: the chosen weights divided by their p-norm; 0: left as they are
    router_jitter_eps: float = 0.0  # Phi-3.5-MoE's sparsemixer: logits this far below the best are masked
    dense_layers: tuple[int, ...] = ()  # MoE models: layers with a dense MLP of intermediate_size
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE, GLM-4.5: hidden units of each MoE layer's shared expert
    # DeepSeek-V3's grouped routing (GLM-4.5; models.grouped_topk): experts in `expert_groups` groups (n_group),
    # a token's chosen within its best `expert_groups_per_token` (topk_group), weights scaled by the factor.
    expert_groups: int = 1
    expert_groups_per_token: int = 1
    routed_scaling_factor: float = 1.0
    # Cohere2-MoE: the top-k logits' sigmoids (expert_selection_fn "sigmoid"), not their softmax; and the routed and
    # shared experts' outputs averaged (shared_expert_combination_strategy "average"), not summed
    sigmoid_top_k: bool = False
    shared_expert_average: bool = False
    mtp_layers: int = 0  # multi-token-prediction layers after the decoder's (skipped by it; method "mtp" drafts)
    bos_token_id: int | None = None
    pad_token_id: int = 0  # Gemma 4: the token an image token's per-layer input reads (HF's Gemma4Model)
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (0,) * self.num_layers)
        if not self.layer_chunks:
            object.__setattr__(self, "layer_chunks", (0,) * self.num_layers)
        _validate(self)

    @property
    def q_per_kv(self) -> int:
        """Query heads sharing one KV head (GQA group size)."""
        return self.num_heads // self.num_kv_heads

    @property
    def embedding_size(self) -> int:
        """Width of the token embeddings and of the final hidden states (OPT-350M's word_embed_proj_dim)."""
        return self.word_embed_proj_dim or self.hidden_size

    @property
    def rotated_dims(self) -> int:
        """Head dims the rotary embedding turns (the rest pass through)."""
        return self.rotary_dim or self.head_dim

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """(kv heads, head dim) of `layer`'s keys and values."""
        heads = self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads
        return heads, self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def layer_rotated_dims(self, layer: int) -> int:
        """Head dims the rotary embedding turns in `layer` (Laguna's sliding layers: their own)."""
        if self.local_rotary_dim and self.layer_windows[layer]:
            return self.local_rotary_dim
        return self.rotary_dim or self.kv_shape(layer)[1]

    def kv_source(self, layer: int) -> int:
        """The layer whose K/V pages `layer` attends over (itself but for Gemma 4's KV-sharing layers)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def is_state_layer(self, layer: int) -> bool:
        """Whether `layer` keeps a per-request state (a Mamba2 mixer, LFM2's short conv) rather than K/V pages
        (Falcon-H1's keep both: `keeps_kv`)."""
        return self.state_space is not None and layer in self.state_space.layers

    def keeps_kv(self, layer: int) -> bool:
        """Whether `layer` writes K/V pages: every layer but a state layer, unless it also attends (Falcon-H1's
        layers; Zamba2's hybrid ones), and but an MLP-only one (Nemotron-H's "-": half its layers, whose buffers
        would be a pool's worth unused) and one reading another's (Gemma 4's KV sharing)."""
        if layer in self.mlp_only_layers or self.kv_source(layer) != layer:
            return False
        if self.qwen4_exp is not None and layer in self.qwen4_exp.ple_layers:  # their rows: models/token_rows
            return True
        if self.shared_blocks is not None and layer in self.shared_blocks.layers:  # Zamba2's hybrid layers
            return True
        return not self.is_state_layer(layer) or self.state_space.parallel_attention

    def is_moe_layer(self, layer: int) -> bool:
        """Whether `layer` runs routed experts rather than a dense MLP."""
        return self.num_experts > 0 and layer not in self.dense_layers


def _validate(cfg: ModelConfig) -> None:
    if cfg.num_heads % cfg.num_kv_heads:
        raise ConfigError(
            f"num_attention_heads ({cfg.num_heads}) must be a multiple of "
            f"num_key_value_heads ({cfg.num_kv_heads})"
        )
    if cfg.rope_scaling.rope_type not in ROPE_TYPES:
        raise ConfigError(
            f"rope type {cfg.rope_scaling.rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}"
        )
    if cfg.activation not in ACTIVATIONS:
        raise ConfigError(f"activation {cfg.activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    if len(cfg.layer_windows) != cfg.num_layers:
        raise ConfigError(f"layer_windows has {len(cfg.layer_windows)} entries for {cfg.num_layers} layers")
    if len(cfg.layer_chunks) != cfg.num_layers:
        raise ConfigError(f"layer_chunks has {len(cfg.layer_chunks)} entries for {cfg.num_layers} layers")
    if cfg.alibi_slopes and len(cfg.alibi_slopes) != cfg.num_heads:
        raise ConfigError(f"alibi_slopes has {len(cfg.alibi_slopes)} entries for {cfg.num_heads} heads; one per "
                          "query head, or none")
    if any(w and c for w, c in zip(cfg.layer_windows, cfg.layer_chunks)):
        raise ConfigError(f"a layer has both a sliding window and an attention chunk (layer_windows "
                          f"{cfg.layer_windows}, layer_chunks {cfg.layer_chunks}); each layer takes one or neither")
    for name in ("layer_kv_heads", "layer_head_dims", "kv_sources", "layer_intermediate_sizes", "layer_sparsity"):
        if getattr(cfg, name) and len(getattr(cfg, name)) != cfg.num_layers:
            raise ConfigError(f"{name} has {len(getattr(cfg, name))} entries for {cfg.num_layers} layers")
    if any(cfg.kv_source(i) > i for i in range(cfg.num_layers)):
        raise ConfigError(f"kv_sources {cfg.kv_sources} must name each layer itself or an earlier layer")
    if cfg.rotated_dims % 2 or cfg.rotated_dims > cfg.head_dim:
        raise ConfigError(f"rotary dims {cfg.rotated_dims} must be even and at most head_dim {cfg.head_dim}")
    if cfg.local_rotary_dim % 2 or cfg.local_rotary_dim > cfg.head_dim:
        raise ConfigError(f"sliding layers' rotary dims {cfg.local_rotary_dim} must be even and at most head_dim "
                          f"{cfg.head_dim}")
    if cfg.output_gate not in OUTPUT_GATES:
        raise ConfigError(f"output_gate {cfg.output_gate!r} is not supported; supported: {', '.join(OUTPUT_GATES)}")
    if cfg.mrope_section and sum(cfg.mrope_section) != cfg.rotated_dims // 2:
        raise ConfigError(f"mrope_section {list(cfg.mrope_section)} must add up to the {cfg.rotated_dims // 2} "
                          f"rotary frequencies of head_dim {cfg.head_dim}")
    if cfg.num_experts and not 0 < cfg.experts_per_token <= cfg.num_experts:
        raise ConfigError(
            f"num_experts_per_tok {cfg.experts_per_token} must be between 1 and the {cfg.num_experts} experts"
        )


def activation_name(name: str) -> str:
    """Our name for an HF activation; unsupported ones raise naming the supported."""
    if name not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(f"activation {name!r} is not supported; supported: {', '.join(SUPPORTED_ACTIVATIONS)}")
    return SUPPORTED_ACTIVATIONS[name]


def layer_types(hf: Mapping[str, Any], num_layers: int) -> list[str] | None:
    """`layer_types` when the config lists them, checked: one known type per layer."""
    types = hf.get("layer_types")
    if types is not None and (len(types) != num_layers or not set(types) <= set(LAYER_TYPES)):
        raise ConfigError(
            f"layer_types {types!r} must list one of {sorted(LAYER_TYPES)} for each of the {num_layers} layers"
        )
    return types


def uniform_windows(hf: Mapping[str, Any], arch: str, num_layers: int, window: int) -> tuple[int, ...]:
    """Every layer with the same window (0 = full), refusing `layer_types` that say otherwise.

    transformers ignores layer_types for such architectures; running them either way would be a guess.
    """
    types = layer_types(hf, num_layers)
    expected = ["sliding_attention" if window else "full_attention"] * num_layers
    if types is not None and types != expected:
        raise ConfigError(
            f"layer_types {types!r} is not supported for {arch}: its layers all use "
            f"{'sliding_window' if window else 'full attention'}"
        )
    return (window,) * num_layers


def common_fields(hf: Mapping[str, Any], arch: str, longrope: bool = False) -> dict[str, Any]:
    """The ModelConfig fields every family reads the same way (shapes, norms, rope, token ids).
    longrope: whether the family reads LongRoPE's factors (Phi-3's); the others refuse it by name."""
    if hf.get("mlp_bias"):
        raise ConfigError(f"mlp_bias=True is not supported for {arch} (no released checkpoint uses it)")
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    theta, scaling = rope_fields(hf)
    if scaling.rope_type == "longrope" and not longrope:
        raise ConfigError(f"rope type 'longrope' is read for Phi3ForCausalLM only, not {arch}")
    return dict(
        architecture=arch,
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(field(hf, "num_key_value_heads", heads)),
        head_dim=int(field(hf, "head_dim", hidden // heads)),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=token_ids(hf.get("eos_token_id")),
    )


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    """The parsed `config.json` of a model directory; an error naming the file unless it holds a JSON object."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise CheckpointError(f"no config.json in {model_dir}; pass an HF model directory or a converted one")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path} is not valid JSON ({err}); expected the model's HF config.json") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path} holds a JSON {type(raw).__name__}; expected an object (the model's HF config.json)")
    return raw
