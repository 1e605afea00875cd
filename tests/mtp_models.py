"""Tiny checkpoints holding an MTP layer (DeepSeek-V3's, GLM-4.5's `model.layers.{num_hidden_layers}.*`).

transformers' DeepseekV3 and Glm4Moe classes neither build nor save MTP layers, so the fixture saves
the tiny model, then writes the MTP tensors beside it under their published names: the decoder layer's
from the same HF class built one layer deeper (its last layer, an MoE layer), the rest set so the
layer mostly drafts a given token-to-token map (a test makes it the target's own greedy continuations,
so drafts are accepted as well as rejected).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hf_models import make_hf_model, save_hf_model
from safetensors.torch import load_file, save_file


def deeper_model(name: str) -> torch.nn.Module:
    """The named tiny HF model one layer deeper: its last layer is the MTP layer's decoder layer, with its two
    outputs into the residual (o_proj, the experts' down projections) scaled down so the token's embedding
    dominates the MTP layer's output."""
    model = make_hf_model(name, num_hidden_layers=make_hf_model(name).config.num_hidden_layers + 1)
    with torch.no_grad():
        for key, param in model.model.layers[-1].named_parameters():
            if key.endswith(("o_proj.weight", "down_proj.weight", "down_proj")):
                param.mul_(0.1)
    return model


def mtp_tensors(name: str, scratch: Path, follows: dict[int, int], seed: int = 1) -> dict[str, torch.Tensor]:
    """The MTP layer of the named tiny config (index num_hidden_layers), by stored name, drafting
    follows[t] after token t (t_{i+2} from t_{i+1}; others: noise): eh_proj passes the token's normed
    embedding plus a little of h_i, the decoder layer's outputs are scaled down, and shared_head.head's
    row v is the sum of the normed embeddings of the tokens v follows, scaled to unit norm. The deeper model is saved in scratch:
    transformers renames fused expert tensors only as it saves."""
    base = make_hf_model(name)
    layers, d, vocab = base.config.num_hidden_layers, base.config.hidden_size, base.config.vocab_size
    deeper_model(name).save_pretrained(scratch, safe_serialization=True)
    prefix = f"model.layers.{layers}."
    tensors = {k: v for k, v in load_file(scratch / "model.safetensors").items() if k.startswith(prefix)}
    gen = torch.Generator().manual_seed(seed)
    noise = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    embed = base.model.embed_tokens.weight.detach()
    normed = embed / embed.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-6)  # the padding row is zeros
    head = 0.01 * noise(vocab, d)
    for following in set(follows.values()):  # each row unit-norm: a token many others map to does not dominate
        rows = sum(normed[token] for token, f in follows.items() if f == following)
        head[following] += rows / rows.norm()
    tensors.update({
        prefix + "enorm.weight": 1 + 0.1 * noise(d),
        prefix + "hnorm.weight": 1 + 0.1 * noise(d),
        prefix + "eh_proj.weight": torch.cat([torch.eye(d), 0.05 * noise(d, d)], dim=1),
        prefix + "shared_head.norm.weight": 1 + 0.1 * noise(d),
        prefix + "shared_head.head.weight": head,
    })
    return {k: v.contiguous() for k, v in tensors.items()}


def save_with_mtp(name: str, path: Path, follows: dict[int, int]) -> Path:
    """A tiny checkpoint of the named config with an MTP layer in its own safetensors file (path/model)."""
    model = save_hf_model(name, path / "model")
    save_file(mtp_tensors(name, path / "deeper", follows), model / "mtp.safetensors")
    return model
