"""Reading a model's own MTP layer from its checkpoint: `model.layers.{num_hidden_layers}.*`.

DeepSeek-V3 and GLM-4.5 store it as one more decoder layer of their own kind (the family's tensor
names at index num_hidden_layers) plus `enorm`, `hnorm`, `eh_proj` and `shared_head.{norm, head}`;
`embed_tokens` (a copy of the target's) is not read. The decoder's loader skips these tensors
(`checkpoint.hf_names.in_mtp_layer`); this reads them with its reader (FP8 blocks dequantized).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxinfer.checkpoint.hf_names import HFTensor, hf_tensor, hf_tensor_map, stored_names
from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.checkpoint.loader import CheckpointError, load_named_leaves, safetensors_index
from jaxinfer.checkpoint.named_tensors import sourced_leaves
from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import HFLeaf
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from jaxinfer.speculative.eagle import MTP, EagleConfig
from jaxinfer.speculative.mtp import MtpWeights, abstract_mtp, mtp_layer_config

HEAD = "shared_head.head.weight"


def mtp_prefix(target: ModelConfig) -> str:
    """Where the first MTP layer's tensors start."""
    return f"model.layers.{target.num_layers}."


def _own_leaves(target: ModelConfig) -> dict[str, HFTensor]:
    """The MTP layer's leaves outside the decoder layer: its norms, projection and shared head."""
    D, V = target.hidden_size, target.vocab_size
    p = mtp_prefix(target)
    leaves = {
        "enorm": HFLeaf(p + "enorm.weight", "same", (D,)),
        "hnorm": HFLeaf(p + "hnorm.weight", "same", (D,)),
        "eh_proj": HFLeaf(p + "eh_proj.weight", "transpose", (D, 2 * D)),
        "norm": HFLeaf(p + "shared_head.norm.weight", "same", (D,)),
        "lm_head": HFLeaf(p + HEAD, "transpose", (V, D)),
    }
    return {path: hf_tensor(leaf) for path, leaf in leaves.items()}


def _sources(target: ModelConfig, layer_cfg: ModelConfig, abstract: MtpWeights) -> dict[str, tuple]:
    """Leaf path -> (HF tensor, stored names, ArrayInfo) for every leaf of the MTP layer."""
    layer_tensors, own = hf_tensor_map(layer_cfg), _own_leaves(target)
    out = {}
    for path, info in leaf_paths(abstract):
        top, _, field = path.partition(".")
        if top == "layer":
            t = layer_tensors[f"layers.{field}"]
            out[path] = (t, stored_names(t, target.num_layers), info)
        else:
            out[path] = (own[top], stored_names(own[top], None), info)
    return out


def mtp_updates(named: Mapping[str, Any], target: ModelConfig, dtype: Any, head: MtpWeights) -> dict[str, Any]:
    """{leaf path of `head`: float leaf} for the first MTP layer's tensors among `named` (HF names: an RL
    trainer's update); the later MTP layers' and the layer's `embed_tokens` copy are not read, as at load."""
    layer_cfg = mtp_layer_config(target)
    sources = _sources(target, layer_cfg, abstract_mtp(layer_cfg, own_head=head.lm_head is not None))
    return sourced_leaves(named, sources, dtype)[0]


def load_mtp(
    model_dir: str | Path, target: ModelConfig, dtype: Any, layout: Layout = UNSHARDED
) -> tuple[EagleConfig, MtpWeights]:
    """The first MTP layer of the checkpoint in model_dir, as a draft head for `target`, cast to `dtype`."""
    model_dir = Path(model_dir)
    layer_cfg = mtp_layer_config(target)
    names = set(safetensors_index(model_dir))
    abstract = abstract_mtp(layer_cfg, own_head=mtp_prefix(target) + HEAD in names)
    sources = _sources(target, layer_cfg, abstract)
    missing = sorted(n for _, stored, _ in sources.values() for n in stored if n not in names)
    if missing:
        raise CheckpointError(
            f"{model_dir} declares {target.mtp_layers} MTP layer(s) (num_nextn_predict_layers) but lacks "
            f"{len(missing)} of the first one's tensors, first: {missing[:4]}"
        )
    arrays = load_named_leaves(model_dir, sources, dtype, layout)
    ecfg = EagleConfig(layer_cfg, MTP, feature_layers=(target.num_layers,))
    return ecfg, unflatten(abstract, arrays)

