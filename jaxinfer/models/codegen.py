"""Salesforce CodeGen (CodeGenForCausalLM: codegen-350M to 16B, mono / multi / nl; CodeGen2): GPT-J's model with
q, k and v fused in the layout of the 4 model-parallel shards it was trained on.

GPT-J's (`models.gptj`: one LayerNorm `ln_1` feeding attention and the biased gelu_new MLP `fc_in` / `fc_out`
in parallel, `rotary_dim` of each head's dims turned in adjacent pairs, the untied `lm_head` with a bias) but
for `qkv_proj` [3 * D, D]: its rows are 4 groups (`mp_num`), each holding a quarter of the heads' query rows,
then their value rows, then their key rows; each is read as its heads' part of every group
("in_group_rows", Falcon-40B's kind). The heads must split evenly over the 4 groups.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.models.family import Family, HFLeaf
from jaxinfer.models.gptj import PREFIX, REQUIRED, abstract_layer, decoder_layer
from jaxinfer.models.gptj import hf_leaves as gptj_leaves
from jaxinfer.models.gptj import read_config as gptj_config

ARCHITECTURES = ("CodeGenForCausalLM",)
MP_NUM = 4  # transformers' CodeGenAttention.mp_num: the shards the fused projection is laid out for
ORDER = "qvk"  # each shard's rows: its heads' queries, then values, then keys


def hf_leaves(cfg: ModelConfig) -> dict[str, HFLeaf]:
    """GPT-J's leaves, q, k and v as each shard's part of `qkv_proj`."""
    H, K, D = cfg.num_heads, cfg.head_dim, cfg.hidden_size
    local = H * K // MP_NUM  # one shard's rows of q (of k, of v)
    qkv = (PREFIX + "h.{i}.attn.qkv_proj.weight", "in_group_rows", (3 * H * K, D), H, K)
    return {**gptj_leaves(cfg), **{f"w{p}": HFLeaf(*qkv, row_offset=ORDER.index(p) * local, groups=MP_NUM)
                                   for p in "qkv"}}


def read_config(hf: Mapping[str, Any], arch: str) -> ModelConfig:
    """GPT-J's reading of the config (CodeGenConfig's defaults are GPTJConfig's), the heads checked against the
    4 shards."""
    cfg = gptj_config(hf, arch)
    if cfg.num_heads % MP_NUM:
        raise ConfigError(f"n_head {cfg.num_heads} is not supported for {arch}: qkv_proj is laid out in {MP_NUM} "
                          f"shards of whole heads, so n_head must be a multiple of {MP_NUM}")
    return cfg


FAMILY = Family("codegen", ARCHITECTURES, read_config, abstract_layer, hf_leaves, decoder_layer,
                top_names=(PREFIX + "wte.weight", PREFIX + "ln_f.weight"), required=REQUIRED)
