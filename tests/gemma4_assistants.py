"""Tiny Gemma 4 assistants (transformers' Gemma4AssistantForCausalLM) for make_hf_model("gemma4_dense"): random
ones, and one built to draft a given token-to-token map (a test makes it the target's own greedy continuations,
so drafts are accepted as well as rejected)."""

from __future__ import annotations

import torch
from hf_models import hf

# The assistant's text model: half the target's width, its layers of the target's two kinds and K/V shapes.
TEXT = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, global_head_dim=16, sliding_window=8, rms_norm_eps=1e-5,
            layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
            vocab_size_per_layer_input=0, num_kv_shared_layers=2, pad_token_id=0)


def make_assistant(ordered: bool, text: dict | None = None, **overrides) -> torch.nn.Module:
    """A random float32 assistant for make_hf_model("gemma4_dense") (norms off 1, a random token ordering); text:
    settings of its text model over TEXT's (for a target of other K/V shapes)."""
    config = hf.Gemma4AssistantConfig(text_config=hf.Gemma4TextConfig(**{**TEXT, **(text or {})}),
                                      **{"backbone_hidden_size": 64, **overrides},
                                      use_ordered_embeddings=ordered, num_centroids=16,
                                      centroid_intermediate_top_k=4)
    torch.manual_seed(1)
    model = hf.Gemma4AssistantForCausalLM(config).eval()
    with torch.no_grad():
        for param in model.parameters():  # matrices at a scale that gives peaky logits, norms away from 1
            if param.dim() > 1:
                param.normal_(0.0, 0.1)
            else:
                param.add_(0.1 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.add_(0.1 * torch.randn_like(buffer))
        if ordered:
            model.masked_embedding.token_ordering.copy_(torch.randperm(256))
    return model


def following_assistant(target: torch.nn.Module, follows: dict[int, int]) -> torch.nn.Module:
    """An assistant drafting follows[t] after token t (others: noise), whatever the target's state says much:
    pre_projection passes the first D coordinates of the target's scaled embedding of t at unit scale (and a
    little of the state), its layers add nothing to the residual (o_proj and down_proj zero, layer scalars 1),
    and its tied head's row v is the sum of the normed inputs of the tokens v follows, scaled to unit norm."""
    model = make_assistant(False)
    d, width = model.config.text_config.hidden_size, model.config.backbone_hidden_size
    embed = target.get_input_embeddings().weight.detach()[:, :d]
    scale = 1.0 / (width**0.5 * embed.pow(2).mean().sqrt())  # the target's embedding scaling undone, to unit rms
    normed = embed / embed.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)  # the padding row is zeros
    gen = torch.Generator().manual_seed(2)
    head = 0.01 * torch.randn(embed.shape[0], d, generator=gen)
    for following in set(follows.values()):  # each row unit-norm: a token many others map to does not dominate
        rows = sum(normed[token] for token, f in follows.items() if f == following)
        head[following] += rows / rows.norm()
    with torch.no_grad():
        model.pre_projection.weight.copy_(torch.cat(
            [scale * torch.eye(d, width), 0.01 * torch.randn(d, width, generator=gen)], dim=1))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            layer.layer_scalar.fill_(1.0)
        model.model.norm.weight.fill_(1.0)
        model.model.embed_tokens.weight.copy_(head)
    return model
