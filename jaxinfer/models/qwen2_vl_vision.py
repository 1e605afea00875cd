"""Qwen2-VL's and Qwen2.5-VL's vision tower and PatchMerger: one image's patches in, its image tokens' rows out.

The image processor (Qwen2VLImageProcessor) resizes an image to multiples of patch * merge pixels and flattens
it into patches of (temporal_patch_size, patch, patch) pixels, each 2x2 merge block's four patches together;
an image is [blocks_h, blocks_w, merge * merge, C * T * p * p] (the processor's order) and reaches the tower
flattened, padded to a bucket of merged blocks with each patch's position as data (models/tower_patches), so
images of many sizes share a program. The patch embedding (a Conv3d with its stride
equal to its kernel) is a linear map of the flattened patch; attention rotates queries and keys by each patch's
(row, column) (2-D rotary, half the frequencies each); the merger norms each patch and maps each merge block's
four to one language-model row. Qwen2-VL: LayerNorms, a fc1-act-fc2 MLP, every layer attends to the whole
image. Qwen2.5-VL: RMSNorms, a gated SiLU MLP with biases, and layers outside `fullatt_block_indexes` attend
within windows of window_size pixels (HF permutes patches into window order; a mask is the same attention).
Padding patches are masked apart from the image's in every layer.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.model import ConfigError
from jaxinfer.models.tower_patches import PAD_WINDOW, TowerPatches
from jaxinfer.models.vision_tower import layer_norm, vision_activation
from jaxinfer.parallel.array_info import ArrayInfo

QWEN2_VL, QWEN2_5_VL = "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"
ACTIVATIONS = ("quick_gelu", "gelu", "gelu_pytorch_tanh", "silu")
EPS = 1e-6  # every norm of the tower and merger (HF hard-codes it)


@dataclasses.dataclass(frozen=True)
class QwenTowerConfig:
    """The tower's shape (hashable: a static program argument)."""

    depth: int
    width: int  # embed_dim (Qwen2-VL) / hidden_size (Qwen2.5-VL)
    heads: int
    mlp_width: int
    activation: str
    patch_size: int
    temporal_patch_size: int
    merge: int  # spatial_merge_size
    channels: int
    theta: float
    windowed: bool  # Qwen2.5-VL: RMSNorms, gated MLP, window attention outside full_layers
    window: int = 0  # merged tokens per window side
    full_layers: tuple[int, ...] = ()

    @property
    def patch_dims(self) -> int:
        """Pixels per patch: C * T * p * p."""
        return self.channels * self.temporal_patch_size * self.patch_size ** 2


@dataclasses.dataclass(frozen=True)
class Qwen2VLConfig:
    """What a Qwen2-VL / Qwen2.5-VL checkpoint adds to its language model."""

    vision: QwenTowerConfig
    text_hidden_size: int
    image_token_id: int  # <|image_pad|>: one per merged block of an image
    vision_start_token_id: int
    vision_end_token_id: int
    video_token_id: int = 151656  # <|video_pad|>: one per merged block of a video's frame group
    # Qwen2.5-VL's vision_config.tokens_per_second: a video's temporal rotary step per second of frames (0: Qwen2-VL,
    # whose frame groups step by 1; Qwen3-VL puts timestamps in the text instead)
    tokens_per_second: float = 0.0
    videos: bool = False  # whether its videos are served: Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's (not Qwen3.5's, GLM's)


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QwenBlock:
    """One tower layer (Linear weights [in, out]; biases None where the checkpoint has none)."""

    norm1: jax.Array
    norm1_bias: jax.Array | None
    qkv: jax.Array  # [E, 3E]
    qkv_bias: jax.Array | None
    proj: jax.Array  # [E, E]
    proj_bias: jax.Array | None
    norm2: jax.Array
    norm2_bias: jax.Array | None
    fc1: jax.Array  # [E, F]: fc1 (Qwen2-VL) or gate_proj (Qwen2.5-VL)
    fc1_bias: jax.Array | None
    fc2: jax.Array  # [F, E]: fc2 or down_proj
    fc2_bias: jax.Array | None
    up: jax.Array | None = None  # [E, F] Qwen2.5-VL's up_proj
    up_bias: jax.Array | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class QwenTowerWeights:
    """Patch embedding [C*T*p*p, E], the layers, and the merger (ln_q, mlp.0 [4E, 4E], mlp.2 [4E, D])."""

    patch: jax.Array
    blocks: list[QwenBlock]
    merger_norm: jax.Array
    merger_norm_bias: jax.Array | None
    merger_w1: jax.Array
    merger_b1: jax.Array
    merger_w2: jax.Array
    merger_b2: jax.Array


