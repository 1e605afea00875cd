"""Whole-tree transforms of a model's weights: quantize, pack for the CPU kernels, join projections.

Every family's layer dataclass names its projections (`PROJECTIONS`: field -> axes contracted
with the activations) and the groups that read the same input (`JOINED`); the transforms here
touch those fields only, so they serve every family. Fields that are None are skipped (a
family without biases, a joined tree's later parts, an MoE layer's dense MLP).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxinfer.kernels.cpu import PackedWeight, pack_weight, packing_applies, unpack_weight
from jaxinfer.models.decoder import Weights
from jaxinfer.models.invariant_weight import InvariantWeight
from jaxinfer.models.joined_weight import JoinedWeight, join, joinable, split
from jaxinfer.models.layers import Weight
from jaxinfer.models.row_table import RowTable, as_row_table, full_table
from jaxinfer.parallel.sharding import Layout
from jaxinfer.quantization import quantized_weight
from jaxinfer.quantization.quantized_experts import QuantizedExperts, quantize_experts
from jaxinfer.quantization.quantized_weight import QuantizedWeight


def projections(lw: Any) -> dict[str, int]:
    """The layer's projection fields that are present: name -> axes contracted with the input."""
    return {name: c for name, c in type(lw).PROJECTIONS.items() if getattr(lw, name) is not None}


def map_projections(weights: Weights, fn: Callable[[Weight, int, str], Weight]) -> Weights:
    """weights with each present projection replaced by fn(leaf, contract, "layers.i.name")."""
    layers = [
        dataclasses.replace(lw, **{name: fn(getattr(lw, name), c, f"layers.{i}.{name}")
                                   for name, c in projections(lw).items()})
        for i, lw in enumerate(weights.layers)
    ]
    return dataclasses.replace(weights, layers=layers)


def quantize_weights(weights: Weights, mode: str | None, group: int = quantized_weight.DEFAULT_GROUP) -> Weights:
    """The projections and routed experts quantized to `mode` (embedding, head, norms and routers as
    they are); None: `weights` unchanged.

    A tree already quantized (a converted checkpoint) is returned as it is when the mode and
    group match, and refused otherwise: quantizing quantized values again would lose accuracy.
    """
    if mode is None:
        return weights
    quantized_weight.check_mode(mode, group)
    # The first layer's first projection tells (wq is None, or absent, on a hybrid's state layer).
    first = next((getattr(weights.layers[0], name) for name in projections(weights.layers[0])), None)
    if isinstance(first, QuantizedWeight):
        if (first.mode, first.group) != (mode, group if mode == "int4" else 0):
            raise ValueError(f"quantization={mode!r} (group {group}), but these weights are stored as "
                             f"{first.mode!r} (group {first.group}); load them with quantization=None")
        return weights
    weights = map_projections(weights, lambda w, c, name: quantized_weight.quantize(w, c, mode, group, name))
    return map_experts(weights, lambda w, name: quantize_experts(w, mode, group, name))


def leaf_quantizer(abstract: Weights, mode: str | None, group: int = quantized_weight.DEFAULT_GROUP,
                   experts_mode: str | None = None) -> Callable[[str, jax.Array], Any] | None:
    """fn(path, leaf) quantizing each leaf as `quantize_weights` would (projections and routed experts;
    others as they are), for quantizing weights as they load; None when there is nothing to quantize.

    experts_mode: the routed experts' mode where it differs from `mode` (GPT-OSS's MXFP4 experts
    kept in "mxfp4" while the projections stay unquantized). The loader holds one unquantized leaf
    at a time beside the quantized ones: a model whose weights fit in memory only quantized (an MoE
    model in int4, GPT-OSS-120B's experts) can load.
    """
    experts_mode = experts_mode or mode
    if mode is None and experts_mode is None:
        return None
    if mode is not None:
        quantized_weight.check_mode(mode, group)
    contracts: dict[str, int | None] = {}  # path -> axes a projection contracts; None for routed experts
    for i, lw in enumerate(abstract.layers):
        if mode is not None:
            contracts.update({f"layers.{i}.{name}": c for name, c in projections(lw).items()})
        contracts.update({f"layers.{i}.{name}": None for name in _expert_fields(lw)})

    def quantize_leaf(path: str, leaf: jax.Array) -> Any:
        if path not in contracts:
            return leaf
        if (contract := contracts[path]) is None:
            return quantize_experts(leaf, experts_mode, group, path)
        return quantized_weight.quantize(leaf, contract, mode, group, path)

    return quantize_leaf


