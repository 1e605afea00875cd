"""vLLM's chat_template_content_format: templates that print a message's content read it as text ("string"),
templates that loop over its parts read typed parts ("openai"), told apart from the Jinja syntax tree; the forced
formats render as given, and a bad value is refused by name. No engine: HF's tiny tokenizer renders."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hf_models import save_tiny_tokenizer
from test_llava_next import STRING_TEMPLATE, TYPED_TEMPLATE

from jaxinfer.entrypoints.chat_template import DEFAULT_CHAT_TEMPLATE, render_conversations
from jaxinfer.entrypoints.content_format import detect_content_format, resolve_content_format
from jaxinfer.entrypoints.openai.chat import chat_content_format, render_chat
from jaxinfer.entrypoints.openai.protocol import ChatMessage

LLAMA3_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                   "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                   "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
                   "{% endif %}")
# llava-hf/llava-v1.6-mistral-7b-hf's and llava-onevision's shape: a loop over the content's typed parts
LLAVA_HF_TEMPLATE = ("{% for message in messages %}{{ message['role'].upper() + ': ' }}"
                     "{% for content in message['content'] %}{% if content['type'] == 'image' %}{{ '<image>\\n' }}"
                     "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}{% endfor %}{% endfor %}"
                     "{{ ' ASSISTANT:' }}")
# the parts reached through assignments, and messages through a slice (a system message taken apart)
SET_TEMPLATE = ("{% set rest = messages[1:] %}{% for m in rest %}{% set c = m.content %}{% set parts = c %}"
                "{% for p in parts %}{{ p.text }}{% endfor %}{% endfor %}")
CONVERSATION = [{"role": "user", "content": [{"type": "text", "text": "The quick"}, {"type": "text", "text": " fox"}]}]


@pytest.mark.parametrize("template, expected", [
    (DEFAULT_CHAT_TEMPLATE, "string"), (LLAMA3_TEMPLATE, "string"), (STRING_TEMPLATE, "string"),
    (LLAVA_HF_TEMPLATE, "openai"), (TYPED_TEMPLATE, "openai"), (SET_TEMPLATE, "openai"),
    ("{% for x in", "string"),  # unparsable: rendering reports the template's own error
])
def test_detection_from_the_template(template, expected):
    assert detect_content_format(template) == expected


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    import transformers

    path = tmp_path_factory.mktemp("tokenizer")
    save_tiny_tokenizer(path)
    return transformers.AutoTokenizer.from_pretrained(path)


def render(tokenizer, template: str, content_format: str, messages=CONVERSATION) -> str:
    (text,) = render_conversations(tokenizer, messages, template, False, None, None, False, content_format)
    return text


def test_formats_render_as_given_or_detected(tokenizer):
    """"auto" renders each template in its own format; forcing the other loses the text (or fails in the template)."""
    assert render(tokenizer, LLAVA_HF_TEMPLATE, "auto") == "USER: The quick fox ASSISTANT:"
    assert render(tokenizer, LLAVA_HF_TEMPLATE, "openai") == "USER: The quick fox ASSISTANT:"
    assert render(tokenizer, LLAVA_HF_TEMPLATE, "string") == "USER:  ASSISTANT:"  # the bug "auto" fixes
    assert render(tokenizer, STRING_TEMPLATE, "auto") == "USER: The quick fox ASSISTANT:"
    with pytest.raises(ValueError, match=r"the chat template rejected them: can only concatenate str \(not \"list\"\)"):
        render(tokenizer, STRING_TEMPLATE, "openai")
    # a str content is one text part to a typed template
    assert render(tokenizer, LLAVA_HF_TEMPLATE, "auto", [{"role": "user", "content": "hi"}]) == "USER: hi ASSISTANT:"


def test_server_renders_in_the_served_templates_format(tokenizer, monkeypatch):
    """The server's format: --chat-template-content-format, with "auto" the served template's own."""
    monkeypatch.setattr(tokenizer, "chat_template", LLAVA_HF_TEMPLATE)
    assert chat_content_format(SimpleNamespace(tokenizer=tokenizer, content_format="auto")) == "openai"
    assert chat_content_format(SimpleNamespace(tokenizer=tokenizer, content_format="string")) == "string"
    messages = [ChatMessage(role="user", content=CONVERSATION[0]["content"])]
    assert render_chat(tokenizer, messages, False, content_format="openai") == "USER: The quick fox ASSISTANT:"


def test_bad_values_refused_by_name(tokenizer):
    with pytest.raises(ValueError, match=r"chat_template_content_format 'json' is not supported; accepted: auto, "
                                         r"string, openai"):
        resolve_content_format("json", STRING_TEMPLATE)
    image = [{"role": "user", "content": [{"type": "image"}]}]  # a mark without an image_url (and so no image)
    with pytest.raises(ValueError, match=r"messages\[0\].content\[0\]: only text content parts"):
        render(tokenizer, LLAVA_HF_TEMPLATE, "string", image)
    with pytest.raises(ValueError, match=r"messages\[0\].content\[1\]: only text content parts"):
        render(tokenizer, LLAVA_HF_TEMPLATE, "openai", [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                       {"type": "audio"}]}])
