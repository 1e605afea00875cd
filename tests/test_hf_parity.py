"""Every supported architecture against HF transformers on the same tiny random weights.

Each family's float32 logits (to float32 rounding) with the native CPU kernels on and off (off is the XLA code
accelerators compile); its greedy tokens through the engine and its bfloat16 logits (against HF's own bfloat16
run) once, on the path LLM takes by default (the kernels on a CPU that builds them, XLA elsewhere): see `one_run`.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from hf_models import ARCH_CONFIGS, ENGINE_TESTED, make_hf_model
from python_subprocess import needs_compiler, on_cpu_backend

from jaxinfer import LLM, SamplingParams

ARCHS = sorted(ARCH_CONFIGS)
PROMPT = np.random.RandomState(0).randint(3, 256, size=64).tolist()
KERNELS = [pytest.param(True, marks=[on_cpu_backend, needs_compiler], id="kernels"), pytest.param(False, id="xla")]
# Families run on XLA's path only: the native kernels take their q, k and v as any GQA layer's (what differs comes
# before; GLM-4.7-Flash's and Mistral 4's latent attention is DeepSeek's, whose kernels runs are tested), and their
# kernels twins would add an MoE engine's compiles to the suite (MiniMax-M2: ~5 s).
XLA_ONLY = ("minimax_m2", "dots1", "glm4_moe_lite", "mistral4")
XLA_ONLY += ("deepseek_v32",)  # its sparse attention reads the cache itself, never the native kernels
# Greedy tokens checked elsewhere: ENGINE_TESTED's in test_families; DeepSeek-V3.2's in test_deepseek_v32
# (the engine through chunked prefill and prefix caching past index_topk).
GREEDY_ELSEWHERE = ENGINE_TESTED + ("deepseek_v32",)
# HunYuan's attention too: its q/k norms follow the rotation, before the kernels see q and k.
XLA_ONLY += ("hunyuan_moe",)
# GPT-NeoX, Phi and GPT-2 too: what they change (the parallel residual, fused q/k/v, partial rotary, biases, learned
# positions, the head's bias) is outside attention; their kernels twins would cost ~25 s of compiles (loaded 2 cores).
XLA_ONLY += ("gpt_neox", "phi", "gpt2")
XLA_ONLY += ("falcon",)  # the ungated layer with one K/V head: the kernels take it as any GQA layer's
XLA_ONLY += ("stablelm",)  # LayerNorms around Llama's MLP, per-head q/k LayerNorms before the rotation
XLA_ONLY += ("gpt_bigcode",)  # GPT-2's model with one K/V head: the kernels take it as any GQA layer's
XLA_ONLY += ("gptj",)  # Phi's parallel layer, q and k rotated in pairs before the kernels see them
XLA_ONLY += ("opt",)  # GPT-2's learned positions (OPT's from row 2), a ReLU MLP: outside attention too
# MiMo-V2-Flash too: its sliding layers' sinks skip the native kernels, and its full layer hands them q, k and
# (zero-padded) v as any GQA layer does.
XLA_ONLY += ("mimo_v2_flash",)
GREEDY_ELSEWHERE += ("gpt2",)  # test_gpt2: each decode step's pick and log-probability against HF's forward
# Gemma 3n: Gemma 4's attention (its q, k, v reach the kernels as any GQA layer's; AltUp, LAuReL and the sparse gate
# are outside it); its greedy tokens in test_gemma3n, through the engine with a prefix-cache hit.
XLA_ONLY += ("gemma3n",)
GREEDY_ELSEWHERE += ("gemma3n",)
# A float32 kernels twin checks the native cache write and paged attention (float32 weights are not packed), which
# take any family's q, k and v alike but for the options they are given: windows, scales, soft caps, chunks, latent
# (MLA) rows, head sizes. These families' attention reaches the kernels as Llama's does (llama2 and llama3 keep their
# twins; what these change -- rope layouts, norms, MLPs, routers, residual and logit scales -- comes before or
# after), so their twins add no check: ~1-2 s of compiles each from an empty cache. Their greedy and bfloat16 runs
# (one_run) keep LLM's default path, whose packed bfloat16 matmuls the kernels do change.
LLAMA_ATTENTION = ("apertus", "arcee", "cohere", "ernie4_5", "ernie4_5_moe", "gemma", "gemma_legacy_gelu", "glm",
                   "glm4", "glm4_moe", "granitemoe", "granitemoe_shared", "llama_exact_gelu", "llama_linear_rope",
                   "nemotron", "olmo2", "olmoe", "phi3", "qwen2", "qwen3_moe", "seed_oss", "smollm3")
# A second form of a family tested in full, checked by its float32 logits on XLA alone (~0.5 s, not ~6 s): what it
# changes (GPT-NeoX's sequential residual) shows in them.
LOGITS_ONLY = ("gpt_neox_sequential",)
LOGITS_ONLY += ("hunyuan_dense",)  # HunYuan-MoE's attention before Llama's MLP
LOGITS_ONLY += ("solar_open",)  # GLM-4.5's layer with Llama's attention options
LOGITS_ONLY += ("dots1",)  # GLM-4.5's layer with Qwen3's attention options
LOGITS_ONLY += ("sarvam_moe",)  # GLM-4.5's model under other names and defaults
LOGITS_ONLY += ("gpt_bigcode_mha",)  # GPTBigCode without multi_query: c_attn per head, as GPT-NeoX's
# OPT-350M: OPT's model with post-norm layers and project_in / project_out around them; its decode step runs the
# same layer function and projections as its prefill, so what it changes shows in its float32 logits (~0.3 s). Its
# kernels twin, greedy run (32 tokens) and bfloat16 run passed and would add ~4.5 s from a cold cache.
LOGITS_ONLY += ("opt_350m",)
LOGITS_ONLY += ("stablelm_parallel",)  # StableLM's parallel residual off one norm, as Phi's
LOGITS_ONLY += ("falcon_new", "falcon_sequential")  # Falcon's other two arrangements and q/k/v layouts
LOGITS_ONLY += ("exaone_moe",)  # GLM-4.5's layer with EXAONE 4.0's attention (windows, NoPE full layers)
# Phi-3.5-MoE and DBRX run Mixtral's cache and decode path (self_attention, moe.pre_norm_layer), MiniCPM3
# DeepSeek-V2's (latent_attention): greedy tokens checked in test_families. What each changes is inside its
# layer and shows in these float32 logits (~1 s each from a cold cache); its greedy and bfloat16 runs
# would add ~6.5 s a family (measured on the 2 loaded cores; both pass).
LOGITS_ONLY += ("phimoe", "dbrx", "minicpm3")
# Families whose decoding runs another family's layer unchanged, its greedy tokens checked there: GLM-4.7-Flash's is
# DeepSeek-V3's (test_families), so its logits are checked here but not its greedy tokens (~3 s saved).
DECODES_AS_ANOTHER = ("glm4_moe_lite",)
# GPT-J, GPTBigCode, StableLM and Falcon decode through layers whose greedy runs are checked (ungated_mlp's layer:
# GPT-NeoX's and Phi's here, GPT-2's in test_gpt2; with Llama's gated MLP: Llama's here), rotating and caching as
# families checked here do (Cohere's adjacent pairs, Llama 3's one K/V head); what each changes shows in its float32
# and bfloat16 logits
# (prefill and decode call the same layer). Their greedy runs passed and would add ~3.5 s each from a cold cache on
# the loaded 2 cores; OPT keeps its own: its positions' offset is gathered by each decode step.
DECODES_AS_ANOTHER += ("gptj", "gpt_bigcode", "stablelm", "falcon")
# Mamba-1 and FalconMamba: no layer attends, so a kernels twin would run the same step; FalconMamba's dt, B and C
# norms show in its float32 logits, and its engine runs would repeat Mamba's (the same mixer and state pool).
XLA_ONLY += ("mamba",)
LOGITS_ONLY += ("falcon_mamba",)
# Jamba: its float32 logits here (its NoPE attention hands the kernels q, k and v as any GQA layer does); its greedy
# tokens in test_jamba, two requests decoding together; in bfloat16 its parts are Mamba's mixer (above) and any GQA
# and MoE layer's. That engine test runs Mamba-1's mixer and state pools for Mamba too: its greedy tokens there.
LOGITS_ONLY += ("jamba",)
GREEDY_ELSEWHERE += ("mamba",)
# Mistral Large 4: DeepSeek-V3.2's sparse attention, reading the cache itself (never the native kernels); its decode
# runs DeepSeek-V3.2's (test_deepseek_v32: chunked prefill, prefix caching past index_topk), what it changes (learned
# rope and query scales, NoPE layers, its router, the soft cap) computed per token and shown in these logits. Its
# greedy run passed (32 tokens past index_topk) and would add ~4 s from a cold cache.
XLA_ONLY += ("mistral_large4",)
DECODES_AS_ANOTHER += ("mistral_large4",)
# BLOOM and MPT: ALiBi's slopes keep their attention off the native kernels (XLA's path: a kernels twin would run the
# same attention). BLOOM's greedy tokens in test_families (two prompts sharing a page, prefix caching on: the paged
# path); MPT decodes through the same ungated layer and attention paths, its slopes and clamp shown by its logits.
XLA_ONLY += ("bloom", "mpt")
GREEDY_ELSEWHERE += ("bloom",)
DECODES_AS_ANOTHER += ("mpt",)
LOGITS_ONLY += ("falcon_rw",)  # Falcon-RW: BLOOM's ALiBi scaled with the scores, biased projections
# Kimi K2.5 and Apertus 1.5: DeepSeek-V3's and Apertus' language models unchanged, checked in full above; their float32
# logits check where the wrapper keeps them (Kimi's prefixes, the head untied by the outer config; Apertus 1.5's head
# pruned to 256 of its 300 ids): test_text_only_wrappers for the layouts their makers ship.
LOGITS_ONLY += ("kimi_k25", "apertus1p5")
# LFM3: LFM2's short conv and state pool (their decode checked by test_hybrid_families' LFM2 engine run) beside
# attention whose gate, norms and ropes come before or after the kernels (its windows reach them as Mistral's): its
# float32 logits here, on XLA, and its bfloat16 error; a greedy run would add ~3 s.
LLAMA_ATTENTION += ("lfm3",)
DECODES_AS_ANOTHER += ("lfm3",)
# Laguna: GLM-4.5's MoE layer (its decode and bfloat16 runs checked as glm4_moe's) under attention whose softplus
# head gate, q/k norms and per-kind ropes come before or after the kernels: what it changes shows in its float32
# logits (~0.5 s); its greedy and bfloat16 runs would add ~4.5 s.
LOGITS_ONLY += ("laguna",)
# Cohere2-MoE: Cohere 2's parallel layer and rope (its decode checked as cohere2's) over Mixtral's experts; what it
# changes shows in its float32 logits.
LOGITS_ONLY += ("cohere2_moe",)
# LongCat-Flash: DeepSeek's latent attention (its decode checked as deepseek_v3's) in half-layers handing on a
# second stream (Gemma 3n's way, through the engine in test_gemma3n); its greedy run (batched, kernels and XLA)
# passed, ~4 s more; what it changes shows in its float32 logits.
LOGITS_ONLY += ("longcat_flash",)
# VaultGemma: Llama's layer (decode checked as llama's) under Gemma 2's attention options (windows, scale, caps:
# checked as gemma2's); what it changes (no post-sublayer norms) shows in its float32 logits.
LOGITS_ONLY += ("vaultgemma",)
# Persimmon: GPT-NeoX's sequential layer (decode checked as gpt_neox's) with Phi's q/k LayerNorms (phi's) and a
# relu(x)^2 MLP, all outside attention: what it changes shows in its float32 logits.
LOGITS_ONLY += ("persimmon",)
# Llama's layer under other norms, windows and options, decoding as llama2 / mistral / qwen2_layer_types / ernie4_5
# do here: what each changes (OLMo 1's weightless LayerNorms and q/k/v clamp, Ministral's and CWM's windows by layer
# type, Helium's rope in pairs) shows in its float32 logits; a greedy and a bfloat16 run would add ~3 s a family.
LOGITS_ONLY += ("olmo", "ministral", "helium", "cwm")
# JetMoE: its routed queries and per-expert output projections come before and after attention that takes them as
# any GQA layer's (the kernels and the paged path alike), and decode calls the same layer per token: what it
# changes shows in its float32 logits. Its greedy run (32 tokens) and bfloat16 run passed and would add ~10 s
# (HF's generate alone ~4 s: its experts are a Python loop).
LOGITS_ONLY += ("jetmoe",)
# FlexOlmo: OLMo 2's post-norm attention (olmo2's) over OLMoE's router and experts (olmoe's, through the engine in
# test_families); Mellum: Qwen3-MoE's layers (qwen3_moe's) with windows and a rope per layer type (Laguna's): what
# each changes shows in its float32 logits.
LOGITS_ONLY += ("flex_olmo", "mellum")
# nanochat: its weightless norms, reversed rotation and q/k norms come before attention that takes q, k and v as any
# GQA layer's, and decode calls the same layer: what it changes shows in its float32 logits.
LOGITS_ONLY += ("nanochat",)
# GPT-Neo: GPT-2's layer and learned positions (gpt2's decode, test_gpt2) with unscaled scores and sliding windows
# the paged path takes as Mistral's and Gemma 2's: what it changes shows in its float32 logits.
LOGITS_ONLY += ("gpt_neo",)
# Jais 2: Nemotron's ungated relu(x)^2 layer (nemotron's) with biased LayerNorms (starcoder2's) and MLP biases;
# HyperCLOVA X: Granite's scaled layer (granite's) with a norm on each sublayer's output: what each changes shows in
# its float32 logits.
LOGITS_ONLY += ("jais2", "hyperclovax")
# Youtu: DeepSeek's dense layer (deepseek_v3's, whose layer 0 is dense and whose decode is checked in test_families)
# in every layer: its float32 logits.
LOGITS_ONLY += ("youtu",)
# HY-V4: DeepSeek-V3.2's sparse attention (never the native kernels) with hyper-connections, sinks, an output gate and
# a layer reusing the last full layer's choice, all shown in its float32 logits; its engine greedy tokens through
# chunked prefill in test_hy_v4. Its bfloat16 and 32-token greedy runs passed and would add ~7 s (loaded 2 cores).
XLA_ONLY += ("hy_v4",)
LOGITS_ONLY += ("hy_v4",)
# Kolibri-1: GLM-4.5's MoE layer and shared experts (glm4_moe's) in GLM-4's sandwich (glm4's) under EXAONE 4.0's
# attention (exaone4's), routed by its own biased top-k: what it changes shows in its float32 logits.
LOGITS_ONLY += ("kolibri1",)
LOGITS_ONLY += ("flint",)  # GLM-4.5's layer (glm4_moe's) with MiMo-V2-Flash's sinks and NoPE full layers
# Granite SWA and Granite-MoE SWA: Granite's and Granite-MoE-Shared's layers (granite's, granitemoe_shared's) with
# GPT-OSS's sinks over sliding windows (gpt_oss's decode, test_families) and Gemma 3's per-kind rope bases (gemma3's):
# what they change shows in their float32 logits.
LOGITS_ONLY += ("granite_swa", "granitemoe_swa")
LOGITS_ONLY += ("hy_v3",)  # GLM-4.5's layer (glm4_moe's) with Qwen3's attention options, as dots1's
# AFMoE: Kolibri-1's sandwich layer (kolibri1's) over GLM-4.5's routed block (glm4_moe's), with Qwen3-Next's output
# gate and Flint's NoPE full layers, all outside the attention the kernels take: shown by its float32 logits.
LOGITS_ONLY += ("afmoe",)
LOGITS_ONLY += ("codegen",)  # GPT-J's model (gptj's) under another q/k/v layout, read at load: shown by its logits
# A.X-K1: DeepSeek-V3's layer (deepseek_v3's decode) with its MoE output normed: shown by its logits. Its greedy,
# bfloat16 and kernels runs passed and would add ~6 s.
LOGITS_ONLY += ("axk1",)
LOGITS_ONLY += ("bitnet",)  # Llama's layer (llama2's decode) with two sub-norms: shown by its logits
# Gemma 4 Unified: Gemma 4's layer less its per-layer inputs and experts (test_gemma4's decode, with KV sharing and a
# prefix-cache hit): shown by its logits; the conditional-generation layout in test_text_only_wrappers.
LOGITS_ONLY += ("gemma4_unified",)
# Cohere Compass: Cohere 2's parallel layer (cohere2's decode) with each layer type's rope, turned in halves as Llama's:
# shown by its logits; the conditional-generation layout in test_text_only_wrappers.
LOGITS_ONLY += ("cohere_compass",)
# DiffLlama: Llama's layer (llama2's decode) whose attention is one GQA attention over 2 * head_dim-wide heads (keys
# zero-padded, each K/V head's value pair side by side: the kernels and pages take it as any GQA layer's), the
# differential mix, norm and lambdas after it: shown by its logits.
LOGITS_ONLY += ("diffllama",)
# Dory: unrolled loops, each pass a decoder layer with its own pages running its first pass's weights (Zamba2's
# borrowing, test_hybrid_families) and handing on the restart point (HY-V4's way of handing a pytree, test_hy_v4);
# its unit norms, scales and logit scale, all outside the attention the kernels take, show in its float32 logits.
# Its greedy run (32 tokens, two prompts, kernels and XLA) matched HF's generate and would add ~3 s.
LOGITS_ONLY += ("dory",)
# LaraMini: Qwen3-Next's DeltaNet and state pool (their decode through the engine in test_hybrid_families) beside
# Flint's sliding and NoPE attention (flint's) and a softmax-routed MoE block with an ungated shared expert: what it
# changes (the fused in_proj's rows, w-not-1+w norms, the layer kinds) shows in its float32 logits.
LOGITS_ONLY += ("lara_mini",)
# OLMo Hybrid: Qwen3-Next's DeltaNet and state pool (their decode through the engine in test_hybrid_families) with
# its projections and convs apart and beta doubled, beside OLMo 3's post-norm attention (olmo2's): shown by its
# float32 logits.
LOGITS_ONLY += ("olmo_hybrid",)
# Ling hybrid: Kimi Linear's KDA layers and state pool (their decode through the engine in test_hybrid_families) with
# one-projection gates and the safe forget gate, beside DeepSeek-V3's rotated latent attention (deepseek_v3's decode)
# with each head's output gated: shown by its float32 logits. XLA only: the latent rows reach the kernels as V3's.
XLA_ONLY += ("bailing_hybrid",)
LOGITS_ONLY += ("bailing_hybrid",)
# A.X-K2: DeepSeek-V3.2's sparse attention (deepseek_v32's decode, test_deepseek_v32; never the native kernels) with
# gated norms and a gated query computed per token: shown by its float32 logits.
XLA_ONLY += ("axk2",)
LOGITS_ONLY += ("axk2",)
# HRM-Text: Llama's layer (llama2's decode) with weightless norms and Qwen3-Next's output gate, its cycles unrolled as
# Dory's loops are (runs borrowing their stack's weights, each its own pages, two states handed between layers): shown
# by its float32 logits. Its greedy run (32 tokens) and bfloat16 run passed (with its kernels twin, ~4 s more).
LOGITS_ONLY += ("hrm_text",)
# DeepSeek-V4: sliding, CSA and HCA attention reading their token rows from the cache itself (never the native
# kernels), hash and learned routing, mixed hyper-connection streams: shown by its float32 logits; its engine greedy
# tokens through chunked prefill that splits compression blocks in test_deepseek_v4.
XLA_ONLY += ("deepseek_v4",)
LOGITS_ONLY += ("deepseek_v4",)
# Beam: AFMoE's sandwich layer (afmoe's) over GLM-4.5's grouped routing without shared experts (glm4_moe's decode,
# test_families), with a gate bias, depth-scaled adds and NoPE query scales, all outside the attention the kernels
# take: shown by its float32 logits. Its greedy, bfloat16 and kernels runs passed and would add ~14 s (HF's MoE loop).
LOGITS_ONLY += ("beam",)
# ZAYA: its CCA conv state is read, windowed and written back as LFM2's short conv's (conv_windows; LFM2's chunked
# engine run in test_hybrid_families), its router state handed between layers as HY-V4's streams are; the CCA's
# convs, residual paths, delayed values, norms and the router show in its float32 logits. Its chunked, batched and
# preempted engine run (two prompts, 16 greedy tokens each) matched HF's generate and would add ~22 s (~4.4 s for
# one prompt prefilled over two steps; HF's generate is half of it).
LOGITS_ONLY += ("zaya",)
# Doge: Llama's layer with each key's bias riding in doubled heads (DiffLlama's cache layout, its decode through the
# same layer): shown by its float32 logits. Its greedy, bfloat16 and kernels runs passed and would add ~7.6 s.
LOGITS_ONLY += ("doge",)
# Step 3.7: Laguna's layer (laguna's decode) with 1 + w norms, a sigmoid gate, a scale and clamped SiLUs, read from
# Step3p7ForConditionalGeneration (no causal class in transformers): shown by its float32 logits; the tower's refusal
# and the settings refused in test_text_only_wrappers.
LOGITS_ONLY += ("step3p7",)
# Muse Glimmer: Gemma 2's sandwich (gemma2's decode) with weightless q/k norms, an output gate, normed embeddings and
# a logit multiplier, read from MuseGlimmerForConditionalGeneration (no causal class in transformers): shown by its
# float32 logits; the tower's refusal in test_text_only_wrappers.
LOGITS_ONLY += ("muse_glimmer",)
# Muse Spark: Muse Glimmer's attention (gemma2's decode) with a normed output, residual gates and experts at their own
# width, each expert's output normed: shown by its float32 logits (MuseSparkForConditionalGeneration: no causal class
# in transformers); the towers' refusal in test_text_only_wrappers.
LOGITS_ONLY += ("muse_spark",)

# MiniMax-M3: its sparse layer reads its token rows from the cache itself, as Qwen4-Exp's QSA does (never the native
# kernels); the full layer and the MoE block are MiniMax-M2's and GLM-4.5's (their decode checked there): shown by
# its float32 logits; the conditional-generation layout in test_text_only_wrappers.
XLA_ONLY += ("minimax_m3",)
LOGITS_ONLY += ("minimax_m3",)

@functools.cache
def hf_logits(name: str, dtype: torch.dtype) -> np.ndarray:
    """HF's float32 logits [64, 256] of PROMPT, computed with the model in `dtype`."""
    with torch.no_grad():
        return make_hf_model(name).to(dtype)(torch.tensor([PROMPT])).logits[0].float().numpy()