def quantize_head(weights: Weights, mode: str, group: int, layout: Layout) -> Weights:
    """The output head quantized to `mode` like the projections; a tied head gets a quantized copy
    of the embedding's transpose (the lookup keeps the embedding as it is).

    Small models with large vocabularies spend a fifth or more of each decode step reading the
    head (SmolLM-135M: 28M of 135M parameters), so quantizing only the projections leaves that.
    """
    if isinstance(weights.lm_head, QuantizedWeight):
        return weights
    head = weights.embed.T if weights.lm_head is None else weights.lm_head
    q = quantized_weight.quantize(head, 1, mode, group, "lm_head")
    return dataclasses.replace(weights, lm_head=quantized_weight.shard_quantized(q, ("embed", "vocab"), layout))


def _pack_leaf(w: Weight, contract: int, name: str = "") -> Weight:
    """One projection in the CPU kernel's layout: quantized tiles, packed bf16, or as it is."""
    if isinstance(w, QuantizedWeight):
        return quantized_weight.tile(w)
    if isinstance(w, PackedWeight) or not packing_applies(w.dtype):
        return w
    return pack_weight(w, contract)


def _in_kernel_layout(w: Weight | None) -> bool:
    return isinstance(w, PackedWeight) or (isinstance(w, QuantizedWeight) and w.tiled)


def _unpack_leaf(w: Weight, contract: int = 0, name: str = "") -> Weight:
    """`_pack_leaf` undone (a copy of a packed leaf)."""
    if isinstance(w, QuantizedWeight):
        return quantized_weight.untile(w)
    return unpack_weight(w) if isinstance(w, PackedWeight) else w


def pack_for_cpu(weights: Weights) -> Weights:
    """The projections in the CPU kernel's layouts (bf16 packed, int8/int4 tiled), others as they are.

    For running only, when the CPU kernels are on: a packed tree is not the model's pytree
    (`unpack_for_cpu` gives that back). With bf16 weights the embedding is kept as its bits for
    the lookup (see row_table) and the output head is packed (a tied head gets a packed copy of
    the embedding's transpose: vocab x hidden more bf16 values), read at the kernel's speed; a
    quantized head (`quantize_head`) is tiled instead.
    """
    weights = map_projections(weights, _pack_leaf)
    lm_head, embed = weights.lm_head, weights.embed
    if lm_head is not None or packing_applies(embed.dtype):
        lm_head = _pack_leaf(embed.T if lm_head is None else lm_head, 1)
    if packing_applies(embed.dtype):  # the head is in a kernel layout then: the table only serves lookups
        embed = as_row_table(embed)
    return dataclasses.replace(weights, embed=embed, lm_head=lm_head)


def join_projections(weights: Weights, release: bool = False) -> Weights:
    """Each layer's `JOINED` groups (q/k/v, gate/up) as one `JoinedWeight` (in the first field, the
    others None) where joinable.

    For running on one device off the CPU kernels' path; `split_projections` gives the model's
    tree back. release: free the parts as they are joined (a tree nothing else holds).
    """

    def joined(lw: Any) -> Any:
        fields = {}
        for names in type(lw).JOINED:
            parts = [getattr(lw, name) for name in names]
            if all(p is not None for p in parts) and joinable(parts):
                fields.update({names[0]: join(parts, release), **{name: None for name in names[1:]}})
        return dataclasses.replace(lw, **fields)

    return dataclasses.replace(weights, layers=[joined(lw) for lw in weights.layers])


def split_projections(weights: Weights) -> Weights:
    """`join_projections` undone (copies of the parts); a tree with nothing joined as it is."""

    def split_layer(lw: Any) -> Any:
        fields = {}
        for names in type(lw).JOINED:
            if isinstance(first := getattr(lw, names[0]), JoinedWeight):
                fields.update(zip(names, split(first)))
        return dataclasses.replace(lw, **fields)

    return dataclasses.replace(weights, layers=[split_layer(lw) for lw in weights.layers])


def mark_for_gpu_kernel(weights: Weights, interpret: bool = False) -> Weights:
    """Quantized projections (joined ones too) and head marked for the Triton decode kernel where it
    takes them (others as they are)."""

    def mark(w: Weight | None, contract: int = 0, name: str = "") -> Weight | None:
        if isinstance(w, JoinedWeight):
            return dataclasses.replace(w, weight=mark(w.weight))
        return quantized_weight.for_gpu_kernel(w, interpret) if isinstance(w, QuantizedWeight) else w

    return dataclasses.replace(map_projections(weights, mark), lm_head=mark(weights.lm_head))


def _expert_fields(lw: Any) -> tuple[str, ...]:
    """The layer's routed-expert fields that it has (Gemma 4's are None without its MoE block)."""
    return tuple(name for name in getattr(type(lw), "EXPERTS", ()) if getattr(lw, name) is not None)


def map_experts(weights: Weights, fn: Callable[[jax.Array, str], Any]) -> Weights:
    """weights with each layer's routed experts (its `EXPERTS` fields) replaced by fn(leaf, "layers.i.name")."""
    layers = [dataclasses.replace(lw, **{name: fn(getattr(lw, name), f"layers.{i}.{name}")
                                         for name in _expert_fields(lw)})
              for i, lw in enumerate(weights.layers)]
    return dataclasses.replace(weights, layers=layers)


