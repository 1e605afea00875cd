"""EAGLE head checkpoints in their published HF layouts: read EAGLE-1 and EAGLE-3, write either.

EAGLE-1 (SafeAILab/EAGLE `cnets1.py`): `fc.weight` [D, 2D] (+ `fc.bias`), `layers.0.self_attn.
{q,k,v,o}_proj.weight`, `layers.0.mlp.{gate,up,down}_proj.weight`,
`layers.0.post_attention_layernorm.weight` (layer 0 has no input norm). EAGLE-3 (`cnets.py`):
`fc.weight` [D, 3D], `midlayer.*` (q/k/v over [2D], plus `input_layernorm` and `hidden_norm`),
`norm.weight`, `lm_head.weight` [V_draft, D] and `d2t` [V_draft]. A head's own copy of the
target's embedding (`embed_tokens.weight`) and EAGLE-3's `t2d` mask are not read. Weights must
be safetensors (re-save a `pytorch_model.bin` with `safetensors.torch.save_file`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from safetensors import numpy as st_numpy

from jaxinfer.checkpoint.leaf_paths import leaf_paths
from jaxinfer.checkpoint.loader import CheckpointError, safetensors_index
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.models.registry import from_hf_config
from jaxinfer.parallel.array_info import ArrayInfo, is_info
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from jaxinfer.speculative.eagle import EagleConfig, EagleWeights, abstract_eagle

IGNORED = ("embed_tokens.weight", "t2d", "rotary_emb.inv_freq")
LAYER_PREFIX = {1: "layers.0.", 3: "midlayer."}
ROPE_KEYS = ("rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings", "rms_norm_eps")

Transform = tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]


def _same() -> Transform:
    return (lambda x: x), (lambda x: x)


def _transpose() -> Transform:
    return (lambda w: w.T), (lambda w: w.T)


def _in_heads(heads: int, head_dim: int) -> Transform:
    """torch Linear [heads*K, A] <-> [A, heads, K]."""
    return (lambda w: w.T.reshape(w.shape[1], heads, head_dim)), (lambda w: w.reshape(w.shape[0], -1).T)


def _out_heads(heads: int, head_dim: int) -> Transform:
    """torch Linear [D, heads*K] <-> [heads, K, D]."""
    return (lambda w: w.T.reshape(heads, head_dim, w.shape[0])), (lambda w: w.reshape(heads * head_dim, -1).T)


def hf_layout(ecfg: EagleConfig) -> dict[str, tuple[str, Transform]]:
    """Leaf path ('fc', 'layer.wq', ...) -> HF tensor name and the transforms to and from it."""
    cfg = ecfg.layer
    H, KV, K = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = LAYER_PREFIX[ecfg.version]
    table = {
        "fc": ("fc.weight", _transpose()),
        "fc_bias": ("fc.bias", _same()),
        "layer.attn_norm": (p + "input_layernorm.weight", _same()),
        "layer.wq": (p + "self_attn.q_proj.weight", _in_heads(H, K)),
        "layer.wk": (p + "self_attn.k_proj.weight", _in_heads(KV, K)),
        "layer.wv": (p + "self_attn.v_proj.weight", _in_heads(KV, K)),
        "layer.wo": (p + "self_attn.o_proj.weight", _out_heads(H, K)),
        "layer.mlp_norm": (p + "post_attention_layernorm.weight", _same()),
        "layer.w_gate": (p + "mlp.gate_proj.weight", _transpose()),
        "layer.w_up": (p + "mlp.up_proj.weight", _transpose()),
        "layer.w_down": (p + "mlp.down_proj.weight", _transpose()),
        "hidden_norm": (p + "hidden_norm.weight", _same()),
        "norm": ("norm.weight", _same()),
        "lm_head": ("lm_head.weight", _transpose()),
        "d2t": ("d2t", _same()),
    }
    present = {path for path, _ in leaf_paths(abstract_eagle(ecfg))}
    return {path: entry for path, entry in table.items() if path in present}


def head_version(names: set[str], head_dir: Path) -> int:
    """1 or 3 from the tensor names; anything else is not an EAGLE head."""
    if any(n.startswith(LAYER_PREFIX[3]) for n in names):
        return 3
    if "fc.weight" in names and any(n.startswith(LAYER_PREFIX[1]) for n in names):
        return 1
    raise CheckpointError(
        f"{head_dir} is not an EAGLE head: expected EAGLE-1 tensors (fc.weight, layers.0.*) or EAGLE-3 "
        f"ones (fc.weight, midlayer.*, norm.weight, lm_head.weight, d2t); found {sorted(names)[:6]}"
    )


def feature_layers(hf: dict[str, Any], num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's three target layers: the config's, else low/middle/high as the reference code picks them."""
    ids = (hf.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or (2, num_layers // 2, num_layers - 3)
    ids = tuple(sorted(int(i) for i in ids))
    if len(set(ids)) != 3 or ids[0] < 0 or ids[-1] >= num_layers:
        raise CheckpointError(
            f"an EAGLE-3 head reads 3 distinct target layers in [0, {num_layers}), got {ids}; set "
            "eagle_config.eagle_aux_hidden_state_layer_ids in its config.json for a target this shallow"
        )
    return ids


def eagle_config(hf: dict[str, Any], names: set[str], target: ModelConfig, head_dir: Path) -> EagleConfig:
    """The head's shape from its config.json and tensor names, checked against the target."""
    version = head_version(names, head_dir)
    layer_hf = {**hf, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1, "layer_types": None}
    layer = from_hf_config({k: v for k, v in layer_hf.items() if v is not None})
    if layer.hidden_size != target.hidden_size:
        raise CheckpointError(
            f"EAGLE head {head_dir} has hidden_size {layer.hidden_size}, the target {target.hidden_size}: "
            "a head reads the target's embedding and hidden states, so they must match"
        )
    if layer.vocab_size != target.vocab_size:
        raise CheckpointError(
            f"EAGLE head {head_dir} was made for a vocabulary of {layer.vocab_size} tokens, the target has "
            f"{target.vocab_size}"
        )
    if version == 1:
        return EagleConfig(layer, 1, fc_bias="fc.bias" in names)
    draft_vocab = int(hf.get("draft_vocab_size") or layer.vocab_size)
    return EagleConfig(layer, 3, draft_vocab=draft_vocab, feature_layers=feature_layers(hf, target.num_layers))


def load_eagle(
    head_dir: str | Path, target: ModelConfig, dtype: Any, layout: Layout = UNSHARDED
) -> tuple[EagleConfig, EagleWeights]:
    """Read an EAGLE-1 or EAGLE-3 head (HF safetensors layout) for `target`, cast to `dtype`."""
    head_dir = Path(head_dir)
    if not (head_dir / "config.json").is_file():
        raise CheckpointError(f"no config.json in EAGLE head directory {head_dir}")
    hf = read_config_json(head_dir)  # broken JSON: an error naming the file
    index = safetensors_index(head_dir)
    names = set(index)
    ecfg = eagle_config(hf, names, target, head_dir)
    table = hf_layout(ecfg)
    wanted = {name for name, _ in table.values()}
    missing = sorted(wanted - names)
    unexpected = sorted(n for n in names - wanted if not n.endswith(IGNORED))
    if missing or unexpected:
        raise CheckpointError(
            f"EAGLE-{ecfg.version} head {head_dir}: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    tensors: dict[str, np.ndarray] = {}
    for path in sorted(set(index.values())):
        tensors.update({n: t for n, t in st_numpy.load_file(path).items() if n in wanted})
    abstract = abstract_eagle(ecfg)
    arrays = {path: _leaf(tensors, path, info, table, dtype, layout, ecfg) for path, info in leaf_paths(abstract)}
    leaves, treedef = jax.tree.flatten(abstract, is_leaf=is_info)
    return ecfg, jax.tree.unflatten(treedef, [arrays[p] for p, _ in leaf_paths(abstract)])


def _leaf(
    tensors: dict[str, np.ndarray], path: str, info: ArrayInfo, table: dict, dtype: Any, layout: Layout,
    ecfg: EagleConfig,
) -> jax.Array:
    name, (to_jax, _) = table[path]
    raw = tensors[name]
    value = to_jax(raw) if raw.size == int(np.prod(info.shape)) else None
    if value is None or value.shape != info.shape:
        raise CheckpointError(f"EAGLE head tensor {name} has shape {raw.shape}, which does not fit {info.shape}")
    if path == "d2t":
        ids = value.astype(np.int64) + np.arange(value.shape[0])
        if ids.min() < 0 or ids.max() >= ecfg.layer.vocab_size:
            raise CheckpointError(
                f"EAGLE-3 d2t maps draft ids outside the target vocabulary [0, {ecfg.layer.vocab_size})"
            )
        return layout.put(value.astype(np.int32), info.axes)
    return layout.put(value.astype(np.float32).astype(dtype), info.axes)


def save_eagle(weights: EagleWeights, ecfg: EagleConfig, out_dir: str | Path, target_hf: dict[str, Any]) -> Path:
    """Write a head in its published HF layout (model.safetensors + config.json) that `load_eagle` reads.

    Rope, norm epsilon and position limits are copied from the target's config.json (`target_hf`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = hf_layout(ecfg)
    tensors = {}
    for path, leaf in leaf_paths(weights):
        name, (_, to_hf) = table[path]
        tensors[name] = np.ascontiguousarray(to_hf(np.asarray(jax.device_get(leaf))))
    st_numpy.save_file(tensors, out / "model.safetensors")
    cfg = ecfg.layer
    config = {k: target_hf[k] for k in ROPE_KEYS if k in target_hf}
    config.update(
        architectures=["LlamaForCausalLM" if ecfg.version == 1 else "LlamaForCausalLMEagle3"],
        model_type="llama", hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        num_hidden_layers=1, vocab_size=cfg.vocab_size, hidden_act="silu", bias=ecfg.fc_bias,
        torch_dtype=str(np.dtype(tensors["fc.weight"].dtype)),
    )
    if ecfg.version == 3:
        config.update(draft_vocab_size=ecfg.draft_vocab,
                      eagle_config={"eagle_aux_hidden_state_layer_ids": list(ecfg.feature_layers)})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out
