"""vLLM's names where a notebook user ports code: max_model_len, chat, get_tokenizer, Logprob, use_tqdm."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer import LLM, Logprob, SamplingParams
from jaxinfer.entrypoints.chat_template import DEFAULT_CHAT_TEMPLATE

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def add"}]


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, dtype="float32", max_model_len=96, decode_steps=4)


def test_max_model_len_is_max_seq_len(llm, text_model_dir):
    assert llm.max_seq_len == 96 and llm.engine.config.max_seq_len == 96
    with pytest.raises(ValueError, match=r"max_seq_len=64 and max_model_len=96 disagree"):
        LLM(text_model_dir, max_seq_len=64, max_model_len=96)


def _ids(llm, messages, template: str) -> list[int]:
    text = llm.tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=True)
    return llm.tokenizer.encode(text, add_special_tokens=False)


def test_chat_renders_the_tokenizers_template_or_the_default(llm):
    out = llm.chat(MESSAGES, GREEDY)
    assert [o.token_ids for o in out] == [llm.generate([_ids(llm, MESSAGES, DEFAULT_CHAT_TEMPLATE)], GREEDY)[0].token_ids]
    assert out[0].prompt == "system: be brief\nuser: def add\nassistant:"
    own = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>"
    llm.tokenizer.chat_template = own
    try:
        second = [{"role": "user", "content": [{"type": "text", "text": "class "}, {"type": "text", "text": "A"}]}]
        both = llm.chat([MESSAGES, second], GREEDY)
    finally:
        llm.tokenizer.chat_template = None
    assert [o.prompt for o in both] == ["<system>be brief<user>def add<assistant>", "<user>class A<assistant>"]
    joined = [{"role": "user", "content": "class A"}]
    assert both[1].token_ids == llm.generate([_ids(llm, joined, own)], GREEDY)[0].token_ids


@pytest.mark.parametrize("messages, error, words", [
    ("hi", TypeError, ["messages", "list"]),
    ([{"content": "hi"}], TypeError, ["messages[0]", "role"]),
    ([{"role": "user", "content": [{"type": "image_url"}]}], ValueError, ["messages[0].content[0]", "text"]),
])
def test_chat_rejects_malformed_messages_by_name(llm, messages, error, words):
    with pytest.raises(error) as caught:
        llm.chat(messages)
    assert all(w in str(caught.value) for w in words), caught.value


def test_get_tokenizer(llm, checkpoint_dir):
    assert llm.get_tokenizer() is llm.tokenizer and llm.get_tokenizer().encode("x")
    with pytest.raises(ValueError, match="no tokenizer files"):
        LLM(checkpoint_dir("llama3"), dtype="float32", max_seq_len=64).get_tokenizer()


def test_tokenize_gives_ids_and_encode_is_pooling_only(llm):
    """`tokenize` is a prompt's ids; `encode` is vLLM's pooling call, refused on a generating LLM by name."""
    assert llm.tokenize("def add") == llm.get_tokenizer().encode("def add") and llm.tokenize([5, 6]) == [5, 6]
    with pytest.raises(ValueError, match="LLM.encode pools hidden states .* runner='generate' .* llm.tokenize"):
        llm.encode(["def add"], pooling_task="embed")


def _text(llm, token: int) -> str:
    return llm.tokenizer.decode([token], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def test_logprobs_are_vllm_logprob_objects_with_ranks_and_text(llm):
    prompt = llm.tokenize("def add(a, b):")
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=3, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    out = llm.generate([prompt], params)[0]
    ids, ranks = out.token_ids, []
    for i, entry in enumerate(out.outputs[0].logprobs):
        logits = llm.logits(prompt + ids[:i])[-1].astype(np.float64)
        logp = logits - np.logaddexp.reduce(logits)
        top = list(entry.values())[:3]  # the top 3 in order, then the sampled token
        assert all(isinstance(lp, Logprob) for lp in entry.values()) and [lp.rank for lp in top] == [1, 2, 3]
        assert [lp.logprob for lp in top] == pytest.approx(np.sort(logp)[::-1][:3], abs=1e-4)
        chosen = entry[ids[i]]
        assert chosen.logprob == pytest.approx(logp[ids[i]], abs=1e-4) and float(chosen) == chosen.logprob
        above = [np.count_nonzero(logp > logp[ids[i]] + eps) for eps in (1e-4, -1e-4)]  # ties within rounding
        assert above[0] + 1 <= chosen.rank <= above[1] + 1
        assert chosen.decoded_token == _text(llm, ids[i])
        ranks.append(chosen.rank)
    assert max(ranks) > 1  # sampled tokens off the top are ranked too
    first, second = out.prompt_logprobs[:2]
    assert first is None and second[prompt[1]].decoded_token == _text(llm, prompt[1])
    assert [lp.rank for lp in list(second.values())[:2]] == [1, 2]


def test_use_tqdm_shows_a_progress_bar_over_requests(llm, capsys):
    llm.generate(["a", "b", "c"], GREEDY, use_tqdm=True)
    assert "Processed prompts" in capsys.readouterr().err
    llm.chat(MESSAGES, GREEDY)
    assert capsys.readouterr().err == ""


def test_chat_template_kwargs_reach_the_template(llm):
    """vLLM's chat_template_kwargs (Qwen3's enable_thinking, say) are template variables; the renderer's own are not."""
    llm.tokenizer.chat_template = "{{ messages[-1]['content'] }}{% if thinking %}<think>{% endif %}:"
    try:
        on, off = (llm.chat(MESSAGES, GREEDY, chat_template_kwargs={"thinking": value})[0] for value in (True, False))
        with pytest.raises(ValueError, match="chat_template_kwargs may not set tokenize"):
            llm.chat(MESSAGES, GREEDY, chat_template_kwargs={"tokenize": True})
        with pytest.raises(TypeError, match="chat_template_kwargs must be a dict"):
            llm.chat(MESSAGES, GREEDY, chat_template_kwargs=["thinking"])
    finally:
        llm.tokenizer.chat_template = None
    assert (on.prompt, off.prompt) == ("def add<think>:", "def add:")
