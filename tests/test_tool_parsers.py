"""--tool-call-parser formats (vLLM's names), with no server: each reply parsed whole, and streamed through a
ChoiceStream split at every point (and a character a delta), must give the same content and calls (and the
ids a format writes, Kimi K2's); streamed a token-sized piece a delta, each call goes out as it is written (its
name and id first, then its arguments in pieces), the content around it too, as do tool_choice "required" and a
named function's."""

from __future__ import annotations

import argparse
import json
import re

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

KIMI_CALL = "<|tool_call_begin|>functions.{}:{}<|tool_call_argument_begin|>{}<|tool_call_end|>"
KIMI_REPLY = ("Sure.\n<|tool_calls_section_begin|>" + KIMI_CALL.format("get_weather", 0, '{"city": "Oslo", "days": 2}')
              + "\n" + KIMI_CALL.format("get_time", 1, '{"zone": "UTC"}') + "<|tool_calls_section_end|>")
KIMI_SPACED = KIMI_REPLY.replace(" 2}<", " 2}\n<") + "\nDone."  # space after the arguments, text after the section
KIMI_SINGULAR = KIMI_SPACED.replace("tool_calls_section", "tool_call_section")  # the markers some checkpoints write
KIMI_TYPED = ("<|tool_calls_section_begin|> <|tool_call_begin|> get_weather:0 <|tool_call_argument_begin|> "
              '{"city":"007","days":3,"metric":true,"hours":[6,18]} <|tool_call_end|> <|tool_calls_section_end|>')
KIMI_CALLS = [(*call, f"functions.{call[0]}:{index}") for index, call in enumerate(CALLS)]  # ids as written

GLM_TEXT, QWEN_TEXT = 'x < y </arg\n"z" \u00e9', '\nline one\n  "two" </param\n'  # text values with tag-like parts
MINIMAX_TEXT = 'x < y </param\n  "z" \u00e9'  # its whitespace around is the format's (cut), inside it the value's
MINIMAX_CALL = '<invoke name="{}">\n{}</invoke>\n'
MINIMAX_WEATHER = MINIMAX_CALL.format("get_weather", '<parameter name="city">Oslo</parameter>\n'
                                      '<parameter name="days">2</parameter>\n')
