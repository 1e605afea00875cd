"""Prompt embeddings as input (vLLM's prompt_embeds) on a tiny saved Llama: the embedding table's rows give the
token prompt's tokens, perturbed rows HF's `generate(inputs_embeds=...)`, through chunked prefill, prefix
caching keyed by content and preemption; the server's base64 form through the official openai client; bad
input refused by name."""

from __future__ import annotations

import base64
import io

import numpy as np
import openai
import pytest
import torch
import transformers

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.model import ConfigError

GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
# 16 tokens a step: a 37-token prompt's rows are sliced over three chunks; 12 pages of 8 tokens: two 37 + 40
# token requests decoding together outgrow the pool (see the preemption test)
KNOBS = dict(dtype="float32", max_seq_len=96, max_num_batched_tokens=16, page_size=8, num_pages=13, max_num_seqs=2,
             enable_prompt_embeds=True)
IDS = np.random.default_rng(0).integers(3, 300, 37).tolist()


@pytest.fixture(scope="module")
def hf_llama(text_model_dir):
    return transformers.LlamaForCausalLM.from_pretrained(text_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, **KNOBS)


def table_rows(hf_llama, ids: list[int], noise: float = 0.0, seed: int = 0) -> torch.Tensor:
    """The embedding table's rows of ids, plus Gaussian noise of that scale (so they are no table's rows)."""
    rows = hf_llama.get_input_embeddings().weight[ids].detach().clone()
    return rows + noise * torch.from_numpy(np.random.default_rng(seed).standard_normal(rows.shape).astype(np.float32))


def tokens(llm: LLM, prompt, params: SamplingParams = GREEDY) -> list[int]:
    return llm.generate(prompt, params)[0].outputs[0].token_ids


def test_table_rows_give_the_token_prompts_tokens(llm, hf_llama):
    """{"prompt_embeds": table[ids]} (torch, NumPy and jax alike) decodes as the ids do, and logprobs agree."""
    import jax.numpy as jnp

    rows = table_rows(hf_llama, IDS)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    by_ids = llm.generate([IDS], params)[0].outputs[0]
    for value in (rows, rows.numpy(), jnp.asarray(rows.numpy())):
        out = llm.generate({"prompt_embeds": value}, params)[0].outputs[0]
        assert out.token_ids == by_ids.token_ids
        assert [lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)] == pytest.approx(
            [lp[t].logprob for lp, t in zip(by_ids.logprobs, by_ids.token_ids)], abs=1e-5)


@pytest.mark.filterwarnings("ignore:Passing `repetition_penalty` with `inputs_embeds`")
def test_stream_takes_an_embeds_prompt(llm, hf_llama):
    """LLM.stream / stream_text of {"prompt_embeds": rows}: the deltas join to generate's tokens and text."""
    prompt = {"prompt_embeds": table_rows(hf_llama, IDS, noise=0.05)}
    whole = llm.generate(prompt, GREEDY)[0].outputs[0]
    deltas = [delta.outputs[0] for delta in llm.stream(prompt, GREEDY)]
    assert [t for d in deltas for t in d.token_ids] == whole.token_ids and len(deltas) > 1
    assert "".join(llm.stream_text(prompt, GREEDY)) == whole.text
    with pytest.raises(ValueError, match="prompt: a prompt_embeds prompt takes no"):
        next(llm.stream({**prompt, "prompt": "x"}, GREEDY))


