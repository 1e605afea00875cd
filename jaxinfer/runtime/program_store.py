"""Compiled programs kept on disk, so that a warm start neither traces nor compiles them.

JAX's persistent compilation cache skips compiling, but finding a program in it takes tracing
and lowering the Python function first, and that is most of a warm start (4.9 of 5.1 s for the
CPU demo's 17 programs). This store keeps each compiled executable
(`jax.experimental.serialize_executable`) under a key of everything that decides the program,
read without tracing it:

- the directory: the source of jaxinfer and pallas_kernels (any edit starts a new store), jax and
  jaxlib, the backend's platform and version, the devices, XLA_FLAGS, the JAXINFER_* environment
  and the jax options that change lowering;
- the file: the function, its static arguments, and the tree, type, shape, dtype and sharding of
  every argument.

Only programs XLA compiled then are saved (runtime/executables: XLA:CPU re-serializes one
loaded from JAX's cache without all of its code), and a copy that fails at run time for lack of
its code has the runner's stored programs removed and compiled again. An entry also names the
CPU kernels that were registered when it was saved (the FFI targets it may call): they are
registered before it loads, and the devices it runs on, in its device assignment's order (a mesh
may hold only some of the devices), which it loads onto. A sharded program's argument trees name
its mesh's devices: they are pickled by platform and id (`_Pickler`), and an entry that still does
not pickle is not stored (the program runs; it compiles again next start). The store lives beside
JAX's cache and is on when that is (runtime/compile_cache), on one process, unless
JAXINFER_PROGRAM_STORE=0 (what it cannot see is code changed in memory: a patched traced function
needs the store off, as the test suite has it). Only the newest stores are kept.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import logging
import os
import pickle
import shutil
import threading
from pathlib import Path
from typing import Any

import jax
import jaxlib
import numpy as np
from jax.experimental import serialize_executable

from jaxinfer.kernels.cpu.build import load as load_kernel
from jaxinfer.kernels.cpu.build import registered_kernels
from jaxinfer.runtime.compile_cache import OFF_VALUES

log = logging.getLogger(__name__)

SUBDIR = "jaxinfer-programs"  # inside JAX's compilation cache directory
KEEP_STORES = 3  # stores (code and platform versions) kept; older ones are removed
SOURCE_SUFFIXES = (".py", ".cc", ".h")
PACKAGES = ("jaxinfer", "pallas_kernels")
JAX_OPTIONS = (
    "jax_enable_x64", "jax_default_matmul_precision", "jax_default_prng_impl", "jax_threefry_partitionable",
    "jax_use_shardy_partitioner", "jax_numpy_dtype_promotion", "jax_pallas_use_mosaic_gpu",
)
ENVIRONMENT = ("XLA_FLAGS", "LIBTPU_INIT_ARGS")
ENV_SWITCH = "JAXINFER_PROGRAM_STORE"  # 0/false/no/off: trace every program (e.g. while patching traced code)
UNSTABLE = " at 0x"  # a repr with an address differs in every process: such a key is never stored


@functools.cache
def code_digest() -> str:
    """sha256 of every source file (Python and the CPU kernels' C++) of the packages the programs come from."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(p for p in root.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def platform_digest() -> str:
    """sha256 of what besides the code changes a compiled program: versions, devices, flags and options."""
    backend = jax.devices()[0].client
    devices = [(d.id, d.device_kind, d.process_index) for d in jax.devices()]
    environment = sorted((k, v) for k, v in os.environ.items() if k in ENVIRONMENT or k.startswith("JAXINFER_"))
    options = [(name, str(getattr(jax.config, name, None))) for name in JAX_OPTIONS]
    material = (jax.__version__, jaxlib.__version__, backend.platform, backend.platform_version, devices,
                environment, options)
    return hashlib.sha256(repr(material).encode()).hexdigest()


def stable_repr(value: Any) -> str:
    """A static argument as text that is the same in every process (functions by their qualified names)."""
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    if hasattr(value, "__dataclass_fields__"):
        fields = ", ".join(f"{name}={stable_repr(getattr(value, name))}" for name in value.__dataclass_fields__)
        return f"{type(value).__qualname__}({fields})"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__name__}({', '.join(stable_repr(v) for v in value)})"
    return repr(value)


def leaf_signature(leaf: Any) -> str:
    """What of an argument leaf a compiled program depends on: its type, shape, dtype and placement."""
    if isinstance(leaf, jax.Array):
        return f"jax {leaf.shape} {leaf.dtype} weak={leaf.weak_type} {leaf.sharding}"
    if isinstance(leaf, (np.ndarray, np.generic)):
        return f"numpy {leaf.shape} {leaf.dtype}"
    return f"{type(leaf).__qualname__} {leaf!r}"


