"""--reasoning-parser openai_gptoss through the server with the official `openai` client: the tiny model's
tokenizer gains GPT-OSS's harmony markers as special tokens, a grammar (guided_grammar, whose `<|name|>`
is a special token) forces harmony-shaped replies, and the reply's reasoning and content, streamed and
not, must be the channels' text, with no marker in either."""

from __future__ import annotations

import re
import shutil

import openai
import pytest
from live_server import serve_in_thread
from reasoning_streams import stream_parts

from jaxinfer import LLM
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.entrypoints.openai.harmony import MARKERS

pytest.importorskip("llguidance")

SPECIAL = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"]
ANALYSIS = '<|channel|> "analysis" <|message|> /[a-z ]{1,15}/ <|end|>'
FINAL = ' <|start|> "assistant" <|channel|> "final" <|message|> /[a-z ]{1,15}/ <|return|>'
CALL = (' <|start|> "assistant" <|channel|> "commentary to=functions.get_time " <|constrain|> "json"'
        ' <|message|> "{}" <|call|>')
WEATHER = (' <|start|> "assistant" <|channel|> "commentary to=functions.get_weather " <|constrain|> "json"'
           ' <|message|> "{\\"city\\": \\"Paris\\"}" <|call|>')
THINK = '<|channel|> "analysis" <|message|> /[a-z]{1,4}/ <|end|>'  # short: the call's header is long in bytes
MESSAGES = [{"role": "user", "content": "think first"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def client(text_model_dir, tmp_path_factory):
    """The official client of the tiny text model, its tokenizer with harmony's markers (ids 300-306 of its
    320), served with --reasoning-parser openai_gptoss."""
    import transformers

    path = tmp_path_factory.mktemp("harmony")
    shutil.copytree(text_model_dir, path, dirs_exist_ok=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL})
    tokenizer.save_pretrained(path)
    llm = LLM(path, dtype="float32", max_seq_len=160)
    with serve_in_thread(llm, ServerConfig("tiny", reasoning_parser="openai_gptoss")) as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def chat(client: openai.OpenAI, grammar: str, **fields):
    fields = {"max_tokens": 80, "temperature": 1.0, "seed": 7, **fields}
    return client.chat.completions.create(model="tiny", messages=MESSAGES,
                                          extra_body={"guided_grammar": f"start: {grammar}"}, **fields)


def streamed(client: openai.OpenAI, grammar: str, n: int) -> list[tuple[str, str]]:
    """Each choice's reasoning and content deltas, joined."""
    return stream_parts(chat(client, grammar, n=n, stream=True), n)


def test_analysis_is_reasoning_and_final_is_content_streamed_or_not(client):
    response = chat(client, ANALYSIS + FINAL, n=2, logprobs=True)
    splits = []
    for choice in response.choices:
        message = choice.message
        reasoning, content = message.model_extra["reasoning_content"], message.content
        assert message.model_extra["reasoning"] == reasoning and choice.finish_reason == "stop"
        assert re.fullmatch("[a-z ]+", reasoning) and re.fullmatch("[a-z ]+", content)
        tokens = "".join(t.token for t in choice.logprobs.content)  # the reply as generated, markers and all
        assert tokens == (f"<|channel|>analysis<|message|>{reasoning}<|end|>"
                          f"<|start|>assistant<|channel|>final<|message|>{content}<|return|>")
        splits.append((reasoning, content))
    assert splits[0] != splits[1]
    assert streamed(client, ANALYSIS + FINAL, 2) == splits


def test_a_tool_call_on_the_commentary_channel_is_not_content(client):
    message = chat(client, ANALYSIS + CALL).choices[0].message
    assert re.fullmatch("[a-z ]+", message.model_extra["reasoning_content"]) and message.content is None
    (reasoning, content), = streamed(client, ANALYSIS + CALL, 1)
    assert reasoning == message.model_extra["reasoning_content"] and content == ""


def test_a_commentary_call_comes_back_as_tool_calls_with_tools(client):
    """vLLM's `openai` tool parser: with tools (tool_choice auto), a call to functions.NAME is a tool call."""
    choice = chat(client, THINK + WEATHER, tools=TOOLS, max_tokens=120).choices[0]
    (call,) = choice.message.tool_calls
    assert (call.function.name, call.function.arguments, call.type) == ("get_weather", '{"city": "Paris"}', "function")
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert re.fullmatch("[a-z]+", choice.message.model_extra["reasoning_content"])
    names, arguments, reasons, thought = [], "", [], ""
    for chunk in chat(client, THINK + WEATHER, tools=TOOLS, max_tokens=120, stream=True):
        thought += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
        for piece in chunk.choices[0].delta.tool_calls or []:
            names += [piece.function.name] if piece.function.name else []
            arguments += piece.function.arguments or ""
        reasons += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
    assert (names, arguments, reasons) == (["get_weather"], '{"city": "Paris"}', ["tool_calls"])
    assert thought == choice.message.model_extra["reasoning_content"]
    choice = chat(client, THINK + WEATHER, tools=TOOLS, max_tokens=120, tool_choice="none").choices[0]
    assert choice.message.tool_calls is None and choice.finish_reason == "stop" and choice.message.content is None


def test_plain_constrained_text_is_content_and_beam_search_is_refused(client):
    message = chat(client, "/[a-z ]{1,20}/").choices[0].message
    assert message.model_extra["reasoning_content"] is None and re.fullmatch("[a-z ]+", message.content)
    assert not any(m in message.content for m in MARKERS)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, n=2,
                                       extra_body={"use_beam_search": True})
    assert error.value.body["param"] == "use_beam_search"


def test_a_completion_keeps_special_tokens_only_when_asked(client):
    """vLLM's skip_special_tokens on /v1/completions: the markers are in the text only with it false."""
    grammar = {"guided_grammar": f"start: {FINAL.strip()}"}
    texts = {skip: client.completions.create(model="tiny", prompt="hi", max_tokens=40, temperature=0,
                                             extra_body={**grammar, "skip_special_tokens": skip}).choices[0].text
             for skip in (True, False)}
    assert re.fullmatch(r"<\|start\|>assistant<\|channel\|>final<\|message\|>[a-z ]+<\|return\|>", texts[False])
    assert texts[True] == re.sub(r"<\|[a-z]+\|>", "", texts[False])
