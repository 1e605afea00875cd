"""POST /v1/responses (OpenAI's Responses API) through the server with the official `openai` client, on the
tiny text model served with --tool-call-parser llama3_json: its greedy text equals the chat endpoint's for
the same messages, streamed deltas join to the whole text, a tool round trip, a JSON-schema format,
previous_response_id and the store, and 400s naming the Responses field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from live_server import serve_in_thread
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from jaxinfer import LLM
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import ChatMessage
from jaxinfer.entrypoints.openai.reasoning import reasoning_parser, start_split
from jaxinfer.entrypoints.openai.responses_output import output_items, usage
from jaxinfer.entrypoints.openai.responses_protocol import chat_tools
from jaxinfer.entrypoints.openai.responses_store import ResponseStore, StoredResponse
from jaxinfer.entrypoints.openai.responses_stream import ResponseEvents
from jaxinfer.entrypoints.openai.tool_calls import plan_tools

# Renders an assistant's tool calls (a function_call input item must reach the prompt) and reasoning_effort.
TEMPLATE = ("{% if reasoning_effort is defined %}effort {{ reasoning_effort }}\n{% endif %}"
            "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{% for c in m.get('tool_calls') or [] %}"
            "<call {{ c['function']['name'] }} {{ c['function']['arguments'] }}>{% endfor %}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")
WEATHER = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
           "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "parameters": WEATHER}
# A reply that is one Llama-3 JSON call of get_weather: llama3_json reads it as the call.
CALL = {"type": "object", "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER},
        "required": ["name", "parameters"], "additionalProperties": False}
GREEDY = dict(model="tiny", temperature=0, max_output_tokens=8)


@pytest.fixture(scope="module")
def served(text_model_dir):
    """(official client, base URL, ServerState) of the tiny text model, its chat template one that renders tool
    calls."""
    llm = LLM(text_model_dir, dtype="float32", max_seq_len=128)
    llm.tokenizer.chat_template = TEMPLATE
    with serve_in_thread(llm, ServerConfig("tiny", tool_call_parser="llama3_json")) as (url, app):
        yield openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0), url, app.state.server


def _chat_text(client: openai.OpenAI, messages: list[dict], max_tokens: int = 8) -> tuple[str, int]:
    out = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=max_tokens)
    return out.choices[0].message.content, out.usage.prompt_tokens


def test_greedy_text_equals_chat_and_streams_the_same(served):
    client, _, _ = served
    response = client.responses.create(input=[{"role": "user", "content": [{"type": "input_text", "text": "def add"}]}],
                                       instructions="be brief", metadata={"run": "1"}, **GREEDY)
    text, prompt_tokens = _chat_text(client, [{"role": "system", "content": "be brief"},
                                              {"role": "user", "content": "def add"}])
    assert response.id.startswith("resp_") and response.object == "response" and response.metadata == {"run": "1"}
    assert response.output_text == text and response.usage.input_tokens == prompt_tokens
    (message,) = response.output
    assert message.type == "message" and message.content[0].type == "output_text"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 8 and message.status == "incomplete"

    events = list(client.responses.create(input="def add", instructions="be brief", stream=True, **GREEDY))
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == text == events[-1].response.output_text
    streamed = events[-1].response
    assert [item.model_dump(exclude={"id"}) for item in streamed.output] == [message.model_dump(exclude={"id"})]
    assert streamed.usage == response.usage and streamed.status == "incomplete"


def test_tool_round_trip_through_function_call_output(served):
    client, _, _ = served
    ask = dict(model="tiny", input="Weather in Oslo?", tools=[TOOL], max_output_tokens=80, temperature=0,
               text={"format": {"type": "json_schema", "name": "call", "schema": CALL}})
    first = client.responses.create(**ask)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Oslo") and first.status == "completed"
    second = client.responses.create(previous_response_id=first.id, tools=[TOOL], **GREEDY,
                                     input=[{"type": "function_call_output", "call_id": call.call_id, "output": "9C"}])
    tool_call = {"id": call.call_id, "type": "function", "function": {"name": "get_weather",
                                                                      "arguments": call.arguments}}
    text, prompt_tokens = _chat_text(client, [{"role": "user", "content": "Weather in Oslo?"},
                                              {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                                              {"role": "tool", "content": "9C", "tool_call_id": call.call_id}])
    assert second.output_text == text and second.usage.input_tokens == prompt_tokens
    assert second.previous_response_id == first.id
    replayed = client.responses.create(tools=[TOOL], **GREEDY, input=[  # the whole conversation sent back as items
        {"role": "user", "content": "Weather in Oslo?"}, *first.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": "9C"}])
    assert replayed.output_text == text and replayed.usage.input_tokens == prompt_tokens

    with client.responses.stream(**ask) as stream:  # the client's helper checks the events' order and ids
        arguments = [event.delta for event in stream if event.type == "response.function_call_arguments.delta"]
        (streamed,) = stream.get_final_response().output
    assert "".join(arguments) == streamed.arguments == call.arguments and streamed.type == "function_call"


def test_json_schema_format_and_stored_responses(served):
    client, _, _ = served
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    response = client.responses.create(input="a number", model="tiny", max_output_tokens=60, temperature=0,
                                       text={"format": {"type": "json_schema", "name": "num", "schema": schema}})
    assert isinstance(json.loads(response.output_text)["n"], int) and response.status == "completed"
    assert client.responses.retrieve(response.id).output_text == response.output_text
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(input="x", store=False, **GREEDY)
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(input="y", previous_response_id=unstored.id, **GREEDY)
    assert missing.value.body["param"] == "previous_response_id"


def test_reasoning_effort_reaches_the_chat_template(served):
    client, _, _ = served
    response = client.responses.create(input="def add", reasoning={"effort": "high", "summary": "auto"}, **GREEDY)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "def add"}],
                                          temperature=0, max_tokens=8,
                                          extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}})
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens > _chat_text(client, [{"role": "user",
                                                                                          "content": "def add"}])[1]
    assert response.reasoning.effort == "high"


def test_reasoning_items_hold_what_the_reasoning_parser_splits_off(served, monkeypatch):
    """Under deepseek_r1 an output without </think> is all reasoning: one reasoning item, streamed or not,
    holding chat's reasoning_content."""
    client, _, state = served
    monkeypatch.setattr(state, "reasoning_parser", reasoning_parser("deepseek_r1"))
    response = client.responses.create(input="def add", **GREEDY)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "def add"}],
                                          temperature=0, max_tokens=8)
    (item,) = response.output
    assert item.type == "reasoning" and item.content[0].text == chat.choices[0].message.reasoning_content
    assert response.usage.output_tokens_details.reasoning_tokens > 0 and response.status == "incomplete"
    events = list(client.responses.create(input="def add", stream=True, **GREEDY))
    deltas = "".join(event.delta for event in events if event.type == "response.reasoning_text.delta")
    assert deltas == item.content[0].text
    assert [i.model_dump(exclude={"id"}) for i in events[-1].response.output] == [item.model_dump(exclude={"id"})]


