"""Sleep mode and weight updates through the server (vLLM's /sleep, /wake_up, /is_sleeping; SGLang's
/update_weights_from_disk), with the official `openai` client for the completions between them."""

from __future__ import annotations

import argparse
import shutil

import httpx
import openai
import pytest
import torch
from live_server import serve_in_thread
from transformers import AutoModelForCausalLM

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.entrypoints.openai.weight_flags import check_weight_flags

KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=4, num_pages=32)
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def trained_dir(text_model_dir, tmp_path_factory):
    """The tiny text model with every weight moved (a training step), saved beside its tokenizer's files."""
    model = AutoModelForCausalLM.from_pretrained(text_model_dir, dtype=torch.float32)
    torch.manual_seed(4)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("trained_text")
    model.save_pretrained(path)
    for tokenizer_file in text_model_dir.glob("tokenizer*"):
        shutil.copy(tokenizer_file, path)
    return path


@pytest.fixture(scope="module")
def served(text_model_dir):
    llm = LLM(text_model_dir, **KNOBS)
    with serve_in_thread(llm, ServerConfig("tiny", sleep_mode=True, weight_updates=True)) as (url, _):
        yield url, llm


def complete(url: str) -> str:
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text


def test_sleep_wake_and_update_from_disk(served, trained_dir, text_model_dir):
    url, _ = served
    before = complete(url)
    assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": False}
    assert httpx.post(url + "/sleep", params={"level": 1}).status_code == 200
    assert httpx.get(url + "/is_sleeping").json() == {"is_sleeping": True}
    with pytest.raises(openai.APIStatusError) as refused:
        complete(url)
    assert refused.value.status_code == 503 and "POST /wake_up" in refused.value.message
    assert httpx.post(url + "/wake_up").status_code == 200
    assert complete(url) == before
    answer = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(trained_dir)})
    assert answer.status_code == 200 and answer.json()["success"]
    trained = complete(url)
    fresh = LLM(trained_dir, **KNOBS).generate([PROMPT], SamplingParams(max_tokens=8, temperature=0))
    assert trained != before and trained == fresh[0].outputs[0].text
    assert httpx.post(url + "/sleep", params={"level": 2}).status_code == 200
    httpx.post(url + "/wake_up")
    with pytest.raises(openai.APIStatusError, match="update_weights_from_disk"):
        complete(url)
    assert httpx.post(url + "/update_weights_from_disk", json={"model_path": str(text_model_dir)}).status_code == 200
    assert complete(url) == before


def test_bad_calls_are_refused_by_name(served, tmp_path):
    url, _ = served
    bad_level = httpx.post(url + "/sleep", params={"level": 3})
    assert bad_level.status_code == 400 and bad_level.json()["error"]["param"] == "level"
    missing = httpx.post(url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "none")})
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "model_path"


def test_routes_are_off_unless_asked_and_flags_checked(text_model_dir):
    llm = LLM(text_model_dir, **KNOBS)
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        assert httpx.post(url + "/sleep").status_code == 404
        assert httpx.post(url + "/update_weights_from_disk", json={"model_path": "x"}).status_code == 404
    args = argparse.Namespace(enable_sleep_mode=True, enable_weight_updates=False, speculative_method="eagle",
                              shadow_fraction=0.0)
    check_weight_flags(args)  # speculation falls back in the engine, and an EAGLE head follows the new weights
    with pytest.raises(ValueError, match="--enable-sleep-mode do not go with --shadow-fraction"):
        check_weight_flags(argparse.Namespace(**{**vars(args), "shadow_fraction": 0.1}))
