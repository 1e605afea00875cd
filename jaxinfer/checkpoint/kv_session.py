"""Saved sessions on disk: a prompt's token ids and the KV pages of its full pages, as an orbax checkpoint.

A session directory holds `session.json` (what it was saved from: the weights' fingerprint, the
page size and each buffer's shape and stored dtype, the token ids) and `kv/`, an orbax checkpoint
of the pages (per buffer [L, KV, pages, page_size, ...]). It loads only where those match: KV
written by other weights, or laid out otherwise, would give wrong text without an error.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config.errors import CheckpointError

FORMAT = "jaxinfer-kv-session"
VERSION = 1
META_FILE = "session.json"
KV_SUBDIR = "kv"
SAMPLED_VALUES = 64  # per weight leaf, hashed into the fingerprint


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    """A saved or loaded session: where it is, its prompt's token ids, and how many of them have KV
    stored (whole pages); `pages_written`: pages a load wrote into the pool (0 where already cached)."""

    path: Path
    token_ids: list[int]
    num_cached_tokens: int
    pages_written: int = 0


def weights_fingerprint(weights: Any) -> str:
    """A short hash of the weights' tree, shapes, dtypes and the first values of every leaf: tells
    the weights a session was saved from from any others (a fine-tune changes them all)."""
    leaves, tree = jax.tree.flatten(weights)
    digest = hashlib.blake2b(str(tree).encode(), digest_size=12)
    digest.update(str([(leaf.shape, jnp.dtype(leaf.dtype).name) for leaf in leaves]).encode())
    digest.update(np.asarray(_first_values(leaves)).tobytes())
    return digest.hexdigest()


@jax.jit
def _first_values(leaves: list[jax.Array]) -> jax.Array:
    """The first SAMPLED_VALUES values of each leaf's first row, as float32, end to end."""
    rows = [leaf.reshape(1) if leaf.ndim == 0 else leaf[(0,) * (leaf.ndim - 1)] for leaf in leaves]
    return jnp.concatenate([row[:SAMPLED_VALUES].astype(jnp.float32) for row in rows])


def session_target(path: str | Path, overwrite: bool) -> Path:
    """`path` as an absolute directory a session may be written to (new, empty, or a saved session when
    `overwrite`); a CheckpointError naming it otherwise. Callers check early, before minutes of work."""
    path = Path(path).absolute()
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"session path {path} is a file; give a directory to save the session into")
    if path.is_dir() and any(path.iterdir()) and (not overwrite or not (path / META_FILE).is_file()):
        raise CheckpointError(f"session path {path} is not empty; give a new or empty directory"
                              + ("" if overwrite else ", or pass overwrite=True to replace a saved session"))
    return path


def write_session(path: Path, meta: dict, token_ids: list[int], pages: dict[str, np.ndarray], overwrite: bool) -> None:
    """Write a session directory at `path` (new or empty, or replaced when `overwrite`)."""
    from orbax import checkpoint as ocp

    path = session_target(path, overwrite)
    if path.is_dir() and any(path.iterdir()):
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / KV_SUBDIR, pages)
    meta = {"format": FORMAT, "version": VERSION, **meta, "token_ids": [int(t) for t in token_ids]}
    (path / META_FILE).write_text(json.dumps(meta) + "\n")  # last: a directory without it is not a session


def read_meta(path: Path) -> dict:
    """A session's `session.json`, checked to be one this version reads."""
    path = Path(path).absolute()
    file = path / META_FILE
    if not file.is_file():
        raise CheckpointError(f"session path {path} holds no {META_FILE}; give a directory written by save_session")
    meta = json.loads(file.read_text())
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise CheckpointError(f"{file}: format {meta.get('format')!r} version {meta.get('version')!r}; this "
                              f"jaxinfer reads {FORMAT!r} version {VERSION}")
    return meta


def read_pages(path: Path) -> dict[str, np.ndarray]:
    """A session's stored pages, per buffer [L, KV, pages, page_size, ...], on the host."""
    from orbax import checkpoint as ocp

    with ocp.StandardCheckpointer() as checkpointer:
        return {name: np.asarray(value) for name, value in checkpointer.restore(Path(path).absolute() / KV_SUBDIR).items()}


def check_compatible(path: Path, meta: dict, expected: dict) -> None:
    """Raise naming the first setting in which the session differs from the engine loading it.

    expected: this engine's `fingerprint`, `page_size`, `kv_cache_dtype` and `buffers` (see
    `session_settings`)."""
    if meta["fingerprint"] != expected["fingerprint"]:
        raise CheckpointError(
            f"session {path} was saved from other weights (fingerprint {meta['fingerprint']}, this model's "
            f"{expected['fingerprint']}): load it into the model, dtype and quantization it was saved with")
    for field in ("page_size", "kv_cache_dtype"):
        if meta[field] != expected[field]:
            raise CheckpointError(f"session {path} was saved with {field}={meta[field]!r}, this engine has "
                                  f"{expected[field]!r}: load it into an LLM made with {field}={meta[field]!r}")
    saved = {name: [list(shape), dtype] for name, (shape, dtype) in meta["buffers"].items()}
    here = {name: [list(shape), dtype] for name, (shape, dtype) in expected["buffers"].items()}
    if saved != here:
        raise CheckpointError(f"session {path} holds KV buffers {saved}, this engine's pools are {here} "
                              "(layers, kv heads, page size, head size and stored dtype must match)")
