"""Prompts with images (vLLM's `multi_modal_data`): the model's own HF image processor makes the
pixels, and each image placeholder token of the prompt is expanded to the run of
`image_seq_length` placeholders its features fill (what LLaVA's HF processor does to the text; Gemma 3's
start-of-image mark becomes its whole image sequence, as HF's Gemma3Processor makes it; Gemma 4's image token
<boi>, a row count of its own per image and <eoi>: entrypoints/gemma4_prompts; LLaVA-NeXT's and OneVision's count
per image from its size: entrypoints/anyres_prompts; PaliGemma's image tokens, bos, text and "\n":
entrypoints/paligemma_prompts).

A prompt is vLLM's dict, `{"prompt": text or "prompt_token_ids": ids, "multi_modal_data": {"image":
image or [images]}}`; an image is a PIL image or a NumPy array (H x W x C, uint8). Each `<image>`
(the processor's `image_token`) in the prompt takes the next image; a prompt may carry up to
`limit_mm_per_prompt["image"]` of them. Qwen-VL models take `"video"` too (entrypoints/qwen_video_prompts), up to
`limit_mm_per_prompt["video"]`; a chat's `video_url` part is refused by name (no video decoder is installed).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.checkpoint.gemma4_vision_weights import is_gemma4_vision
from jaxinfer.checkpoint.hf_import import auto_image_processor, transformers_version
from jaxinfer.checkpoint.loader import load_vision_weights, safetensors_index
from jaxinfer.checkpoint.vision_weights import is_vision_language
from jaxinfer.config.model import ConfigError, read_config_json
from jaxinfer.engine.prompt_checks import encode_prompt
from jaxinfer.entrypoints.anyres_prompts import anyres_prompt
from jaxinfer.entrypoints.aya_vision_prompts import MARK as AYA_MARK
from jaxinfer.entrypoints.aya_vision_prompts import aya_vision_prompt
from jaxinfer.entrypoints.cohere2_vision_prompts import cohere2_vision_prompt
from jaxinfer.entrypoints.cohere2_vision_tiles import Cohere2VisionTiles
from jaxinfer.entrypoints.gemma4_prompts import gemma4_prompt
from jaxinfer.entrypoints.idefics2_prompts import idefics2_prompt
from jaxinfer.entrypoints.idefics3_prompts import idefics3_prompt
from jaxinfer.entrypoints.internvl_prompts import internvl_prompt
from jaxinfer.entrypoints.media import load_image
from jaxinfer.entrypoints.no_images import no_images_reason
from jaxinfer.entrypoints.paligemma_prompts import paligemma_prompt
from jaxinfer.entrypoints.pixtral_prompts import mistral3_prompt
from jaxinfer.entrypoints.prompt_embeds import PromptEmbeds
from jaxinfer.entrypoints.qwen2_vl_prompts import qwen2_vl_prompt
from jaxinfer.entrypoints.qwen_video import Video, VideoProcessor, as_videos, read_video_processor
from jaxinfer.entrypoints.qwen_video_prompts import qwen_vl_video_prompt
from jaxinfer.models.aya_vision import AyaVisionConfig
from jaxinfer.models.cohere2_vision import Cohere2VisionConfig
from jaxinfer.models.gemma4_vision import Gemma4VisionConfig, with_processor_limit
from jaxinfer.models.idefics2_vision import Idefics2Config
from jaxinfer.models.idefics3_vision import Idefics3VisionConfig
from jaxinfer.models.internvl_vision import InternVLVisionConfig
from jaxinfer.models.llava_next import LlavaNextConfig
from jaxinfer.models.paligemma_vision import PaliGemmaConfig
from jaxinfer.models.pixtral_vision import Mistral3Config, with_token_ids
from jaxinfer.models.qwen2_vl_vision import Qwen2VLConfig
from jaxinfer.models.vision_language import (
    IMAGE_ARCHITECTURES,
    VisionLanguageConfig,
    VisionLanguageWeights,
    mark_token_id,
    read_vision_language_config,
)
from jaxinfer.runtime.image_input import ImageInput

MODALITIES = ("image",)
VIDEO_MODALITIES = ("image", "video")  # Qwen-VL's
DEFAULT_IMAGE_LIMIT = 999  # vLLM V1's default per modality


def load_vision(model_dir: Path, dtype: Any) -> tuple[VisionLanguageConfig, VisionLanguageWeights] | None:
    """A vision-language checkpoint's tower config and weights; None for a text-only model."""
    hf = read_config_json(model_dir)
    if (hf.get("architectures") or [None])[0] not in IMAGE_ARCHITECTURES or not takes_images(hf):
        return None
    cfg = read_vision_language_config(hf)
    index = safetensors_index(model_dir)
    if not (is_vision_language(index) or is_gemma4_vision(index)):
        raise ConfigError(f"{model_dir}: a {hf['architectures'][0]} config without vision tower tensors")
    if isinstance(cfg, Mistral3Config):  # its image runs hold [IMG_BREAK] / [IMG_END], ids only its tokenizer has
        import transformers

        cfg = with_token_ids(cfg, transformers.AutoTokenizer.from_pretrained(model_dir))
    if isinstance(cfg, Gemma4VisionConfig):  # its processor's ceiling on an image's rows caps the tower's buckets
        cfg = with_processor_limit(cfg, read_processor_config(model_dir))
    return cfg, load_vision_weights(model_dir, cfg, dtype)