def test_perturbed_rows_match_hf_inputs_embeds(llm, hf_llama):
    """Rows off the table: greedy tokens HF's from the same inputs_embeds (chunks of 16 slice them); another
    tensor with the same placeholder ids shares no page, the same tensor again is a prefix hit."""
    a, b = table_rows(hf_llama, IDS, 0.05, seed=1), table_rows(hf_llama, IDS, 0.05, seed=2)
    scheduler = llm.engine.scheduler
    hits = scheduler.prefix_hits
    out_a = tokens(llm, {"prompt_embeds": a})
    out_b = tokens(llm, {"prompt_embeds": b})
    hits_b = scheduler.prefix_hits - hits
    again = tokens(llm, {"prompt_embeds": a})
    hits_again = scheduler.prefix_hits - hits - hits_b
    with torch.no_grad():
        hf = [hf_llama.generate(inputs_embeds=x[None], attention_mask=torch.ones(1, len(IDS), dtype=torch.long),
                                max_new_tokens=GREEDY.max_tokens, min_new_tokens=GREEDY.max_tokens,
                                do_sample=False)[0].tolist() for x in (a, b)]
    assert out_a == hf[0] and out_b == hf[1] and out_a != out_b and again == out_a
    page = llm.engine.config.page_size
    assert hits_b == 0  # same placeholder ids, other rows: no page shared
    assert hits_again == (len(IDS) - 1) // page * page
    # HF penalizes no prompt token of inputs_embeds (it has no ids), nor do we: the placeholders are not counted
    penalized = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, repetition_penalty=3.0)
    with torch.no_grad():
        hf = hf_llama.generate(inputs_embeds=a[None], attention_mask=torch.ones(1, len(IDS), dtype=torch.long),
                               max_new_tokens=8, min_new_tokens=8, do_sample=False, repetition_penalty=3.0)
    assert tokens(llm, {"prompt_embeds": a}, penalized) == hf[0].tolist()


def test_preempted_embeds_requests_recompute_the_same_tokens(llm, hf_llama):
    """An embeds prompt and a token prompt that outgrow the pool together: one is preempted and recomputed
    (the embeds from the rows the request keeps), and both give the tokens their ids give alone."""
    other = np.random.default_rng(1).integers(3, 300, 40).tolist()
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    alone = [tokens(llm, [IDS], params), tokens(llm, [other], params)]
    preempted = llm.engine.scheduler.num_preemptions
    llm.reset_prefix_cache()
    together = llm.generate([{"prompt_embeds": table_rows(hf_llama, IDS)}, other], params)
    assert llm.engine.scheduler.num_preemptions > preempted
    assert [out.outputs[0].token_ids for out in together] == alone


def test_beam_search_over_table_rows_is_the_ids_search(llm, hf_llama):
    """LLM.beam_search of {"prompt_embeds": table[ids]}: the beams and scores of the ids' search."""
    params = BeamSearchParams(beam_width=2, max_tokens=3, ignore_eos=True)
    (by_rows,), (by_ids,) = llm.beam_search([{"prompt_embeds": table_rows(hf_llama, IDS)}], params), \
        llm.beam_search([IDS], params)
    assert [s.tokens[len(IDS):] for s in by_rows.sequences] == [s.tokens[len(IDS):] for s in by_ids.sequences]
    assert [s.cum_logprob for s in by_rows.sequences] == pytest.approx([s.cum_logprob for s in by_ids.sequences],
                                                                       abs=1e-5)


def test_no_program_added(llm, text_model_dir):
    """enable_prompt_embeds compiles the text model's programs and no more (its steps take the rows as data)."""
    plain = LLM(text_model_dir, **{**KNOBS, "enable_prompt_embeds": False})
    assert llm.engine.program_count() == plain.engine.program_count()


@pytest.mark.parametrize("value, message", [
    (torch.zeros(3, 65), "hidden_size is 64"),
    (torch.zeros(3, 4, 64), "rank 2"),
    (torch.zeros(0, 64), "is empty"),
    (torch.zeros(3, 64, dtype=torch.int64), "not floating"),
    (np.zeros((3, 64), np.int32), "not floating"),
    ([[0.0] * 64], "torch, NumPy or jax tensor"),
])
def test_bad_tensors_refused_by_name(llm, value, message):
    with pytest.raises((ValueError, TypeError), match=message) as error:
        llm.generate({"prompt_embeds": value}, GREEDY)
    assert "prompts[0].prompt_embeds" in str(error.value)


