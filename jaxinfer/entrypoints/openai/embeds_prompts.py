"""POST /v1/completions' `prompt_embeds` (vLLM's, with `--enable-prompt-embeds`): base64 of `torch.save`d
[L, hidden_size] tensors, one or a list, each a prompt of its own; with text prompts beside them the
embeddings' choices come first, as vLLM orders them (entrypoints/prompt_embeds carries them)."""

from __future__ import annotations

from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import CompletionRequest
from jaxinfer.entrypoints.openai.serving import ServerState
from jaxinfer.entrypoints.prompt_embeds import PromptEmbeds, decode_base64


def embedded_prompts(state: ServerState, body: CompletionRequest) -> list[tuple[list[int], tuple]]:
    """Each prompt_embeds tensor as (placeholder ids, its rows as the engine carries them); 400s name the field."""
    if body.prompt_embeds is None:
        return []
    if body.echo:
        raise APIError("echo is not served with prompt_embeds (they have no text)", param="echo")
    items = [body.prompt_embeds] if isinstance(body.prompt_embeds, str) else body.prompt_embeds
    if not items:
        raise APIError("prompt_embeds is an empty list; give base64 of torch.save'd tensors", param="prompt_embeds")
    embeds = state.prompt_embeds or PromptEmbeds(False, 0)
    try:
        return [embeds.prompt(decode_base64(item, f"prompt_embeds[{i}]"), f"prompt_embeds[{i}]")
                for i, item in enumerate(items)]
    except (ValueError, TypeError) as error:
        raise APIError(str(error).replace("enable_prompt_embeds=True (the server's --enable-prompt-embeds)",
                                          "--enable-prompt-embeds"), param="prompt_embeds") from None