def read_processor_config(model_dir: Path) -> dict[str, Any]:
    """The checkpoint's preprocessor_config.json (empty when it has none: its processor is refused on first use)."""
    path = Path(model_dir) / "preprocessor_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def takes_images(hf: Mapping[str, Any]) -> bool:
    """Whether a vision-language config has a tower (a Gemma 4 one without `vision_config` runs text-only, as
    transformers builds it without one)."""
    return hf["architectures"][0] != "Gemma4ForConditionalGeneration" or hf.get("vision_config") is not None


def image_limit(limit_mm_per_prompt: Mapping[str, int] | None, modality: str = "image") -> int:
    """Images (videos) a prompt may carry, from vLLM's `limit_mm_per_prompt` ({"image": n, "video": m}); ConfigError
    naming it."""
    if limit_mm_per_prompt is None:
        return DEFAULT_IMAGE_LIMIT
    if not isinstance(limit_mm_per_prompt, Mapping):
        raise ConfigError(f"limit_mm_per_prompt must be a dict like {{'image': 2}}, got {limit_mm_per_prompt!r}")
    unknown = sorted(set(limit_mm_per_prompt) - set(VIDEO_MODALITIES))
    limits = [limit_mm_per_prompt.get(m, DEFAULT_IMAGE_LIMIT) for m in VIDEO_MODALITIES]
    if unknown or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in limits):
        raise ConfigError(f"limit_mm_per_prompt {dict(limit_mm_per_prompt)!r}: accepted is {{'image': n, 'video': m}}"
                          f" with n, m >= 0 (videos for Qwen-VL models only)")
    return limit_mm_per_prompt.get(modality, DEFAULT_IMAGE_LIMIT)


def media_dir(value: str | Path | None) -> Path | None:
    """vLLM's `allowed_local_media_path`: an existing directory, or None (no file:// images)."""
    if value is None or value == "":
        return None
    path = Path(value)
    if not path.is_dir():
        raise ConfigError(f"allowed_local_media_path {str(value)!r} is not a directory; give the directory whose "
                          "files file:// image URLs may name")
    return path


def as_images(data: Any, field: str) -> list[Any]:
    """PIL images from a PIL image, a NumPy array [H, W, C] or a list of them; TypeError naming the field."""
    from PIL import Image

    items = list(data) if isinstance(data, (list, tuple)) else [data]
    images = []
    for i, item in enumerate(items):
        if isinstance(item, np.ndarray):
            item = Image.fromarray(item)
        if not isinstance(item, Image.Image):
            raise TypeError(f"{field}[{i}] must be a PIL image or a NumPy array, got {type(item).__name__}")
        images.append(item.convert("RGB"))
    return images


