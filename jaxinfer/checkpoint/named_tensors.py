"""Tensors named as in an HF checkpoint, held in memory -> weight leaves (`LLM.update_weights`).

A trainer (PyTorch's `state_dict()`, a JAX trainer's HF-named export, vLLM's `load_weights`
pairs) hands over tensors under the names `save_pretrained` writes. Each jaxinfer leaf reads the
tensors behind it with the loader's own descriptions (`hf_names`): transposed, split into heads,
a row range of a fused tensor, experts stacked. An update may carry a subset of the model's leaves
(pushed in buckets to bound memory), but every tensor of a leaf it touches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxinfer.checkpoint.hf_names import HFTensor, hf_tensor_map, unread_tensor
from jaxinfer.checkpoint.leaf_paths import leaf_paths
from jaxinfer.checkpoint.loader import IGNORED_SUFFIXES, hf_source, transform_on_device
from jaxinfer.config.errors import CheckpointError
from jaxinfer.config.model import ModelConfig
from jaxinfer.models import abstract_weights
from jaxinfer.parallel.array_info import ArrayInfo


def as_array(x: Any) -> Any:
    """A jax or NumPy array of a tensor: jax and NumPy arrays as given, torch tensors without a float32
    detour (bf16 bits reinterpreted; a CUDA tensor through DLPack, staying on its device)."""
    if isinstance(x, (jax.Array, np.ndarray)):
        return x
    if type(x).__module__.startswith("torch"):
        x = x.detach()
        if x.device.type != "cpu":
            return jax.dlpack.from_dlpack(x)
        if str(x.dtype) == "torch.bfloat16":
            return x.view(dtype=_torch_int16()).numpy().view(ml_dtypes.bfloat16)
        return x.numpy()
    return np.asarray(x)


def _torch_int16() -> Any:
    import torch  # only reached with a torch tensor in hand

    return torch.int16


def named_dict(tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """A {name: tensor} dict of a mapping or of (name, tensor) pairs (vLLM's `load_weights` argument)."""
    pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
    out: dict[str, Any] = {}
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise TypeError(f"weights must be a mapping of tensor names to tensors or (name, tensor) pairs; got an "
                            f"item {type(pair).__name__}")
        out[pair[0]] = pair[1]
    return out


def _sources(cfg: ModelConfig) -> dict[str, tuple[HFTensor, list[str], ArrayInfo]]:
    """leaf path -> (its HF tensor description, the stored names behind it, its shape and axes)."""
    tensors = hf_tensor_map(cfg)
    return {path: (*hf_source(path, tensors), info) for path, info in leaf_paths(abstract_weights(cfg))}


def sourced_leaves(named: Mapping[str, Any], sources: Mapping[str, tuple[HFTensor, list[str], ArrayInfo]],
                   dtype: Any) -> tuple[dict[str, Any], set[str]]:
    """({leaf path: float leaf} for each source whose tensors `named` holds, the names used); CheckpointError for
    a leaf given some but not all of its tensors."""
    used: set[str] = set()
    out = {}
    for path, (t, names, info) in sources.items():
        given = [n for n in names if n in named]
        if not given:
            continue
        if len(given) < len(names):
            missing = [n for n in names if n not in named]
            raise CheckpointError(f"weights for {path} need all of its {len(names)} tensors; missing "
                                  f"{len(missing)} (first: {missing[:3]}): push a leaf's tensors together")
        out[path] = _leaf(t, [(n, as_array(named[n])) for n in names], info, dtype)
        used.update(names)
    return out, used


def _leaf(t: HFTensor, tensors: list[tuple[str, Any]], info: ArrayInfo, dtype: Any) -> Any:
    """One leaf from the tensors behind it, each checked against its HF shape, cast to the leaf's dtype.

    NumPy arrays are reshaped by NumPy on a CPU backend (the loader's choice: see `transform_on_device`),
    anything else by jax on its device.
    """
    whole = tuple(slice(0, n) for n in info.shape)
    for name, x in tensors:
        if tuple(x.shape) != t.hf_shape:
            raise CheckpointError(f"tensor {name} has shape {tuple(x.shape)}, expected {t.hf_shape}")
    on_host = not transform_on_device() and all(isinstance(x, np.ndarray) for _, x in tensors)
    xp = np if on_host else jnp
    if t.experts:
        leaf = xp.stack([t.to_jax(xp.asarray(x)[t.hf_index(whole[1:])]) for _, x in tensors])
    else:
        leaf = t.to_jax(xp.asarray(tensors[0][1])[t.hf_index(whole)])
    return leaf.astype(info.dtype_in(dtype))


def leaf_updates(tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], cfg: ModelConfig,
                 dtype: Any) -> dict[str, Any]:
    """{leaf path: float leaf} for the leaves whose tensors `tensors` holds (in the model's dtype, unsharded).

    CheckpointError naming them: a leaf given some but not all of its tensors, a name no leaf reads,
    a tensor of the wrong shape.
    """
    named = {n: as_array(x) for n, x in named_dict(tensors).items()
             if not n.endswith(IGNORED_SUFFIXES) and not unread_tensor(cfg, n)}
    if cfg.tie_word_embeddings:
        named.pop("lm_head.weight", None)  # a tied copy some state dicts keep
    out, used = sourced_leaves(named, _sources(cfg), dtype)
    unknown = sorted(set(named) - used)
    if unknown:
        raise CheckpointError(f"{len(unknown)} tensor name(s) are not weights of this model (first: {unknown[:5]}); "
                              "expected names as save_pretrained writes them, e.g. "
                              f"{next(iter(_sources(cfg).values()))[1][0]!r}")
    return out
