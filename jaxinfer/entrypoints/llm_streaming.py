"""`LLM.stream` and `stream_text`: one request's outputs as they are produced (mixed into LLM)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Iterator

from jaxinfer.config import validation
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import RequestOutput
from jaxinfer.entrypoints.call_arguments import Prompt
from jaxinfer.entrypoints.lora_settings import lora_requests_for
from jaxinfer.entrypoints.multimodal import dict_prompt

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM


class StreamCalls:
    """The streaming calls of `LLM` (mixed into it: `self` is the LLM)."""

    def stream(self: LLM, prompt: Prompt, sampling_params: SamplingParams | None = None,
               lora_request: LoRARequest | None = None) -> Iterator[RequestOutput]:
        """Yield one request's outputs as they are produced (a few tokens per device call), as vLLM's
        AsyncLLM.generate: RequestOutput deltas whose `outputs` hold every sample's new text and token
        ids, its index and, once it ended, its finish reason. Closing the iterator early aborts the request.
        The prompt may be vLLM's dict, as `generate` takes it (images, prompt_embeds).
        """
        self._check_generating("LLM.stream")
        prompt, images = self._stream_prompt(prompt, "stream")
        yield from self._stream_checked(prompt, images, self._params_for([prompt], sampling_params), lora_request)

    def _stream_checked(self: LLM, prompt: Prompt, images: list[tuple] | None, params: list[SamplingParams],
                        lora_request: LoRARequest | None) -> Iterator[RequestOutput]:
        """`stream` of a prompt `_stream_prompt` already read (a dict prompt's images decoded once)."""
        (request_id,) = self._front.add([prompt], params, final_only=False, streamed=True,
                                        lora_requests=lora_requests_for(lora_request, 1), images=images)
        yield from self._front.stream(request_id)

    def _stream_prompt(self: LLM, prompt: Prompt, method: str) -> tuple[Prompt, list[tuple] | None]:
        """One prompt of `method` checked: a str or ids as they are, a dict prompt as (its ids, [its images])."""
        if isinstance(prompt, Mapping) and self.audio_prompts is not None:  # a speech model's: its audio
            ids, audio = self.audio_prompts.prompt(prompt, "prompt")
            return ids, [audio]
        if isinstance(prompt, Mapping):
            ids, images = dict_prompt(prompt, self.image_prompts, "prompt", self.prompt_embeds)
            return ids, [images]
        return validation.single_prompt(prompt, "prompt", method, self.config.vocab_size), None

    def stream_text(self: LLM, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text pieces of one single-sample request as they are produced (`stream` gives more)."""
        self._check_generating("LLM.stream_text")
        prompt, images = self._stream_prompt(prompt, "stream_text")
        checked = self._params_for([prompt], sampling_params)
        if checked[0].n != 1:
            raise ValueError(f"stream_text streams one sample's text, got SamplingParams(n={checked[0].n}); use "
                             "stream(), whose deltas carry each sample's index")
        # stopping early aborts the request
        with contextlib.closing(self._stream_checked(prompt, images, checked, None)) as deltas:
            for delta in deltas:
                if delta.outputs[0].text:
                    yield delta.outputs[0].text
