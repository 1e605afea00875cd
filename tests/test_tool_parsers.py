"""--tool-call-parser formats (vLLM's names), with no server: each reply parsed whole, and streamed through a
ChoiceStream split at every point (and a character a delta), must give the same content and calls."""

from __future__ import annotations

import argparse
import json

import pytest

from jaxinfer.entrypoints.openai.app import ServerConfig, _tool_parser
from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.launch import add_serve_parser
from jaxinfer.entrypoints.openai.tool_calls import plan_tools
from jaxinfer.entrypoints.openai.tool_parsers import TOOL_PARSERS, tool_parser
from jaxinfer.entrypoints.openai.tool_parsers.values import typed_value

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                            "metric": {"type": "boolean"}, "hours": {"type": "array"}}}
TIME = {"type": "object", "properties": {"zone": {"type": "string"}}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}}]
CALLS = [("get_weather", {"city": "Oslo", "days": 2}), ("get_time", {"zone": "UTC"})]
TYPED = [("get_weather", {"city": "007", "days": 3, "metric": True, "hours": [6, 18]})]  # "007": a string by schema
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"
DS_REPLY = ("Sure.\n<｜tool▁calls▁begin｜>" + DS_CALL.format("get_weather", '{"city": "Oslo", "days": 2}') + "\n"
            + DS_CALL.format("get_time", '{"zone": "UTC"}') + "<｜tool▁calls▁end｜>")

REPLIES = {  # parser: [(reply, content, calls)], the content as parsed whole (None: none)
    "hermes": [('Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
                "Checking.", CALLS[1:])],
    "mistral": [
        ('Let me look.[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}, '
         '{"name": "get_time", "arguments": {"zone": "UTC"}}]', "Let me look.", CALLS),
        ('[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo", "days": 2}[TOOL_CALLS]get_time[ARGS]{"zone": "UTC"}',
         None, CALLS),
    ],
    "deepseek_v3": [(DS_REPLY, "Sure.", CALLS), (DS_REPLY + "\nDone.", "Sure.\n\nDone.", CALLS)],
    "glm45": [
        ("Sure.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>"
         "\n<arg_value>2</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>UTC"
         "</arg_value>\n</tool_call>", "Sure.", CALLS),
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>007</arg_value>\n<arg_key>days</arg_key>\n"
         "<arg_value>3</arg_value>\n<arg_key>metric</arg_key>\n<arg_value>true</arg_value>\n<arg_key>hours</arg_key>"
         "\n<arg_value>[6, 18]</arg_value>\n</tool_call>", None, TYPED),
    ],
    "qwen3_coder": [
        ("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n"
         "</parameter>\n</function>\n</tool_call>", "Sure.", CALLS),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\n007\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n[6, 18]\n</parameter>\n"
         "</function>\n</tool_call>", None, TYPED),
    ],
    "granite": [('Sure.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}, '
                 '{"name": "get_time", "arguments": {"zone": "UTC"}}]', "Sure.", CALLS)],
}
CASES = [(name, *case) for name, cases in REPLIES.items() for case in cases]


def plan(parser: str, tool_choice: str = "auto") -> ReplyPlan:
    return ReplyPlan(None, plan_tools(TOOLS, tool_choice, None, tool_parser(parser)))


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message.get("tool_calls") or []]


def streamed(reply_plan: ReplyPlan, deltas: list[str], finish_reason: str = "stop") -> tuple[str, list, str | None]:
    """(content joined, calls, finish reason) of a stream of these text deltas, as a client joins them."""
    stream, content, calls, reason = ChoiceStream(reply_plan), "", [], None
    for i, text in enumerate(deltas):
        delta, reason = stream.delta(text, finish_reason if i == len(deltas) - 1 else None)
        content += (delta or {}).get("content") or ""
        calls += [(c["index"], c) for c in (delta or {}).get("tool_calls", [])]
    assert [index for index, _ in calls] == list(range(len(calls)))  # each call once, whole, in order
    return content, calls_of({"tool_calls": [call for _, call in calls]}), reason


