"""Compile a kernel source with the system C++ compiler on first use and register it with XLA.

Only flags written here reach the compiler (no `CXX` or flag variables from the environment).
The library is built into a directory the user owns and no one else can write (mode 0o700,
under ~/.cache/jaxinfer, or $JAXINFER_CACHE_DIR) and named by a hash of the source with its
headers, jaxlib version, CPU and flags. Its own SHA-256, recorded beside it at build time, is
checked before every dlopen; a mismatch rebuilds it. Without a compiler `load` returns False
(one log line) and callers keep XLA's ops.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import jax
import jaxlib

log = logging.getLogger(__name__)
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-std=c++17", "-shared", "-fPIC", "-Wall")
COMPILERS = ("g++", "clang++")


class KernelBuildError(RuntimeError):
    """A kernel that could not be built or verified; the message says why."""


@functools.cache
def compiler() -> str | None:
    """The C++ compiler on PATH (g++, else clang++), or None, said once in the log."""
    found = next((path for name in COMPILERS if (path := shutil.which(name))), None)
    if found is None:
        log.warning("no C++ compiler (g++ or clang++) on PATH: jaxinfer's CPU kernels are off, XLA's ops run instead")
    return found


def cache_dir() -> Path:
    """Where built kernels live: a directory private to this user."""
    default = Path.home() / ".cache" / "jaxinfer"
    return Path(os.environ.get("JAXINFER_CACHE_DIR", default)) / "cpu_kernels"


def private_dir(path: Path) -> Path:
    """`path`, created with mode 0o700 if missing; refused unless this user owns it and only they can write it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise KernelBuildError(f"kernel cache {path} is owned by uid {info.st_uid}, not this user ({os.getuid()})")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KernelBuildError(f"kernel cache {path} is writable by others (mode {oct(info.st_mode & 0o777)})")
    return path


def _cpu_signature() -> str:
    """The CPU's model and flags: -march=native code must not move to another machine kind."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return os.uname().machine
    wanted = [line for line in lines if line.startswith(("model name", "flags"))][:2]
    return "\n".join(wanted)


def library_name(source: Path, flags: tuple[str, ...]) -> str:
    """File name of the library for this source and its headers, jaxlib (FFI ABI), CPU and flags."""
    headers = [header.read_bytes() for header in sorted(source.parent.glob("*.h"))]
    parts = [source.read_bytes(), *headers, jaxlib.__version__.encode(), _cpu_signature().encode()]
    parts.append(" ".join(flags).encode())
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return f"{source.stem}-{key}.so"


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _digest_path(library: Path) -> Path:
    return library.with_suffix(".sha256")


def verified(library: Path) -> bool:
    """Whether the library exists, belongs to this user and still has the digest recorded at its build."""
    digest = _digest_path(library)
    if not (library.is_file() and digest.is_file()) or library.stat().st_uid != os.getuid():
        return False
    return digest.read_text().strip() == file_digest(library)


def compile_library(source: Path, target: Path, flags: tuple[str, ...]) -> None:
    """Build into a temporary file, record its digest, then rename: no one sees a partial library."""
    cxx = compiler()
    if cxx is None:
        raise KernelBuildError("no C++ compiler on PATH")
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        # -isystem: the FFI headers' own warnings are not ours to fix; the kernel's are shown.
        cmd = [cxx, *flags, "-isystem", jax.ffi.include_dir(), "-o", str(out), str(source)]
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise KernelBuildError(f"{' '.join(cmd)} failed:\n{result.stderr[-2000:]}")
        if result.stderr.strip():
            log.warning("building %s:\n%s", source.name, result.stderr[-2000:])
        tmp_digest = Path(tmp) / "digest"
        tmp_digest.write_text(file_digest(out))
        os.replace(tmp_digest, _digest_path(target))
        os.replace(out, target)


_registered: dict[str, bool] = {}
_specs: dict[str, tuple[str, str, str, tuple[str, ...]]] = {}  # target -> load()'s arguments, for those registered


def load(source_name: str, symbol: str, target_name: str, extra_flags: tuple[str, ...] = ()) -> bool:
    """Build (once), verify and register `symbol` of the kernel source as FFI target `target_name`.

    The first call per target decides (later `extra_flags` are ignored: XLA keeps one handler
    per name). `extra_flags` exist for tests, e.g. `-mno-avx512bf16` for the portable loops.
    """
    if target_name not in _registered:
        _registered[target_name] = _build_and_register(source_name, symbol, target_name, FLAGS + extra_flags)
        if _registered[target_name]:
            _specs[target_name] = (source_name, symbol, target_name, extra_flags)
    return _registered[target_name]


def registered_kernels() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """`load`'s arguments for every kernel registered in this process: what a program compiled now may
    call, so a process loading that program (runtime/program_store) registers them first."""
    return list(_specs.values())


def _build_and_register(source_name: str, symbol: str, target_name: str, flags: tuple[str, ...]) -> bool:
    if compiler() is None:
        return False
    source = Path(__file__).with_name(source_name)
    try:
        library = private_dir(cache_dir()) / library_name(source, flags)
        if not verified(library):
            compile_library(source, library, flags)
        if not verified(library):  # replaced between the build and this check
            raise KernelBuildError(f"{library} does not match the digest recorded when it was built")
        handler = getattr(ctypes.cdll.LoadLibrary(str(library)), symbol)
        jax.ffi.register_ffi_target(target_name, jax.ffi.pycapsule(handler), platform="cpu")
    except (OSError, KernelBuildError, AttributeError) as err:
        log.warning("CPU kernel %s unavailable, using XLA's ops instead: %s", source_name, err)
        return False
    return True
