"""Structured output through the server with the official `openai` client: tool calls for
tool_choice "required" and a named function, json_schema and json_object responses, and 400s
naming the field; tool-call parsing for "auto" on its own."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
import uvicorn
from test_server import _free_port
from test_structured_output import KNOBS, SCHEMA

from jaxinfer import LLM
from jaxinfer.entrypoints.openai import ServerConfig, build_app
from jaxinfer.entrypoints.openai.tool_calls import parse_tool_calls, plan_tools

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("llguidance")

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False,
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER,
                                           "strict": True}},  # strict: the openai client's stream helper reads them
         {"type": "function", "function": {"name": "get_time", "parameters": TIME, "strict": True}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]


@pytest.fixture(scope="module")
def client():
    app = build_app(LLM(**KNOBS), ServerConfig("demo"))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
    server.should_exit = True
    thread.join(timeout=30)


def chat(client: openai.OpenAI, **fields):
    return client.chat.completions.create(model="demo", messages=MESSAGES, **{"max_tokens": 60, **fields})


def test_tool_choice_required_returns_parsed_tool_calls(client):
    for seed in range(3):
        response = chat(client, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=1.0,
                        seed=seed)
        choice = response.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        schema = {"get_weather": WEATHER, "get_time": TIME}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), schema)
    assert streamed_calls(client, tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=2) == [
        (call.function.name, call.function.arguments)]  # the last seed's call, streamed as it is written


def test_named_tool_choice_calls_that_function(client):
    named = {"type": "function", "function": {"name": "get_weather"}}
    response = chat(client, tools=TOOLS, tool_choice=named, temperature=0)
    (call,) = response.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    assert streamed_calls(client, tool_choice=named, temperature=0) == [("get_weather", call.function.arguments)]


def streamed_calls(client: openai.OpenAI, **fields) -> list[tuple[str, str]]:
    """The (name, arguments) a stream's calls come to through the `openai` client's stream helper (it reads
    strict tools only), checking they came as written: the arguments in several pieces, each call's joined."""
    with client.chat.completions.stream(model="demo", messages=MESSAGES, max_tokens=60, tools=TOOLS, **fields) as stream:
        events = list(stream)
        final = stream.get_final_completion().choices[0]
    pieces = [event for event in events if event.type == "tool_calls.function.arguments.delta"]
    done = [(event.name, event.arguments) for event in events if event.type == "tool_calls.function.arguments.done"]
    assert len(pieces) > 1 and final.finish_reason == "tool_calls" and not final.message.content
    assert [(c.function.name, c.function.arguments) for c in final.message.tool_calls] == done
    return done


def test_json_schema_and_json_object_responses(client):
    schema_format = {"type": "json_schema", "json_schema": {"name": "settings", "schema": SCHEMA, "strict": True}}
    for seed in range(3):
        response = chat(client, response_format=schema_format, temperature=1.0, seed=seed, max_tokens=100)
        jsonschema.validate(json.loads(response.choices[0].message.content), SCHEMA)
    completion = client.completions.create(model="demo", prompt="x = ", max_tokens=20, temperature=0,
                                           extra_body={"guided_choice": ["True", "False"]})
    assert completion.choices[0].text in ("True", "False")
    response = chat(client, response_format={"type": "json_object"}, temperature=0, max_tokens=100)
    if response.choices[0].finish_reason == "stop":  # an open object need not close within max_tokens
        assert isinstance(json.loads(response.choices[0].message.content), dict)
    assert response.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("fields, param", [
    (dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}),
     "response_format.json_schema.schema"),
    (dict(extra_body={"guided_regex": "(open"}), "guided_regex"),
    (dict(extra_body={"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
])
def test_bad_constraints_are_400s_naming_the_field(client, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        chat(client, **fields)
    assert info.value.param == param, info.value.message


def test_auto_parses_hermes_and_llama3_tool_calls():
    plan = plan_tools(TOOLS, "auto", None)
    hermes = 'Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>'
    content, calls = parse_tool_calls(plan, hermes)
    assert content == "Checking." and calls[0]["function"] == {"name": "get_time", "arguments": '{"zone": "UTC"}'}
    llama = '{"name": "get_weather", "parameters": {"city": "Lima", "days": 2}}; {"name": "get_time", "parameters": {}}'
    content, calls = parse_tool_calls(plan, llama)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Lima", "days": 2}
    assert parse_tool_calls(plan, '{"name": "unknown", "parameters": {}}') == ('{"name": "unknown", "parameters": {}}', [])
    assert parse_tool_calls(plan_tools(TOOLS, "none", None), hermes) == (hermes, [])