MINIMAX_TIME = MINIMAX_CALL.format("get_time", '<parameter name="zone">UTC</parameter>\n')
REPLIES = {  # parser: [(reply, content, calls)], the content as parsed whole (None: none)
    "hermes": [('Checking.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "UTC"}}\n</tool_call>',
                "Checking.", CALLS[1:]),
               ('<tool_call>{"arguments":{"city":"Z\\u00fcrich \\"old\\"","days":2.50e1,"hours":[]},'
                '"name":"get_weather"}</tool_call>\n'
                '<tool_call>[{"name":"get_time", "arguments": {"zone":"Europe/Z\u00fcrich"}}]</tool_call>',
                None, [("get_weather", {"city": 'Z\u00fcrich "old"', "days": 25.0, "hours": []}),
                       ("get_time", {"zone": "Europe/Z\u00fcrich"})])],  # compact, escaped, name last: rewritten
    "llama3_json": [('{"name": "get_weather", "parameters": {"city": "Oslo", "days": 2}}; '
                     '{"name": "get_time", "parameters": {"zone": "UTC"}}', None, CALLS)],
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
        (f"<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>{GLM_TEXT}</arg_value>\n</tool_call>", None,
         [("get_time", {"zone": GLM_TEXT})]),
    ],
    "qwen3_coder": [
        ("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
         "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=zone>\nUTC\n"
         "</parameter>\n</function>\n</tool_call>", "Sure.", CALLS),
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\n007\n</parameter>\n<parameter=days>\n3\n"
         "</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n[6, 18]\n</parameter>\n"
         "</function>\n</tool_call>", None, TYPED),
        (f"<tool_call>\n<function=get_time>\n<parameter=zone>\n{QWEN_TEXT}\n</parameter>\n</function>\n</tool_call>",
         None, [("get_time", {"zone": QWEN_TEXT})]),
    ],
    "minimax_m2": [
        (f"Sure.\n<minimax:tool_call>\n{MINIMAX_WEATHER}{MINIMAX_TIME}</minimax:tool_call>", "Sure.", CALLS),
        ("<minimax:tool_call>\n" + MINIMAX_CALL.format("get_weather", '<parameter name="city">007</parameter>\n'
         '<parameter name="days"> 3 </parameter>\n<parameter name="metric">true</parameter>\n<parameter name='
         '"hours">[6, 18]</parameter>\n') + "</minimax:tool_call>", None, TYPED),
        (f"<minimax:tool_call>{MINIMAX_WEATHER}</minimax:tool_call> then <minimax:tool_call>"
         + MINIMAX_CALL.format("get_time", f'<parameter name="zone">\n {MINIMAX_TEXT}\n</parameter>')
         + "</minimax:tool_call>\nDone.", " then \nDone.", [CALLS[0], ("get_time", {"zone": MINIMAX_TEXT})]),
    ],
    "granite": [('Sure.<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}, '
                 '{"name": "get_time", "arguments": {"zone": "UTC"}}]', "Sure.", CALLS)],
    "kimi_k2": [(KIMI_REPLY, "Sure.", KIMI_CALLS), (KIMI_TYPED, None, [(*TYPED[0], "get_weather:0")]),
                (KIMI_SPACED, "Sure.\n\nDone.", KIMI_CALLS), (KIMI_SINGULAR, "Sure.\n\nDone.", KIMI_CALLS)],
    "pythonic": [
        ('[get_weather(city="Oslo", days=2), get_time(zone=\'UTC\')]', None, CALLS),
        ("<|python_start|>[get_weather(city='007', days=3, metric=True, hours=(6, 18),)]<|python_end|>", None, TYPED),
        ('[get_time(zone="a, (b) \\"c, d\\" \u00e9"), get_time(zone=\'\'\'it\'s)\'\'\')]', None,
         [("get_time", {"zone": 'a, (b) "c, d" \u00e9'}), ("get_time", {"zone": "it's)"})]),
    ],
}
TIME_CALL = '{"name": "get_time", "arguments": {"zone": "UTC"}}'
BOTH_CALLS = '[' + TIME_CALL + ', {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}]'
V31_CALL = "<｜tool▁call▁begin｜>{}<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
SEED_CALL = "<seed:tool_call>\n<function={}>\n{}</function>\n</seed:tool_call>"
SEED_TIME = SEED_CALL.format("get_time", "<parameter=zone>\nUTC\n</parameter>\n")
SEED_WEATHER = SEED_CALL.format("get_weather", "<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n"
                                               "</parameter>\n")
STEP_CALL = ('<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="{}">{}</steptml:invoke>'
             "<｜tool_call_end｜>")
STEP_PARAMETER = '<steptml:parameter name="{}">{}</steptml:parameter>'
STEP_REPLY = ("Sure.<｜tool_calls_begin｜>" + STEP_CALL.format("get_time", STEP_PARAMETER.format("zone", " UTC "))
              + "\n" + STEP_CALL.format("get_weather", STEP_PARAMETER.format("city", "Oslo")
                                        + STEP_PARAMETER.format("days", "2")) + "<｜tool_calls_end｜>")
REPLIES["step3"] = [(STEP_REPLY, "Sure.", CALLS[::-1]), (STEP_REPLY + " Done.", "Sure. Done.", CALLS[::-1])]
REPLIES["olmo3"] = [("get_time(zone='UTC')\nget_weather(city=\"Oslo\", days=2)", None, CALLS[::-1]),
                    ("<function_calls>\nget_weather(city='007', days=3, metric=true, hours=[6, 18])\n</function_calls>",
                     None, TYPED)]
