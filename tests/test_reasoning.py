"""Reasoning apart from content (--reasoning-parser): the text splitters against vLLM's examples, the
streaming splitter against the whole-text one with tags cut at every position, the chat message with
tool calls, the flag's error, and chat_template_kwargs reaching the template."""

from __future__ import annotations

import subprocess
import sys

import pytest
from python_subprocess import child_env

from jaxinfer.entrypoints.chat_template import check_template_kwargs, render_chat
from jaxinfer.entrypoints.openai.chat_messages import ChoiceStream, ReplyPlan, assistant_message
from jaxinfer.entrypoints.openai.reasoning import (
    PARSERS,
    SplitState,
    reasoning_parser,
    split_delta,
    split_text,
    start_split,
)
from jaxinfer.entrypoints.openai.tool_calls import plan_tools

DEEPSEEK, QWEN3 = PARSERS["deepseek_r1"], PARSERS["qwen3"]
# text: (deepseek_r1's split, qwen3's split)
CASES = {
    "<think>I add</think>The sum is 4": (("I add", "The sum is 4"), ("I add", "The sum is 4")),
    "I add</think>\n\nThe sum is 4": (("I add", "\n\nThe sum is 4"), (None, "I add</think>\n\nThe sum is 4")),
    "<think>I add, then": (("I add, then", None), ("I add, then", None)),
    "no tags at all": (("no tags at all", None), (None, "no tags at all")),
    "\n<think>a</think>": (("a", None), ("a", None)),
    "<think></think>only the answer": (("", "only the answer"), ("", "only the answer")),
    "x </think> y </think> z": (("x ", " y </think> z"), (None, "x </think> y </think> z")),
    "a <think>b</think>c": (("a <think>b", "c"), (None, "a <think>b</think>c")),
    "<thi": (("<thi", None), (None, "<thi")),
    "": (("", None), (None, "")),
}


@pytest.mark.parametrize("text", CASES)
def test_split_text_of_both_parsers(text):
    deepseek, qwen3 = CASES[text]
    assert split_text(start_split(DEEPSEEK), text) == deepseek
    assert split_text(start_split(QWEN3), text) == qwen3


def test_explicit_start_makes_untagged_text_content():
    # A constrained output or enable_thinking=false: reasoning only where the output writes <think>.
    assert split_text(start_split(DEEPSEEK, implicit=False), "no tags") == (None, "no tags")
    assert split_text(start_split(DEEPSEEK, implicit=False), "<think>a</think>b") == ("a", "b")


def streamed(state: SplitState, deltas: list[str]) -> tuple[str, str, SplitState]:
    """The reasoning and content a stream of deltas sends, joined, and the state it ends in."""
    reasoning = content = ""
    for i, delta in enumerate(deltas):
        state, r, c = split_delta(state, delta, final=i == len(deltas) - 1)
        reasoning, content = reasoning + r, content + c
    return reasoning, content, state


TEXTS = [*CASES, "  <think> one </think> two", "<think>a<</think>b</", "<think><think></think></think>", " \n "]


@pytest.mark.parametrize("parser", [DEEPSEEK, QWEN3], ids=lambda p: p.name)
@pytest.mark.parametrize("text", TEXTS)
def test_stream_equals_the_whole_split_wherever_the_text_is_cut(parser, text):
    whole = split_text(start_split(parser), text)
    cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]
    cuts += [[text[:i], text[i:j], text[j:]] for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    cuts.append(list(text) + [""])  # a character a delta, then an empty last one
    for deltas in cuts:
        reasoning, content, state = streamed(start_split(parser), deltas)
        assert (reasoning, content) == (whole[0] or "", whole[1] or ""), deltas
        assert state.thought == (whole[0] is not None) and state.held == "", deltas


def test_a_partial_tag_is_held_back_until_it_resolves():
    state, reasoning, content = split_delta(start_split(QWEN3), "  <th")
    assert (reasoning, content, state.held) == ("", "", "  <th")
    state, reasoning, content = split_delta(state, "ink>why</thi")
    assert (reasoning, content, state.held) == ("why", "", "</thi")
    state, reasoning, content = split_delta(state, "s is not a tag")
    assert (reasoning, content) == ("</this is not a tag", "")


def test_unknown_parser_names_the_accepted_ones():
    with pytest.raises(ValueError, match="'nope'; accepted: deepseek_r1, qwen3"):
        reasoning_parser("nope")
    result = subprocess.run([sys.executable, "-m", "jaxinfer", "serve", "--reasoning-parser", "nope"],
                            capture_output=True, text=True, timeout=120, env=child_env())
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "--reasoning-parser" in result.stderr and "'deepseek_r1', 'qwen3'" in result.stderr


TOOLS = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
CALL = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'


def test_tool_calls_come_from_the_content_alone():
    plan = ReplyPlan(start_split(DEEPSEEK), plan_tools(TOOLS, "auto", None))
    message, reason = assistant_message(plan, f"I need the time</think>{CALL}", "stop")
    assert message["reasoning_content"] == message["reasoning"] == "I need the time" and reason == "tool_calls"
    assert message["content"] is None and message["tool_calls"][0]["function"]["name"] == "get_time"
    message, reason = assistant_message(plan, f"maybe {CALL}</think>no call", "stop")
    assert message["reasoning_content"] == f"maybe {CALL}" and message["content"] == "no call" and reason == "stop"
    assert "tool_calls" not in message
    message, reason = assistant_message(plan, f"still thinking {CALL}", "length")
    assert message == {"role": "assistant", "content": None, "reasoning_content": f"still thinking {CALL}",
                       "reasoning": f"still thinking {CALL}"} and reason == "length"


def test_streamed_tool_calls_send_the_reasoning_first_and_the_calls_as_they_are_written():
    plan = ReplyPlan(start_split(DEEPSEEK), plan_tools(TOOLS, "auto", None))
    stream = ChoiceStream(plan)
    text = f"I need the time</think>{CALL}"
    deltas = [stream.delta(text[i:i + 5], None) for i in range(0, len(text), 5)] + [stream.delta("", "stop")]
    reasoning = "".join(d["reasoning_content"] for d, _ in deltas if d and "reasoning_content" in d)
    pieces = [piece for d, _ in deltas if d for piece in d.get("tool_calls", ())]
    assert reasoning == "I need the time" and deltas[-1] == ({}, "tool_calls")  # the call all sent before the end
    assert pieces[0]["type"] == "function" and pieces[0]["function"]["name"] == "get_time"
    assert "".join(piece["function"]["arguments"] for piece in pieces) == "{}"
    assert all(d is None or "content" not in d for d, _ in deltas)


def test_without_a_parser_the_message_and_deltas_are_as_before():
    plan = ReplyPlan(None, None)
    assert assistant_message(plan, "<think>a</think>b", "stop") == ({"role": "assistant",
                                                                      "content": "<think>a</think>b"}, "stop")
    assert ChoiceStream(plan).delta("<thi", None) == ({"content": "<thi"}, None)
    assert ChoiceStream(plan).delta("", "stop") == ({"content": ""}, "stop")


def test_chat_template_kwargs_reach_the_template_unless_they_set_its_arguments(text_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(text_model_dir)
    messages = [{"role": "user", "content": "hi"}]
    template = "{{ enable_thinking }} {{ messages | length }}"
    text = render_chat(tokenizer, messages, chat_template=template, template_kwargs={"enable_thinking": False})
    assert text == "False 1"
    with pytest.raises(ValueError, match="may not set add_generation_prompt, tokenize"):
        check_template_kwargs(tokenizer, {"tokenize": True, "add_generation_prompt": False, "enable_thinking": False})
