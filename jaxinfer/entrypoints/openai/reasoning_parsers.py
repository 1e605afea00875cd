"""The `--reasoning-parser` formats by vLLM's names: which tags open and close an output's reasoning, whether an
output that does not open with one is reasoning all the same, what wraps its answer, and which chat template
variable turns thinking off. reasoning.py splits an output by them.

- deepseek_r1 (DeepSeek-R1 and its distills, QwQ), seed_oss (`<seed:think>`), minimax_m2, ernie45, olmo3,
  kimi_k2: the chat template may open the reasoning in the prompt, so an output is reasoning up to its first
  end tag whether or not it opens with the start tag; unclosed, all of it is;
- step3: the same, with no start tag at all (a `<think>` the model writes is reasoning text);
- qwen3, glm45, mistral (Magistral's `[THINK]` tokens), granite (Granite 3.x's sentences), hunyuan_a13b:
  reasoning only when the output opens with the start tag; else all of it is content;
- deepseek_v3: DeepSeek-R1's when the request turns thinking on (`thinking` or `enable_thinking`), else no
  reasoning at all (V3.1's default); kimi_k2 likewise when `thinking` is false;
- minimax_m2_append_think: no reasoning; the content is the output with the `<think>` the prompt opened;
- openai_gptoss (GPT-OSS): harmony channels, read from the text with its special tokens kept (harmony.py).
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

THINK = ("<think>",), ("</think>",)


@dataclasses.dataclass(frozen=True)
class ReasoningParser:
    """A parser by name.

    implicit: an output that does not open with a start tag is still reasoning (up to an end tag).
    starts, ends: the tags that open and close the reasoning, either of each (none: no start tag to read).
    kept_ends: markers that end the reasoning and stay in the content (Kimi K2's tool-call section).
    answer: (open, close) tags wrapping the answer, dropped from the content (and what follows the close).
    keeps_special: the tags are special tokens, so the text must keep them.
    thinking_keys, thinking_default: the chat_template_kwargs that turn thinking on or off, and its default.
    off_is_content: thinking off, the whole output is content (else only an opening start tag makes reasoning).
    prefix: text put before the content (minimax_m2_append_think's `<think>`).
    empty_reasoning_none: a finished output's empty reasoning is None, as if there were none (olmo3, hunyuan_a13b).
    harmony: the output is in GPT-OSS's harmony format, whose markers are special tokens the text must keep.
    """

    name: str
    implicit: bool
    harmony: bool = False
    starts: tuple[str, ...] = THINK[0]
    ends: tuple[str, ...] = THINK[1]
    kept_ends: tuple[str, ...] = ()
    answer: tuple[str, str] | None = None
    keeps_special: bool = False
    thinking_keys: tuple[str, ...] = ("enable_thinking",)
    thinking_default: bool = True
    off_is_content: bool = False
    prefix: str = ""
    empty_reasoning_none: bool = False

    def thinking(self, template_kwargs: Mapping | None) -> bool:
        """Whether the request's chat_template_kwargs leave thinking on: a default-on parser is off only where a
        key is false; a default-off one on where a key is true."""
        given = [template_kwargs[key] for key in self.thinking_keys if key in (template_kwargs or {})]
        if self.thinking_default:
            return not any(value is False for value in given)
        return any(bool(value) for value in given)


GRANITE_STARTS = ("Here is my thought process:", "Here's my thought process:")
GRANITE_ENDS = ("Here is my response:", "Here's my response:")
PARSERS = {
    "deepseek_r1": ReasoningParser("deepseek_r1", True),
    "qwen3": ReasoningParser("qwen3", False),
    "openai_gptoss": ReasoningParser("openai_gptoss", True, harmony=True, keeps_special=True),
    "glm45": ReasoningParser("glm45", False),
    "seed_oss": ReasoningParser("seed_oss", True, starts=("<seed:think>",), ends=("</seed:think>",)),
    "mistral": ReasoningParser("mistral", False, starts=("[THINK]",), ends=("[/THINK]",), keeps_special=True),
    "granite": ReasoningParser("granite", False, starts=GRANITE_STARTS, ends=GRANITE_ENDS),
    "minimax_m2": ReasoningParser("minimax_m2", True),
    "minimax_m2_append_think": ReasoningParser("minimax_m2_append_think", False, starts=(), ends=(),
                                               thinking_keys=(), prefix="<think>"),
    "ernie45": ReasoningParser("ernie45", True, answer=("<response>", "</response>")),
    "hunyuan_a13b": ReasoningParser("hunyuan_a13b", False, starts=("<think>\n",), ends=("\n</think>\n",),
                                    answer=("<answer>\n", "\n</answer>"), empty_reasoning_none=True),
    "olmo3": ReasoningParser("olmo3", True, empty_reasoning_none=True),
    "step3": ReasoningParser("step3", True, starts=()),
    "kimi_k2": ReasoningParser("kimi_k2", True, kept_ends=("<|tool_calls_section_begin|>",),
                               thinking_keys=("thinking",), off_is_content=True),
    "deepseek_v3": ReasoningParser("deepseek_v3", True, thinking_keys=("thinking", "enable_thinking"),
                                   thinking_default=False, off_is_content=True),
}


def reasoning_parser(name: str) -> ReasoningParser:
    """The parser called `name`; a ValueError naming the accepted ones otherwise."""
    if name not in PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; accepted: {', '.join(PARSERS)}")
    return PARSERS[name]
