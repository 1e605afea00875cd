"""Compile a kernel source with the system C++ compiler on first use and register it with XLA.

The shared library is cached per source (with the headers beside it), jaxlib version, CPU
and compiler flags under $JAXINFER_CACHE_DIR (default ~/.cache/jaxinfer). JAXINFER_CXXFLAGS
adds flags (e.g. `-mno-avx512bf16` to build the portable loops). Without a compiler, or with
JAXINFER_CPU_KERNELS=0, `load` returns False and callers keep the pure-XLA path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

log = logging.getLogger(__name__)
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-w")


def flags() -> tuple[str, ...]:
    """The compiler flags: FLAGS, then any from $JAXINFER_CXXFLAGS."""
    return FLAGS + tuple(os.environ.get("JAXINFER_CXXFLAGS", "").split())


def cache_dir() -> Path:
    """Where built kernels live."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxinfer"
    return Path(os.environ.get("JAXINFER_CACHE_DIR", default)) / "cpu_kernels"


def _cpu_signature() -> str:
    """The CPU's model and flags: -march=native code must not move to another machine kind."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def _library_path(source: Path) -> Path:
    """The cached library for this source and its headers, jaxlib (FFI ABI), CPU and flags."""
    headers = [header.read_bytes() for header in sorted(source.parent.glob("*.h"))]
    parts = [source.read_bytes(), *headers, jaxlib.__version__.encode(), _cpu_signature().encode()]
    parts.append(" ".join(flags()).encode())
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return cache_dir() / f"{source.stem}-{key}.so"


def _compile(source: Path, target: Path) -> None:
    """Build into a temporary file, then rename: concurrent builders never see a partial library."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        cmd = [compiler, *flags(), f"-I{jax.ffi.include_dir()}", "-o", str(out), str(source)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr[-2000:]}")
        os.replace(out, target)


@functools.cache
def load(source_name: str, symbol: str, target_name: str) -> bool:
    """Build (once) and register `symbol` of the kernel source as FFI target `target_name`."""
    if os.environ.get("JAXINFER_CPU_KERNELS", "1") == "0":
        return False
    source = Path(__file__).with_name(source_name)
    try:
        library = _library_path(source)
        if not library.is_file():
            _compile(source, library)
        handler = getattr(ctypes.cdll.LoadLibrary(str(library)), symbol)
        jax.ffi.register_ffi_target(target_name, jax.ffi.pycapsule(handler), platform="cpu")
    except (OSError, RuntimeError, AttributeError) as err:
        log.warning("CPU kernel %s unavailable, using XLA's dot instead: %s", source_name, err)
        return False
    return True
