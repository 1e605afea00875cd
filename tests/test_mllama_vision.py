"""Llama 3.2 Vision's image side against transformers 5.24, outside the engine (which runs Mllama on text only):
the tower and projector (models/mllama_vision) over MllamaImageProcessor's tiles give transformers' cross-attention
states, and the gated cross-attention layer (models/mllama_cross) gives transformers' layer output under the
processor's cross-attention mask, for an image using 1 of its 2 tiles after two text tokens (so a row before the
image, and unused tiles, are both exercised). The tiny checkpoint of tests/mllama_models, read from disk."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from mllama_models import VISION, VOCAB, make_mllama
from transformers.models.mllama.processing_mllama import (
    convert_sparse_cross_attention_mask_to_dense,
    get_cross_attention_token_mask,
)

from jaxinfer.checkpoint.mllama_vision_weights import cross_layer as read_cross_layer
from jaxinfer.checkpoint.mllama_vision_weights import vision_weights
from jaxinfer.checkpoint.whisper_weights import as_dtype, tensor_reader
from jaxinfer.config.model import ConfigError
from jaxinfer.models.mllama_cross import cross_keys_values, cross_layer, visible_states
from jaxinfer.models.mllama_vision import image_states, read_mllama_vision_config

PROMPT = [1, 17, VOCAB, 40, 41, 42, 43]  # BOS, a token before the image, <|image|>, text after it
IMAGE_AT = PROMPT.index(VOCAB)


@pytest.fixture(scope="module")
def mllama(tmp_path_factory):
    """(HF's model, its saved directory, the processor's inputs for one 24 x 20 RGB image: 1 tile of 2)."""
    model = make_mllama()
    path = tmp_path_factory.mktemp("mllama_vision")
    model.save_pretrained(path)
    processor = transformers.MllamaImageProcessor(size={"height": 28, "width": 28}, max_image_tiles=2)
    image = np.random.RandomState(0).randint(0, 256, (24, 20, 3), dtype=np.uint8)
    inputs = processor([[image]], return_tensors="pt")
    return model, path, inputs


def test_tower_gives_transformers_cross_attention_states(mllama):
    """The projected states of the image's tiles, the unused tile's too, within 1e-5 of the largest."""
    model, path, inputs = mllama
    hf = transformers.AutoConfig.from_pretrained(path).to_dict()
    cfg = read_mllama_vision_config(hf)
    with torch.no_grad():
        states = model.model.vision_model(pixel_values=inputs["pixel_values"],
                                          aspect_ratio_ids=inputs["aspect_ratio_ids"],
                                          aspect_ratio_mask=inputs["aspect_ratio_mask"]).last_hidden_state
        expected = model.model.multi_modal_projector(states).reshape(-1, cfg.text_hidden_size).numpy()
    weights = as_dtype(vision_weights(tensor_reader(path), cfg), jnp.float32)
    used = int(inputs["aspect_ratio_mask"].sum())
    assert used == 1 and cfg.frames == expected.shape[0]
    pixels, ratio = jnp.asarray(inputs["pixel_values"][0, 0].numpy()), jnp.int32(int(inputs["aspect_ratio_ids"][0, 0]))
    got = np.asarray(jax.jit(image_states, static_argnums=0)(cfg, weights, pixels, ratio, jnp.int32(used)))
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()


def test_cross_layer_gives_transformers_layer_output(mllama):
    """Layer 1 (cross-attention) of transformers' forward with the image and the processor's mask: its output from
    its input, the token before the image seeing every state with its MLP zeroed, as transformers computes it."""
    model, path, inputs = mllama
    num_tiles = [[int(inputs["aspect_ratio_mask"].sum())]]
    mask = convert_sparse_cross_attention_mask_to_dense([get_cross_attention_token_mask(PROMPT, VOCAB)], num_tiles,
                                                        max_num_tiles=2, length=len(PROMPT))
    seen = {}
    layer = model.model.language_model.layers[1]
    hook = layer.register_forward_hook(lambda m, args, kwargs, out: seen.update(x=args[0], out=out), with_kwargs=True)
    with torch.no_grad():
        model(input_ids=torch.tensor([PROMPT]), pixel_values=inputs["pixel_values"],
              aspect_ratio_ids=inputs["aspect_ratio_ids"], aspect_ratio_mask=inputs["aspect_ratio_mask"],
              cross_attention_mask=torch.tensor(mask))
        states = model.model.multi_modal_projector(model.model.vision_model(
            pixel_values=inputs["pixel_values"], aspect_ratio_ids=inputs["aspect_ratio_ids"],
            aspect_ratio_mask=inputs["aspect_ratio_mask"]).last_hidden_state).reshape(-1, 64)
    hook.remove()
    text = model.config.text_config
    lw = as_dtype(read_cross_layer(tensor_reader(path), 1, text.num_attention_heads, text.num_key_value_heads),
                  jnp.float32)
    eps = text.rms_norm_eps
    keys, values = cross_keys_values(lw, jnp.asarray(states.numpy()), eps)
    frames = states.shape[0]
    used = num_tiles[0][0] * (frames // VISION["max_num_tiles"])
    visible, row_on = visible_states(jnp.arange(len(PROMPT)), IMAGE_AT, used, frames)
    x = jnp.asarray(seen["x"][0].numpy())
    got = np.asarray(jax.jit(cross_layer, static_argnums=6)(lw, x, keys, values, visible, row_on, eps))
    expected = seen["out"][0].numpy()
    assert np.abs(got - expected).max() <= 1e-5 * np.abs(expected).max()
    assert np.abs(got[:IMAGE_AT] - seen["x"][0, :IMAGE_AT].numpy()).max() > 1e-3  # pre-image rows do attend


def test_vision_config_refusals(mllama):
    """What transformers would run otherwise is refused by name."""
    _, path, _ = mllama
    hf = transformers.AutoConfig.from_pretrained(path).to_dict()
    with pytest.raises(ConfigError, match="vision_output_dim 64"):
        read_mllama_vision_config({**hf, "vision_config": {**hf["vision_config"], "vision_output_dim": 64}})
    with pytest.raises(ConfigError, match=r"intermediate_layers_indices \[2\]"):
        read_mllama_vision_config({**hf, "vision_config": {**hf["vision_config"], "intermediate_layers_indices": [2]}})
