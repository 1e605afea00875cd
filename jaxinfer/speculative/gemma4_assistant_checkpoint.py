"""Reading a Gemma 4 assistant checkpoint (config.json + safetensors, as transformers saves one).

Its text model's tensors are named as Gemma4ForCausalLM's (`model.layers.{i}.*`, without k/v projections,
`model.embed_tokens`, `model.norm`); beside them `pre_projection`, `post_projection` and, under
use_ordered_embeddings, `masked_embedding.{centroids.weight, token_ordering}`. The LM head is tied to
`model.embed_tokens` (transformers saves no `lm_head.weight`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp

from jaxinfer.checkpoint.hf_names import HFTensor, hf_tensor, hf_tensor_map
from jaxinfer.checkpoint.leaf_paths import leaf_paths, unflatten
from jaxinfer.checkpoint.loader import CheckpointError, hf_source, load_named_leaves, safetensors_index
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.models.family import HFLeaf
from jaxinfer.parallel.array_info import ArrayInfo
from jaxinfer.speculative.gemma4_assistant import (
    AssistantConfig,
    AssistantWeights,
    abstract_assistant,
    read_assistant_config,
)

ORDERING = "masked_embedding.token_ordering"


def _own_leaves(acfg: AssistantConfig) -> dict[str, HFTensor]:
    """The leaves outside its text model's layers."""
    D, B, C, V = acfg.layers.hidden_size, acfg.backbone_hidden_size, acfg.num_centroids, acfg.layers.vocab_size
    leaves = {"pre_projection": HFLeaf("pre_projection.weight", "transpose", (D, 2 * B)),
              "post_projection": HFLeaf("post_projection.weight", "transpose", (B, D)),
              "embed": HFLeaf("model.embed_tokens.weight", "same", (V, D)),
              "norm": HFLeaf("model.norm.weight", "same", (D,))}
    if C:
        leaves["centroids"] = HFLeaf("masked_embedding.centroids.weight", "transpose", (C, D))
        leaves["token_ordering"] = HFLeaf(ORDERING, "same", (V,))
    return {path: hf_tensor(leaf) for path, leaf in leaves.items()}


def _sources(acfg: AssistantConfig, abstract: AssistantWeights) -> dict[str, tuple]:
    """Leaf path -> (HF tensor, stored names, ArrayInfo) for every leaf."""
    layer_tensors, own = hf_tensor_map(acfg.layers), _own_leaves(acfg)
    out = {}
    for path, info in leaf_paths(abstract):
        if path.startswith("layers."):
            out[path] = (*hf_source(path, layer_tensors), info)
        else:
            out[path] = (own[path], [own[path].name], info)
    return out


def _ordering(acfg: AssistantConfig, read: Any) -> Any:
    """token_ordering [V] (int64 as stored) as [C, V / C] int32, refused unless a permutation of the vocabulary."""
    flat = jnp.asarray(read).astype(jnp.int32).reshape(-1)
    if not bool(jnp.array_equal(jnp.sort(flat), jnp.arange(acfg.layers.vocab_size, dtype=jnp.int32))):
        raise CheckpointError(f"{ORDERING} must hold every token id 0..{acfg.layers.vocab_size - 1} once")
    return flat.reshape(acfg.num_centroids, -1)


def load_assistant(model_dir: str | Path, target: ModelConfig, dtype: Any) -> tuple[AssistantConfig, AssistantWeights]:
    """The assistant in model_dir, checked against `target` (ConfigError naming a mismatch), cast to `dtype`."""
    model_dir = Path(model_dir)
    acfg = read_assistant_config(read_config_json(model_dir), target)
    abstract = abstract_assistant(acfg)
    sources = _sources(acfg, abstract)
    names = set(safetensors_index(model_dir))
    missing = sorted(n for _, stored, _ in sources.values() for n in stored if n not in names)
    if missing:
        raise CheckpointError(f"{model_dir} lacks {len(missing)} of the assistant's tensors, first: {missing[:4]}")
    floats = {path: s for path, s in sources.items() if path != "token_ordering"}
    arrays = load_named_leaves(model_dir, floats, dtype)
    if acfg.num_centroids:
        t, stored, _ = sources["token_ordering"]
        flat = ArrayInfo((acfg.layers.vocab_size,), (None,), dtype="int32")  # stored flat, one row per centroid here
        arrays["token_ordering"] = _ordering(acfg, load_named_leaves(model_dir, {"o": (t, stored, flat)}, dtype)["o"])
    return acfg, unflatten(abstract, arrays)