REPLIES |= {  # vLLM's other names: formats above under other markers, or one line in the table
    "seed_oss": [("Sure.\n" + SEED_TIME, "Sure.", CALLS[1:]), (f"{SEED_WEATHER}\n{SEED_TIME}", None, CALLS)],
    "qwen3_xml": REPLIES["qwen3_coder"][:1],
    "hunyuan_a13b": [(f"Checking.\n<tool_calls>{BOTH_CALLS}</tool_calls>", "Checking.", CALLS[::-1])],
    "jamba": [(f"<tool_calls>\n{BOTH_CALLS}\n</tool_calls>", None, CALLS[::-1])],
    "ernie45": [(f"\n\n<tool_call>\n{TIME_CALL}\n</tool_call>\n", None, CALLS[1:])],
    "longcat": [(f"Sure.<longcat_tool_call>{TIME_CALL}</longcat_tool_call>", "Sure.", CALLS[1:])],
    "llama4_json": REPLIES["llama3_json"],
    "llama4_pythonic": [("[get_time(zone='UTC'), get_weather(city='Oslo', days=2)]", None, CALLS[::-1]),
                        ("<|python_start|>[get_weather(city='Oslo', days=2)]<|python_end|>", None, CALLS[:1])],
    "phi4_mini_json": [(f"functools{BOTH_CALLS}", None, CALLS[::-1])],
    "internlm": [('Let me check.<|action_start|><|plugin|>\n{"name": "get_time", "parameters": {"zone": "UTC"}}'
                  "<|action_end|>", "Let me check.", CALLS[1:])],
    "deepseek_v31": [("Sure.\n<｜tool▁calls▁begin｜>" + V31_CALL.format("get_time", '{"zone": "UTC"}')
                      + V31_CALL.format("get_weather", '{"city": "Oslo", "days": 2}') + "<｜tool▁calls▁end｜>",
                      "Sure.", CALLS[::-1])],
}
CASES = [(name, *case) for name, cases in REPLIES.items() for case in cases]


def plan(parser: str, tool_choice: str = "auto") -> ReplyPlan:
    return ReplyPlan(None, plan_tools(TOOLS, tool_choice, None, tool_parser(parser)))


def format_id(call_id: str) -> tuple[str, ...]:
    """(the id,) where the format wrote it; () for the server's own `call_...` (new each time)."""
    return () if call_id.startswith("call_") else (call_id,)


def calls_of(message: dict) -> list[tuple]:
    """(name, arguments, the format's id if any) of each call."""
    return [(c["function"]["name"], json.loads(c["function"]["arguments"]), *format_id(c["id"]))
            for c in message.get("tool_calls") or []]


def texts_of(message: dict) -> list[tuple]:
    """(name, arguments text, the format's id if any) of each call."""
    return [(c["function"]["name"], c["function"]["arguments"], *format_id(c["id"]))
            for c in message.get("tool_calls") or []]


def stream_events(reply_plan: ReplyPlan, deltas: list[str], finish_reason: str = "stop") -> tuple[list, str | None]:
    """(("content", text) / ("call", index, name, arguments, id) / ("arguments", index, text) per piece, each with
    the delta it came in, finish reason) of a stream of these text deltas; checks each piece is as vLLM's:
    a call's first gives its next index, id, type and name, later ones only arguments."""
    stream, events, reason, started = ChoiceStream(reply_plan), [], None, 0
    for i, text in enumerate(deltas):
        delta, reason = stream.delta(text, finish_reason if i == len(deltas) - 1 else None)
        if (delta or {}).get("content"):
            events.append(("content", delta["content"], i))
        for piece in (delta or {}).get("tool_calls", []):
            if "id" in piece:
                assert piece["index"] == started and piece["type"] == "function" and piece["id"]
                function = piece["function"]
                events.append(("call", piece["index"], function["name"], function["arguments"], piece["id"], i))
                started += 1
            else:
                assert piece.keys() == {"index", "function"} and piece["function"].keys() == {"arguments"}
                assert piece["index"] < started and piece["function"]["arguments"]
                events.append(("arguments", piece["index"], piece["function"]["arguments"], i))
    return events, reason


def joined(events: list) -> tuple[str, list[tuple]]:
    """(content, [(name, arguments text, the format's id if any)]) as a client joins the pieces."""
    calls = [[e[2], e[3], *format_id(e[4])] for e in events if e[0] == "call"]
    for event in events:
        if event[0] == "arguments":
            calls[event[1]][1] += event[2]
    return "".join(e[1] for e in events if e[0] == "content"), [tuple(call) for call in calls]


def streamed(reply_plan: ReplyPlan, deltas: list[str], finish_reason: str = "stop") -> tuple[str, list, str | None]:
    """(content joined, calls, finish reason) of a stream of these text deltas, as a client joins them."""
    events, reason = stream_events(reply_plan, deltas, finish_reason)
    content, calls = joined(events)
    return content, [(name, json.loads(arguments), *call_id) for name, arguments, *call_id in calls], reason


def tokens(text: str) -> list[str]:
    """The text in token-sized pieces (words, spaces, single marks), as a model's deltas come."""
    return re.findall(r"\w+|\s+|[^\w\s]", text)