@pytest.mark.parametrize("parser, reply, content, calls", CASES)
def test_each_format_parses_whole_and_streamed_at_every_split(parser, reply, content, calls):
    message, reason = assistant_message(plan(parser), reply, "stop")
    assert (message["content"], calls_of(message), reason) == (content, calls, "tool_calls")
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"])
    splits = [[reply[:at], reply[at:]] for at in range(len(reply) + 1)] + [list(reply)]
    for deltas in splits:
        assert streamed(plan(parser), deltas) == (content or "", calls, "tool_calls"), deltas


@pytest.mark.parametrize("parser, reply, content, calls", [case for case in CASES if case[2]])
def test_content_before_the_marker_streams_before_the_reply_ends(parser, reply, content, calls):
    stream = ChoiceStream(plan(parser))
    sent = [(stream.delta(char, None)[0] or {}).get("content") or "" for char in reply]
    head = reply[:reply.index(TOOL_PARSERS[parser].start)].rstrip()
    assert "".join(sent) == head  # all of it before the last delta, no part of a marker or the space before it


@pytest.mark.parametrize("parser", REPLIES)
def test_a_reply_without_calls_of_the_tools_stays_content(parser):
    reply, _, _ = REPLIES[parser][0]
    for text in (reply.replace("get_time", "get_date"), reply[:-3], "Just text, no calls."):
        assert assistant_message(plan(parser), text, "stop") == ({"role": "assistant", "content": text}, "stop")
        assert streamed(plan(parser), [text[:7], text[7:]]) == (text, [], "stop")
    cut = assistant_message(plan(parser), reply, "length")  # cut off by max_tokens: not parsed, as before
    assert cut == ({"role": "assistant", "content": reply}, "length")
    assert streamed(plan(parser), [reply], "length") == (reply, [], "length")
    assert assistant_message(plan(parser, "none"), reply, "stop")[0]["content"] == reply


def test_values_are_typed_by_the_parameters_schema():
    assert typed_value("2", {"type": "integer"}) == 2 and typed_value("2", {"type": "string"}) == "2"
    assert typed_value("2.5", {"type": "integer"}) == "2.5" and typed_value("2.5", {"type": "number"}) == 2.5
    assert typed_value("false", {"type": "boolean"}) is False and typed_value("1", {"type": "boolean"}) == "1"
    assert typed_value('{"a": 1}', {"type": "object"}) == {"a": 1} and typed_value("[1]", None) == [1]
    assert typed_value("Oslo", None) == "Oslo" and typed_value("null", {"type": ["integer", "null"]}) is None
    assert typed_value("7", {"type": ["integer", "string"]}) == "7"  # text that may be a string stays one


def test_unknown_parser_names_are_refused_naming_the_accepted_ones(capsys):
    with pytest.raises(ValueError, match="'nope'; accepted: hermes, llama3_json, mistral"):
        tool_parser("nope")
    commands = argparse.ArgumentParser(prog="jaxinfer").add_subparsers()
    add_serve_parser(commands)
    with pytest.raises(SystemExit):
        commands.choices["serve"].parse_args(["--tool-call-parser", "nope"])
    assert "--tool-call-parser: invalid choice: 'nope'" in capsys.readouterr().err
    assert set(TOOL_PARSERS) == {*REPLIES, "llama3_json", "openai"}  # each format here is tested
    with pytest.raises(ValueError, match="openai_gptoss and openai"):
        _tool_parser(ServerConfig("m", tool_call_parser="openai"))
    with pytest.raises(ValueError, match="openai_gptoss and openai"):
        _tool_parser(ServerConfig("m", reasoning_parser="openai_gptoss", tool_call_parser="hermes"))
    assert _tool_parser(ServerConfig("m", reasoning_parser="openai_gptoss", tool_call_parser="openai")).name == "openai"
