"""Every bad input of issue 17: a ValueError/TypeError naming the field and the value (API), or
one line on stderr and exit 2 (CLI); the LLM keeps working after each."""

from __future__ import annotations

import math
import re

import pytest

from jaxinfer import DEMO_MODEL, LLM, SamplingParams
from jaxinfer.checkpoint import loader
from jaxinfer.entrypoints.cli import main as cli_main

GOOD = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM()  # the demo model: vocabulary 4096, max_position_embeddings 1024


@pytest.fixture(scope="module")
def not_a_model(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("not_a_model")
    (path / "notes.txt").write_text("no config.json here")
    return path


# (call on the demo LLM, error type, what the message must contain: the field and the value)
LLM_CALLS = {
    "id list with a string": (lambda m: m.generate([313, "def"]), TypeError, ["prompts[1]", "'def'"]),
    "prompt list with an int": (lambda m: m.generate([[313, 5], 909]), TypeError, ["prompts[1]", "909"]),
    "bytes prompt": (lambda m: m.generate(b"def f"), TypeError, ["prompts", "b'def f'", "bytes"]),
    "bytes in a prompt list": (lambda m: m.generate([b"def f"]), TypeError, ["prompts[0]", "bytes"]),
    "params as a dict": (lambda m: m.generate("x", {"max_tokens": 3}), TypeError, ["params", "dict"]),
    "stream params as a dict": (lambda m: list(m.stream("x", {"max_tokens": 3})), TypeError, ["params", "dict"]),
    "stop id beyond the vocabulary": (
        lambda m: m.generate("x", SamplingParams(stop_token_ids=[10**9])), ValueError,
        ["stop_token_ids", "1000000000", "4096"],
    ),
    "logit_bias id beyond the vocabulary": (
        lambda m: m.generate("x", SamplingParams(logit_bias={7: 1.0, 10**6: -5})), ValueError,
        ["logit_bias", "1000000", "4096"],
    ),
    "logits of text": (lambda m: m.logits("text"), TypeError, ["token_ids", "'text'", "llm.tokenize"]),
    "logits id beyond the vocabulary": (lambda m: m.logits([1, 450, 4996]), ValueError, ["token_ids", "4996", "4096"]),
    "prompt id beyond the vocabulary": (lambda m: list(m.stream([1, 99999])), ValueError, ["prompt", "99999"]),
    "bool in a prompt's ids": (lambda m: m.generate([[313, True]]), TypeError, ["prompts[0][1]", "True", "bool"]),
    "float in a prompt's ids": (lambda m: list(m.stream([1, 2.0])), TypeError, ["prompt", "2.0", "float"]),
}

PARAMS = {
    "negative stop id": (dict(stop_token_ids=[-7, 10**9]), ValueError, ["stop_token_ids", "-7"]),
    "stop id beyond int32": (dict(stop_token_ids=[2**40]), ValueError, ["stop_token_ids", str(2**40)]),
    "stop id as a string": (dict(stop_token_ids=["\n"]), TypeError, ["stop_token_ids[0]", "'\\n'", "stop="]),
    "stop ids as a string": (dict(stop_token_ids="\n"), TypeError, ["stop_token_ids", "stop="]),
    "top_k beyond int32": (dict(top_k=2**40), ValueError, ["top_k", str(2**40), "2147483647"]),
    "fractional max_tokens": (dict(max_tokens=2.5), TypeError, ["max_tokens", "2.5", "integer"]),
    "string max_tokens": (dict(max_tokens="16"), TypeError, ["max_tokens", "'16'"]),
    "infinite temperature": (dict(temperature=math.inf), ValueError, ["temperature", "inf", "finite"]),
    "nan top_p": (dict(top_p=math.nan), ValueError, ["top_p", "nan"]),
    "negative temperature": (dict(temperature=-0.5), ValueError, ["temperature", "-0.5", ">= 0"]),
    "negative seed": (dict(seed=-1), ValueError, ["seed", "-1"]),
    "ignore_eos as a string": (dict(ignore_eos="yes"), TypeError, ["ignore_eos", "'yes'"]),
    "logit_bias beyond 100": (dict(logit_bias={5: 150}), ValueError, ["logit_bias", "token 5", "150", "[-100, 100]"]),
    "nan logit_bias": (dict(logit_bias={5: math.nan}), ValueError, ["logit_bias", "nan"]),
    "logit_bias key as a string": (dict(logit_bias={"5": 1}), TypeError, ["logit_bias key", "'5'", "int token ids"]),
    "negative logit_bias id": (dict(logit_bias={-3: 1}), ValueError, ["logit_bias key", "-3"]),
    "logit_bias as a list": (dict(logit_bias=[5]), TypeError, ["logit_bias", "list"]),
    "too many logit_bias ids": (dict(logit_bias=dict.fromkeys(range(301), 1)), ValueError, ["logit_bias", "301", "300"]),
    "include_stop_str_in_output as a number": (
        dict(include_stop_str_in_output=1), TypeError, ["include_stop_str_in_output", "1"]
    ),
}

CONSTRUCTOR = {
    "negative max_seq_len": (dict(max_seq_len=-5), ValueError, ["max_seq_len", "-5", ">= 1"]),
    "fractional max_seq_len": (dict(max_seq_len=2.5), TypeError, ["max_seq_len", "2.5"]),
    "max_seq_len beyond the model": (dict(max_seq_len=2048), ValueError, ["max_seq_len", "2048", "1024"]),
    "zero max_num_seqs": (dict(max_num_seqs=0), ValueError, ["max_num_seqs", "0", ">= 1"]),
    # Removed: it set the engine's max_num_seqs too, so max_num_seqs=8 ran 2 sequences.
    "max_batch_size beside max_num_seqs": (dict(max_num_seqs=8, max_batch_size=2), TypeError, ["max_batch_size"]),
    "int8 dtype": (dict(dtype="int8"), ValueError, ["dtype", "int8", "float32"]),
    "unknown dtype": (dict(dtype="float64"), ValueError, ["dtype", "float64", "bfloat16"]),
    "model path as an int": (dict(model=5), TypeError, ["model", "5"]),
    "speculative as a string": (dict(speculative="draft"), TypeError, ["speculative", "str"]),
}


def _assert_names(err: BaseException, needles: list[str]) -> None:
    for needle in needles:
        assert needle in str(err), f"{needle!r} not in {str(err)!r}"


def _works(llm: LLM) -> None:
    assert len(llm.generate([[1, 2, 3]], GOOD)[0].token_ids) == 2


@pytest.mark.parametrize("case", list(LLM_CALLS))
def test_bad_call_names_field_and_llm_still_works(llm, case):
    call, error, needles = LLM_CALLS[case]
    with pytest.raises(error) as info:
        call(llm)
    _assert_names(info.value, needles)
    _works(llm)


@pytest.mark.parametrize("case", list(PARAMS))
def test_bad_sampling_params_name_field(case):
    kwargs, error, needles = PARAMS[case]
    with pytest.raises(error) as info:
        SamplingParams(**kwargs)
    _assert_names(info.value, needles)


@pytest.mark.parametrize("case", list(CONSTRUCTOR))
def test_bad_constructor_argument_names_field(llm, case):
    kwargs, error, needles = CONSTRUCTOR[case]
    with pytest.raises(error) as info:
        LLM(**kwargs)
    _assert_names(info.value, needles)
    _works(llm)


def test_directory_without_config_is_not_a_model(not_a_model):
    with pytest.raises(ValueError) as info:
        LLM(not_a_model, dtype="auto")
    _assert_names(info.value, ["model", str(not_a_model), "config.json"])


CLI = {
    "top_k beyond int32": (["generate", "--prompt", "x", "--top-k", str(2**40)], ["top_k", str(2**40)]),
    "infinite temperature": (["generate", "--prompt", "x", "--temperature", "inf"], ["temperature", "inf"]),
    "negative max_seq_len": (["generate", "--prompt", "x", "--max-seq-len", "-5"], ["max_seq_len", "-5"]),
    "max_seq_len beyond the model": (["generate", "--prompt", "x", "--max-seq-len", "2048"], ["max_seq_len", "2048"]),
    "unknown dtype": (["generate", "--prompt", "x", "--dtype", "int4"], ["dtype", "int4"]),
    "missing model": (["generate", "--model", "/nonexistent/model", "--prompt", "x"], ["model", "does not exist"]),
    "convert int8": (["convert", str(DEMO_MODEL), "OUT", "--dtype", "int8"], ["--dtype", "int8", "bfloat16"]),
    "convert bogus dtype": (["convert", str(DEMO_MODEL), "OUT", "--dtype", "fp8"], ["--dtype", "fp8", "float16"]),
    "convert into itself": (["convert", str(DEMO_MODEL), str(DEMO_MODEL)], ["OUT_DIR", "HF_DIR"]),
    "convert a non-model": (["convert", "NOT_A_MODEL", "OUT"], ["HF_DIR", "config.json"]),
    # Rejected by argparse itself: one line (no usage block) naming the flag, the value and what it takes.
    "fractional --max-tokens": (["generate", "--prompt", "x", "--max-tokens", "2.5"], ["--max-tokens", "'2.5'", "integer"]),
    "--top-k not a number": (["generate", "--prompt", "x", "--top-k", "abc"], ["--top-k", "'abc'", "integer"]),
    "--temperature not a number": (["generate", "--prompt", "x", "--temperature", "hot"], ["--temperature", "'hot'", "number"]),
    "unknown flag": (["generate", "--prompt", "x", "--bogus", "3"], ["--bogus", "jaxinfer generate --help"]),
    "flag without its value": (["generate", "--prompt"], ["--prompt", "expected one argument"]),
    "missing required flag": (["generate", "--max-tokens", "3"], ["--prompt", "required"]),
    "unknown choice": (["generate", "--prompt", "x", "--quantization", "int3"], ["--quantization", "'int3'", "'int4'"]),
    "generate from a non-model": (["generate", "--model", "NOT_A_MODEL", "--prompt", "x"], ["--model", "NOT_A_MODEL", "config.json"]),
}


@pytest.mark.parametrize("case", list(CLI))
def test_cli_bad_input_is_one_line_and_exit_2(case, capsys, tmp_path, not_a_model):
    argv, needles = CLI[case]
    names = {"OUT": str(tmp_path / "out"), "NOT_A_MODEL": str(not_a_model)}
    argv, needles = [names.get(a, a) for a in argv], [names.get(n, n) for n in needles]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert re.match(r"jaxinfer( \w+)?: error: \S", err) and err.count("\n") == 1 and err.endswith("\n"), err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    assert not (tmp_path / "out").exists()


def test_cli_unexpected_error_is_one_line_unless_debug(tmp_path, capsys, monkeypatch):
    """A failure the CLI does not expect (here a bug planted in loading) is one line and exit 1; --debug raises."""

    def broken_loader(*args, **kwargs):
        raise RuntimeError("planted loader bug")

    monkeypatch.setattr(loader, "load_hf_weights", broken_loader)
    argv = ["convert", str(DEMO_MODEL), str(tmp_path / "out")]
    monkeypatch.delenv("JAXINFER_DEBUG", raising=False)
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("jaxinfer: internal error: RuntimeError: planted") and err.count("\n") == 1, err
    assert "--debug" in err, err
    with pytest.raises(RuntimeError, match="planted"):  # the exception itself, with its traceback
        cli_main(["--debug", *argv])
    monkeypatch.setenv("JAXINFER_DEBUG", "1")
    with pytest.raises(RuntimeError, match="planted"):
        cli_main(argv)
