"""BigCode's GPTBigCode (GPTBigCodeForCausalLM: StarCoder 1, StarCoderBase, SantaCoder): GPT-2 with one K/V head.

GPT-2's model (`models.gpt2`: learned positions `wpe` gathered by position, the ungated sequential pre-norm
layer, LayerNorms and every projection biased, tied head, the same config fields and refusals) with torch
Linear weights ([out, in]) and, under `multi_query` (the default, every release's), multi-query attention: one
K/V head every query head reads (`cfg.num_kv_heads` 1). The fused `c_attn` holds, with multi_query, all q rows,
then the one head's k rows, then its v rows ([H*K + 2*K, D]); without it each head's q, k and v rows in turn
([heads, 3, head_dim], GPT-NeoX's layout); either is read as three at load. The MLP is
c_proj(gelu_pytorch_tanh(c_fc(x))) by default (`activation_function`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxinfer.config.model import ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gpt2 import FAMILY as GPT2
from jaxinfer.models.gpt2 import PREFIX, REQUIRED, body_leaves
from jaxinfer.models.gpt2 import read_config as gpt2_config
from jaxinfer.models.ungated_mlp import abstract_layer, decoder_layer

ARCHITECTURES = ("GPTBigCodeForCausalLM",)
# GPTBigCodeConfig's defaults where GPT2Config's differ.
DEFAULTS = dict(activation_function="gelu_pytorch_tanh", multi_query=True)


def qkv_leaves(cfg: ModelConfig, qkv: str) -> dict[str, HFLeaf]:
    """q/k/v and their biases in the fused c_attn: q rows then k then v (multi-query), else each head's q, k, v."""
    H, KV, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.hidden_size
    rows = (H + 2 * KV) * K
    if KV == H:  # [heads, 3, head_dim]: each leaf the K rows from i * K of each head's 3 * K
        return {
            **{f"w{p}": HFLeaf(qkv + "weight", "in_head_rows", (rows, D), H, K, row_offset=i * K)
               for i, p in enumerate("qkv")},
            **{f"b{p}": HFLeaf(qkv + "bias", "bias_head_rows", (rows,), H, K, row_offset=i * K)
               for i, p in enumerate("qkv")},
        }
    parts = {"q": (H, 0), "k": (KV, H * K), "v": (KV, (H + KV) * K)}  # (heads, first row)
    return {
        **{f"w{p}": HFLeaf(qkv + "weight", "in_heads", (rows, D), heads, K, row_offset=first)
           for p, (heads, first) in parts.items()},
        **{f"b{p}": HFLeaf(qkv + "bias", "bias_heads", (rows,), heads, K, row_offset=first)
           for p, (heads, first) in parts.items()},
    }


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """Where each layer field lives: GPT-2's names over torch Linear weights, q/k/v from the fused `c_attn`."""
    return {**qkv_leaves(cfg, PREFIX + "h.{i}.attn.c_attn."), **body_leaves(cfg, conv1d=False)}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """ModelConfig of a GPTBigCode HF config: GPT-2's reading, one K/V head under multi_query."""
    hf = {**DEFAULTS, **hf}
    cfg = gpt2_config(hf, arch)
    return dataclasses.replace(cfg, num_kv_heads=1 if hf["multi_query"] else cfg.num_heads)


FAMILY = Family("gpt_bigcode", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=GPT2.top_names, positions_name=GPT2.positions_name, required=REQUIRED)
