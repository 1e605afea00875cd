"""The --reasoning-parser formats beyond deepseek_r1 and qwen3 (reasoning_parsers.py): each against outputs in
its model's format (vLLM's test and model-card examples) as vLLM's parser splits them whole, the stream
giving the same reasoning and content wherever the text is cut, and the chat_template_kwargs toggles."""

from __future__ import annotations

import pytest

from jaxinfer.entrypoints.openai.reasoning import PARSERS, split_delta, split_text, start_split

TOOLS_SECTION = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0"
CASES = {  # parser: [(output, (reasoning, content))]
    "glm45": [("<think>I add</think>The sum is 4", ("I add", "The sum is 4")),
              ("The sum is 4", (None, "The sum is 4")),
              ("\n<think></think>only the answer", ("", "only the answer")),
              ("<think>I add, then", ("I add, then", None))],
    "seed_oss": [("<seed:think>I add</seed:think>4", ("I add", "4")),
                 ("I add</seed:think>\n4", ("I add", "\n4")),
                 ("<seed:think>I add <think></seed:think>", ("I add <think>", None)),
                 ("I add", ("I add", None))],
    "mistral": [("[THINK]I add[/THINK]The sum is 4", ("I add", "The sum is 4")),
                ("The sum is 4", (None, "The sum is 4")),
                ("[THINK]I add", ("I add", None))],
    "granite": [("Here is my thought process: I add. Here is my response: 4", (" I add. ", " 4")),
                ("Here's my thought process:\nx\nHere's my response:\ny", ("\nx\n", "\ny")),
                ("Here is my thought process: Here, is my response: x", (" Here, is my response: x", None)),
                ("Here is the answer: 4", (None, "Here is the answer: 4"))],
    "minimax_m2": [("I add</think>\n\nThe sum is 4", ("I add", "\n\nThe sum is 4")),
                   ("<think>I add</think>4", ("I add", "4"))],
    "minimax_m2_append_think": [("I add</think>4", (None, "<think>I add</think>4")), ("", (None, "<think>"))],
    "ernie45": [("abc\n</think>\n\n<response>\ndef\n</response>\n", ("abc\n", "\ndef\n")),
                ("abc\n</think>\ndef", ("abc\n", "\ndef")),
                ("<think>abc</think><response>def", ("abc", "def")),
                ("abc\n</think>\n\n<resp", ("abc\n", "\n\n<resp"))],
    "hunyuan_a13b": [("<think>\nabc\n</think>\n<answer>\ndef\n</answer>", ("abc", "def")),
                     ("<think>\n\n</think>\n<answer>\nhi\n</answer>\n<think>", (None, "hi")),
                     ("<think>\nabc\n</think>\ndef", ("abc", "def")),
                     ("hi there", (None, "hi there")),
                     ("<think>\nabc", ("abc", None))],
    "olmo3": [("<think>abc</think>def", ("abc", "def")), ("abc</think>def", ("abc", "def")),
              ("</think>def", (None, "def")), ("abc", ("abc", None))],
    "step3": [("abc</think>def", ("abc", "def")), ("<think>abc</think>def", ("<think>abc", "def")),
              ("abc", ("abc", None))],
    "kimi_k2": [("<think>abc</think>def", ("abc", "def")), ("abc</think>", ("abc", None)),
                (f"abc{TOOLS_SECTION}", ("abc", TOOLS_SECTION))],
    "deepseek_v3": [("<think>abc</think>def", (None, "<think>abc</think>def")), ("abc", (None, "abc"))],
}
PAIRS = [(name, *case) for name, cases in CASES.items() for case in cases]


def streamed(parser_name: str, deltas: list[str], **kwargs: bool) -> tuple[str, str]:
    """The reasoning and content a stream of deltas sends, joined."""
    state, reasoning, content = start_split(PARSERS[parser_name], **kwargs), "", ""
    for index, delta in enumerate(deltas):
        state, r, c = split_delta(state, delta, final=index == len(deltas) - 1)
        reasoning, content = reasoning + r, content + c
    assert state.held == ""
    return reasoning, content


def cuts(text: str) -> list[list[str]]:
    """The text cut everywhere once and twice, a character a delta, and in chunks of 2, 3 and 5."""
    found = [[text[:i], text[i:j], text[j:]] for i in range(len(text) + 1) for j in range(i, len(text) + 1)]
    found.append([*text, ""])
    found += [[text[i:i + size] for i in range(0, len(text), size)] + [""] for size in (2, 3, 5)]
    return found


@pytest.mark.parametrize("name,text,expected", PAIRS, ids=[f"{p[0]}-{i}" for i, p in enumerate(PAIRS)])
def test_whole_and_streamed_split_as_vllm_does(name, text, expected):
    assert split_text(start_split(PARSERS[name]), text) == expected
    for deltas in cuts(text):
        assert streamed(name, deltas) == (expected[0] or "", expected[1] or ""), deltas


def test_thinking_toggles_follow_each_templates_variable():
    v3, kimi, glm = PARSERS["deepseek_v3"], PARSERS["kimi_k2"], PARSERS["glm45"]
    assert not v3.thinking(None) and v3.thinking({"thinking": True}) and v3.thinking({"enable_thinking": True})
    assert split_text(start_split(v3, thinking=True), "abc</think>def") == ("abc", "def")
    assert kimi.thinking({}) and not kimi.thinking({"thinking": False}) and kimi.thinking({"enable_thinking": False})
    assert split_text(start_split(kimi, thinking=False), "<think>abc</think>d") == (None, "<think>abc</think>d")
    # glm45 off: the template closes the thinking in the prompt; a <think> the model writes is still one
    assert not glm.thinking({"enable_thinking": False})
    assert split_text(start_split(glm, thinking=False), "<think>a</think>b") == ("a", "b")
    assert split_text(start_split(PARSERS["seed_oss"], thinking=False), "a</seed:think>b") == (None, "a</seed:think>b")


def test_magistral_tags_need_the_special_tokens_kept():
    assert PARSERS["mistral"].keeps_special and not PARSERS["glm45"].keeps_special