def _replayed(events: list[dict], drop: set[str] = frozenset({"id"})) -> list[dict]:
    """The output items the openai client's own stream state assembles from `events` (`drop`: keys left out)."""
    state = ResponseStreamState(input_tools=[], text_format=openai.omit)
    for event in events:
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=json.loads(json.dumps(event))))
    return [item.model_dump(exclude=drop, exclude_none=True) for item in state._completed_response.output]


def _without_ids(items: list[dict], drop: set[str] = frozenset({"id"})) -> list[dict]:
    return [{key: value for key, value in item.items() if key not in drop} for item in items]


HEADER = {"id": "resp_1", "object": "response", "created_at": 0, "model": "m", "output": [], "status": "in_progress",
          "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def test_a_harmony_reply_is_reasoning_and_a_call_whole_or_streamed():
    """GPT-OSS's analysis channel is the reasoning item and its commentary to functions.NAME the function_call,
    through the chat path's harmony split as /v1/responses runs it (the reply's <|call|> is its stop token)."""
    plan = ReplyPlan(start_split(reasoning_parser("openai_gptoss")), plan_tools(chat_tools([TOOL]), "auto", None))
    text = ('<|channel|>analysis<|message|>need weather<|end|><|start|>assistant<|channel|>commentary '
            'to=functions.get_weather <|constrain|>json<|message|>{"city": "Oslo"}')
    whole = output_items(assistant_message(plan, text, "stop")[0], "stop")
    assert [item["type"] for item in whole] == ["reasoning", "function_call"]
    assert whole[0]["content"][0]["text"] == "need weather" and whole[1]["arguments"] == '{"city": "Oslo"}'
    events, reply = ResponseEvents(dict(HEADER)), ChoiceStream(plan)
    sent = events.start()
    for at in range(0, len(text), 7):  # markers cut across deltas
        last = at + 7 >= len(text)
        sent += events.delta(reply.delta(text[at:at + 7], "stop" if last else None)[0] or {})
    sent += events.close("stop")
    ids = {"id", "call_id"}  # each reply's calls get new ids
    assert _replayed([*sent, events.complete("stop", usage(3, 9, 2))[0]], ids) == _without_ids(whole, ids)


def test_streamed_reasoning_text_and_calls_replay_in_the_clients_stream_state():
    """Events of a reply with reasoning, text and a call (in pieces), read by the openai client's own stream
    state: the Response it assembles has the items a whole reply gets."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    pieces = [{"reasoning_content": "think "}, {"reasoning_content": "more"}, {"content": "Hi"},
              {"tool_calls": [{"index": 0, **call, "function": {"name": "f", "arguments": '{"a"'}}]},
              {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]}]
    events = ResponseEvents(dict(HEADER))
    sent = [*events.start(), *(event for piece in pieces for event in events.delta(piece)), *events.close("stop")]
    terminal, final = events.complete("stop", usage(3, 5, 2))
    whole = output_items({"reasoning_content": "think more", "content": "Hi", "tool_calls": [call]}, "stop")
    assert _replayed([*sent, terminal]) == _without_ids(whole)
    assert [event["sequence_number"] for event in [*sent, terminal]] == list(range(len(sent) + 1))
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"background": True}, "background"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "x"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "file_id": "x"}]}]},
     "input[0].content[0].image_url"),
    # a text-only model refuses an image as chat does: the part named in the message (its images: test_llava)
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input"),
    ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [TOOL]}, "tool_choice"),
    ({"reasoning": {"effort": "huge"}}, "reasoning.effort"),
    ({"top_logprobs": 2}, "top_logprobs"),
])
def test_bad_requests_are_400s_naming_the_field(served, fields, param):
    _, url, _ = served
    reply = httpx.post(url + "/v1/responses", json={"model": "tiny", "input": "hi", **fields})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and param in error["message"]


def test_the_store_drops_the_least_recently_used():
    store = ResponseStore(2)
    for name in "abc"[:2]:
        store.save(StoredResponse({"id": name}, [ChatMessage(role="user", content=name)]))
    store.get("a")
    store.save(StoredResponse({"id": "c"}, []))
    assert store.get("a").conversation[0].content == "a" and store.get("c").response == {"id": "c"}
    with pytest.raises(APIError, match="--max-stored-responses") as missing:
        store.get("b")
    assert missing.value.status == 404
