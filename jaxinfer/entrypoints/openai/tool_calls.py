"""Tools on chat completions: `tool_choice` as an output constraint, and tool calls parsed from the text.

- "required": the output is a JSON array of {"name": <a tool>, "arguments": <its parameters schema>}
  (one item when parallel_tool_calls is false);
- a named function: the output is that function's arguments;
- "auto": free text, then parsed by the `--tool-call-parser` format (tool_parsers/); without the flag,
  Hermes/Qwen `<tool_call>{...}</tool_call>` blocks, else Llama-3's bare JSON `{"name": ..., "parameters": ...}`
  objects (separated by ";"); text that holds no calls of the request's tools stays content;
- "none": free text, never parsed.

Under `--reasoning-parser openai_gptoss` with "auto", the calls are GPT-OSS's harmony function calls instead
(harmony.py's `HarmonyCall`s, as vLLM's `openai` tool parser reads them): each becomes one call of its name
(one the request did not list too), its arguments the message text as written; the content is not parsed.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any, Sequence

from jaxinfer.config.structured_outputs import StructuredOutputsParams
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.harmony import HarmonyCall
from jaxinfer.entrypoints.openai.tool_parsers import AUTO, ToolParser, parse_calls
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall, json_calls

CHOICES = ("none", "auto", "required")


@dataclasses.dataclass(frozen=True)
class ToolPlan:
    """What the request's tools ask of the output, and how to read calls back from it."""

    mode: str  # "none", "auto", "required" or "named"
    parameters: dict[str, dict]  # each tool's arguments schema, by name (in the request's order)
    named: str | None = None
    parallel: bool = True
    parser: ToolParser = AUTO  # how "auto" reads calls from the text (--tool-call-parser)

    @property
    def constraint(self) -> StructuredOutputsParams | None:
        """The output constraint tool_choice sets (none for "auto" and "none")."""
        if self.mode == "named":
            return StructuredOutputsParams(json=self.parameters[self.named])
        if self.mode != "required":
            return None
        calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": schema},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for name, schema in self.parameters.items()]
        array = {"type": "array", "items": {"anyOf": calls}, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}
        return StructuredOutputsParams(json=array)


def plan_tools(tools: list[dict] | None, tool_choice: Any, parallel: bool | None,
               parser: ToolParser | None = None) -> ToolPlan | None:
    """The request's plan (None without tools); 400s name tools, tool_choice and what they accept."""
    if tools is None:
        if tool_choice not in (None, "none"):
            raise APIError("tool_choice needs tools; give the tools the model may call", param="tool_choice")
        return None
    parameters = {}
    for i, tool in enumerate(tools):
        name, schema = _tool(tool, f"tools[{i}]")
        parameters[name] = schema
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if named not in parameters:
            raise APIError(f'tool_choice must be {{"type": "function", "function": {{"name": <one of '
                           f'{", ".join(parameters)}>}}}} or one of {", ".join(CHOICES)}; got {choice!r:.120}',
                           param="tool_choice")
        return ToolPlan("named", parameters, named, parallel is not False, parser or AUTO)
    if choice not in CHOICES:
        raise APIError(f"tool_choice must be one of {', '.join(CHOICES)} or a named function, got {choice!r:.80}",
                       param="tool_choice")
    return ToolPlan(choice, parameters, None, parallel is not False, parser or AUTO)


def _tool(tool: Any, field: str) -> tuple[str, dict]:
    """A tool's name and arguments schema ({"type": "object"} when it declares none)."""
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise APIError(f'{field} must be {{"type": "function", "function": {{"name": ..., "parameters": {{...}}}}}}, '
                       f"got {tool!r:.120}", param="tools")
    schema = function.get("parameters") or {"type": "object"}
    if not isinstance(schema, dict):
        raise APIError(f"{field}.function.parameters must be a JSON schema object, got {schema!r:.80}", param="tools")
    return function["name"], schema


def parse_tool_calls(plan: ToolPlan | None, text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of a finished output; the text stays content when it holds no calls."""
    if plan is None or plan.mode == "none":
        return text, []
    if plan.mode == "named":
        return None, [tool_call(plan.named, text)]
    if plan.mode == "required":
        calls = _json_calls(text, plan, "arguments")
        return (text, []) if calls is None else (None, calls)
    content, calls = parse_calls(plan.parser, text, plan.parameters)
    return content, [tool_call(*call) for call in calls]


def _json_calls(text: str, plan: ToolPlan, arguments_key: str) -> list[dict] | None:
    """OpenAI calls from JSON calls text (None unless all are calls of known tools)."""
    calls = json_calls(text, plan.parameters, arguments_key)
    return None if calls is None else [tool_call(*call) for call in calls]


def tool_call(name: str, arguments: str, call_id: str | None = None) -> dict:
    """One OpenAI tool call (arguments as JSON text), its id the format's where it writes one, else a new
    `call_...`."""
    return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}


def tool_message(plan: ToolPlan | None, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
    """The assistant message of a finished output ({"content"} or {"content", "tool_calls"}) and its
    finish reason ("tool_calls" when it called any)."""
    content, calls = parse_tool_calls(plan, text) if finish_reason == "stop" else (text, [])
    if not calls:
        return {"role": "assistant", "content": text}, finish_reason
    return {"role": "assistant", "content": content, "tool_calls": calls}, "tool_calls"


def made_calls(calls: Sequence[HarmonyCall], finish_reason: str | None) -> list[HarmonyCall]:
    """The harmony calls a finished reply made: those whose message ended, and the one it stopped in (its
    `<|call|>` a stop token the text may lack); not one cut off by max_tokens."""
    return [call for call in calls if call.ended or finish_reason == "stop"]


def harmony_tool_calls(calls: Sequence[HarmonyCall]) -> list[dict]:
    """OpenAI tool_calls of harmony calls."""
    return [tool_call(call.name, call.arguments) for call in calls]


def tool_call_deltas(sent: Sequence[ParsedCall], calls: Sequence[ParsedCall]) -> list[dict]:
    """A stream's tool_calls deltas from the calls seen before (`sent`) to those seen now, as vLLM streams
    them: a call's first piece gives its index, id and name, later ones only more of its arguments (where
    they extend what was sent)."""
    deltas = []
    for index, call in enumerate(calls):
        if index >= len(sent):
            deltas.append({"index": index, **tool_call(*call)})
            continue
        before = sent[index].arguments
        if call.name == sent[index].name and call.arguments.startswith(before) and call.arguments != before:
            deltas.append({"index": index, "function": {"arguments": call.arguments[len(before):]}})
    return deltas