@pytest.mark.parametrize("parser, reply, content, calls", CASES)
def test_each_format_parses_whole_and_streamed_at_every_split(parser, reply, content, calls):
    message, reason = assistant_message(plan(parser), reply, "stop")
    assert (message["content"], calls_of(message), reason) == (content, calls, "tool_calls")
    assert all(c["id"] and c["type"] == "function" for c in message["tool_calls"])
    splits = [[reply[:at], reply[at:]] for at in range(len(reply) + 1)] + [list(reply)]
    for deltas in splits:
        events, reason = stream_events(plan(parser), deltas)
        assert (joined(events), reason) == ((content or "", texts_of(message)), "tool_calls"), deltas  # exactly


@pytest.mark.parametrize("parser, reply, content, calls", CASES)
def test_calls_stream_as_they_are_written(parser, reply, content, calls):
    assert_streams_as_written(plan(parser), reply, reply[:TOOL_PARSERS[parser].find_start(reply)].rstrip())


@pytest.mark.parametrize("tool_choice, reply", [
    ("required", '[{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}, '
                 '{"name": "get_time", "arguments": {"zone": "UTC"}}]'),
    ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Oslo", "days": 2}'),
])
def test_required_and_named_tool_choice_stream_the_same_way(tool_choice, reply):
    assert_streams_as_written(ReplyPlan(None, plan_tools(TOOLS, tool_choice, None)), reply, "")


@pytest.mark.parametrize("reply, head", [
    ('{"name": "get_time", "parameters": {"zone": "UTC"}}', ""),
    ('[1] first, then <tool_call>{"name": "get_time", "arguments": {"zone": "UTC"}}</tool_call>', "[1] first, then"),
])
def test_the_default_reads_llama3_json_or_else_hermes_blocks_as_they_stream(reply, head):
    assert_streams_as_written(ReplyPlan(None, plan_tools(TOOLS, "auto", None)), reply, head)


def assert_streams_as_written(reply_plan: ReplyPlan, reply: str, head: str) -> None:
    """Streamed a token (or a character) a delta: joined, the pieces are the message parsed whole, exactly;
    each call's name goes out first, its arguments over later deltas (unless written before the name), the
    content before the calls (`head`) before them, and nothing waits for the reply's end."""
    message = assistant_message(reply_plan, reply, "stop")[0]
    for pieces in (tokens(reply), list(reply)):  # a character a delta cuts every marker
        events, reason = stream_events(reply_plan, [*pieces, ""])  # the finish comes alone, after the text
        assert joined(events) == (message["content"] or "", texts_of(message)) and reason == "tool_calls"
        assert all(event[-1] < len(pieces) for event in events)  # all sent as it was decided
        for index, (name, *_) in enumerate(texts_of(message)):
            call = [e for e in events if e[0] in ("call", "arguments") and e[1] == index]
            assert call[0][:3] == ("call", index, name)
            assert call[0][-1] < call[-1][-1] or reply.index('"name"') > reply.index('"arguments"')
        first_call = next(e[-1] for e in events if e[0] == "call")
        assert "".join(e[1] for e in events if e[0] == "content" and e[-1] < first_call) == head


@pytest.mark.parametrize("parser, value, end", [("glm45", GLM_TEXT, "</arg_value>"),
                                               ("qwen3_coder", QWEN_TEXT, "\n</parameter>"),
                                               ("minimax_m2", MINIMAX_TEXT, "\n</parameter>")])
def test_text_values_go_out_as_they_come_not_when_they_close(parser, value, end):
    reply = next(reply for reply, _, _ in REPLIES[parser] if value in reply)
    pieces = tokens(reply)
    events, _ = stream_events(plan(parser), [*pieces, ""])
    closing = len(tokens(reply[:reply.index(value + end)] + value)) - 1  # the delta the value's last token came in
    _, calls = joined([e for e in events if e[-1] <= closing])
    assert calls[-1][1] == '{"zone": ' + json.dumps(value)[:-1]  # all of the value before its end tag came


