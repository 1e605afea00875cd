"""Qwen4-Exp (models/qwen4_exp) against transformers 5.24 on the same tiny saved weights: every position's float32
logits of a prompt crossing an EOS (the n-grams restart after it), through its residual streams, PLE layers, QSA
attention (block choice active: 40 tokens, 4-token blocks, 2 kept), DeltaNet and experts; the n-gram hash at the
real vocabulary and table sizes; the engine's greedy tokens through chunked prefill and decode; the
conditional-generation checkpoint's language model read text-only.

transformers' QSA picks among exactly tied block scores (the relu'd sums are 0 for every block where all index
heads score negative, common with few heads) by torch.topk's order, which is unspecified (CPU: the later blocks);
jaxinfer takes lax.top_k's (the earlier). The test's config and prompt have no such tie among the blocks a query
keeps (checked below from transformers' own scores), so the comparison is exact up to float32 rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.torch
import torch
from hf_models import hf
from PIL import Image

from jaxinfer import LLM, ConfigError, SamplingParams, from_hf_config
from jaxinfer.checkpoint.loader import load_hf_weights
from jaxinfer.config.qwen4_exp import ngram_tables
from jaxinfer.models.decoder import forward_with_taps
from jaxinfer.models.ngram_hash import ngram_rows, sequence_context

LAYER_TYPES = ["linear_attention", "indexed_attention"] * 2
CONFIG = dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, layer_types=LAYER_TYPES, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=8, linear_value_head_dim=16, num_experts=4, num_experts_per_tok=2,
              moe_intermediate_size=32, shared_expert_intermediate_size=48, hc_count=2, hc_lowrank=16,
              ple_layer_ids=[1, 3], ple_embed_dim=32, ple_conv_kernel_size=3, heads_per_ngram=2,
              ngram_vocab_size_base=97, make_ngram_vocab_size_divisible_by=8, split_ngram_parts=2,
              indexer_n_heads=4, indexer_kv_heads=1, indexer_head_dim=16, indexer_budget=8, indexer_compress_ratio=4,
              rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.25,
                               "mrope_section": [1, 1, 0]},
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0, initializer_range=0.1,
              rms_norm_eps=1e-5)
PROMPT = np.random.RandomState(2).randint(3, 256, size=40).tolist()
PROMPT[17] = 2  # an EOS mid-prompt: the n-grams after it do not reach before it


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """The model saved by transformers (each n-gram table in 2 shards), 1-d parameters and the PLE convs (zeros at
    init: silu(0) adds nothing) moved off their init."""
    torch.manual_seed(0)
    model = hf.Qwen4ExpForCausalLM(hf.Qwen4ExpTextConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 1 or name.endswith("ple.conv1d.weight"):  # transformers starts the PLE conv at 0
                param.add_(0.1 * torch.randn_like(param))
    path = tmp_path_factory.mktemp("qwen4_exp")
    model.save_pretrained(path)
    return model, path


def kept_block_scores_untied(model: torch.nn.Module, ids: list[int]) -> bool:
    """Whether, at every QSA layer and query, the last block kept scores strictly above the first one dropped."""
    scores = []
    hooks = [layer.self_attn.indexer.register_forward_hook(lambda mod, args, out: scores.append((mod, args)))
             for layer in model.model.layers if hasattr(layer, "self_attn")]
    with torch.no_grad():
        model(torch.tensor([ids]))
    for hook in hooks:
        hook.remove()
    for indexer, (hidden, (cos, sin), *_) in scores:
        q, keys = indexer.index_qk_proj(hidden).split([indexer.index_n_heads * 16, 16], dim=-1)
        q = indexer.q_layernorm(q.reshape(1, len(ids), -1, 16))
        rotated = torch.cat([q[..., :4] * cos[:, :, None] + torch.cat([-q[..., 2:4], q[..., :2]], -1)
                             * sin[:, :, None], q[..., 4:]], -1)[0]
        r = indexer.compress_ratio
        pooled = indexer.k_layernorm(keys[0, : len(ids) // r * r].reshape(-1, r, 16).mean(1))
        starts = torch.arange(0, len(ids) // r * r, r)
        c, s = cos[0, starts], sin[0, starts]
        blocks = torch.cat([pooled[:, :4] * c + torch.cat([-pooled[:, 2:4], pooled[:, :2]], -1) * s, pooled[:, 4:]], -1)
        for t in range(len(ids)):
            complete = (t + 1) // r
            if complete <= indexer.block_topk:
                continue
            ranked = torch.relu(rotated[t] @ blocks[:complete].T).sum(0).sort(descending=True).values
            if ranked[indexer.block_topk - 1] == ranked[indexer.block_topk]:
                return False
    return True


@pytest.fixture(scope="module")
def llm(saved) -> LLM:
    """16-token steps: the 40-token prompt prefills in three chunks, its n-grams, conv inputs and index keys read
    back across them. One row: one ragged and one decode program (a second row's decode program cost ~10 s of
    compiling from an empty cache)."""
    return LLM(str(saved[1]), dtype="float32", max_seq_len=64, max_num_batched_tokens=16, max_num_seqs=1,
               num_pages=40, cpu_kernels=False)


def test_logits_match_hf(saved, llm):
    """Float32 rounding only at every position, and transformers' greedy choice at each."""
    model = saved[0]
    assert kept_block_scores_untied(model, PROMPT)
    with torch.no_grad():
        expected = model(torch.tensor([PROMPT])).logits[0].numpy()
    got = llm.logits(PROMPT)
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert (got.argmax(-1) == expected.argmax(-1)).all()


