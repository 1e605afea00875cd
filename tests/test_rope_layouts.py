"""apply_rope's two layouts against transformers' own functions: rotate-half (Llama's) and adjacent pairs (GLM's)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers.models.glm import modeling_glm
from transformers.models.llama import modeling_llama

from jaxinfer.config.model import RopeScaling
from jaxinfer.models.rope import apply_rope, cos_sin

HEAD_DIM = 16


@pytest.mark.parametrize("interleaved", [False, True], ids=["halves", "pairs"])
@pytest.mark.parametrize("rotated", [HEAD_DIM, 8], ids=["full", "partial"])
def test_apply_rope_matches_transformers(interleaved, rotated):
    """q [B=2, T=5, heads=3, 16] at scattered positions; HF takes [B, heads, T, K] and the same cos/sin tables."""
    rng = np.random.RandomState(0)
    q = rng.randn(2, 5, 3, HEAD_DIM).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 30, 31, 90, 500]])
    cos, sin = cos_sin(positions, rotated, 100.0, RopeScaling())
    ours = np.asarray(apply_rope(q, cos, sin, interleaved))
    hf_apply = modeling_glm.apply_rotary_pos_emb if interleaved else modeling_llama.apply_rotary_pos_emb
    q_t = torch.from_numpy(q).transpose(1, 2)
    cos_t, sin_t = torch.tensor(np.asarray(cos)), torch.tensor(np.asarray(sin))
    if rotated < HEAD_DIM and not interleaved:  # Llama's function turns the whole head; the rest passes through
        theirs = torch.cat([hf_apply(q_t[..., :rotated], q_t[..., :rotated], cos_t, sin_t)[0], q_t[..., rotated:]], -1)
    else:
        theirs = hf_apply(q_t, q_t, cos_t, sin_t)[0]
    np.testing.assert_allclose(ours, theirs.transpose(1, 2).numpy(), atol=1e-6, rtol=0)
    assert np.array_equal(ours[..., rotated:], q[..., rotated:])