class ImagePrompts:
    """Turns a prompt and its images into token ids with expanded placeholders and `ImageInput`s."""

    def __init__(self, model_dir: Path, cfg: VisionLanguageConfig | None, tokenizer: Any, limit: int,
                 allowed_local_media_path: Path | None = None, video_limit: int = DEFAULT_IMAGE_LIMIT):
        self.model_dir, self.cfg, self.tokenizer, self.limit = model_dir, cfg, tokenizer, limit
        self.video_limit = video_limit
        self.allowed_local_media_path = allowed_local_media_path  # file:// image URLs only under it
        self._processor = None
        self._video_processor: VideoProcessor | None = None

    @property
    def modalities(self) -> tuple[str, ...]:
        """What `multi_modal_data` may hold for this model: videos too for Qwen2-VL, Qwen2.5-VL and Qwen3-VL."""
        return VIDEO_MODALITIES if isinstance(self.cfg, Qwen2VLConfig) and self.cfg.videos else MODALITIES

    def video_processor(self) -> VideoProcessor:
        """The checkpoint's video processor settings (read on first use)."""
        if self._video_processor is None:
            model_type = str(read_config_json(self.model_dir).get("model_type", ""))
            self._video_processor = read_video_processor(self.model_dir, model_type)
        return self._video_processor

    @property
    def image_token(self) -> str:
        """The placeholder text a prompt marks each image with ("<image>" for LLaVA, "<start_of_image>" for
        Gemma 3)."""
        return self.tokenizer.convert_ids_to_tokens(mark_token_id(self.cfg))

    def image_text(self) -> str:
        """What an image part of a chat message becomes: the mark, inside Qwen2-VL's vision start and end; InternVL's,
        LLaVA-NeXT's and LLaVA-OneVision's followed by a newline, as their checkpoints' chat templates render an
        image part (and vLLM joins a mark to its text); Aya Vision's the processor's `<image>` text."""
        if isinstance(self.cfg, AyaVisionConfig) and not isinstance(self.cfg, Cohere2VisionConfig):
            return AYA_MARK
        if isinstance(self.cfg, Qwen2VLConfig):
            start, end = self.tokenizer.convert_ids_to_tokens([self.cfg.vision_start_token_id,
                                                              self.cfg.vision_end_token_id])
            return f"{start}{self.image_token}{end}"
        if isinstance(self.cfg, (InternVLVisionConfig, LlavaNextConfig)):
            return f"{self.image_token}\n"
        return self.image_token

    def full_image_sequence(self) -> str:
        """What HF's Gemma3Processor puts for each start-of-image mark: blank lines around the mark, the image
        tokens and the end-of-image token."""
        image, end = self.tokenizer.convert_ids_to_tokens([self.cfg.image_token_id, self.cfg.eoi_token_id])
        return f"\n\n{self.image_token}{image * self.cfg.image_seq_length}{end}\n\n"

    def marked_ids(self, prompt: str | Sequence[int], count: int) -> tuple[list[int], int]:
        """(token ids, marks found): Gemma 3's marks expanded to its full image sequence when there is one per
        image (text through the string, as HF's processor does; ids spliced with the same tokens)."""
        if mark_token_id(self.cfg) == self.cfg.image_token_id:  # LLaVA: expanded by `expand`
            return encode_prompt(prompt, self.tokenizer), -1
        if isinstance(prompt, str):
            marks = prompt.count(self.image_token)
            text = prompt.replace(self.image_token, self.full_image_sequence()) if marks == count else prompt
            return encode_prompt(text, self.tokenizer), marks
        ids = encode_prompt(prompt, self.tokenizer)
        marks = [i for i, t in enumerate(ids) if t == self.cfg.boi_token_id]
        if len(marks) != count or self.cfg.image_token_id in ids:
            return ids, len(marks)
        sequence = self.tokenizer.encode(self.full_image_sequence(), add_special_tokens=False)
        out, previous = [], 0
        for mark in marks:
            out += ids[previous:mark] + sequence
            previous = mark + 1
        return out + ids[previous:], len(marks)

    def processor(self) -> Any:
        """The checkpoint's HF image processor (loaded on first use); ValueError naming the missing file."""
        if self._processor is None:
            loader = Cohere2VisionTiles if isinstance(self.cfg, Cohere2VisionConfig) else auto_image_processor()
            try:  # Cohere2 Vision's: a PIL port (transformers' needs torchvision)
                processor = loader.from_pretrained(self.model_dir)
            except (OSError, ValueError) as error:  # no file, or a processor class older transformers lack
                raise ValueError(f"{self.model_dir} has no image processor (preprocessor_config.json) that the "
                                 f"installed transformers ({transformers_version()}) loads: {error}") from None
            if getattr(processor, "do_pan_and_scan", False):  # Gemma 3's extra crops: more images than marks
                raise ValueError(f"{self.model_dir}: preprocessor_config.json's do_pan_and_scan true is not "
                                 "supported (one image, one crop); set it false")
            self._processor = processor
        return self._processor

    def check_count(self, count: int, field: str) -> None:
        """ValueError when a prompt carries images this model cannot take, or more than the limit."""
        if self.cfg is None and count:
            reason = no_images_reason(self.model_dir)
            raise ValueError(f"{field}: this model takes no images ({reason}); send text only")
        if count > self.limit:
            raise ValueError(f"{field}: {count} images in one prompt, more than limit_mm_per_prompt's "
                             f"{{'image': {self.limit}}}")

    def prompt(self, prompt: str | Sequence[int], images: list[Any], field: str, videos: Sequence[Video] = ()
               ) -> tuple[list[int], tuple]:
        """(ids with each image's (video's) placeholders expanded, the images (videos) as the engine carries them)."""
        self.check_count(len(images), field)
        if videos:
            if len(videos) > self.video_limit:
                raise ValueError(f"{field}: {len(videos)} videos in one prompt, more than limit_mm_per_prompt's "
                                 f"{{'video': {self.video_limit}}}")
            return qwen_vl_video_prompt(prompt, images, list(videos), self.cfg, self.tokenizer,
                                        self.processor() if images else None, self.video_processor(), field)
        if not images:
            return encode_prompt(prompt, self.tokenizer), ()
        if isinstance(self.cfg, Qwen2VLConfig):  # a pad count per image, from its size
            return qwen2_vl_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, Mistral3Config):  # a run of [IMG] rows and breaks per image, from its size
            return mistral3_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, Idefics3VisionConfig):  # tiles, each its own run of <image> rows between text marks
            return idefics3_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, Idefics2Config):  # tiles of many sizes, each its own run of <image> rows between marks
            return idefics2_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, InternVLVisionConfig):  # tiles end to end in one <IMG_CONTEXT> run per image
            return internvl_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, Gemma4VisionConfig):  # <boi>, a row count per image from its size, <eoi>
            return gemma4_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, Cohere2VisionConfig):  # tiles, each its own run of patches and a line break
            return cohere2_vision_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, AyaVisionConfig):  # tiles, each its own run of patches between text marks
            return aya_vision_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, LlavaNextConfig):  # a placeholder count per image from its size and grid of tiles
            return anyres_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        if isinstance(self.cfg, PaliGemmaConfig):  # image tokens, bos, text, "\n" (HF's PaliGemmaProcessor)
            return paligemma_prompt(prompt, images, self.cfg, self.tokenizer, self.processor(), field)
        ids, found = self.marked_ids(prompt, len(images))
        token, length = self.cfg.image_token_id, self.cfg.image_seq_length
        marks = [i for i, t in enumerate(ids) if t == token]
        expanded = len(marks) == len(images) * length and all(
            marks[k * length + length - 1] - marks[k * length] == length - 1 for k in range(len(images)))
        if (len(marks) != len(images) or found >= 0) and not expanded:
            found = len(marks) if found < 0 else found
            raise ValueError(f"{field}: the prompt marks {found} image(s) with {self.image_token!r} and "
                             f"{len(images)} were given; put one {self.image_token!r} where each image goes")
        pixels = self.processor()(images, return_tensors="np")["pixel_values"]
        v = self.cfg.vision
        if pixels.shape[1:] != (v.num_channels, v.image_size, v.image_size):
            raise ValueError(f"{field}: the image processor made {pixels.shape[1:]} pixels, the tower takes "
                             f"{(v.num_channels, v.image_size, v.image_size)}")
        if expanded:  # token ids whose placeholders were expanded already (as HF's processor returns them)
            return ids, tuple(ImageInput.of(marks[k * length], length, p) for k, p in enumerate(pixels))
        return expand(ids, marks, pixels, length)

    def chat_images(self, contents: Sequence[Any], field: str, typed: bool = False) -> tuple[list[Any], list[Any]]:
        """Messages' contents with each `image_url` part as the placeholder text (typed: as {"type": "image"}, whose
        mark the template writes: the "openai" content format), and the images (read from their URLs, see
        entrypoints/media) in order; ValueError naming the part a model cannot take."""
        out, images = [], []
        for i, content in enumerate(contents):
            if isinstance(content, str) or not isinstance(content, Sequence):
                out.append(content)
                continue
            parts = []
            for j, part in enumerate(content):
                where = f"{field}[{i}].content[{j}]"
                if typed and isinstance(part, Mapping) and part.get("type") == "image":  # a mark with no image
                    raise ValueError(f"{where}: an {{'type': 'image'}} part carries no image; send an image_url part")
                if isinstance(part, Mapping) and part.get("type") == "video_url":
                    raise ValueError(f"{where}: video_url parts are not supported: reading a video file needs a "
                                     "video decoder (PyAV, decord, OpenCV or imageio), none of which jaxinfer uses; "
                                     + ("pass its frames as multi_modal_data['video'] to LLM.generate" if
                                        "video" in self.modalities else "this model takes no videos"))
                if not (isinstance(part, Mapping) and part.get("type") == "image_url"):
                    parts.append(part)
                    continue
                if self.cfg is None:
                    raise ValueError(f"{where}: this model takes no images ({no_images_reason(self.model_dir)}); "
                                     "send text parts")
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, Mapping) else url
                images.append(load_image(url, f"{where}.image_url.url", self.allowed_local_media_path))
                parts.append({"type": "image"} if typed else {"type": "text", "text": self.image_text()})
            out.append(parts)
        self.check_count(len(images), field)
        return out, images