def test_engine_greedy_matches_hf(saved, llm):
    """Six greedy tokens of two prompts through the engine, one after the other in the one row (the first
    prefilled in 16-token chunks, so its n-grams, PLE conv and QSA blocks read earlier chunks' rows from the pages;
    decode reads them one token at a time; the second reads none of the first's) as transformers' generate gives
    them."""
    model = saved[0]
    prompts = [PROMPT, PROMPT[10:30]]  # the second crosses the EOS too
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0))
    with torch.no_grad():
        expected = [model.generate(torch.tensor([p]), max_new_tokens=6, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    assert [out.outputs[0].token_ids for out in outs] == expected


def hf_ngram_rows(ids: np.ndarray, index: int, vocab: int, base: int) -> np.ndarray:
    """transformers' rows for PLE layer `index` (its hash as Qwen4ExpTextNGramEmbedding.forward writes it, in
    int64), without building its table."""
    reference = pytest.importorskip("transformers.models.qwen4_exp.modeling_qwen4_exp")  # transformers 5.24's
    heads, per_order, size = 4, 2, 3
    sizes = [reference._find_nth_prime_after(base - 1, index * heads + h + 1) for h in range(heads)]
    offsets = np.cumsum([0] + sizes[:-1])
    multipliers = reference._build_layer_multipliers(vocab, size, index, 1234)
    eos = type("Eos", (), {"eos_token_id": 2})()
    history = torch.cat([torch.full((ids.shape[0], 2), 2), torch.tensor(ids)], -1)
    shifted = [reference.Qwen4ExpTextNGramEmbedding._shift_right_ignore_eos(eos, history, i) for i in range(size)]
    rows = []
    for n in range(2, size + 1):
        mixed = shifted[0] * multipliers[0]
        for i in range(1, n):
            mixed = torch.bitwise_xor(mixed, shifted[i] * multipliers[i])
        rows += [torch.remainder(mixed, sizes[h]) + int(offsets[h]) for h in range((n - 2) * per_order,
                                                                               (n - 1) * per_order)]
    return torch.stack(rows, -1)[:, 2:].numpy()


def test_ngram_rows_at_real_sizes():
    """The 64-bit hash in 32-bit words as transformers computes it in int64, at Qwen4-Exp's vocabulary (248320 ids)
    and table primes (from 20M): every token's rows at the second PLE layer, across EOS tokens."""
    tables = ngram_tables(248320, 3, 4, 2, 20_000_000, 8, 1234)
    ids = np.random.RandomState(0).randint(0, 248320, size=(2, 24))
    ids[0, 5], ids[1, 0], ids[1, 9], ids[1, 10] = 2, 2, 2, 2
    expected = hf_ngram_rows(ids, 1, 248320, 20_000_000)  # the second PLE layer: its own primes and multipliers
    context = sequence_context(jnp.asarray(ids, jnp.int32), 3, 2)
    assert np.array_equal(np.asarray(ngram_rows(context, tables[1], 2)), expected)


def test_conditional_generation_reads_its_language_model_text_only(saved, tmp_path):
    """Qwen4ExpForConditionalGeneration (its language model under `model.language_model.`, a vision tower beside):
    the text config and tensors read as the causal model's, leaf for leaf; the tower is not run, so an image is
    refused by name."""
    model, path = saved
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=4, out_hidden_size=64,
                  num_position_embeddings=16)
    conditional = hf.Qwen4ExpForConditionalGeneration(hf.Qwen4ExpConfig(text_config=CONFIG, vision_config=vision))
    conditional.model.language_model.load_state_dict(model.model.state_dict())
    conditional.lm_head.load_state_dict(model.lm_head.state_dict())
    conditional.save_pretrained(tmp_path)
    cfg = from_hf_config(conditional.config.to_dict())
    causal = load_hf_weights(path, from_hf_config(model.config.to_dict()), np.float32, progress=False)
    read = load_hf_weights(tmp_path, cfg, np.float32, progress=False)
    assert cfg.architecture == "Qwen4ExpForConditionalGeneration" and cfg.qwen4_exp.ple_layers == (0, 2)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(causal), jax.tree.leaves(read)))
    llm = LLM(str(tmp_path), dtype="float32", max_seq_len=64, cpu_kernels=False)
    image = {"prompt_token_ids": [5, 6, 7], "multi_modal_data": {"image": Image.new("RGB", (8, 8))}}
    with pytest.raises(ValueError, match="this model takes no images"):
        llm.generate(image, SamplingParams(max_tokens=2))


