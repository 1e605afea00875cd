"""Loading a model for `LLM`: its settings resolved and checked, its weights read into their shardings.

What `LLM.__init__` decides before any engine exists: the dtype ("auto" reads the checkpoint's),
the context length (vLLM's max_model_len too), the mesh layout for tp x dp x ep, quantization of
the projections and the head, which platform kernels (native CPU, Triton quantized matmul) apply, and
the weights as they run (`running_weights`).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxinfer.checkpoint.converted import is_converted, quantization_of
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.config import validation
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.config.packed_checkpoint import packed_scheme
from jaxinfer.kernels.cpu import resolve_cpu_kernels
from jaxinfer.models import (
    Weights,
    abstract_weights,
    batch_invariant_weights,
    leaf_quantizer,
    projections,
    quantize_head,
    quantize_weights,
    weights_to_run,
)
from jaxinfer.models.moe import DOWN_AXES
from jaxinfer.models.registry import load_config
from jaxinfer.parallel.sharding import Layout, check_experts, layout_for
from jaxinfer.quantization import mxfp4_codes
from jaxinfer.quantization.quantized_experts import packed_experts_fit
from jaxinfer.quantization.quantized_weight import DEFAULT_GROUP, QuantizedWeight, native_int4
from jaxinfer.quantization.sharding import shard_quantized_tree

log = logging.getLogger(__name__)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def resolve_max_seq_len(requested: int | None, limit: int) -> int:
    """The requested length (default: the model's, at most 2048), checked against the model's limit."""
    length = int(requested or min(limit, 2048))
    if length > limit:
        raise ValueError(f"max_seq_len {length} exceeds the model's max_position_embeddings {limit}")
    return length


def seq_len_setting(max_seq_len: int | None, max_model_len: int | None) -> int | None:
    """max_seq_len, or vLLM's name for it, max_model_len; both given must agree."""
    validation.optional_int(max_seq_len, "max_seq_len", 1)
    validation.optional_int(max_model_len, "max_model_len", 1)
    if max_seq_len is not None and max_model_len is not None and max_seq_len != max_model_len:
        raise ValueError(f"max_seq_len={max_seq_len} and max_model_len={max_model_len} disagree; max_model_len is "
                         "vLLM's name for max_seq_len, so give one of them (or the same value)")
    return max_model_len if max_seq_len is None else max_seq_len


def resolve_dtype(dtype: str, model_dir: Path) -> jnp.dtype:
    """A jnp dtype from a name; "auto" takes the checkpoint's own dtype (float32 if unstated)."""
    dtype = validation.dtype_name(dtype, "dtype")
    if dtype == "auto":
        cfg = read_config_json(model_dir)
        stored = cfg.get("dtype") or cfg.get("torch_dtype") or "float32"
        dtype = validation.dtype_name(stored, f"{model_dir / 'config.json'} dtype", allow_auto=False)
    return DTYPES[dtype]


def model_identity(model_dir: Path, dtype: jnp.dtype) -> str:
    """Names these weights for the prefix cache: path, dtype and the weight files' sizes and times."""
    files = sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("**/*.zarray"))[:1]
    marks = [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files]
    return "|".join([str(model_dir.resolve()), jnp.dtype(dtype).name, *marks])


