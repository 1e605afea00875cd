"""Tensor names of a base model saved on its own (`Qwen3Model.save_pretrained`, e5-mistral, a
sentence-transformers checkpoint): the decoder's tensors without the `model.` prefix that a causal
LM's carry (`embed_tokens.weight`, `layers.0.self_attn.q_proj.weight`, `norm.weight`). Checks and
leaf reads go by the causal LM's names; these map them to what the files hold, as vLLM's loader
strips the prefix for pooling models."""

from __future__ import annotations

from pathlib import Path

PREFIX = "model."
BASE_EMBEDDING = "embed_tokens.weight"  # present, and no name prefixed: the decoder was saved alone
HEAD = "lm_head."


def stored_names(index: dict[str, Path], embed: str = PREFIX + BASE_EMBEDDING) -> dict[str, str]:
    """Causal-LM tensor name -> the name stored, for a checkpoint whose decoder tensors lack the prefix of the
    family's embedding name `embed` (`model.`; GPT-2's `transformer.`, as the hub's gpt2 files store them); empty
    for one that has it (its names are the causal LM's). An output head stored beside such tensors (an exporter's
    tied copy) keeps its name: a causal LM's `lm_head` sits outside the prefix too."""
    prefix, base = embed.split(".", 1)
    if base not in index or any(name.startswith(prefix + ".") for name in index):
        return {}
    return {name if name.startswith(HEAD) else f"{prefix}.{name}": name for name in index}


def by_causal_names(index: dict[str, Path]) -> dict[str, Path]:
    """The index under the causal LM's tensor names (itself when they are already)."""
    renamed = stored_names(index)
    return {name: index[stored] for name, stored in renamed.items()} if renamed else index
