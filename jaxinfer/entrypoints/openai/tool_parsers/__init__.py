"""Tool calls read from a chat reply's free text, one module per format, as vLLM's `--tool-call-parser` names them.

A parser is a start marker (where the calls begin; None: the whole reply may be calls) and a pure `read`
of the text from that marker on, giving the calls (`ParsedCall`: name, arguments as JSON text, and the id
where the format writes one) and the text left over that is content; `read` gives None unless the text
holds calls of the request's tools only, and then the whole reply stays content. Its `stream` reads a
streaming reply (incremental.py): the content, each call's name (and id) once written and its arguments as
they come, joined the same text `read` gives. `openai` reads nothing here: GPT-OSS's calls are harmony
messages (harmony.py).
"""

from __future__ import annotations

import dataclasses
import functools
from types import ModuleType
from typing import Callable, Mapping

from jaxinfer.entrypoints.openai.tool_parsers import (
    deepseek_v3,
    glm45,
    granite,
    hermes,
    kimi_k2,
    llama3_json,
    minimax_m2,
    mistral,
    olmo3,
    pythonic,
    qwen3_coder,
    step3,
)
from jaxinfer.entrypoints.openai.tool_parsers.incremental import Malformed, Progress, Reader, Source, Wait, skip_space
from jaxinfer.entrypoints.openai.tool_parsers.json_calls import ParsedCall

Read = Callable[[str, Mapping[str, dict]], "tuple[list[ParsedCall], str] | None"]


@dataclasses.dataclass(frozen=True)
class ToolParser:
    """A format by name. keeps_special: its start marker is a special token, so the text must keep them;
    other_starts: markers that begin the calls as `start` does (Kimi K2's singular section marker)."""

    name: str
    start: str | None
    read: Read | None
    stream: Reader | None = None
    keeps_special: bool = False
    other_starts: tuple[str, ...] = ()

    def find_start(self, text: str) -> int:
        """Where the calls begin in `text`: its first start marker (0 without one; -1: none there)."""
        if self.start is None:
            return 0
        found = [at for marker in (self.start, *self.other_starts) if (at := text.find(marker)) >= 0]
        return min(found, default=-1)


def _read_auto(text: str, tools: Mapping[str, dict]) -> tuple[list[ParsedCall], str] | None:
    """Hermes blocks where the reply has one, else Llama-3 JSON (the server's behaviour without the flag)."""
    at = text.find(hermes.START)
    if at < 0:
        return llama3_json.read(text, tools)
    found = hermes.read(text[at:], tools)
    return None if found is None else (found[0], text[:at] + found[1])


def _stream_auto(src: Source, out: Progress, tools: Mapping[str, dict]) -> Wait:
    """Llama-3 JSON calls where the reply opens with them, else (from the start) Hermes blocks, as `_read_auto`
    reads a reply that is not Llama-3 calls."""
    at = src.at
    if (yield from skip_space(src)) in ("[", "{"):
        try:
            yield from llama3_json.stream(src, out, tools)
        except Malformed:
            if out.calls:
                raise
    src.at = at  # the space, and JSON that is not calls, are content there
    yield from hermes.stream(src, out, tools)


def _marked(name: str, module: ModuleType, keeps_special: bool = False, **markers: str) -> ToolParser:
    """`module`'s format between other markers (`start`, and `end` where it has one)."""
    return ToolParser(name, markers["start"], functools.partial(module.read, **markers),
                      functools.partial(module.stream, **markers), keeps_special=keeps_special)


AUTO = ToolParser("auto", None, _read_auto, _stream_auto)
TOOL_PARSERS = {
    "hermes": ToolParser("hermes", hermes.START, hermes.read, hermes.stream),
    "llama3_json": ToolParser("llama3_json", None, llama3_json.read, llama3_json.stream),
    "mistral": ToolParser("mistral", mistral.START, mistral.read, mistral.stream, keeps_special=True),
    "deepseek_v3": ToolParser("deepseek_v3", deepseek_v3.START, deepseek_v3.read, deepseek_v3.stream),
    "glm45": ToolParser("glm45", glm45.START, glm45.read, glm45.stream),
    "qwen3_coder": ToolParser("qwen3_coder", qwen3_coder.START, qwen3_coder.read, qwen3_coder.stream),
    "granite": ToolParser("granite", granite.START, granite.read, granite.stream, keeps_special=True),
    "pythonic": ToolParser("pythonic", None, pythonic.read, pythonic.stream),
    "kimi_k2": ToolParser("kimi_k2", kimi_k2.START, kimi_k2.read, kimi_k2.stream, keeps_special=True,
                          other_starts=(kimi_k2.SINGULAR_START,)),
    "minimax_m2": ToolParser("minimax_m2", minimax_m2.START, minimax_m2.read, minimax_m2.stream),
    "openai": ToolParser("openai", None, None),
    "seed_oss": _marked("seed_oss", qwen3_coder, start="<seed:tool_call>", end="</seed:tool_call>"),
    "qwen3_xml": ToolParser("qwen3_xml", qwen3_coder.START, qwen3_coder.read, qwen3_coder.stream),
    "hunyuan_a13b": _marked("hunyuan_a13b", hermes, start="<tool_calls>", end="</tool_calls>"),
    "jamba": _marked("jamba", hermes, keeps_special=True, start="<tool_calls>", end="</tool_calls>"),
    "ernie45": ToolParser("ernie45", hermes.START, hermes.read, hermes.stream),
    "longcat": _marked("longcat", hermes, start="<longcat_tool_call>", end="</longcat_tool_call>"),
    "llama4_json": ToolParser("llama4_json", None, llama3_json.read, llama3_json.stream),
    "llama4_pythonic": ToolParser("llama4_pythonic", None, pythonic.read, pythonic.stream),
    "phi4_mini_json": _marked("phi4_mini_json", granite, start="functools"),
    "deepseek_v31": ToolParser("deepseek_v31", deepseek_v3.START, deepseek_v3.read_v31, deepseek_v3.stream_v31),
    "step3": ToolParser("step3", step3.START, step3.read, step3.stream, keeps_special=True),
    "olmo3": ToolParser("olmo3", None, olmo3.read, olmo3.stream),
    "internlm": _marked("internlm", hermes, keeps_special=True, start="<|action_start|><|plugin|>",
                        end="<|action_end|>"),
}


def tool_parser(name: str) -> ToolParser:
    """The parser called `name`; a ValueError naming the accepted ones otherwise."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; accepted: {', '.join(TOOL_PARSERS)}")
    return TOOL_PARSERS[name]


def read_calls(parser: ToolParser, text: str, tools: Mapping[str, dict]) -> tuple[str, list[ParsedCall]] | None:
    """(the content text around the calls, the calls) of a finished reply; None when it holds no calls."""
    at = parser.find_start(text)
    if parser.read is None or at < 0:
        return None
    found = parser.read(text[at:], tools)
    if not found or not found[0]:
        return None
    return text[:at] + found[1], found[0]


def parse_calls(parser: ToolParser, text: str, tools: Mapping[str, dict]) -> tuple[str | None, list[ParsedCall]]:
    """(content, calls) of a finished reply: the text as it is without calls; else the text around them,
    trailing space cut (None when empty)."""
    found = read_calls(parser, text, tools)
    if found is None:
        return text, []
    return found[0].rstrip() or None, found[1]