@functools.cache
def hf_greedy(name: str) -> list[int]:
    """HF's 32 greedy tokens after PROMPT[:12]."""
    with torch.no_grad():
        out = make_hf_model(name).generate(torch.tensor([PROMPT[:12]]), max_new_tokens=32, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
    return out[0, 12:].tolist()


def hf_reads_legacy_gelu_as_exact(name: str) -> bool:
    """True where this transformers runs Gemma's legacy hidden_act="gelu" as exact (erf) GELU.

    The official Gemma releases mean the tanh approximation by it, which jaxinfer follows and
    transformers 5.2x maps it to; older versions ran erf, so their logits are not the reference.
    """
    if name != "gemma_legacy_gelu":
        return False
    act = make_hf_model(name).model.layers[0].mlp.act_fn
    return abs(float(act(torch.tensor(1.0))) - 0.8413447) < 1e-6  # erf GELU(1); the tanh form gives 0.8411920


@pytest.fixture(scope="module", params=ARCHS)
def arch(request, checkpoint_dir):
    """(name, checkpoint directory) of one architecture."""
    if hf_reads_legacy_gelu_as_exact(request.param):
        pytest.skip("this transformers runs Gemma's legacy hidden_act='gelu' as erf GELU; the releases mean tanh")
    return request.param, checkpoint_dir(request.param)


def runs(names: list[str]) -> list:
    """(arch, kernels) params of the families `names`, each with and without the native kernels (XLA_ONLY,
    LOGITS_ONLY and LLAMA_ATTENTION families without), for `indirect=["arch"]`: the runs a family skips are not
    generated."""
    return [pytest.param(name, kernels.values[0], marks=kernels.marks, id=f"{name}-{kernels.id}")
            for name in names for kernels in KERNELS
            if not (kernels.values[0] and name in XLA_ONLY + LOGITS_ONLY + LLAMA_ATTENTION)]


def one_run(names: list[str]) -> list:
    """(arch, kernels) params of the families `names`, one each: cpu_kernels None (LLM's default: the native kernels
    where they build, XLA elsewhere), XLA_ONLY families on XLA. What a kernels run changes per family shows in
    test_logits_match_hf's two runs (float32) and in this bfloat16 one (only bfloat16 weights are packed for the
    kernels' matmuls); in a float32 engine the rest is the cache writes and the paged attention, taking any family's
    q, k, v, window, scale and chunk alike: both paths are tested against dense attention (test_cpu_kernels,
    test_blocked_attention) and through the engine per family in test_families (prefix caching on: the kernels;
    off: XLA). A twin run per family cost ~70 s of a cold suite (greedy ~50, bfloat16 ~21)."""
    return [pytest.param(name, False if name in XLA_ONLY else None, id=name) for name in names]


@pytest.mark.parametrize("arch, kernels", runs(ARCHS), indirect=["arch"])
def test_logits_match_hf(arch, kernels):
    name, path = arch
    expected = hf_logits(name, torch.float32)
    got = LLM(path, dtype="float32", max_seq_len=128, cpu_kernels=kernels).logits(PROMPT)
    assert got.shape == expected.shape == (64, 256)
    # float32 rounding only: a wrong activation, window or norm shows up at 1e-4 and above.
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max(), name


# test_families checks the ENGINE_TESTED families' greedy tokens through the engine, prefix caching on and off.
@pytest.mark.parametrize("arch, kernels",
                         one_run([a for a in ARCHS if a not in GREEDY_ELSEWHERE + DECODES_AS_ANOTHER + LOGITS_ONLY]),
                         indirect=["arch"])
def test_greedy_tokens_match_hf_generate(arch, kernels):
    name, path = arch
    llm = LLM(path, dtype="float32", max_seq_len=128, cpu_kernels=kernels)
    out = llm.generate([PROMPT[:12]], SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))[0]
    assert out.token_ids == hf_greedy(name), name
    assert out.finish_reason == "length"


@pytest.mark.parametrize("arch, kernels", one_run([a for a in ARCHS if a not in LOGITS_ONLY]), indirect=["arch"])
def test_bfloat16_error_matches_hf_bfloat16(arch, kernels):
    """Our bf16 run is as close to float32 as HF's own bf16 run is, at worst and on average."""
    name, path = arch
    llm = LLM(path, dtype="bfloat16", max_seq_len=128, cpu_kernels=kernels)
    assert llm.weights.embed.dtype == np.dtype("bfloat16")
    got, hf_bf16, hf_f32 = llm.logits(PROMPT), hf_logits(name, torch.bfloat16), hf_logits(name, torch.float32)
    ours, theirs = np.abs(got - hf_f32), np.abs(hf_bf16 - hf_f32)
    assert ours.max() <= 1.5 * theirs.max(), name
    assert ours.mean() <= 1.5 * theirs.mean(), name