def program_key(function: Any, args: list, static: dict[str, Any], dynamic: dict[str, Any]) -> str | None:
    """The file name a compiled program is stored under, or None where some part has no stable text."""
    leaves, tree = jax.tree.flatten((tuple(args), dynamic))
    material = "\n".join([
        f"{function.__module__}.{function.__qualname__}",
        *(f"{name}={stable_repr(value)}" for name, value in sorted(static.items())),
        str(tree),
        *map(leaf_signature, leaves),
    ])
    if UNSTABLE in material:
        return None
    return hashlib.sha256(material.encode()).hexdigest()


def default_store() -> ProgramStore | None:
    """The store beside JAX's compilation cache (see `store_beside`)."""
    return store_beside(jax.config.jax_compilation_cache_dir)


def store_beside(cache_dir: str | None) -> ProgramStore | None:
    """A store inside JAX's compilation cache directory, or None where that is off or remote, where
    programs span processes, or where JAXINFER_PROGRAM_STORE says off."""
    if not cache_dir or "://" in cache_dir or jax.process_count() > 1:
        return None
    if os.environ.get(ENV_SWITCH, "1").strip().lower() in OFF_VALUES:
        return None
    return ProgramStore(Path(cache_dir) / SUBDIR)


def device_by_id(platform: str, device_id: int) -> jax.Device:
    """This process's device of that platform and id (a stored program's mesh names its devices so)."""
    return next(d for d in jax.devices(platform) if d.id == device_id)


class _Pickler(pickle.Pickler):
    """Pickles devices by platform and id: a sharded program's argument trees hold its mesh, whose
    devices do not pickle. The store's directory key names the devices, so the ids mean the same
    devices when an entry loads."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, jax.Device):
            return device_by_id, (obj.platform, obj.id)
        return NotImplemented


def _dumps(entry: dict) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer).dump(entry)
    return buffer.getvalue()


class ProgramStore:
    """Compiled programs of this code and platform, one file each under `directory`."""

    def __init__(self, root: Path):
        self.root = root
        self.directory = root / f"{code_digest()[:20]}-{platform_digest()[:20]}"
        self._pruned = False

    def has(self, key: str) -> bool:
        return self._path(key).is_file()

    def load(self, key: str) -> jax.stages.Compiled | None:
        """The stored program, or None (an unreadable entry is removed, with a warning)."""
        path = self._path(key)
        try:
            entry = pickle.loads(path.read_bytes())  # devices come back by platform and id: `_Pickler`
            for kernel in entry["kernels"]:
                load_kernel(*kernel)
            # Onto the devices it was compiled for, in their order (by default it would load onto every
            # device of the backend, and XLA aborts where a mesh holds only some of them).
            return serialize_executable.deserialize_and_load(entry["payload"], entry["in_tree"], entry["out_tree"],
                                                             execution_devices=entry["devices"])
        except FileNotFoundError:
            return None
        except Exception as err:  # noqa: BLE001 - any damage to an entry means: compile it again
            log.warning("removing the stored program %s, which does not load (%s: %s); it compiles again",
                        path, type(err).__name__, err)
            path.unlink(missing_ok=True)
            return None

    def remove(self, key: str) -> None:
        """Drop an entry (one that failed at run time), if it is there."""
        self._path(key).unlink(missing_ok=True)

    def save(self, key: str, compiled: jax.stages.Compiled) -> bool:
        """Store a compiled program (written whole, then renamed: readers never see part of one)."""
        try:
            payload, in_tree, out_tree = serialize_executable.serialize(compiled)
        except Exception as err:  # noqa: BLE001 - a program the backend cannot serialize is compiled each start
            log.info("a compiled program is not stored (%s: %s)", type(err).__name__, err)
            return False
        devices = list(compiled.runtime_executable().local_devices())  # the device assignment, in order
        entry = dict(payload=payload, in_tree=in_tree, out_tree=out_tree, kernels=registered_kernels(), devices=devices)
        path = self._path(key)
        try:
            data = _dumps(entry)
        except (TypeError, pickle.PicklingError, AttributeError) as err:  # a program is never lost to its copy
            log.info("a compiled program is not stored (%s: %s)", type(err).__name__, err)
            return False
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
            partial.write_bytes(data)
            os.replace(partial, path)
        except OSError as err:
            log.warning("could not store a compiled program in %s: %s", path.parent, err)
            return False
        self._prune()
        return True

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.program"

    def _prune(self) -> None:
        """Remove all but the KEEP_STORES most recently written stores (older code or platforms), once."""
        if self._pruned:
            return
        self._pruned = True
        self.directory.touch()
        stores = sorted((d for d in self.root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
        for old in stores[KEEP_STORES:]:
            if old != self.directory:
                shutil.rmtree(old, ignore_errors=True)
