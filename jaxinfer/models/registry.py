"""The model registry: HF `architectures` -> the family module that runs it.

A new family is a new module defining `FAMILY` (see `models.family`) and one entry in
`FAMILIES`. Configs are read here because the family decides what its fields mean.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

from jaxinfer.config.generation import generation_defaults, merge_ids
from jaxinfer.config.model import ConfigError, ModelConfig, read_config_json
from jaxinfer.config.packed_checkpoint import packed_scheme
from jaxinfer.config.scaled_checkpoint import scale_scheme
from jaxinfer.models.afmoe import FAMILY as AFMOE
from jaxinfer.models.apertus import FAMILY as APERTUS
from jaxinfer.models.arcee import FAMILY as ARCEE
from jaxinfer.models.axk1 import FAMILY as AXK1
from jaxinfer.models.axk2 import FAMILY as AXK2
from jaxinfer.models.bailing_hybrid import FAMILY as BAILING_HYBRID
from jaxinfer.models.bamba import FAMILY as BAMBA
from jaxinfer.models.base_models import causal_architecture, pools_only
from jaxinfer.models.beam import FAMILY as BEAM
from jaxinfer.models.bitnet import FAMILY as BITNET
from jaxinfer.models.bloom import FAMILY as BLOOM
from jaxinfer.models.codegen import FAMILY as CODEGEN
from jaxinfer.models.cohere import FAMILY as COHERE
from jaxinfer.models.cohere2 import FAMILY as COHERE2
from jaxinfer.models.cohere2_moe import FAMILY as COHERE2_MOE
from jaxinfer.models.cohere_compass import FAMILY as COHERE_COMPASS
from jaxinfer.models.cwm import FAMILY as CWM
from jaxinfer.models.dbrx import FAMILY as DBRX
from jaxinfer.models.deepseek import FAMILY as DEEPSEEK
from jaxinfer.models.deepseek_v4 import FAMILY as DEEPSEEK_V4
from jaxinfer.models.deepseek_v32 import FAMILY as DEEPSEEK_V32
from jaxinfer.models.diffllama import FAMILY as DIFFLLAMA
from jaxinfer.models.doge import FAMILY as DOGE
from jaxinfer.models.dory import FAMILY as DORY
from jaxinfer.models.dots1 import FAMILY as DOTS1
from jaxinfer.models.ernie4_5 import FAMILY as ERNIE4_5
from jaxinfer.models.ernie4_5_moe import FAMILY as ERNIE4_5_MOE
from jaxinfer.models.exaone4 import FAMILY as EXAONE4
from jaxinfer.models.exaone_moe import FAMILY as EXAONE_MOE
from jaxinfer.models.falcon import FAMILY as FALCON
from jaxinfer.models.falcon_h1 import FAMILY as FALCON_H1
from jaxinfer.models.family import Family
from jaxinfer.models.flex_olmo import FAMILY as FLEX_OLMO
from jaxinfer.models.flint import FAMILY as FLINT
from jaxinfer.models.gemma2 import FAMILY as GEMMA2
from jaxinfer.models.gemma3n import FAMILY as GEMMA3N
from jaxinfer.models.gemma4 import FAMILY as GEMMA4
from jaxinfer.models.gemma4_unified import FAMILY as GEMMA4_UNIFIED
from jaxinfer.models.glm import FAMILY as GLM
from jaxinfer.models.glm4 import FAMILY as GLM4
from jaxinfer.models.glm4_moe import FAMILY as GLM4_MOE
from jaxinfer.models.glm4_moe_lite import FAMILY as GLM4_MOE_LITE
from jaxinfer.models.glm4v import ARCHITECTURES as GLM4V
from jaxinfer.models.glm4v import glm4v_text_config
from jaxinfer.models.gpt2 import FAMILY as GPT2
from jaxinfer.models.gpt_bigcode import FAMILY as GPT_BIGCODE
from jaxinfer.models.gpt_neo import FAMILY as GPT_NEO
from jaxinfer.models.gpt_neox import FAMILY as GPT_NEOX
from jaxinfer.models.gpt_oss import FAMILY as GPT_OSS
from jaxinfer.models.gptj import FAMILY as GPTJ
from jaxinfer.models.granite import FAMILY as GRANITE
from jaxinfer.models.granite_moe import FAMILY as GRANITE_MOE
from jaxinfer.models.granite_moe_hybrid import FAMILY as GRANITE_MOE_HYBRID
from jaxinfer.models.granite_swa import FAMILY as GRANITE_SWA
from jaxinfer.models.helium import FAMILY as HELIUM
from jaxinfer.models.hrm_text import FAMILY as HRM_TEXT
from jaxinfer.models.hunyuan import FAMILY as HUNYUAN
from jaxinfer.models.hy_v3 import FAMILY as HY_V3
from jaxinfer.models.hy_v4 import FAMILY as HY_V4
from jaxinfer.models.hyperclovax import FAMILY as HYPERCLOVAX
from jaxinfer.models.inkling import FAMILY as INKLING
from jaxinfer.models.jais2 import FAMILY as JAIS2
from jaxinfer.models.jamba import FAMILY as JAMBA
from jaxinfer.models.jetmoe import FAMILY as JETMOE
from jaxinfer.models.kimi_k25 import FAMILY as KIMI_K25
from jaxinfer.models.kimi_linear import FAMILY as KIMI_LINEAR
from jaxinfer.models.kolibri1 import FAMILY as KOLIBRI1
from jaxinfer.models.laguna import FAMILY as LAGUNA
from jaxinfer.models.lara_mini import FAMILY as LARA_MINI
from jaxinfer.models.lfm2 import FAMILY as LFM2
from jaxinfer.models.lfm2_moe import FAMILY as LFM2_MOE
from jaxinfer.models.lfm3 import FAMILY as LFM3
from jaxinfer.models.llama import FAMILY as LLAMA
from jaxinfer.models.llama4 import FAMILY as LLAMA4
from jaxinfer.models.llava import text_hf_config
from jaxinfer.models.longcat_flash import FAMILY as LONGCAT_FLASH
from jaxinfer.models.mamba import FAMILY as MAMBA
from jaxinfer.models.mamba2 import FAMILY as MAMBA2
from jaxinfer.models.mellum import FAMILY as MELLUM
from jaxinfer.models.mimo_v2_flash import FAMILY as MIMO_V2_FLASH
from jaxinfer.models.minicpm3 import FAMILY as MINICPM3
from jaxinfer.models.minimax import FAMILY as MINIMAX
from jaxinfer.models.minimax_m2 import FAMILY as MINIMAX_M2
from jaxinfer.models.minimax_m3 import FAMILY as MINIMAX_M3
from jaxinfer.models.ministral import FAMILY as MINISTRAL
from jaxinfer.models.ministral3 import FAMILY as MINISTRAL3
from jaxinfer.models.mistral4 import FAMILY as MISTRAL4
from jaxinfer.models.mistral_large4 import FAMILY as MISTRAL_LARGE4
from jaxinfer.models.mixtral import FAMILY as MIXTRAL
from jaxinfer.models.mllama import FAMILY as MLLAMA
from jaxinfer.models.mpt import FAMILY as MPT
from jaxinfer.models.muse_glimmer import FAMILY as MUSE_GLIMMER
from jaxinfer.models.muse_spark import FAMILY as MUSE_SPARK
from jaxinfer.models.nanochat import FAMILY as NANOCHAT
from jaxinfer.models.nemotron import FAMILY as NEMOTRON
from jaxinfer.models.nemotron_h import FAMILY as NEMOTRON_H
from jaxinfer.models.olmo import FAMILY as OLMO
from jaxinfer.models.olmo2 import FAMILY as OLMO2
from jaxinfer.models.olmo_hybrid import FAMILY as OLMO_HYBRID
from jaxinfer.models.olmoe import FAMILY as OLMOE
from jaxinfer.models.opt import FAMILY as OPT
from jaxinfer.models.persimmon import FAMILY as PERSIMMON
from jaxinfer.models.phi import FAMILY as PHI
from jaxinfer.models.phi3 import FAMILY as PHI3
from jaxinfer.models.phimoe import FAMILY as PHIMOE
from jaxinfer.models.qwen2_moe import FAMILY as QWEN2_MOE
from jaxinfer.models.qwen2_vl import ARCHITECTURES as QWEN2_VL
from jaxinfer.models.qwen2_vl import mrope_fields, qwen2_text_config
from jaxinfer.models.qwen3_5 import FAMILY as QWEN3_5
from jaxinfer.models.qwen3_5 import MOE_FAMILY as QWEN3_5_MOE
from jaxinfer.models.qwen3_moe import FAMILY as QWEN3_MOE
from jaxinfer.models.qwen3_next import FAMILY as QWEN3_NEXT
from jaxinfer.models.qwen4_exp import FAMILY as QWEN4_EXP
from jaxinfer.models.recurrent_gemma import FAMILY as RECURRENT_GEMMA
from jaxinfer.models.sarvam_moe import FAMILY as SARVAM_MOE
from jaxinfer.models.sarvam_moe import MODEL_TYPE as SARVAM_MODEL_TYPE
from jaxinfer.models.seed_oss import FAMILY as SEED_OSS
from jaxinfer.models.solar_open import FAMILY as SOLAR_OPEN
from jaxinfer.models.stablelm import FAMILY as STABLELM
from jaxinfer.models.starcoder2 import FAMILY as STARCODER2
from jaxinfer.models.step3p7 import FAMILY as STEP3P7
from jaxinfer.models.text_part import text_config
from jaxinfer.models.vaultgemma import FAMILY as VAULTGEMMA
from jaxinfer.models.vision_language import ARCHITECTURES as VISION_LANGUAGE
from jaxinfer.models.whisper import FAMILY as WHISPER
from jaxinfer.models.youtu import FAMILY as YOUTU
from jaxinfer.models.zamba import FAMILY as ZAMBA
from jaxinfer.models.zamba2 import FAMILY as ZAMBA2
from jaxinfer.models.zaya import FAMILY as ZAYA

FAMILIES: tuple[Family, ...] = (LLAMA, GEMMA2, PHI3, OLMO2, GLM, GLM4, GRANITE, MIXTRAL, QWEN2_MOE, QWEN3_MOE, GPT_OSS,
                                GRANITE_MOE, GLM4_MOE, DEEPSEEK, DEEPSEEK_V32, SEED_OSS, ERNIE4_5, ERNIE4_5_MOE,
                                EXAONE4, MINISTRAL3, COHERE2, APERTUS, ARCEE, OLMOE, COHERE, NEMOTRON, STARCODER2,
                                LLAMA4, GEMMA4, MAMBA2, GRANITE_MOE_HYBRID, BAMBA, NEMOTRON_H, WHISPER, QWEN3_NEXT,
                                MAMBA, JAMBA, FALCON_H1, LFM2, LFM2_MOE, QWEN3_5, QWEN3_5_MOE, MINIMAX_M2, GEMMA3N,
                                DOTS1, HUNYUAN, SOLAR_OPEN, SARVAM_MOE, GPT_NEOX, PHI, GPT2, BLOOM, MPT,
                                GLM4_MOE_LITE, MISTRAL4, KIMI_LINEAR, MIMO_V2_FLASH, EXAONE_MOE, PHIMOE, DBRX,
                                MINICPM3, OPT, GPTJ, GPT_BIGCODE, STABLELM, FALCON, MISTRAL_LARGE4, KIMI_K25, LFM3,
                                LAGUNA, COHERE2_MOE, LONGCAT_FLASH, VAULTGEMMA,
                                PERSIMMON, OLMO, MINISTRAL, HELIUM, CWM, QWEN4_EXP, JETMOE,
                                FLEX_OLMO, MELLUM, NANOCHAT,
                                GPT_NEO, JAIS2, HYPERCLOVAX, YOUTU, HY_V4, ZAMBA2, ZAMBA, RECURRENT_GEMMA,
                                KOLIBRI1, CODEGEN,
                                FLINT, AXK1, BITNET, HY_V3, GRANITE_SWA, AFMOE,
                                GEMMA4_UNIFIED, COHERE_COMPASS, DORY,
                                LARA_MINI, AXK2, HRM_TEXT, DEEPSEEK_V4, BEAM, MINIMAX,
                                INKLING, DIFFLLAMA, ZAYA, DOGE, STEP3P7, OLMO_HYBRID, MUSE_GLIMMER, MINIMAX_M3,
                                BAILING_HYBRID, MUSE_SPARK, MLLAMA)
BY_ARCHITECTURE: dict[str, Family] = {arch: f for f in FAMILIES for arch in f.architectures}
SUPPORTED_ARCHITECTURES = tuple(BY_ARCHITECTURE) + VISION_LANGUAGE  # these run their language model's family
# Checkpoints transformers runs as another family's class, and saves under its name (a Sarvam-MoE model as
# Glm4MoeForCausalLM): their model_type says which family reads them.
BY_MODEL_TYPE = {SARVAM_MODEL_TYPE: SARVAM_MOE.architectures[0]}
# Architectures users meet that are not run, with what to use instead.
NOT_SUPPORTED = {
    "Phi3VForCausalLM": "Phi-3 vision (its image encoder is not supported; the text-only Phi3ForCausalLM "
                        "checkpoints are)",
    "Phi3SmallForCausalLM": "Phi-3-small (block-sparse attention and GeGELU, not Phi3ForCausalLM's layer; "
                            "Phi-3-mini and -medium are Phi3ForCausalLM)",
    "Glm5NextForConditionalGeneration": "GLM-5.3-Flash (Kimi Delta Attention with a lower-bounded gate and DSA "
                                        "with a k-pool indexer, inside DeepSeek-V4-style mixed hyper-connection "
                                        "streams, and a vision tower: not supported yet; Kimi Linear's "
                                        "KimiLinearForCausalLM and HY-V4's HYV4ForCausalLM are)",
    "InklingForConditionalGeneration": "Thinking Machines Inkling with its vision and audio towers (its checkpoints "
                                       "keep Thinking Machines' own layout: model.llm.*, each layer's experts as "
                                       "interleaved w13 tensors, beside model.visual.* and model.audio.*; neither the "
                                       "towers nor that layout are read yet: not supported yet; InklingForCausalLM "
                                       "checkpoints as transformers saves them run)",
    **{arch: "Thinking Machines Inkling 2 (and its looped variant): Inkling's attention and short convolutions "
              "(InklingForCausalLM runs) with a dynamic first convolution, L2-clipped queries and keys, a block "
              "attention residual over earlier blocks' summed outputs and soft-capped experts: not supported yet"
       for arch in ("Inkling2ForCausalLM", "Inkling2ForConditionalGeneration", "Inkling2LoopForCausalLM",
                    "Inkling2LoopForConditionalGeneration")},
    **{arch: "dots3-note (Dots3 Note Preview): DeepSeek-V3.2's latent attention and GLM-5's indexer with latent "
              "shapes that differ per layer type (per_layer_config: the released sliding layers' 64 heads, "
              "kv_lora_rank 1024 and 192 unrotated dims beside the indexed layers' 128 heads, 512 and 128, where "
              "models/latent_attention reads one shape per model), plus a normed shared rope key, scaled latents "
              "and a per-head output gate: not supported yet; dots.llm1's Dots1ForCausalLM and DeepSeek-V3.2's "
              "DeepseekV32ForCausalLM are"
       for arch in ("Dots3NoteForCausalLM", "Dots3NoteForConditionalGeneration")},
}


def _unsupported(arch: str) -> ConfigError:
    hint = f" ({NOT_SUPPORTED[arch]})" if arch in NOT_SUPPORTED else ""
    return ConfigError(f"architecture {arch!r} is not supported{hint}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}")


def family_for(architecture: str) -> Family:
    """The family running `architecture`; ConfigError naming the supported ones otherwise."""
    if architecture not in BY_ARCHITECTURE:
        raise _unsupported(architecture)
    return BY_ARCHITECTURE[architecture]


def family_of(cfg: ModelConfig) -> Family:
    """The family of a config."""
    return family_for(cfg.architecture)


# Checkpoint quantization formats read (dequantized as tensors load), beside unquantized ones.
STORED_QUANTIZATION = {
    "mxfp4": "GPT-OSS's MXFP4 experts, dequantized as they load",
    "fp8": "block-wise FP8 e4m3 weights (DeepSeek-V3, Qwen3-FP8, ...), dequantized as they load",
    "compressed-tensors": "llm-compressor's 8-bit weights (float-quantized FP8, int-quantized int8; symmetric, "
                          "per tensor, channel, group or block), dequantized as they load, and its pack-quantized "
                          "W4A16/W8A16 integer weights",
    "awq": "AutoAWQ's GEMM 4-bit weights",
    "gptq": "GPTQ's 4- and 8-bit weights (v1 and gptq_v2 formats, act order too)",
}


# Stored quantization formats refused with why (the generic refusal names the supported ones).
REFUSED_QUANTIZATION = {
    "bitnet": "BitNet's ternary weights packed four to a byte with a scale per tensor, run by BitLinear, which also "
              "quantizes each token's activations to int8 before every product: jaxinfer's int8 is weight-only, so "
              "reading the weights alone would not compute what the model computes; the unquantized master weights "
              "(microsoft/bitnet-b1.58-2B-4T-bf16) run as BitNetForCausalLM",
}


def _check_stored_quantization(hf: Mapping[str, Any]) -> None:
    """Refuse a checkpoint quantized in a format the loader cannot read, naming the ones it can."""
    quant = hf.get("quantization_config") or {}
    method = quant.get("quant_method")
    scale_scheme(quant)  # an FP8 or compressed-tensors checkpoint's settings, checked before any tensor is read
    packed_scheme(quant)  # AWQ's, GPTQ's and pack-quantized's likewise
    if method in REFUSED_QUANTIZATION:
        raise ConfigError(f"quantization_config.quant_method {method!r} is not supported: "
                          f"{REFUSED_QUANTIZATION[method]}")
    if method is not None and method not in STORED_QUANTIZATION:
        accepted = "; ".join(f"{name} ({what})" for name, what in STORED_QUANTIZATION.items())
        raise ConfigError(
            f"quantization_config.quant_method {method!r} is not supported; supported: {accepted}. For other "
            "formats load the unquantized checkpoint and quantize at load (quantization='int8', 'int4' or 'fp8')"
        )


def from_hf_config(hf: Mapping[str, Any]) -> ModelConfig:
    """Build a ModelConfig from an HF config dict; unsupported features raise ConfigError."""
    archs = hf.get("architectures") or []
    if len(archs) != 1:
        raise ConfigError(
            f"architectures must name exactly one architecture (got {archs!r}); supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if archs[0] in QWEN2_VL:  # Qwen2's (Qwen3's) decoder, its rope split into (temporal, height, width) sections
        return dataclasses.replace(from_hf_config(qwen2_text_config(hf)), **mrope_fields(hf))
    if archs[0] in GLM4V:  # GLM-4-0414's (GLM-4.5's MoE) decoder with Qwen2-VL's M-RoPE
        return dataclasses.replace(from_hf_config(glm4v_text_config(hf)), **mrope_fields(hf))
    if archs[0] in VISION_LANGUAGE:  # its language model runs as that family; the tower is models/vision_language's
        return from_hf_config(text_hf_config(hf))
    arch = BY_MODEL_TYPE.get(hf.get("model_type"), causal_architecture(archs[0]))
    family = family_for(arch)
    hf = text_config(hf, arch)  # a vision-language checkpoint whose language model runs alone (Llama 4)
    _check_stored_quantization(hf)
    missing = [key for key in family.required if hf.get(key) is None]
    if missing:
        raise ConfigError(f"no {', '.join(missing)}; an HF config of a {archs[0]} model sets "
                          f"{', '.join(family.required)}")
    cfg = family.read_config(hf, arch)
    # A base model or classifier stores no output head: read as tied, nothing asks for one (it pools, never generates).
    return dataclasses.replace(cfg, tie_word_embeddings=True) if pools_only(archs[0]) else cfg


def load_config(model_dir: str | Path) -> ModelConfig:
    """Read `config.json` from a model directory (HF or converted), with generation_config's EOS ids."""
    hf = read_config_json(model_dir)
    try:
        cfg = from_hf_config(hf)
    except ConfigError as err:  # the dict-level message, with the file it came from
        raise ConfigError(f"{Path(model_dir) / 'config.json'}: {err}") from None
    eos = merge_ids(cfg.eos_token_ids, generation_defaults(model_dir).eos_token_ids)
    return dataclasses.replace(cfg, eos_token_ids=eos)
