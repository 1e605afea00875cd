"""Beam search (`LLM.beam_search`, vLLM's): HF transformers' `generate(num_beams=...)` on the same
weights, and the bookkeeping of finished beams on hand-made candidates."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
import transformers

from jaxinfer import LLM, BeamSearchParams, Logprob
from jaxinfer.engine.beams import PromptBeams, beam_score
from jaxinfer.entrypoints.chat_template import render_chat

PROMPTS = [[1, 5, 9, 33, 71, 100, 4, 8], list(range(3, 40))]  # 37 tokens: beams cross a page boundary


@pytest.fixture(scope="module")
def pair(checkpoint_dir):
    path = checkpoint_dir("llama2")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # runs every beam to max_new_tokens, as ignore_eos
    return LLM(path, dtype="float32", max_seq_len=128), hf


def hf_beams(model: torch.nn.Module, ids: list[int], width: int, max_tokens: int, length_penalty: float):
    """HF's num_return_sequences=width best beams: (generated ids, score) each, best first."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), num_beams=width, num_return_sequences=width, do_sample=False,
                             max_new_tokens=max_tokens, length_penalty=length_penalty, return_dict_in_generate=True,
                             output_scores=True, pad_token_id=0)
    return [(seq[len(ids):].tolist(), float(score)) for seq, score in zip(out.sequences, out.sequences_scores)]


@pytest.mark.parametrize("width, length_penalty", [(4, 1.0), (3, 2.0)])
def test_beams_match_hf_generate(pair, width, length_penalty):
    llm, hf = pair
    params = BeamSearchParams(beam_width=width, max_tokens=10, ignore_eos=True, length_penalty=length_penalty)
    outputs = llm.beam_search(PROMPTS, params)
    assert len(outputs) == len(PROMPTS)
    for out, ids in zip(outputs, PROMPTS):
        expected = hf_beams(hf, ids, width, 10, length_penalty)
        assert [seq.tokens[:len(ids)] for seq in out.sequences] == [ids] * width
        assert [seq.tokens[len(ids):] for seq in out.sequences] == [tokens for tokens, _ in expected]
        scores = [beam_score(seq.cum_logprob, 10, length_penalty) for seq in out.sequences]
        np.testing.assert_allclose(scores, [score for _, score in expected], atol=1e-4)
        assert all(seq.finish_reason == "length" and len(seq.logprobs) == 10 for seq in out.sequences)


def test_cumulative_logprob_is_the_sum_over_chosen_tokens(pair):
    llm, _ = pair
    (out,) = llm.beam_search([PROMPTS[0]], BeamSearchParams(beam_width=2, max_tokens=6))
    for seq in out.sequences:
        chosen = seq.tokens[len(PROMPTS[0]):]
        total = sum(step[token].logprob for step, token in zip(seq.logprobs, chosen))
        assert seq.cum_logprob == pytest.approx(total, abs=1e-6)
        assert all(len(step) == 4 for step in seq.logprobs)  # top 2 x beam_width at temperature 0


def test_bad_beam_arguments_name_what_is_accepted(pair):
    llm, _ = pair
    with pytest.raises(ValueError, match=r"beam_width must be an integer in \[1, 10\], got 11"):
        BeamSearchParams(beam_width=11, max_tokens=4)
    with pytest.raises(TypeError, match="params must be a BeamSearchParams, got SamplingParams"):
        llm.beam_search([1, 2], __import__("jaxinfer").SamplingParams())
    with pytest.raises(ValueError, match="exceeds max_seq_len 128"):
        llm.beam_search([list(range(3, 120))], BeamSearchParams(beam_width=2, max_tokens=16))


def candidates(**logprobs: float) -> dict[int, Logprob]:
    return {int(token[1:]): Logprob(value) for token, value in logprobs.items()}


