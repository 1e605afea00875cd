"""A runner's compiled programs, called directly rather than through jit.

A program is found in the table by what changes between calls (the function, its static
arguments, and the shapes of the arguments after its `fixed` ones, which are the same for a
runner's life: weights, pools, row state); a call it does not hold loads it from the program
store or traces, compiles and stores it first (only a program XLA compiled then is stored:
see `_compile_and_store`). A compiled program checks every argument's type
against what it was compiled for, so a wrong table entry raises rather than runs. Warm-up fills
the table (`plan` on the calling thread, the job it returns on a worker).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxinfer.runtime.memory_maps import COMPILE_EVENT, count_loaded, hold_programs
from jaxinfer.runtime.program_store import ProgramStore, program_key

log = logging.getLogger(__name__)


class Program(NamedTuple):
    """A jitted function with its arguments; the first `fixed` keep their types between calls."""

    function: Callable
    args: list
    kwargs: dict
    fixed: int = 0


class Loaded(NamedTuple):
    """What making a program ready took: seconds, and whether it came from the store."""

    seconds: float
    stored: bool


class Executables:
    """Compiled programs by call signature, backed by a program store (None: trace and compile each)."""

    def __init__(self, store: ProgramStore | None, static_argnames: Callable[[Callable], tuple[str, ...]],
                 compiler_options: dict[str, str] | None = None):
        """compiler_options: XLA options every program compiles with (part of JAX's cache key and of
        the program store's)."""
        self.store, self.static_argnames, self.compiler_options = store, static_argnames, compiler_options
        self.table: dict[tuple, jax.stages.Compiled] = {}
        self.from_store: dict[tuple, str] = {}  # table entries loaded from the store, with their store keys
        hold_programs(self)  # memory_maps.drop_compiled_programs empties it

    def clear(self) -> None:
        self.table.clear()
        self.from_store.clear()

    def distrust_store_after(self, error: BaseException) -> bool:
        """After a call failed with XLA's missing-code error (a stored copy that lacks part of its
        program: see `_compile_and_store`), remove every program this table loaded from the store,
        from the store and the table, so the next calls compile them; True when it did."""
        if not self.from_store or not MISSING_CODE.search(str(error)):
            return False
        log.error("a program loaded from the program store failed (%s); its %d stored programs are removed and "
                  "compile again", error, len(self.from_store))
        for call_key, store_key in self.from_store.items():
            self.store.remove(store_key)
            self.table.pop(call_key, None)
        self.from_store.clear()
        return True

    def __call__(self, program: Program) -> Any:
        """Run the program (made ready first if the table lacks it)."""
        static, dynamic = self._split(program)
        key = self._call_key(program, static, dynamic)
        compiled = self.table.get(key)
        if compiled is None:
            compiled = self._fill(key, *self._compile_job(program, static, dynamic)())
        return compiled(*program.args, **dynamic)

    def plan(self, program: Program) -> Callable[[], Loaded]:
        """Make the program ready: what must hold the GIL (tracing, lowering) is done here, and the
        returned job loads or compiles it, stores it and puts it in the table (a worker may run it)."""
        static, dynamic = self._split(program)
        call_key = self._call_key(program, static, dynamic)
        if call_key in self.table:
            return lambda: Loaded(0.0, False)
        compile_job = self._compile_job(program, static, dynamic)

        def job() -> Loaded:
            began = time.perf_counter()
            compiled, stored_key = compile_job()
            self._fill(call_key, compiled, stored_key)
            return Loaded(time.perf_counter() - began, stored_key is not None)

        return job

    def _fill(self, call_key: tuple, compiled: jax.stages.Compiled, stored_key: str | None) -> jax.stages.Compiled:
        """Put a ready program in the table (stored_key: the store's, where it was loaded from there)."""
        self.table[call_key] = compiled
        if stored_key is not None:
            self.from_store[call_key] = stored_key
        return compiled

    def compiled(self, program: Program) -> jax.stages.Compiled:
        """The program compiled (or loaded), not kept in the table: e.g. to read its memory analysis."""
        static, dynamic = self._split(program)
        return self._compile_job(program, static, dynamic)()[0]

    def _compile_job(
        self, program: Program, static: dict, dynamic: dict
    ) -> Callable[[], tuple[jax.stages.Compiled, str | None]]:
        """A job making the program ready: (compiled, its store key where it was loaded from the store)."""
        keyed = {**static, "compiler_options": self.compiler_options} if self.compiler_options else static
        key = None if self.store is None else program_key(program.function, program.args, keyed, dynamic)
        if key is not None and self.store.has(key):
            def load() -> tuple[jax.stages.Compiled, str | None]:
                compiled = self.store.load(key)
                if compiled is None:  # removed or unreadable since `has`: compile it after all
                    return _compile_and_store(lower(program), self.store, key, self.compiler_options), None
                count_loaded()
                return compiled, key
            return load
        lowered = lower(program)
        return lambda: (_compile_and_store(lowered, self.store, key, self.compiler_options), None)

    def _split(self, program: Program) -> tuple[dict, dict]:
        """The keyword arguments as (static, dynamic)."""
        names = self.static_argnames(program.function)
        static = {k: v for k, v in program.kwargs.items() if k in names}
        return static, {k: v for k, v in program.kwargs.items() if k not in names}

    @staticmethod
    def _call_key(program: Program, static: dict, dynamic: dict) -> tuple:
        leaves, tree = jax.tree.flatten(program.args[program.fixed:])
        shapes = tuple((np.shape(leaf), getattr(leaf, "dtype", type(leaf))) for leaf in leaves)
        return program.function, tuple(sorted(static.items())), tuple(sorted(dynamic)), tree, shapes


def lower(program: Program) -> Any:
    """The program traced and lowered for its arguments (holds the GIL: done on the calling thread)."""
    return program.function.lower(*program.args, **program.kwargs)


def _compile_and_store(
    lowered: Any, store: ProgramStore | None, key: str | None, compiler_options: dict[str, str] | None = None
) -> jax.stages.Compiled:
    """Compile, and store the program only if XLA compiled it here and then.

    An executable XLA:CPU loaded from JAX's persistent cache serializes again without all of its
    code (the stored copy fails at run time, "Function ... not found"). Such an executable also
    comes back, with no cache event, when the same program is compiled again in the process
    (jax's in-memory cache of compilations: e.g. a second engine on the same model). So the store
    takes a program only on positive evidence: this thread saw the backend compile, and no
    persistent-cache hit within it.
    """
    _watch_compiles()
    _COMPILE.backend_compiled = _COMPILE.cache_hit = False
    compiled = lowered.compile(compiler_options)
    fresh = _COMPILE.backend_compiled and not _COMPILE.cache_hit
    if store is not None and key is not None and fresh:
        store.save(key, compiled)
    return compiled


# XLA:CPU's error when an executable lacks a function it calls (a stored copy missing part of its code)
MISSING_CODE = re.compile(r"NOT_FOUND: Function \S+ not found")
_COMPILE = threading.local()  # JAX reports both events on the compiling thread, during compile()
CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def _note_cache_hit(event: str, **kwargs: Any) -> None:
    if event == CACHE_HIT_EVENT:
        _COMPILE.cache_hit = True


def _note_backend_compile(event: str, seconds: float, **kwargs: Any) -> None:
    """Recorded around a compile or a persistent-cache load, never for jax's in-memory cache."""
    if event == COMPILE_EVENT:
        _COMPILE.backend_compiled = True


@functools.cache
def _watch_compiles() -> None:
    jax.monitoring.register_event_listener(_note_cache_hit)
    jax.monitoring.register_event_duration_secs_listener(_note_backend_compile)