def abstract_qwen2_vl(cfg: Qwen2VLConfig) -> QwenTowerWeights:
    """Every tower and merger leaf as an ArrayInfo."""
    v = cfg.vision
    e, f, merged = v.width, v.mlp_width, v.width * v.merge ** 2
    vec = lambda n, value=0.0: ArrayInfo((n,), (None,), init_value=value)  # noqa: E731
    mat = lambda a, b: ArrayInfo((a, b), (None, None))  # noqa: E731
    norm_bias = None if v.windowed else vec(e)

    def block() -> QwenBlock:
        up = dict(up=mat(e, f), up_bias=vec(f)) if v.windowed else {}
        return QwenBlock(vec(e, 1.0), norm_bias, mat(e, 3 * e), vec(3 * e), mat(e, e), vec(e), vec(e, 1.0),
                         norm_bias, mat(e, f), vec(f), mat(f, e), vec(e), **up)

    return QwenTowerWeights(mat(v.patch_dims, e), [block() for _ in range(v.depth)], vec(e, 1.0), norm_bias,
                            mat(merged, merged), vec(merged), mat(merged, cfg.text_hidden_size),
                            vec(cfg.text_hidden_size))


def norm(x: jax.Array, weight: jax.Array, bias: jax.Array | None, eps: float = EPS) -> jax.Array:
    """LayerNorm (with a bias: Qwen2-VL) or RMSNorm (without: Qwen2.5-VL, GLM-4.xV's tower), in float32."""
    if bias is not None:
        return layer_norm(x, weight, bias, eps)
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def affine(x: jax.Array, weight: jax.Array, bias: jax.Array | None) -> jax.Array:
    """x @ weight, plus the bias where the checkpoint has one (GLM-4.xV's tower has none)."""
    return x @ weight if bias is None else x @ weight + bias