def chat_prompts(messages: Any, images: ImagePrompts, typed: bool = False) -> tuple[Any, list[list[Any]]]:
    """`LLM.chat`'s conversation (or list of them) with image parts as placeholder text (typed: as image parts
    whose marks the template writes), and each one's images."""
    several = isinstance(messages, Sequence) and not isinstance(messages, str) and bool(messages) and \
        isinstance(messages[0], Sequence) and not isinstance(messages[0], (str, Mapping))
    out, found = [], []
    for c, conversation in enumerate(messages if several else [messages]):
        if not isinstance(conversation, Sequence) or isinstance(conversation, str):
            out.append(conversation)
            found.append([])
            continue
        field = f"messages[{c}]" if several else "messages"
        contents = [m.get("content") if isinstance(m, Mapping) else None for m in conversation]
        contents, pictures = images.chat_images(contents, field, typed)
        out.append([{**m, "content": content} if isinstance(m, Mapping) else m
                    for m, content in zip(conversation, contents)])
        found.append(pictures)
    return (out if several else out[0]), found


def expand(ids: list[int], marks: list[int], pixels: np.ndarray, length: int) -> tuple[list[int], tuple]:
    """ids with the placeholder at each mark repeated `length` times, and each image's ImageInput there."""
    out, images, previous = [], [], 0
    for mark, image in zip(marks, pixels):
        out += ids[previous:mark]
        images.append(ImageInput.of(len(out), length, image))
        out += [ids[mark]] * length
        previous = mark + 1
    return out + ids[previous:], tuple(images)


