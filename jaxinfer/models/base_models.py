"""HF architectures that pool and never generate: a base model (a decoder saved without its output head,
as embedding models ship: e5-mistral's `MistralModel`, bge-multilingual-gemma2's `Gemma2Model`, a
`Qwen3Model` saved by sentence-transformers) and a sequence classifier (`Qwen2ForSequenceClassification`,
`LlamaForSequenceClassification`, ...: reward models, classifiers, cross-encoder rerankers: the decoder plus
a `score` head [num_labels, D] on the last token's state). Each runs as the causal LM whose `model.` it is,
with no output head to read, so it serves `LLM(runner="pooling")` and never generates."""

from __future__ import annotations

from jaxinfer.models.encoder_config import is_encoder

BASE_MODELS = {
    "LlamaModel": "LlamaForCausalLM",
    "MistralModel": "MistralForCausalLM",
    "Qwen2Model": "Qwen2ForCausalLM",
    "Qwen3Model": "Qwen3ForCausalLM",
    "GemmaModel": "GemmaForCausalLM",
    "Gemma2Model": "Gemma2ForCausalLM",
}
CLASSIFIER_SUFFIX = "ForSequenceClassification"  # HF's generic seq-cls head over any decoder: `score`, no bias


def causal_architecture(architecture: str) -> str:
    """The causal-LM architecture whose decoder `architecture` is (itself when it is one)."""
    if is_classifier(architecture):
        return architecture.removesuffix(CLASSIFIER_SUFFIX) + "ForCausalLM"
    return BASE_MODELS.get(architecture, architecture)


def is_base_model(architecture: str) -> bool:
    """Whether `architecture` names a decoder without an output head."""
    return architecture in BASE_MODELS


def is_classifier(architecture: str) -> bool:
    """Whether `architecture` names a decoder with a sequence-classification (`score`) head."""
    return architecture.endswith(CLASSIFIER_SUFFIX)


def pools_only(architecture: str) -> bool:
    """Whether `architecture` has no output head to generate with: a base model, a classifier or an encoder
    (BERT, RoBERTa, XLM-R: models/encoder_config)."""
    return is_base_model(architecture) or is_classifier(architecture) or is_encoder(architecture)
