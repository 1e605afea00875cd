"""An engine's step programs as a GPU or a TPU would run them, built on this CPU (tests only).

The runner is switched to the platform's variant (branchless and fixed-trip loops for a GPU;
Pallas kernels of that platform through the pools' `platform`), then each step program is
traced (its jaxpr) or lowered for the platform with `jax.export`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax import export
from jax.extend.core import ClosedJaxpr, Jaxpr

from jaxinfer import LLM
from jaxinfer.cache.paged import PagedKVCache
from jaxinfer.sampling.row_order import TOPK_KERNEL_MAX

EXPORT_PLATFORMS = {"gpu": "cuda", "tpu": "tpu"}
KERNEL_CALLS = {"gpu": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}
# Triton calls carry no compatibility guarantee across jax versions; lowering them is what is checked.
DISABLED = [export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]


def on_platform(pools: Any, platform: str) -> Any:
    """A pool (a draft's or EAGLE head's too) whose Pallas kernels are `platform`'s."""
    if isinstance(pools, PagedKVCache):
        return dataclasses.replace(pools, platform=platform)
    if pools is None or not hasattr(pools, "pages"):  # none, or the device lookup's token pool (no kernels)
        return pools
    return dataclasses.replace(pools, pages=on_platform(pools.pages, platform))


def step_programs(llm: LLM, platform: str) -> list[tuple[tuple, Any, list, dict]]:
    """(shape, program, args, kwargs) of every engine step program in `platform`'s variant."""
    runner = llm.engine.runner
    runner.branchless = platform == "gpu"
    runner.stop_early = platform != "gpu"
    runner.pages, runner.draft = on_platform(runner.pages, platform), on_platform(runner.draft, platform)
    return [(host.shape, *runner.program_for(host)[:3]) for host in llm.engine.step_hosts()]


def equations(jaxpr: Any, platform: str = "cuda") -> Iterator[Any]:
    """Every equation of a jaxpr and of the jaxprs inside it that `platform` runs: Pallas kernels' bodies left
    out, and of a `lax.platform_dependent` choice (a cond over `branches_platforms`) only the platform's branch."""
    for eqn in jaxpr.eqns:
        if _by_platform(eqn):
            yield from equations(_platform_branch(eqn, platform).jaxpr, platform)
            continue
        yield eqn
        if eqn.primitive.name != "pallas_call":
            for sub in _sub_jaxprs(eqn.params.values()):
                yield from equations(sub, platform)


def _by_platform(eqn: Any) -> bool:
    """A cond whose branch the lowering platform picks (no value read back: resolved when lowered)."""
    return eqn.primitive.name == "cond" and eqn.params.get("branches_platforms") is not None


def _platform_branch(eqn: Any, platform: str) -> Any:
    """The branch of a platform-dependent cond that `platform` lowers (a named one, else the default)."""
    named = [i for i, names in enumerate(eqn.params["branches_platforms"]) if names and platform in names]
    default = [i for i, names in enumerate(eqn.params["branches_platforms"]) if names is None]
    return eqn.params["branches"][(named or default)[0]]


def _where(eqn: Any) -> str:
    return f"{eqn.primitive.name} in {eqn.source_info.name_stack or 'the program'}"


def round_trips(jaxpr: Any) -> list[str]:
    """Equations outside Pallas kernels that a GPU runs by reading a value back on the host: every
    `cond`, and every `while` (a loop of static trip count is a `scan`, fori_loop's lowering)."""
    return [_where(eqn) for eqn in equations(jaxpr) if eqn.primitive.name in ("cond", "while")]


def slow_orderings(jaxpr: Any) -> list[str]:
    """Sorts and top-ks a GPU runs without its fast kernels (see sampling/row_order): a sort on a
    float key (XLA's generic sort, not CUB's radix sort), a top_k of k > TOPK_KERNEL_MAX."""
    found = []
    for eqn in equations(jaxpr):
        name = eqn.primitive.name
        if name == "sort" and jnp.issubdtype(eqn.invars[0].aval.dtype, jnp.floating):
            found.append(_where(eqn))
        if name == "top_k" and eqn.params["k"] > TOPK_KERNEL_MAX:
            found.append(f"{_where(eqn)} k={eqn.params['k']}")
    return found


def _sub_jaxprs(values: Any) -> list[Any]:
    out = []
    for value in values:
        if isinstance(value, ClosedJaxpr):
            out.append(value.jaxpr)
        elif isinstance(value, Jaxpr):
            out.append(value)
        elif isinstance(value, (tuple, list)):
            out += _sub_jaxprs(value)
    return out


def gpu_jaxprs(llm: LLM) -> dict[str, Any]:
    """Each GPU-variant step program's jaxpr, by its shape."""
    return {str(shape): program.trace(*args, **kwargs).jaxpr.jaxpr
            for shape, program, args, kwargs in step_programs(llm, "gpu")}


def gpu_round_trips(llm: LLM) -> dict[str, list[str]]:
    """Each GPU-variant step program's host round trips (none expected)."""
    return {shape: round_trips(jaxpr) for shape, jaxpr in gpu_jaxprs(llm).items()}


def lowered_kernels(llm: LLM, platform: str) -> dict[str, int]:
    """Each step program lowered for `platform` with jax.export: how many Pallas kernel calls it holds."""
    out = {}
    with triton_target_without_a_gpu():
        for shape, program, args, kwargs in step_programs(llm, platform):
            exported = export.export(program, platforms=(EXPORT_PLATFORMS[platform],), disabled_checks=DISABLED)(
                *args, **kwargs)
            out[str(shape)] = exported.mlir_module().count(KERNEL_CALLS[platform])
    return out


@contextlib.contextmanager
def triton_target_without_a_gpu() -> Iterator[None]:
    """Lower Triton kernels for an H100 while the default device is no GPU.

    jax 0.10 assumed compute capability 9.0 where no GPU was visible; jax 0.11 reads the target
    from the default device's kind and raises for a CPU (as under JAX_PLATFORMS=cpu on an H200).
    Its table of kinds takes extra entries: the CPU's is mapped to an H100 for the block.
    """
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:  # jax 0.10
        yield
        return
    kind = jax.devices()[0].device_kind
    if gpu_info.gpu_version_from_device_kind(kind) is not None or kind in gpu_info.registry:
        yield
        return
    gpu_info.registry[kind] = lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H100)
    try:
        yield
    finally:
        del gpu_info.registry[kind]
