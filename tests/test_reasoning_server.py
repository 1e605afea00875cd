"""--reasoning-parser through the server with the official `openai` client: the tiny model's output is
forced through a regex (guided_regex) to hold thinking tags, and the reply's reasoning_content and
content, streamed and not, must be its parts. Tool-call parsers through the same server: their calls,
streamed and not (Kimi K2's ids as the reply writes them)."""

from __future__ import annotations

import json
import re
import shutil

import openai
import pytest
from live_server import serve_in_thread
from reasoning_streams import stream_parts

from jaxinfer import LLM
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.entrypoints.openai.reasoning import PARSERS
from jaxinfer.entrypoints.openai.tool_parsers import TOOL_PARSERS

pytest.importorskip("llguidance")

THINKING = "<think>[a-z ]{1,20}</think>[a-z ]{1,20}"
MESSAGES = [{"role": "user", "content": "think first"}]
CALL = r'<tool_call>\{"name": "get_time", "arguments": \{\}\}</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
KIMI_MARKERS = ["<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>",
                "<|tool_call_end|>", "<|tool_calls_section_end|>"]


@pytest.fixture(scope="module")
def served(text_model_dir, tmp_path_factory):
    """(ServerState, openai client) of the tiny text model served with --reasoning-parser deepseek_r1; its
    tokenizer has Kimi K2's tool-call markers as special tokens (ids 300-304 of its 320), as Kimi's has."""
    import transformers

    path = tmp_path_factory.mktemp("kimi_markers")
    shutil.copytree(text_model_dir, path, dirs_exist_ok=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": KIMI_MARKERS})
    tokenizer.save_pretrained(path)
    llm = LLM(path, dtype="float32", max_seq_len=128)
    with serve_in_thread(llm, ServerConfig("tiny", reasoning_parser="deepseek_r1")) as (url, app):
        yield app.state.server, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def chat(client: openai.OpenAI, regex: str | None = THINKING, **fields):
    extra = {"guided_regex": regex} if regex else {}
    fields = {"max_tokens": 60, "temperature": 1.0, "seed": 7, **fields}
    return client.chat.completions.create(model="tiny", messages=MESSAGES,
                                          extra_body={**extra, **fields.pop("extra_body", {})}, **fields)


def raw_texts(served, monkeypatch, **fields) -> list[str]:
    """The choices' text as a server without a reasoning parser returns it."""
    state, client = served
    with monkeypatch.context() as patch:
        patch.setattr(state, "reasoning_parser", None)
        response = chat(client, **fields)
    assert all("reasoning_content" not in (c.message.model_extra or {}) for c in response.choices)
    return [c.message.content for c in response.choices]


def streamed(client: openai.OpenAI, n: int, **fields) -> list[tuple[str, str]]:
    """Each choice's reasoning and content deltas, joined."""
    return stream_parts(chat(client, n=n, stream=True, **fields), n)


def test_each_choice_splits_into_reasoning_and_content_streamed_or_not(served, monkeypatch):
    _, client = served
    texts = raw_texts(served, monkeypatch, n=3)
    assert len(set(texts)) > 1  # the choices differ, and each is split on its own
    response = chat(client, n=3)
    for text, choice in zip(texts, response.choices):
        message = choice.message
        reasoning = message.model_extra["reasoning_content"]
        assert message.model_extra["reasoning"] == reasoning
        assert f"<think>{reasoning}</think>{message.content}" == text
        assert re.fullmatch("[a-z ]+", reasoning) and re.fullmatch("[a-z ]+", message.content)
    splits = [(c.message.model_extra["reasoning_content"], c.message.content) for c in response.choices]
    assert streamed(client, 3) == splits


def test_reasoning_content_is_none_without_thinking_tags(served, monkeypatch):
    state, client = served
    untagged = "[a-z ]{1,30}"  # constrained: the output begins as the constraint does, not inside a reasoning
    (text,) = raw_texts(served, monkeypatch, regex=untagged)
    for parser in ("deepseek_r1", "qwen3"):
        monkeypatch.setattr(state, "reasoning_parser", PARSERS[parser])
        message = chat(client, regex=untagged).choices[0].message
        assert message.model_extra["reasoning_content"] is None and message.content == text
        assert streamed(client, 1, regex=untagged) == [("", text)]


def test_deepseek_r1_reads_an_untagged_free_output_as_reasoning_unless_thinking_is_off(served, monkeypatch):
    _, client = served
    (text,) = raw_texts(served, monkeypatch, regex=None, max_tokens=8)
    message = chat(client, regex=None, max_tokens=8).choices[0].message
    assert message.model_extra["reasoning_content"] == text and message.content is None
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    message = chat(client, regex=None, max_tokens=8, extra_body=off).choices[0].message
    assert message.model_extra["reasoning_content"] is None and message.content == text


def test_tool_calls_are_parsed_from_the_content_alone(served):
    _, client = served
    tools = dict(tools=TOOLS, tool_choice="auto", max_tokens=100)
    response = chat(client, regex=f"<think>[a-z ]{{1,5}}</think>{CALL}", **tools)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert re.fullmatch("[a-z ]+", choice.message.model_extra["reasoning_content"])
    assert choice.message.tool_calls[0].function.name == "get_time"
    in_reasoning = chat(client, regex=f"<think>{CALL}</think>[a-z]{{1,5}}", **tools)
    choice = in_reasoning.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.model_extra["reasoning_content"].startswith("<tool_call>")
    stream = list(chat(client, regex=f"<think>[a-z ]{{1,5}}</think>{CALL}", stream=True, **tools))
    pieces = [piece for c in stream if c.choices for piece in c.choices[0].delta.tool_calls or ()]
    assert [piece.function.name for piece in pieces if piece.function.name] == ["get_time"]  # its first piece


def test_template_kwargs_that_set_the_servers_own_arguments_are_400s(served):
    _, client = served
    with pytest.raises(openai.BadRequestError) as error:
        chat(client, extra_body={"chat_template_kwargs": {"tokenize": True}})
    assert error.value.body["param"] == "chat_template_kwargs" and "tokenize" in error.value.body["message"]


def test_a_tool_call_parser_reads_its_format_whole_and_streamed(served, monkeypatch):
    state, client = served
    monkeypatch.setattr(state, "reasoning_parser", None)
    monkeypatch.setattr(state, "tool_parser", TOOL_PARSERS["glm45"])
    tools = [{"type": "function", "function": {"name": "wait", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer"}}}}}]
    glm = r"ok\.<tool_call>wait<arg_key>days</arg_key><arg_value>[1-7]</arg_value></tool_call>"
    fields = dict(regex=glm, tools=tools, max_tokens=100)
    choice = chat(client, **fields).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok."
    (call,) = choice.message.tool_calls
    assert call.function.name == "wait" and json.loads(call.function.arguments)["days"] in range(1, 8)  # typed
    chunks = [c.choices[0] for c in chat(client, stream=True, **fields) if c.choices]
    assert "".join(c.delta.content or "" for c in chunks) == "ok." and chunks[-1].finish_reason == "tool_calls"
    pieces = [piece for c in chunks for piece in c.delta.tool_calls or ()]
    assert pieces[0].function.name == "wait" and len(pieces) > 1  # the name first, the arguments as they close
    assert "".join(p.function.arguments for p in pieces) == call.function.arguments  # seeded: the same reply


def test_kimi_k2_calls_reach_the_client_with_their_ids(served, monkeypatch):
    """A Kimi K2 reply (its markers special tokens, forced by a grammar): the call's id is `functions.NAME:IDX`
    as written, whole and in the stream's first piece of the call (Kimi's template sends it back as the next
    turn's tool_call_id)."""
    state, client = served
    monkeypatch.setattr(state, "reasoning_parser", None)
    monkeypatch.setattr(state, "tool_parser", TOOL_PARSERS["kimi_k2"])
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"days": {"type": "integer"}}}}}]
    grammar = ('start: "ok." <|tool_calls_section_begin|> <|tool_call_begin|> "functions.get_weather:0" '
               '<|tool_call_argument_begin|> "{\\"days\\": " /[1-7]/ "}" <|tool_call_end|> <|tool_calls_section_end|>')
    fields = dict(regex=None, tools=tools, max_tokens=60, extra_body={"guided_grammar": grammar})
    choice = chat(client, **fields).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "ok."
    (call,) = choice.message.tool_calls
    assert (call.id, call.function.name) == ("functions.get_weather:0", "get_weather")
    assert json.loads(call.function.arguments)["days"] in range(1, 8)
    chunks = [c.choices[0] for c in chat(client, stream=True, **fields) if c.choices]
    assert "".join(c.delta.content or "" for c in chunks) == "ok." and chunks[-1].finish_reason == "tool_calls"
    pieces = [piece for c in chunks for piece in c.delta.tool_calls or ()]
    assert (pieces[0].id, pieces[0].function.name) == ("functions.get_weather:0", "get_weather")
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments  # seeded: the same reply
