"""Sessions: a prompt's KV cache saved to disk and restored into another engine's prefix cache.

Saving copies the pages the prefix cache holds for the prompt's full pages; loading writes them
into fresh pages of the pool and publishes them under the prompt's page hashes, as a finished
request leaves its pages. A later prompt that starts with the session's tokens then skips their
prefill, in this process or a later one (llama.cpp's slot save/restore; vLLM has no equivalent).
The pages stay evictable like any cached prefix. `LLM.save_session` computes the KV first when
the prompt is not cached.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from jaxinfer.checkpoint import kv_session
from jaxinfer.checkpoint.kv_session import SessionInfo
from jaxinfer.engine.block_manager import OutOfPages
from jaxinfer.engine.engine import LLMEngine


def session_settings(engine: LLMEngine, fingerprint: str) -> dict:
    """What a session must match to load into `engine` (see kv_session.check_compatible)."""
    runner = engine.runner
    return dict(fingerprint=fingerprint, page_size=engine.config.page_size,
                kv_cache_dtype=runner.cache_spec.kv_dtype, buffers=runner.page_specs())


def save_session(engine: LLMEngine, path: str | Path, token_ids: list[int], fingerprint: str,
                 overwrite: bool = False) -> SessionInfo:
    """Write the cached KV of token_ids' full pages to `path`; every one of them must be cached."""
    check_engine(engine)
    page_size = engine.config.page_size
    full = len(token_ids) // page_size
    if full == 0:
        raise ValueError(f"a prompt of {len(token_ids)} tokens fills no page (page_size={page_size}); a session "
                         "stores whole pages of KV")
    engine.land_in_flight()
    pages, _ = engine.blocks.match_pages(token_ids[: full * page_size])
    try:
        if len(pages) < full:
            raise RuntimeError(f"{len(pages)} of the prompt's {full} full pages are cached (the pool evicted the "
                               "rest); save it again with fewer requests running, or a larger pool")
        values = engine.runner.read_pages(pages)
    finally:
        engine.blocks.release(pages)
    kv_session.write_session(Path(path), session_settings(engine, fingerprint), token_ids, values, overwrite)
    return SessionInfo(Path(path).absolute(), list(token_ids), full * page_size)


def load_session(engine: LLMEngine, path: str | Path, fingerprint: str) -> SessionInfo:
    """Restore a saved session's pages into the engine's prefix cache (those already cached are kept)."""
    check_engine(engine)
    path = Path(path).absolute()
    meta = kv_session.read_meta(path)
    kv_session.check_compatible(path, meta, session_settings(engine, fingerprint))
    values = kv_session.read_pages(path)
    token_ids, page_size = meta["token_ids"], engine.config.page_size
    full = next(iter(values.values())).shape[2]
    covered = token_ids[: full * page_size]
    engine.land_in_flight()
    blocks = engine.blocks
    held, hashes = blocks.match_pages(covered)
    try:
        fresh = blocks.allocate(full - len(held), after=held[-1] if held else None)
    except OutOfPages:
        blocks.release(held)
        raise ValueError(f"session {path} needs {full - len(held)} free pages, the pool has {blocks.usable_pages} "
                         "free or evictable; load it into an LLM with a larger pool (num_pages or "
                         "gpu_memory_utilization), or with fewer requests running") from None
    try:
        engine.move_pages()  # pages the allocation evicted go to the host tier before they are overwritten
        if fresh:
            tokens = np.asarray(covered, np.int32).reshape(full, page_size)[len(held):]
            engine.runner.write_pages(fresh, {name: stacked[:, :, len(held):] for name, stacked in values.items()},
                                      tokens)
            blocks.register(covered, held + fresh, list(hashes), full)
    finally:
        blocks.release(held + fresh)
    return SessionInfo(path, list(token_ids), full * page_size, len(fresh))


def check_engine(engine: LLMEngine) -> None:
    """Sessions go through the prefix cache, and are read and written by one process."""
    if not engine.config.enable_prefix_caching:
        raise ValueError("sessions are restored into the prefix cache, which this LLM has off "
                         "(enable_prefix_caching=False); make it with enable_prefix_caching=True")
    if jax.process_count() > 1:
        raise NotImplementedError("sessions are saved and loaded by single-process engines; this one spans "
                                  f"{jax.process_count()} processes")