def rotary(rows: jax.Array, cols: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos, sin [N, head_dim] float32 of patches at (rows, cols) [N]: the first quarter of frequencies turned by
    the row, the next by the column, the second half repeating both (HF's rotate-half layout)."""
    quarter = head_dim // 2
    inv_freq = 1.0 / (np.float32(theta) ** (np.arange(0, quarter, 2, dtype=np.float32) / np.float32(quarter)))
    turns = lambda index: jnp.asarray(index).astype(jnp.float32)[:, None] * inv_freq  # noqa: E731
    freqs = jnp.concatenate([turns(rows), turns(cols)], axis=-1)
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def tower_masks(windows: jax.Array) -> tuple[jax.Array, jax.Array]:
    """([N, N] the image's patches with each other and padding's with padding's: what every layer of a
    full-attention tower and Qwen2.5-VL's `full_layers` see; [N, N] patches in the same window), from each
    patch's window id (models/tower_patches)."""
    image = windows != PAD_WINDOW
    return image[:, None] == image[None, :], windows[:, None] == windows[None, :]


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [N, heads, K] rotated in float32 by cos, sin [N, K]."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    turned = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos[:, None] + turned * sin[:, None]).astype(x.dtype)


def attention(b: QwenBlock, x: jax.Array, heads: int, cos: jax.Array, sin: jax.Array,
              mask: jax.Array | None) -> jax.Array:
    """Bidirectional attention of the image's patches (within windows where mask is given)."""
    n, e = x.shape
    q, k, v = jnp.split(affine(x, b.qkv, b.qkv_bias).reshape(n, 3 * heads, e // heads), 3, axis=1)
    q, k = rotate(q, cos, sin), rotate(k, cos, sin)
    scores = jnp.einsum("qhd,khd->hqk", q, k).astype(jnp.float32) * (e // heads) ** -0.5
    if mask is not None:
        scores = jnp.where(mask[None], scores, -jnp.inf)
    out = jnp.einsum("hqk,khd->qhd", jax.nn.softmax(scores, axis=-1).astype(v.dtype), v)
    return affine(out.reshape(n, e), b.proj, b.proj_bias)


def mlp(b: QwenBlock, x: jax.Array, activation: str) -> jax.Array:
    """fc2(act(fc1 x)) (Qwen2-VL) or down(act(gate x) * up x) (Qwen2.5-VL, GLM-4.xV), with biases where given."""
    gate = affine(x, b.fc1, b.fc1_bias)
    h = vision_activation(activation, gate)
    if b.up is not None:
        h = h * affine(x, b.up, b.up_bias)
    return affine(h, b.fc2, b.fc2_bias)


def image_features(weights: QwenTowerWeights, patches: TowerPatches, cfg: Qwen2VLConfig) -> jax.Array:
    """Language-model rows [1, bucket blocks, D] of one image's padded patches (models/tower_patches); the rows
    past the image's blocks are padding's."""
    v = cfg.vision
    x = patches.pixels.reshape(-1, v.patch_dims).astype(weights.patch.dtype) @ weights.patch
    cos, sin = rotary(patches.rows, patches.cols, v.width // v.heads, v.theta)
    whole, windows = tower_masks(patches.windows)
    for layer, b in enumerate(weights.blocks):
        mask = windows if v.windowed and layer not in v.full_layers else whole
        x = x + attention(b, norm(x, b.norm1, b.norm1_bias), v.heads, cos, sin, mask)
        x = x + mlp(b, norm(x, b.norm2, b.norm2_bias), v.activation)
    merged = norm(x, weights.merger_norm, weights.merger_norm_bias).reshape(-1, v.width * v.merge ** 2)
    h = jax.nn.gelu(merged @ weights.merger_w1 + weights.merger_b1, approximate=False)
    return (h @ weights.merger_w2 + weights.merger_b2)[None]


def read_tower_config(vision: Mapping[str, Any], windowed: bool) -> QwenTowerConfig:
    """The tower's config from an HF vision_config; ConfigError naming a field it cannot run."""
    act = vision.get("hidden_act", "silu" if windowed else "quick_gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"vision_config.hidden_act {act!r} is not supported; supported: {ACTIVATIONS}")
    rope = vision.get("rope_parameters") or {}
    theta = float(rope.get("rope_theta", 10000.0))
    width = int(vision["hidden_size"] if windowed else vision.get("embed_dim", 1280))
    heads = int(vision.get("num_heads", 16))
    if width % heads or (width // heads) % 4:
        raise ConfigError(f"vision_config: width {width} over num_heads {heads} must give a head size that is a "
                          "multiple of 4 (its 2-D rotary turns a quarter of it by rows, a quarter by columns)")
    mlp_width = int(vision["intermediate_size"]) if windowed else int(width * vision.get("mlp_ratio", 4))
    patch, merge = int(vision.get("patch_size", 14)), int(vision.get("spatial_merge_size", 2))
    window = int(vision.get("window_size", 112)) // merge // patch if windowed else 0
    if windowed and window < 1:
        raise ConfigError(f"vision_config.window_size {vision.get('window_size')} is smaller than one merged "
                          f"block ({patch * merge} pixels)")
    return QwenTowerConfig(
        depth=int(vision.get("depth", 32)), width=width, heads=heads, mlp_width=mlp_width, activation=act,
        patch_size=patch, temporal_patch_size=int(vision.get("temporal_patch_size", 2)), merge=merge,
        channels=int(vision.get("in_channels", 3)), theta=theta, windowed=windowed, window=window,
        full_layers=tuple(int(i) for i in vision.get("fullatt_block_indexes") or ()),
    )


def read_qwen2_vl_config(hf: Mapping[str, Any]) -> Qwen2VLConfig:
    """A Qwen2VLConfig from an HF Qwen2-VL / Qwen2.5-VL config (nested or flat)."""
    windowed = hf["architectures"][0] == QWEN2_5_VL
    text = hf.get("text_config") if isinstance(hf.get("text_config"), Mapping) else hf
    vision = read_tower_config(hf.get("vision_config") or {}, windowed)
    return Qwen2VLConfig(
        vision=vision, text_hidden_size=int(text["hidden_size"]),
        image_token_id=int(hf.get("image_token_id", 151655)),
        vision_start_token_id=int(hf.get("vision_start_token_id", 151652)),
        vision_end_token_id=int(hf.get("vision_end_token_id", 151653)),
        video_token_id=int(hf.get("video_token_id", 151656)),
        tokens_per_second=float((hf.get("vision_config") or {}).get("tokens_per_second", 4)) if windowed else 0.0,
        videos=True,
    )


def blank_pixels(cfg: Qwen2VLConfig, blocks: int = 1) -> np.ndarray:
    """Zero patches of a blocks x blocks merged grid (what warm-up compiles the tower for)."""
    return np.zeros((blocks, blocks, cfg.vision.merge ** 2, cfg.vision.patch_dims), np.float32)
