"""vLLM's LLM(...) arguments and `vllm serve` flags: seed (sampled outputs repeat from run to run), tokenizer
(read from another directory), block_size (page_size's name), the positional model, the chat template, and the
rest taken where they change nothing and refused by name where they would. (test_server runs a vLLM command
line end to end.)"""

from __future__ import annotations

import argparse
import re

import pytest
from engine_knobs import ENGINE

from jaxinfer import LLM, SamplingParams, TextPrompt, TokensPrompt
from jaxinfer.engine.request_seeds import RequestSeeds
from jaxinfer.entrypoints.openai.cors import Cors
from jaxinfer.entrypoints.openai.launch import add_serve_parser
from jaxinfer.entrypoints.openai.vllm_flags import cors_settings, prefix_caching, settle_vllm_flags
from jaxinfer.entrypoints.vllm_arguments import vllm_arguments

SAMPLED = SamplingParams(max_tokens=12, temperature=1.0, ignore_eos=True)


def test_inert_arguments_pass_and_block_size_is_page_size():
    given = dict(trust_remote_code=True, enforce_eager=False, swap_space=4, disable_log_stats=True, revision=None,
                 enable_chunked_prefill=True, pipeline_parallel_size=1, block_size=32, max_seq_len_to_capture=8192)
    assert vllm_arguments(given, dict(page_size=None)) == {"page_size": 32}
    assert vllm_arguments({"block_size": 16}, dict(page_size=16)) == {"page_size": 16}
    with pytest.raises(ValueError, match="block_size=32 and page_size=16 disagree; block_size is vLLM's name"):
        vllm_arguments({"block_size": 32}, dict(page_size=16))


