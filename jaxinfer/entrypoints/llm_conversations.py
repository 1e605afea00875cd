"""`LLM.chat` and `LLM.beam_search`: conversations through a chat template, and the likeliest continuations
(mixed into LLM)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from jaxinfer.checkpoint.tokenizer import decode_text
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import RequestOutput
from jaxinfer.engine.beams import BeamSearchOutput
from jaxinfer.entrypoints.beam_search import beam_search, beams_refused
from jaxinfer.entrypoints.call_arguments import Prompt, progress_bar
from jaxinfer.entrypoints.chat_template import chat_prompt_ids, chat_template_of, render_conversations
from jaxinfer.entrypoints.content_format import resolve_content_format
from jaxinfer.entrypoints.lora_settings import lora_requests_for
from jaxinfer.entrypoints.multimodal import chat_prompts

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM


class ConversationCalls:
    """`chat` and `beam_search` of `LLM` (mixed into it: `self` is the LLM)."""

    def beam_search(
        self: LLM,
        prompts: Prompt | Sequence[Prompt],
        params: BeamSearchParams,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        use_tqdm: bool = False,
    ) -> list[BeamSearchOutput]:
        """Each prompt's params.beam_width likeliest continuations, best first (vLLM's `LLM.beam_search`;
        HF transformers' `generate(num_beams=...)` without sampling): one BeamSearchOutput per prompt,
        its `sequences` holding the prompt and generated ids, cumulative logprob and text of each beam.
        Prompts may be vLLM's dicts as `generate` takes them (images, prompt_embeds). use_tqdm=True shows a
        bar over the steps."""
        self._check_generating("LLM.beam_search")
        if (refused := beams_refused(self.engine.runner)) is not None:
            raise ValueError(refused)
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a BeamSearchParams, got {type(params).__name__}")
        prompts, images = self._split_prompts(prompts)
        all_ids = self._checked_ids(prompts, params.max_tokens)
        adapters = lora_requests_for(lora_request, len(all_ids))
        bar = progress_bar(use_tqdm, params.max_tokens, "Beam search", "step")

        def run(ids: list[list[int]], step: SamplingParams, loras: list[LoRARequest | None],
                found: list[tuple]) -> list[RequestOutput]:
            return self._engine_generate(ids, [step] * len(ids), None, loras, found)

        try:
            return beam_search(run, all_ids, params, self.engine.model_config.eos_token_ids,
                               lambda ids: decode_text(self.tokenizer, ids) if self.tokenizer else "", adapters,
                               bar.update, images)
        finally:
            bar.close()

    def chat(
        self: LLM,
        messages: Sequence[dict] | Sequence[Sequence[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
        tools: list[dict] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        continue_final_message: bool = False,
        chat_template_content_format: str = "auto",
    ) -> list[RequestOutput]:
        """Reply to one conversation ([{"role": ..., "content": ...}, ...]) or a list of them, as vLLM's chat.

        The prompt is the conversation through chat_template, else the tokenizer's, else the server's default
        template (one "role: content" line per message, then "assistant:"). tools (OpenAI's list) are rendered
        by templates that take them, as vLLM's; to force a call, constrain the output
        (SamplingParams(structured_outputs=...)) as the server's tool_choice does. chat_template_kwargs are more
        template variables (vLLM's; e.g. Qwen3's enable_thinking=False). continue_final_message=True (vLLM's;
        with add_generation_prompt=False) continues the last message, an assistant's prefill.
        chat_template_content_format (vLLM's: "auto", "string", "openai") says whether the template reads a
        message's content as text or as typed parts; "auto" tells from the template (entrypoints/content_format).
        """
        tokenizer = self.get_tokenizer()
        typed = resolve_content_format(chat_template_content_format,
                                       chat_template_of(tokenizer, chat_template)) == "openai"
        messages, images = chat_prompts(messages, self.image_prompts, typed)  # image_url parts: entrypoints/multimodal
        texts = render_conversations(tokenizer, messages, chat_template, add_generation_prompt, tools,
                                     chat_template_kwargs, continue_final_message, "openai" if typed else "string")
        prompts = [chat_prompt_ids(tokenizer, t) for t in texts]
        prompts = [{"prompt_token_ids": ids, "multi_modal_data": {"image": i}} if i else ids
                   for ids, i in zip(prompts, images)]
        outputs = self.generate(prompts, sampling_params, use_tqdm, lora_request)
        for text, output in zip(texts, outputs):
            output.prompt = text  # as vLLM's: the rendered conversation
        return outputs