@pytest.mark.parametrize("parser, reply, decided_at", [
    ("hermes", 'Checking.\n<tool_call>\n{"name": "get_date", "arguments": {}}\n</tool_call>', 'get_date"'),
    ("glm45", "Sure.<tool_call>get_date\n<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>", "get_d"),
    ("llama3_json", "The answer is 42.", "The"),
    ("pythonic", "[get_date(), get_weather(city='Oslo')]", "get_d"),
    ("kimi_k2", "Sure.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_date:0<|tool_call_argument_begin|>{}"
     "<|tool_call_end|><|tool_calls_section_end|>", "get_d"),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:<|tool_call_argument_begin|>{}",
     "argument_begin|>"),  # an id without its index
    ("pythonic", "[get_weather('Oslo')]", "'"),
    ("minimax_m2", 'Sure.<minimax:tool_call>\n<invoke name="get_date">\n<parameter name="days">2</parameter>\n'
     "</invoke>\n</minimax:tool_call>", "get_d"),
])
def test_text_that_is_not_calls_streams_as_content_once_that_is_decided(parser, reply, decided_at):
    events, reason = stream_events(plan(parser), [*tokens(reply), ""])
    assert joined(events) == (reply, []) and reason == "stop"
    decided = len(tokens(reply[:reply.index(decided_at) + len(decided_at)])) - 1  # the delta that tells
    assert max(e[-1] for e in events if e[-1] <= decided) == decided  # the held text went out there
    assert "".join(e[1] for e in events if e[-1] <= decided) == "".join(tokens(reply)[:decided + 1])


def test_a_reply_that_goes_wrong_after_a_call_went_out_keeps_what_was_sent():
    wrong = REPLIES["mistral"][0][0].replace("get_time", "get_date")  # its second call is of no tool
    assert assistant_message(plan("mistral"), wrong, "stop") == ({"role": "assistant", "content": wrong}, "stop")
    events, reason = stream_events(plan("mistral"), [*tokens(wrong), ""])
    assert joined(events) == ("Let me look.", [("get_weather", '{"city": "Oslo", "days": 2}')]) and reason == "stop"
    cut = REPLIES["hermes"][0][0][:-25]  # max_tokens inside the call's arguments
    events, reason = stream_events(plan("hermes"), [*tokens(cut), ""], "length")
    assert joined(events) == ("Checking.", [("get_time", '{"zo')]) and reason == "length"  # as written


@pytest.mark.parametrize("parser", REPLIES)
def test_a_reply_without_calls_of_the_tools_stays_content(parser):
    reply, _, _ = REPLIES[parser][0]
    unnamed = [reply.replace('"get_time"', '["get_time"]')] if '"get_time"' in reply else []  # was a TypeError
    for text in (reply.replace("get_time", "get_date"), reply[:-3], "Just text, no calls.", *unnamed):
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
    assert typed_value(" null", {"type": "integer"}) is None and typed_value("null", {"type": "object"}) is None
    assert typed_value("null", {"type": "string"}) == "null"  # streamed as text before its end is seen


def test_unknown_parser_names_are_refused_naming_the_accepted_ones(capsys):
    with pytest.raises(ValueError, match="'nope'; accepted: hermes, llama3_json, mistral"):
        tool_parser("nope")
    commands = argparse.ArgumentParser(prog="jaxinfer").add_subparsers()
    add_serve_parser(commands)
    with pytest.raises(SystemExit):
        commands.choices["serve"].parse_args(["--tool-call-parser", "nope"])
    assert "--tool-call-parser: invalid choice: 'nope'" in capsys.readouterr().err
    assert set(TOOL_PARSERS) == {*REPLIES, "llama3_json", "openai"}  # each format here is tested
    special = {name for name, parser in TOOL_PARSERS.items() if parser.keeps_special}
    assert special == {"mistral", "granite", "kimi_k2", "jamba", "step3", "internlm"}  # markers are special tokens
    with pytest.raises(ValueError, match="openai_gptoss and openai"):
        _tool_parser(ServerConfig("m", tool_call_parser="openai"))
    with pytest.raises(ValueError, match="openai_gptoss and openai"):
        _tool_parser(ServerConfig("m", reasoning_parser="openai_gptoss", tool_call_parser="hermes"))
    assert _tool_parser(ServerConfig("m", reasoning_parser="openai_gptoss", tool_call_parser="openai")).name == "openai"


def test_olmo3_calls_are_one_a_line():
    text = "get_time(zone='UTC') get_time(zone='UTC')"
    assert assistant_message(plan("olmo3"), text, "stop") == ({"role": "assistant", "content": text}, "stop")
    events, reason = stream_events(plan("olmo3"), [*tokens(text), ""])
    assert [e[0] for e in events if e[0] == "call"] == ["call"] and reason == "stop"  # the second never went out