def test_refused_combinations(llm, text_model_dir, hf_llama):
    rows = table_rows(hf_llama, IDS[:5])
    with pytest.raises(ValueError, match=r"takes no \['prompt'\] beside it"):
        llm.generate({"prompt_embeds": rows, "prompt": "hi"}, GREEDY)
    with pytest.raises(ValueError, match=r"takes no \['multi_modal_data'\]"):
        llm.generate({"prompt_embeds": rows, "multi_modal_data": {"image": []}}, GREEDY)
    with pytest.raises(ValueError, match="prompt_logprobs is not served with prompt_embeds"):
        llm.generate({"prompt_embeds": rows}, SamplingParams(max_tokens=2, prompt_logprobs=1))
    plain = LLM(text_model_dir, dtype="float32", max_seq_len=64, num_pages=8)
    with pytest.raises(ValueError, match="enable_prompt_embeds=True"):
        plain.generate({"prompt_embeds": rows}, GREEDY)
    with pytest.raises(ConfigError, match="speculative"):
        from jaxinfer import SpeculativeConfig

        LLM(text_model_dir, enable_prompt_embeds=True, speculative=SpeculativeConfig(method="ngram"))
    with pytest.raises(TypeError, match="enable_prompt_embeds must be True or False"):
        LLM(text_model_dir, enable_prompt_embeds="yes")


def base64_tensor(rows: torch.Tensor) -> str:
    """What vLLM's clients send: torch.save's bytes in base64."""
    buffer = io.BytesIO()
    torch.save(rows, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


def test_server_completions_take_base64_prompt_embeds(llm, hf_llama):
    """The official openai client's extra_body prompt_embeds: HF's tokens; embeds' choices before the text's; a
    bad tensor, a non-base64 string and echo are 400s naming the field."""
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    rows = table_rows(hf_llama, IDS, 0.05, seed=4)
    expected = tokens(llm, {"prompt_embeds": rows}, SamplingParams(max_tokens=5, temperature=0))
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        reply = client.completions.create(model="tiny", prompt="", max_tokens=5, temperature=0,
                                          extra_body={"prompt_embeds": base64_tensor(rows)})
        assert reply.choices[0].text == llm.tokenizer.decode(expected)
        assert reply.usage.prompt_tokens == len(IDS)
        both = client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0,
                                         extra_body={"prompt_embeds": [base64_tensor(rows)]})
        assert [c.text for c in both.choices][0] == reply.choices[0].text and len(both.choices) == 2
        beams = client.completions.create(model="tiny", prompt="", max_tokens=3, n=2,
                                          extra_body={"prompt_embeds": base64_tensor(rows), "use_beam_search": True})
        (searched,) = llm.beam_search([{"prompt_embeds": rows}], BeamSearchParams(beam_width=2, max_tokens=3))
        assert [c.text for c in beams.choices] == [s.text for s in searched.sequences]
        for extra, message in (({"prompt_embeds": base64_tensor(rows[:, :8])}, "hidden_size is 64"),
                               ({"prompt_embeds": "not base64!"}, "not base64"),
                               ({"prompt_embeds": base64_tensor(rows), "echo": True}, "echo is not served")):
            with pytest.raises(openai.BadRequestError, match=message):
                client.completions.create(model="tiny", prompt="", max_tokens=2, extra_body=extra)


@pytest.fixture(scope="module")
def xla_llm(text_model_dir):
    """The module's model on XLA's attention (not the native CPU kernels): what accelerators compile."""
    return LLM(text_model_dir, **KNOBS, cpu_kernels=False)


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_ragged_step_with_embeddings_lowers_for_the_accelerators(xla_llm, platform):
    """The widest ragged step, with its embedding rows, lowers for CUDA and TPU (no accelerator here)."""
    from accelerator_programs import DISABLED, EXPORT_PLATFORMS, step_programs, triton_target_without_a_gpu
    from jax import export

    ragged = [(program, args, kwargs) for shape, program, args, kwargs in step_programs(xla_llm, platform)
              if shape[0] == "ragged"]
    assert all("images" in kwargs for _, _, kwargs in ragged)
    program, args, kwargs = ragged[-1]
    with triton_target_without_a_gpu():
        export.export(program, platforms=(EXPORT_PLATFORMS[platform],), disabled_checks=DISABLED)(*args, **kwargs)