def widen_experts(weights: Weights) -> Weights:
    """16-bit expert weights as float32, for running on CPU.

    XLA:CPU float-normalises a bf16 slice of the experts: it converted every expert's weights to
    float32 before the tile loop on each call (all experts' bytes, a dense pass), and bf16 slices
    bitcast from 16-bit integers inside the loop read at ~0.1-1 GB/s. Float32 experts are sliced
    and multiplied at memory speed, for twice their bytes.
    """
    def widen(lw: Any) -> Any:
        fields = {name: getattr(lw, name) for name in _expert_fields(lw)}
        return dataclasses.replace(lw, **{name: w.astype(jax.numpy.float32) for name, w in fields.items()
                                          if not isinstance(w, QuantizedExperts) and w.dtype.itemsize == 2})

    return dataclasses.replace(weights, layers=[widen(lw) for lw in weights.layers])


def narrow_experts(weights: Weights) -> Weights:
    """`widen_experts` undone: experts back in the dtype of the other weights (their norms')."""
    def narrow(lw: Any) -> Any:
        if not _expert_fields(lw):  # no experts (and maybe no attn_norm: OLMo 2 norms after its sublayers)
            return lw
        # the input norm's, or FlexOlmo's output norm's: it norms after its sublayers, as OLMo 2
        dtype = (lw.post_attn_norm if getattr(lw, "attn_norm", None) is None else lw.attn_norm).dtype
        experts = {name: getattr(lw, name) for name in _expert_fields(lw)}
        return dataclasses.replace(lw, **{name: w.astype(dtype) for name, w in experts.items()
                                          if not isinstance(w, QuantizedExperts) and w.dtype != dtype})

    return dataclasses.replace(weights, layers=[narrow(lw) for lw in weights.layers])


def weights_to_run(weights: Weights, cpu_kernels: bool, quantized_kernel: bool, layout: Layout) -> Weights:
    """What runs (consumes `weights`): bf16 projections packed for the CPU kernels; on one device
    q/k/v and gate/up joined where not packed (see joined_weight); quantized ones marked for the GPU's
    kernel; 16-bit experts widened on CPU (see widen_experts)."""
    if jax.default_backend() == "cpu":
        weights = widen_experts(weights)
    if cpu_kernels:
        weights = pack_for_cpu(weights)
    if layout.size == 1:
        weights = join_projections(weights, release=True)
    if quantized_kernel:
        weights = mark_for_gpu_kernel(weights, interpret=jax.default_backend() != "gpu")
    return weights


def batch_invariant_weights(weights: Weights) -> Weights:
    """Every projection, norm and the output head (a tied one reads the embedding) computed in fixed
    row blocks (see invariant_weight); a joined projection's one matrix is wrapped, so it stays one product."""
    def wrap(w: Weight, contract: int = 1, name: str = "") -> Weight:
        if isinstance(w, JoinedWeight):
            return dataclasses.replace(w, weight=InvariantWeight(w.weight))
        return InvariantWeight(w)

    def norms(tree: Any) -> dict[str, InvariantWeight]:
        """Its norm weights (fields named *norm), wrapped."""
        return {field.name: InvariantWeight(getattr(tree, field.name)) for field in dataclasses.fields(tree)
                if field.name.endswith("norm") and getattr(tree, field.name) is not None}

    projected = map_projections(weights, wrap)
    layers = [dataclasses.replace(lw, **norms(lw)) for lw in projected.layers]
    head = InvariantWeight(weights.embed, transposed=True) if weights.lm_head is None else wrap(weights.lm_head)
    return dataclasses.replace(projected, layers=layers, lm_head=head, **norms(projected))


def unpack_for_cpu(packed: Weights, tied: bool) -> Weights:
    """The model's weights back from `pack_for_cpu`'s tree (a copy of each packed leaf); others as they are.

    A tied model's running head (a packed or quantized copy of the embedding) is dropped; joined
    projections are split.
    """
    packed = narrow_experts(split_projections(packed))
    first = packed.layers[0]  # its projections by name: a Mamba2 layer has no wq
    packed_any = isinstance(packed.embed, RowTable) or any(
        _in_kernel_layout(w) for w in (*(getattr(first, name) for name in first.PROJECTIONS), packed.lm_head)
    )
    if not packed_any:  # nothing was packed: the tree itself, no copy
        return dataclasses.replace(packed, lm_head=None) if tied and packed.lm_head is not None else packed
    unpacked = map_projections(packed, _unpack_leaf)
    lm_head = None if tied else _unpack_leaf(packed.lm_head)
    return dataclasses.replace(unpacked, embed=full_table(packed.embed), lm_head=lm_head)