def test_hidden_state_taps_are_refused_by_name():
    """EAGLE-3 heads and MTP drafts read one residual stream; Qwen4-Exp's layers hand each other several."""
    cfg = from_hf_config({**CONFIG, "architectures": ["Qwen4ExpForCausalLM"]})
    with pytest.raises(ValueError, match="hidden-state taps .* not supported for Qwen4ExpForCausalLM"):
        forward_with_taps(None, None, None, None, cfg, (0,))


def test_fused_experts_and_sharded_tables_as_a_state_dict_holds_them(saved, tmp_path):
    """A checkpoint written from the model's state dict (each layer's experts fused, gate_up_proj [E, 2F, D] and
    down_proj [E, D, F]; the n-gram tables cut in split_ngram_parts shards as Qwen stores them) loads leaf for leaf
    as transformers' save_pretrained output does."""
    model, path = saved
    config = model.config
    config.save_pretrained(tmp_path)
    state = {}
    for name, tensor in model.state_dict().items():
        if name.endswith("ngram_embedding.weight"):
            for part, shard in enumerate(tensor.chunk(config.split_ngram_parts)):
                state[name.replace(".weight", f".shard_{part}.weight")] = shard.contiguous()
        else:
            state[name] = tensor.contiguous()
    assert "model.layers.0.mlp.experts.gate_up_proj" in state
    safetensors.torch.save_file(state, tmp_path / "model.safetensors")
    cfg = from_hf_config(config.to_dict())
    fused = load_hf_weights(tmp_path, cfg, np.float32, progress=False)
    per_expert = load_hf_weights(path, cfg, np.float32, progress=False)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(per_expert), jax.tree.leaves(fused)))


def test_quantized_pages_are_refused_by_name(saved):
    """The PLE and QSA layers read token ids and index keys back from their pages: int8 / fp8 pages refused."""
    with pytest.raises(ConfigError, match="kv_cache_dtype 'int8' is not supported for Qwen4ExpForCausalLM"):
        LLM(str(saved[1]), dtype="float32", max_seq_len=64, kv_cache_dtype="int8")