def load_sharded(
    model_dir: Path, dtype: jnp.dtype, quantization: str | None, tp: int, dp: int, quantize_lm_head: bool = False,
    ep: int = 1, pooling: bool = False,
) -> tuple[ModelConfig, Weights, Layout]:
    """Config, weights (each leaf read into its sharding) and the layout for tp x dp x ep devices.
    pooling: an embedding model's, whose output head is not read (a converted checkpoint keeps its own)."""
    validation.positive_int(tp, "tensor_parallel_size")
    validation.positive_int(dp, "data_parallel_size")
    validation.positive_int(ep, "expert_parallel_size")
    validation.boolean(quantize_lm_head, "quantize_lm_head")
    cfg = load_config(model_dir)
    if pooling and not is_converted(model_dir):  # read as tied: no lm_head asked for, a stored one skipped
        cfg = dataclasses.replace(cfg, tie_word_embeddings=True)
    check_experts(cfg.num_experts, ep)
    layout = layout_for(cfg.num_heads, cfg.num_kv_heads, tp, dp, ep)
    # Quantized as each leaf is read; a converted checkpoint is as stored, and checked against the mode.
    transform = leaf_quantizer(abstract_weights(cfg), quantization,
                               experts_mode=stored_experts_mode(model_dir, cfg, layout, quantization))
    cfg, weights = load_weights(model_dir, dtype, layout=layout, transform=transform, cfg=cfg,
                                keep_int4=keeps_stored_int4(model_dir, quantization))
    weights = quantize_weights(weights, quantization)
    if layout.size > 1:
        # Quantized leaves take the shardings of the weights they replace (see quantized_specs).
        weights = shard_quantized_tree(weights, abstract_weights(cfg), layout)
    if quantize_lm_head:
        if (quant := quantization_of(weights)) is None:
            raise ValueError("quantize_lm_head=True quantizes the output head like the projections, so it needs "
                             "quantization='int8', 'int4' or 'fp8' (or a quantized checkpoint); got quantization=None")
        mode, group = quant
        weights = quantize_head(weights, mode, group or DEFAULT_GROUP, layout)
    return cfg, weights, layout


def stored_experts_mode(model_dir: Path, cfg: ModelConfig, layout: Layout,
                        quantization: str | None) -> str | None:
    """"mxfp4" where a checkpoint's routed experts are stored in MXFP4 (GPT-OSS's releases) and no other
    quantization is asked for: they stay in it (exactly: a quarter of their bf16 bytes, as vLLM keeps them),
    unless a tp split would cut their groups of 32 hidden units, where they load in `dtype` (one log line)."""
    stored = (read_config_json(model_dir).get("quantization_config") or {}).get("quant_method")
    if stored != "mxfp4" or quantization is not None or is_converted(model_dir):
        return None
    down = (cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size)
    if not packed_experts_fit(down, DOWN_AXES, layout, mxfp4_codes.GROUP):
        log.info("MXFP4 experts load in the model's dtype: %d hidden units in groups of %d do not split over tp=%d",
                 cfg.moe_intermediate_size, mxfp4_codes.GROUP, layout.axis_size("tp"))
        return None
    return "mxfp4"


def keeps_stored_int4(model_dir: Path, quantization: str | None) -> bool:
    """Whether an AWQ, GPTQ or compressed-tensors 4-bit checkpoint's projections and routed experts stay in its own
    4-bit levels (as vLLM runs them): where no quantization is asked for. Asked for, they are dequantized as read
    and quantized again (a second rounding); 8-bit weights load dequantized (one log line each)."""
    scheme = packed_scheme(read_config_json(model_dir).get("quantization_config"))
    if scheme is None or is_converted(model_dir):
        return False
    if quantization is not None:
        log.info("the checkpoint's %d-bit %s weights are dequantized as read and quantized again to %s (a second "
                 "rounding); quantization=None keeps its own levels", scheme.bits, scheme.method, quantization)
        return False
    if scheme.bits != 4:
        log.info("the checkpoint's %d-bit %s weights load dequantized to the model's dtype", scheme.bits, scheme.method)
        return False
    return True


def kernel_less_int4(weights: Weights) -> int:
    """How many projections are int4 in a layout the kernels do not read (a 4-bit checkpoint's own levels)."""
    return sum(isinstance(w := getattr(lw, name), QuantizedWeight) and w.mode == "int4" and not native_int4(w)
               for lw in weights.layers for name in projections(lw))


