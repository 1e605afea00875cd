"""Each ragged step's `EmbedOverride`: the rows its placeholder tokens read instead of their embeddings.

The rows are a request's `image_rows` (float32, one per placeholder, in the order of its `images`):
an image's made by its model's tower, a prompt_embeds prompt's given (`ImageInput.rows`). A step
of a model whose steps take an override always gets one (a device-resident empty one when none of
its tokens is a placeholder), so its programs are the same with or without such inputs. Qwen3-VL's
rows carry its K DeepStack rows beside (`deepstack` > 0: [length, (1 + K) * D]); given rows (prompt_embeds)
get zeros there. Where a prompt is one bidirectional prefix (PaliGemma's `whole_prompt`), every prompt token's key
end is its prompt's end, negated (it sees the whole prompt on sliding layers too: models/key_span), image and text
tokens alike, in steps without image rows too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from jaxinfer.models.embed_override import EmbedOverride, stacked_override
from jaxinfer.parallel.sharding import Layout
from jaxinfer.runtime.host_step import HostStep
from jaxinfer.runtime.image_input import ImageInput

Encoder = Callable[[list[ImageInput]], list[np.ndarray]]  # each image's [length, D] float32 rows (its tower's)


def no_tower(images: list[ImageInput]) -> list[np.ndarray]:
    """The encoder of a model without a vision tower: only given rows (prompt_embeds) reach it."""
    raise ValueError("multi_modal_data: this model takes no images (it has no vision tower); send text only")


class StepRows:
    """Builds each ragged step's override; `bidirectional`: also each image token's image end (Gemma 3), or with
    `whole_prompt` each prompt token's prompt end (PaliGemma); `deepstack`: the DeepStack rows each image row carries
    beside (Qwen3-VL's K)."""

    def __init__(self, hidden_size: int, layout: Layout, encode: Encoder = no_tower, bidirectional: bool = False,
                 deepstack: int = 0, whole_prompt: bool = False):
        self.hidden_size, self.layout, self.encode, self.bidirectional = hidden_size, layout, encode, bidirectional
        self.whole_prompt = whole_prompt
        self.width = hidden_size * (1 + deepstack)  # of one image row
        self.empty: dict[int, EmbedOverride] = {}  # tokens -> an all-text override on the device

    def fill(self, requests: list[Any]) -> None:
        """Give each request with images (or given rows) and no rows yet its rows (its first schedule)."""
        for request in requests:
            if request is not None and request.images and request.image_rows is None:
                tower = [image for image in request.images if image.rows is None]  # a request's images at once
                made = iter(self.encode(tower) if tower else ())
                request.image_rows = np.concatenate([
                    self.widened(image.rows) if image.rows is not None else next(made) for image in request.images])

    def widened(self, rows: np.ndarray) -> np.ndarray:
        """Given rows [L, D] as image rows: zeros where DeepStack's would be (they add nothing)."""
        return np.pad(rows, ((0, 0), (0, self.width - rows.shape[1])))

    def override(self, host: HostStep) -> EmbedOverride:
        """The step's rows at its placeholder tokens (its requests' rows made first)."""
        tokens = len(host.tokens)
        ends = prompt_ends(host) if self.whole_prompt else None
        if host.image_tokens is None:
            if tokens not in self.empty:
                zeros = stacked_override(np.zeros((tokens, self.width), np.float32), np.zeros(tokens, bool),
                                         self.hidden_size, self._no_key_ends(tokens))
                self.empty[tokens] = jax.tree.map(self.layout.put, zeros)
            if ends is not None and ends.any():  # prompt text (a prefix hit past its images, a recompute)
                return dataclasses.replace(self.empty[tokens], key_ends=self.layout.put(ends))
            return self.empty[tokens]
        self.fill(host.requests)
        rows = np.zeros((tokens, self.width), np.float32)
        mask = host.image_tokens >= 0
        flat = np.flatnonzero(mask)
        owners = host.token_rows[flat]
        key_ends = self._no_key_ends(tokens) if ends is None else ends
        for r in np.unique(owners):
            mine = flat[owners == r]
            rows[mine] = host.requests[r].image_rows[host.image_tokens[mine]]
            if key_ends is not None and ends is None:
                key_ends[mine] = image_ends(host.requests[r].images)[host.image_tokens[mine]]
        return self.layout.put_tree(stacked_override(rows, mask, self.hidden_size, key_ends))

    def _no_key_ends(self, tokens: int) -> np.ndarray | None:
        """Zeros [tokens] int32 (every token sees up to its own position) where images attend both ways."""
        return np.zeros(tokens, np.int32) if self.bidirectional else None


def prompt_ends(host: HostStep) -> np.ndarray:
    """[T] int32: each token of a whole-prompt request's prompt gets minus the prompt's end as its key end (the whole
    prompt is one bidirectional prefix, each token seeing all of it whatever a sliding window, as HF's
    OR(window, prefix) mask); generated tokens, other requests' and padding 0 (causal)."""
    ends = np.asarray([len(r.prompt_ids) if r is not None and r.whole_prompt else 0 for r in host.requests], np.int32)
    mine = ends[host.token_rows]
    return np.where((host.positions >= 0) & (host.positions < mine), -mine, 0).astype(np.int32)


def image_ends(images: tuple[ImageInput, ...]) -> np.ndarray:
    """[image rows] int32: per row of the request's concatenated image rows, the end of its image (0 for given
    rows: they see causally, as text does)."""
    return np.concatenate([np.full(image.length, 0 if image.rows is not None else image.offset + image.length,
                                   np.int32) for image in images])