def test_eos_finishes_a_beam_and_the_search_stops_when_none_can_catch_up():
    search = PromptBeams([7, 7], BeamSearchParams(beam_width=2, max_tokens=50), eos_ids=[0])
    search.advance([candidates(t0=-0.1, t5=-1.0, t6=-2.0, t9=-3.0)])
    assert [b.tokens for b in search.running] == [[7, 7, 5], [7, 7, 6]]
    assert [b.tokens for b in search.finished] == [[7, 7, 0]] and not search.done
    search.advance([candidates(t0=-0.2, t3=-0.5), candidates(t0=-0.1, t4=-0.3)])
    # finished: [7, 7, 0] at -0.1, [7, 7, 5, 0] at -1.2 / 2; the best running beam (-1.5) can reach
    # -1.5 / 50 at most, above -0.6: the search goes on.
    assert [b.cum_logprob for b in search.finished] == pytest.approx([-0.1, -1.2])
    assert not search.done
    search.advance([candidates(t0=-30.0, t8=-40.0), candidates(t0=-30.0, t8=-40.0)])
    # the best running beam now sits at -1.5 - 40 = -41.5, whose best reachable score -41.5 / 50 is
    # below -0.6: done, without running to max_tokens.
    assert search.done
    best = search.best(lambda ids: " ".join(map(str, ids)))
    assert [(b.text, b.finish_reason) for b in best] == [("", "stop"), ("5", "stop")]


def test_ignore_eos_keeps_eos_beams_running_and_max_tokens_ends_them():
    search = PromptBeams([7], BeamSearchParams(beam_width=1, max_tokens=2, ignore_eos=True), eos_ids=[0])
    search.advance([candidates(t0=-0.1, t5=-1.0)])
    search.advance([candidates(t0=-0.1, t5=-1.0)])
    assert search.done
    (beam,) = search.best(lambda ids: ",".join(map(str, ids)))
    assert (beam.tokens, beam.text, beam.finish_reason) == ([7, 0, 0], "0,0", "length")


def test_server_beam_search_returns_the_beams_of_llm_beam_search(served_text_model):
    llm, client = served_text_model
    prompt = "def add(a, b):"
    (expected,) = llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=6, length_penalty=0.5))
    reply = client.completions.create(model="tiny", prompt=prompt, n=3, max_tokens=6,
                                      extra_body={"use_beam_search": True, "length_penalty": 0.5})
    assert [c.text for c in reply.choices] == [seq.text for seq in expected.sequences]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [c.finish_reason for c in reply.choices] == [seq.finish_reason for seq in expected.sequences]
    generated = sum(len(seq.tokens) - len(llm.tokenize(prompt)) for seq in expected.sequences)
    assert reply.usage.completion_tokens == generated
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], n=2,
                                                 max_tokens=5, stream=True, extra_body={"use_beam_search": True}))
    streamed = {}
    for chunk in chunks:
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    chat_ids = llm.tokenize(render_chat(llm.get_tokenizer(), [{"role": "user", "content": "hi"}], True))
    (chat_beams,) = llm.beam_search([chat_ids], BeamSearchParams(beam_width=2, max_tokens=5))
    assert [streamed[i] for i in range(2)] == [seq.text for seq in chat_beams.sequences]


@pytest.mark.parametrize("fields, words", [
    (dict(stop=["\n"]), "stop is not supported with use_beam_search"),
    (dict(logprobs=2), "logprobs is not supported with use_beam_search"),
    (dict(n=11), r"n is the beam width with use_beam_search and must be in \[1, 10\], got 11"),
])
def test_bad_beam_search_requests_are_400s_naming_the_field(served_text_model, fields, words):
    _, client = served_text_model
    with pytest.raises(openai.BadRequestError, match=words):
        client.completions.create(model="tiny", prompt="hi", max_tokens=4, extra_body={"use_beam_search": True},
                                  **fields)
    with pytest.raises(openai.BadRequestError, match="length_penalty ranks beams; it needs use_beam_search"):
        client.completions.create(model="tiny", prompt="hi", max_tokens=4, extra_body={"length_penalty": 2.0})