def split_prompts(prompts: Any, images: ImagePrompts, embeds: PromptEmbeds | None = None
                  ) -> tuple[Any, list[tuple] | None]:
    """vLLM's dict prompts as (token ids, images) pairs (a prompt_embeds dict's images: its given rows); other
    prompts pass as they are. Returns (prompts, each one's images; None when no prompt was a dict)."""
    if isinstance(prompts, Mapping):
        prompts = [prompts]
    if isinstance(prompts, str) or not isinstance(prompts, Sequence) or \
            not any(isinstance(p, Mapping) for p in prompts):
        return prompts, None
    out, carried = [], []
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, Mapping):
            out.append(prompt)
            carried.append(())
            continue
        ids, found = dict_prompt(prompt, images, f"prompts[{i}]", embeds)
        out.append(ids)
        carried.append(found)
    return out, carried


def dict_prompt(prompt: Mapping[str, Any], images: ImagePrompts, field: str, embeds: PromptEmbeds | None = None
                ) -> tuple[list[int], tuple]:
    """One vLLM dict prompt's ids and images; ValueError naming a key it cannot take."""
    if "prompt_embeds" in prompt:
        return (embeds or PromptEmbeds(False, 0)).dict_prompt(prompt, field)
    unknown = sorted(set(prompt) - {"prompt", "prompt_token_ids", "multi_modal_data"})
    if unknown or ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise ValueError(f"{field}: a dict prompt holds 'prompt' (text) or 'prompt_token_ids', and optionally "
                         f"'multi_modal_data'; got keys {sorted(prompt)}")
    data = prompt.get("multi_modal_data") or {}
    if not isinstance(data, Mapping) or set(data) - set(images.modalities):
        got = sorted(data) if isinstance(data, Mapping) else type(data).__name__
        if images.cfg is None:  # a text model (Gemma 3n's checkpoints hold audio and vision towers it does not run)
            raise ValueError(f"{field}.multi_modal_data: this model runs no vision or audio tower, so it takes text "
                             f"only; got {got}")
        raise ValueError(f"{field}.multi_modal_data: served modalities are {images.modalities}, got {got}")
    pictures = as_images(data["image"], f"{field}.multi_modal_data.image") if "image" in data else []
    videos = as_videos(data["video"], f"{field}.multi_modal_data.video") if "video" in data else []
    text = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]
    return images.prompt(text, pictures, f"{field}.multi_modal_data", videos)
