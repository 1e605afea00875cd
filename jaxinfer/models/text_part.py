"""Vision-language checkpoints whose language model runs alone, text in and text out, as vLLM runs them text-only.

Meta ships Llama 4 as Llama4ForConditionalGeneration: the config nests the text model's under `text_config`,
and the checkpoint stores it under `language_model.` (`language_model.model.layers.*`, `language_model.lm_head.*`)
beside the vision tower (`vision_model.*`) and its projector (`multi_modal_projector.*`). The text config is
read as the model's and the text tensors under their prefix; the vision tensors are skipped at load (one log
line) and no image can reach the model: its vision tower never runs (Qwen3.5's conditional-generation checkpoints
run their tower: models/qwen2_vl). As transformers ties the output head by the outer config's
`tie_word_embeddings`, so does the text config here. Google ships Gemma 4 as Gemma4ForConditionalGeneration:
`model.language_model.*` (read under that name: `TextPart.replaced`) beside `model.vision_tower.*`,
`model.audio_tower.*` and their embedders, all skipped here (its vision tower and embedder are read apart, where
the config has a `vision_config`: checkpoint/gemma4_vision_weights; audio is refused). Gemma 3n's
Gemma3nForConditionalGeneration is laid out as Gemma 4's; its MobileNet vision tower and audio tower are never
read: it runs text only. So is Gemma4UnifiedForConditionalGeneration, its encoder-free image and audio embedders
(`model.vision_embedder.*`, `model.embed_vision.*`, `model.embed_audio.*`) skipped: text only. Moonshot ships Kimi
K2.5 laid out as Llama 4 (`language_model.model.*`, `language_model.lm_head.*`) beside its MoonViT tower
(`vision_tower.*`) and projector (`mm_projector.*`, which transformers saves in part as `model.mm_projector.*`):
models/kimi_k25. Apertus 1.5's
Apertus1p5ForConditionalGeneration is laid out as Gemma 4's, its vision and audio tokenizers
(`model.vision_tokenizer.*`, `model.audio_tokenizer.*`) skipped: models/apertus.
Mistral Large 4's MistralLarge4ForConditionalGeneration checkpoints keep Mistral's own names, the language model's
at the top (`layers.*`, `tok_embeddings.*`) beside the Pixtral tower (`vision_encoder.*`) and its projector, never
read: it runs text only. Qwen4-Exp's Qwen4ExpForConditionalGeneration keeps Qwen3.5's layout
(`model.language_model.*` beside `model.visual.*`); its tower is not run here (models/qwen4_exp): text only.
So does Cohere's CohereCompassForConditionalGeneration (Qwen3-VL's layout): its tower is not run either
(models/cohere_compass), and LG's Exaone4_5_ForConditionalGeneration (Qwen2-VL's layout around EXAONE 4.0's
language model: models/exaone4). StepFun's Step3p7ForConditionalGeneration keeps its language model's names at the
causal LM's (`model.*`, `lm_head.*`) beside its tower (`vision_model.*`) and projector (`vit_large_projector.*`),
never read: models/step3p7. MuseGlimmerForConditionalGeneration keeps its language model under
`model.language_model.*` (its head `lm_head.*`) beside its tower, adapter and projection (`model.vision_tower.*`,
`model.vision_adapter.*`, `model.vision_projection.*`), never read: models/muse_glimmer. So does
MuseSparkForConditionalGeneration, beside its audio tower too (`model.audio_tower.*`): models/muse_spark.
MiniMax's MiniMaxM3SparseForConditionalGeneration is laid out as Llama 4
(`language_model.model.*`, `language_model.lm_head.*`) beside its tower (`vision_tower.*`), projector and patch
merger, never read: text only (models/minimax_m3). Meta's MllamaForConditionalGeneration (Llama 3.2 Vision) is
laid out as Llama 4, its tower and projector not read (models/mllama): text only. LiquidAI's
Lfm2VlForConditionalGeneration keeps `model.language_model.*` (read as the causal LM's names by
checkpoint/vision_weights, as Qwen4-Exp's) beside `model.vision_tower.*` and `model.multi_modal_projector.*`, never
read: text only (models/lfm2).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Iterable, Mapping

from jaxinfer.config.model import ConfigError, field

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TextPart:
    """Where a vision-language checkpoint keeps its language model, and the prefixes of what is skipped.

    replaced: the start of a causal LM's tensor names that `prefix` stands in for ('' puts it before every name;
    Gemma 4 keeps `model.*` under `model.language_model.*` and its tied head nowhere)."""

    prefix: str
    skipped: tuple[str, ...]
    replaced: str = ""


TEXT_PARTS = {
    **dict.fromkeys(("Llama4ForConditionalGeneration", "MllamaForConditionalGeneration"),
                    TextPart("language_model.", ("vision_model.", "multi_modal_projector."))),
    "Gemma4ForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                                  "model.embed_audio."), replaced="model."),
    "Gemma4UnifiedForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_embedder.", "model.embed_vision.", "model.embed_audio."),
        replaced="model."),
    "Gemma3nForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.",
                                  "model.embed_audio."), replaced="model."),
    **dict.fromkeys(("Kimi_K25ForConditionalGeneration", "KimiK25ForConditionalGeneration"), TextPart(
        "language_model.", ("vision_tower.", "mm_projector.", "model.vision_tower.", "model.mm_projector."))),
    "Apertus1p5ForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_tokenizer.", "model.audio_tokenizer."), replaced="model."),
    # its language model's names are read as the causal LM's by checkpoint/vision_weights, as Qwen3.5's are
    "Qwen4ExpForConditionalGeneration": TextPart("", ("model.visual.",)),
    "CohereCompassForConditionalGeneration": TextPart("", ("model.visual.",)),
    "Exaone4_5_ForConditionalGeneration": TextPart("", ("model.visual.",)),
    "Step3p7ForConditionalGeneration": TextPart("", ("vision_model.", "vit_large_projector.")),
    "MuseGlimmerForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_tower.", "model.vision_adapter.", "model.vision_projection."),
        replaced="model."),
    "MiniMaxM3SparseForConditionalGeneration": TextPart(
        "", ("vision_tower.", "multi_modal_projector.", "patch_merge_mlp.")),
    "MuseSparkForConditionalGeneration": TextPart(
        "model.language_model.", ("model.vision_tower.", "model.vision_adapter.", "model.vision_projection.",
                                  "model.audio_tower."), replaced="model."),
    "Lfm2VlForConditionalGeneration": TextPart("", ("model.vision_tower.", "model.multi_modal_projector.")),
    "MistralLarge4ForConditionalGeneration": TextPart(
        "", ("vision_encoder.", "vision_language_adapter.", "patch_merger.", "pre_mm_projector_norm.")),
}


def text_config(hf: Mapping[str, Any], architecture: str) -> Mapping[str, Any]:
    """The config the language model is read from: `text_config` for a TEXT_PARTS architecture (with the
    checkpoint's architecture and quantization), the config itself otherwise."""
    if architecture not in TEXT_PARTS:
        return hf
    text = hf.get("text_config")
    if not isinstance(text, Mapping):
        raise ConfigError(f"text_config {text!r} is not supported: a {architecture} config nests its language "
                          "model's settings there as an object")
    quantization = hf.get("quantization_config") or text.get("quantization_config")
    tie = field(hf, "tie_word_embeddings", text.get("tie_word_embeddings"))
    return {**text, "architectures": [architecture], "quantization_config": quantization, "tie_word_embeddings": tie}


def stored_name(architecture: str, name: str) -> str:
    """A causal LM's tensor name as the checkpoint of `architecture` stores it (unchanged for a text model)."""
    part = TEXT_PARTS.get(architecture)
    if part is None or not name.startswith(part.replaced):
        return name
    return part.prefix + name[len(part.replaced):]


def skipped_tensors(architecture: str, names: Iterable[str]) -> set[str]:
    """The vision tower's and projector's tensors among `names` (not read), with one log line when there are any."""
    part = TEXT_PARTS.get(architecture)
    skipped = {n for n in names if n.startswith(part.skipped)} if part else set()
    if skipped:
        logger.info("%s: %d vision tower and projector tensors skipped; the language model runs alone "
                    "(text in, text out: images are not supported)", architecture, len(skipped))
    return skipped