def resolve_kernels_for(layout: Layout, cpu_kernels: bool | None) -> bool:
    """The CPU kernels' switch: off on a mesh (FFI calls cannot be partitioned), else as asked."""
    if layout.size == 1:
        return resolve_cpu_kernels(cpu_kernels)
    if cpu_kernels:
        raise ValueError(
            f"cpu_kernels=True cannot run on a mesh of {layout.size} devices (the native kernels are not "
            "partitioned); pass cpu_kernels=None or False, or tensor_parallel_size=data_parallel_size=1"
        )
    return False


def resolve_invariant_kernels(cpu_kernels: bool | None, invariant: bool, num_experts: int) -> bool | None:
    """The CPU kernels' setting under `batch_invariant`: off (their per-row results depend on the
    batch) unless asked for, which is an error; MoE models, whose experts see a batch-sized share
    of the tokens, are refused."""
    if not validation.boolean(invariant, "batch_invariant"):
        return cpu_kernels
    if jax.default_backend() != "cpu":
        raise ValueError(f"batch_invariant=True is supported on CPUs only so far (this is {jax.default_backend()}): "
                         "on GPUs and TPUs XLA picks each program's fusions and kernel tilings by its shapes, "
                         "which no test has pinned there yet")
    if num_experts:
        raise ValueError(f"batch_invariant=True does not cover mixture-of-experts models yet (this one has "
                         f"{num_experts} experts, each of whose products sees a batch-sized share of the tokens)")
    if cpu_kernels:
        raise ValueError("batch_invariant=True runs without the native CPU kernels, whose per-row results depend "
                         "on the batch; leave cpu_kernels unset or False")
    return False


def resolve_quantized_kernel(layout: Layout, setting: bool | None, interpret: bool) -> bool:
    """The Triton quantized-matmul switch: None = on for one GPU; True needs a GPU (or interpret mode), never a mesh."""
    on_gpu = jax.default_backend() == "gpu"
    if setting is None:
        return on_gpu and layout.size == 1
    if setting and layout.size > 1:
        raise ValueError(f"quantized_kernel=True cannot run on a mesh of {layout.size} devices (the Triton kernel is "
                         "not partitioned); pass quantized_kernel=None or False")
    if setting and not (on_gpu or interpret):
        raise ValueError(f"quantized_kernel=True needs a GPU (this backend is {jax.default_backend()!r}); pass "
                         "interpret_kernels=True to run it in interpret mode, or quantized_kernel=None or False")
    return setting


class RunningWeights(NamedTuple):
    """The weights as they run, and the switch that shaped them."""

    cpu_kernels: bool  # the native CPU kernels' switch, resolved
    run: Weights  # packed for the CPU kernels, joined, marked for the GPU's quantized kernel where they apply
    engine: Weights  # what the engine runs: `run`, in fixed row blocks under batch_invariant


def running_weights(
    weights: Weights, cfg: ModelConfig, layout: Layout, cpu_kernels: bool | None, quantized_kernel: bool | None,
    interpret_kernels: bool, batch_invariant: bool,
) -> RunningWeights:
    """Which platform kernels apply (None: auto: the CPU kernels where they build and $JAXINFER_CPU_KERNELS
    does not say 0, never on a mesh) and the weights turned into what runs (consumes `weights`)."""
    kernels = resolve_kernels_for(layout, resolve_invariant_kernels(cpu_kernels, batch_invariant, cfg.num_experts))
    if kernels and (slow := kernel_less_int4(weights)):
        log.info("%d projections keep a 4-bit checkpoint's zero levels, fp16 scales or act order, which the native CPU "
                 "int4 kernel does not read: they run XLA's widen-and-multiply, far slower on CPUs (quantization.md); "
                 "quantization='int4' re-quantizes them for the kernel (a second rounding)", slow)
    run = weights_to_run(weights, kernels, resolve_quantized_kernel(layout, quantized_kernel, interpret_kernels), layout)
    return RunningWeights(kernels, run, batch_invariant_weights(run) if batch_invariant else run)