@pytest.mark.parametrize("name, value, message", [
    ("enforce_eager", True, "enforce_eager=True is not served (every step is a compiled XLA program"),
    ("pipeline_parallel_size", 2, "pipeline_parallel_size=2 is not served (models split over a jax mesh by "
                                  "tensor_parallel_size"),
    ("revision", "main", "revision='main' is not served (there is no model hub here"),
    ("cpu_offload_gb", 4, "cpu_offload_gb=4 is not served (weights stay on the devices; kv_offloading_size"),
    ("enable_chunked_prefill", False, "enable_chunked_prefill=False is not served (prompts are always prefilled"),
    ("swap_space", "4GB", "swap_space='4GB' is not served (preempted requests are recomputed"),
])
def test_values_that_would_change_something_are_refused_by_name(name, value, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        vllm_arguments({name: value}, {})


def test_unknown_names_are_a_type_error_with_the_closest_name():
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'; did you mean 'max_num_seqs'"):
        vllm_arguments({"max_num_seq": 8}, dict(max_num_seqs=64))
    with pytest.raises(TypeError, match="unexpected keyword argument 'frobnicate'$"):
        vllm_arguments({"frobnicate": 1}, {})


def test_request_seeds_repeat_for_one_seed_and_are_fresh_without_one():
    first, again = RequestSeeds(7, lambda: 0), RequestSeeds(7, lambda: 0)
    drawn = [first() for _ in range(4)]
    assert drawn == [again() for _ in range(4)] and len(set(drawn)) == 4
    assert all(0 <= s < 2**63 for s in drawn)
    assert [RequestSeeds(None, lambda: 5)() for _ in range(2)] == [5, 5]


def test_seed_repeats_sampled_outputs_and_tokenizer_reads_another_directory(text_model_dir, tmp_path):
    weights_only = tmp_path / "weights"
    weights_only.mkdir()
    for name in ("config.json", "model.safetensors"):
        (weights_only / name).symlink_to(text_model_dir / name)
    runs = []
    for _ in range(2):
        llm = LLM(weights_only, tokenizer=text_model_dir, seed=7, trust_remote_code=True, **ENGINE)
        runs.append([llm.generate("a b c", SAMPLED)[0].outputs[0].text for _ in range(2)])
    assert runs[0] == runs[1]  # the same engine seed: the same samples, call after call
    assert runs[0][0] != runs[0][1]  # each request its own seed from the stream
    with pytest.raises(ValueError, match="seed must be an integer >= 0 or None"):
        LLM(weights_only, tokenizer=text_model_dir, seed=-1, **ENGINE)


def _serve(*argv: str) -> argparse.Namespace:
    """`jaxinfer serve ARGV` parsed by the real parser, vLLM's flags settled as the server does before it binds."""
    commands = argparse.ArgumentParser(prog="jaxinfer").add_subparsers()
    add_serve_parser(commands)
    args = commands.choices["serve"].parse_args(list(argv))
    settle_vllm_flags(args)
    return args


def test_a_vllm_serve_command_line_parses_into_ours(tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    args = _serve("/models/m", "--tensor-parallel-size", "2", "-dp", "1", "--block-size", "32", "--seed", "0",
                  "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--trust-remote-code", "--swap-space",
                  "4", "--disable-log-stats", "--no-enable-prefix-caching", "--chat-template", str(template))
    assert (args.model, args.tp, args.dp, args.page_size, args.seed) == ("/models/m", 2, 1, 32, 0)
    assert args.chat_template == template.read_text() and prefix_caching(args) is False
    assert prefix_caching(_serve("--enable-prefix-caching")) is True and prefix_caching(_serve()) is None
    assert _serve("--chat-template", "{{ messages[0]['content'] }}").chat_template == "{{ messages[0]['content'] }}"
    assert _serve("--chat-template-content-format", "openai").chat_template_content_format == "openai"
    assert _serve().chat_template_content_format == "auto"
    assert _serve("--scheduling-policy", "priority").scheduling_policy == "priority"
    assert _serve().scheduling_policy == "fcfs"
    cors = cors_settings(_serve("--allowed-origins", '["https://a.example"]', "--allowed-methods", '["POST"]'))
    assert cors == Cors(("https://a.example",), ("POST",), ("*",), False) and cors_settings(_serve()) == Cors()


@pytest.mark.parametrize("argv, message", [
    (["--enforce-eager"], "--enforce-eager is not served: every step is a compiled XLA program"),
    (["-pp", "2"], "--pipeline-parallel-size 2 is not served: models split over a jax mesh"),
    (["--enable-auto-tool-choice"], "--enable-auto-tool-choice needs --tool-call-parser NAME"),
    (["/models/a", "--model", "/models/b"], "the model is given twice, as '/models/a' and as --model '/models/b'"),
    (["--chat-template", "chat.jinja"], "--chat-template 'chat.jinja' is neither a file nor a Jinja template"),
    (["--enable-prefix-caching", "--no-prefix-caching"], "--enable-prefix-caching and --no-prefix-caching"),
    (["--tokenizer", "/nonexistent"], "--tokenizer"),
    (["--allowed-origins", "https://a.example"], "--allowed-origins must be a JSON list of strings"),
    (["--allow-credentials"], "--allowed-methods, --allowed-headers and --allow-credentials go with --allowed-origins"),
])
def test_vllm_serve_flags_that_cannot_be_served_are_refused_by_name(argv, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        _serve(*argv)


def test_a_bad_chat_template_content_format_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        _serve("--chat-template-content-format", "text")
    assert "--chat-template-content-format: invalid choice: 'text'" in capsys.readouterr().err


def test_vllms_call_names_and_output_fields(text_model_dir):
    """generate/stream's sampling_params keyword, TokensPrompt/TextPrompt, cumulative_logprob, chat's
    continue_final_message: vLLM's names for what LLM does."""
    llm = LLM(text_model_dir, **ENGINE)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    ids = llm.tokenize("def add")
    by_name = llm.generate(prompts=[TokensPrompt(prompt_token_ids=ids), TextPrompt(prompt="def add")],
                           sampling_params=params)
    out = by_name[0].outputs[0]
    assert out.token_ids == by_name[1].outputs[0].token_ids == llm.generate(ids, params)[0].outputs[0].token_ids
    assert out.cumulative_logprob == pytest.approx(sum(lp[t].logprob for lp, t in zip(out.logprobs, out.token_ids)))
    assert out.cumulative_logprob < 0
    assert llm.generate(ids, SamplingParams(max_tokens=2))[0].outputs[0].cumulative_logprob is None  # not asked
    streamed = [d.outputs[0].token_ids for d in llm.stream(ids, sampling_params=params)]
    assert sum(streamed, []) == out.token_ids
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def add"}]
    continued = llm.chat(conversation, params, add_generation_prompt=False, continue_final_message=True)[0]
    assert continued.prompt.rstrip().endswith("def add")  # the assistant's message left open, no new turn
    with pytest.raises(ValueError, match="continue_final_message=True continues the last message"):
        llm.chat(conversation, params, continue_final_message=True)
