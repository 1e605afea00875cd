"""HF base-model architectures: a decoder saved without its output head, as embedding models ship
(e5-mistral's `MistralModel`, bge-multilingual-gemma2's `Gemma2Model`, a `Qwen3Model` saved by
sentence-transformers). Each runs as the causal LM whose `model.` it is, with no head to read, so it
serves embeddings (`LLM(runner="pooling")`) and never generates."""

from __future__ import annotations

BASE_MODELS = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
    "GemmaModel": "GemmaForCausalLM",
    "Gemma2Model": "Gemma2ForCausalLM",
}


def causal_architecture(architecture: str) -> str:
    """The causal-LM architecture whose decoder `architecture` is (itself when it is not a base model)."""
    return BASE_MODELS.get(architecture, architecture)


def is_base_model(architecture: str) -> bool:
    """Whether `architecture` names a decoder without an output head."""
    return architecture in BASE_MODELS
