"""Chat messages to prompt text through the tokenizer's chat template (`LLM.chat` and the server).

No jax and no server extra: the checks raise ValueError/TypeError naming the field, and the
server turns them into 400s.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from jaxinfer.config import validation
from jaxinfer.entrypoints.content_format import resolve_content_format

# Used when the tokenizer has no chat template of its own (the demo model has none): one
# "role: content" line per message, then "assistant:" for the reply. Documented in docs/serving.md.
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def message_text(content: Any, field: str) -> str:
    """A message's content as text: a str, None (empty) or a list of OpenAI text parts, joined."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, Sequence):
        raise TypeError(f"{field} must be a str or a list of text parts, got {type(content).__name__}")
    return "".join(text_part(part, f"{field}[{i}]") for i, part in enumerate(content))


def text_part(part: Any, field: str) -> str:
    """A text content part's text; ValueError naming the field for any other part."""
    if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
        raise ValueError(f"{field}: only text content parts ({{'type': 'text', 'text': ...}}) are supported, "
                         f"got {part!r:.80}")
    return part["text"]


def message_parts(content: Any, field: str) -> list[dict[str, str]]:
    """A message's content as typed parts (the "openai" content format): a str as one text part, None as none;
    text parts checked as message_text checks them, and image parts ({"type": "image"}, what
    multimodal.chat_images makes of an image_url part) kept for the template to mark."""
    if content is None or isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, Sequence):
        raise TypeError(f"{field} must be a str or a list of content parts, got {type(content).__name__}")
    return [{"type": "image"} if isinstance(part, Mapping) and dict(part) == {"type": "image"} else
            {"type": "text", "text": text_part(part, f"{field}[{i}]")} for i, part in enumerate(content)]


def message_content(content: Any, field: str, content_format: str) -> str | list[dict[str, str]]:
    """A message's content as its template reads it: text ("string") or typed parts ("openai")."""
    return message_parts(content, field) if content_format == "openai" else message_text(content, field)


def chat_template_of(tokenizer: Any, chat_template: str | None = None) -> str:
    """The template a chat renders through: chat_template, else the tokenizer's, else DEFAULT_CHAT_TEMPLATE."""
    return chat_template or getattr(tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE


def conversation(messages: Any, field: str = "messages", content_format: str = "string") -> list[dict[str, Any]]:
    """Checked messages as [{"role": ..., "content": text or parts}, ...]; at least one."""
    if isinstance(messages, (str, Mapping)) or not isinstance(messages, Sequence) or not messages:
        raise TypeError(f"{field} must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                        f"got {messages!r:.80}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise TypeError(f"{field}[{i}] must be a dict with a str 'role' and a 'content', got {message!r:.80}")
        content = message_content(message.get("content"), f"{field}[{i}].content", content_format)
        out.append({"role": message["role"], "content": content})
    return out


def conversations(messages: Any, content_format: str = "string") -> list[list[dict[str, Any]]]:
    """One conversation or a list of them (as vLLM's `LLM.chat` takes), checked, as a list."""
    if isinstance(messages, Sequence) and not isinstance(messages, str) and messages and \
            isinstance(messages[0], Sequence) and not isinstance(messages[0], str):
        return [conversation(c, f"messages[{i}]", content_format) for i, c in enumerate(messages)]
    return [conversation(messages, content_format=content_format)]


def render_chat(
    tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool = True, chat_template: str | None = None,
    tools: list[dict] | None = None, template_kwargs: Mapping[str, Any] | None = None,
    continue_final_message: bool = False,
) -> str:
    """The conversation as prompt text: chat_template, else the tokenizer's, else DEFAULT_CHAT_TEMPLATE.

    tools (OpenAI's tool list) go to the template as `tools`, which tool-calling templates render;
    the default template has no place for them. template_kwargs are more template variables (e.g.
    Qwen3's `enable_thinking`), checked by check_template_kwargs. continue_final_message leaves the last
    message open for the model to go on with (an assistant prefill), as transformers renders it.
    """
    template = chat_template_of(tokenizer, chat_template)
    try:
        return tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt, tools=tools,
            continue_final_message=continue_final_message, **(template_kwargs or {}),
        )
    except Exception as error:  # a template may raise on roles or orders it does not accept
        raise ValueError(f"messages: the chat template rejected them: {error}") from None


def check_template_kwargs(tokenizer: Any, template_kwargs: Mapping[str, Any] | None) -> None:
    """ValueError for a template variable that would set one of apply_chat_template's own arguments."""
    own = {name for name, p in inspect.signature(tokenizer.apply_chat_template).parameters.items()
           if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    taken = sorted(own.intersection(template_kwargs or {}))
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {', '.join(taken)}: the chat renderer sets them; give the "
                         "template's own variables (e.g. enable_thinking)")


def render_conversations(
    tokenizer: Any, messages: Any, chat_template: Any, add_generation_prompt: Any, tools: Any, template_kwargs: Any,
    continue_final_message: Any = False, content_format: Any = "auto",
) -> list[str]:
    """`LLM.chat`'s arguments checked by name, and each conversation (one, or a list of them) rendered, its
    contents as text or typed parts as content_format (vLLM's chat_template_content_format) resolves for the
    template."""
    if chat_template is not None and not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a Jinja template string or None, got {type(chat_template).__name__}")
    generation_prompt = validation.boolean(add_generation_prompt, "add_generation_prompt")
    continue_final = check_continuation(generation_prompt, continue_final_message)
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise TypeError(f"tools must be a list of OpenAI tool dicts or None, got {tools!r:.80}")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise TypeError(f"chat_template_kwargs must be a dict of template variables or None, "
                        f"got {type(template_kwargs).__name__}")
    check_template_kwargs(tokenizer, template_kwargs)
    content_format = resolve_content_format(content_format, chat_template_of(tokenizer, chat_template))
    return [render_chat(tokenizer, c, generation_prompt, chat_template, tools, template_kwargs, continue_final)
            for c in conversations(messages, content_format)]


def check_continuation(add_generation_prompt: bool, continue_final_message: Any) -> bool:
    """continue_final_message as a bool; with add_generation_prompt it is a ValueError (vLLM's: a new
    assistant turn and the last message continued are two different prompts)."""
    continue_final = validation.boolean(continue_final_message, "continue_final_message")
    if continue_final and add_generation_prompt:
        raise ValueError("continue_final_message=True continues the last message, add_generation_prompt=True starts "
                         "a new one: set add_generation_prompt=False")
    return continue_final


def chat_prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a rendered conversation (the template writes any BOS itself)."""
    return list(tokenizer.encode(text, add_special_tokens=False))
