"""LoRA adapters through the OpenAI-compatible server, with the official `openai` client,
`jaxinfer serve`'s LoRA flags and `jaxinfer generate --lora-path`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import httpx
import openai
import pytest
from live_server import metrics, serve_in_thread
from python_subprocess import child_env

pytest.importorskip("peft", reason="the test adapters are made by peft (pip install -e '.[test]')")
from lora_adapters import save_adapter  # noqa: E402

from jaxinfer import LLM, LoRARequest, SamplingParams  # noqa: E402
from jaxinfer.entrypoints.openai import ServerConfig  # noqa: E402
from jaxinfer.entrypoints.openai.lora_modules import lora_modules  # noqa: E402

KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=8, num_pages=64)
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def adapter(text_model_dir, tmp_path_factory) -> LoRARequest:
    path, _ = save_adapter(text_model_dir, tmp_path_factory.mktemp("lora") / "sql")
    return LoRARequest("sql", 1, str(path))


@pytest.fixture(scope="module")
def llm(text_model_dir, adapter) -> LLM:
    served = LLM(text_model_dir, enable_lora=True, **KNOBS)
    served.engine.add_lora(adapter)
    return served


@pytest.fixture(scope="module")
def url(llm, adapter):
    config = ServerConfig("tiny", lora_modules=(adapter,), runtime_lora_updating=True)
    with serve_in_thread(llm, config) as (base_url, _):
        yield base_url


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def test_models_list_the_adapters_with_their_parent(client, adapter):
    cards = {card.id: card for card in client.models.list().data}
    assert set(cards) == {"tiny", "sql"}
    assert cards["sql"].parent == "tiny" and cards["sql"].root == adapter.lora_path


def test_the_model_name_picks_the_adapter(client, llm, adapter):
    """model="sql" gives LLM.generate's output with the adapter; the served name gives the base model's."""
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    with_adapter, base = llm.generate([PROMPT] * 2, params, lora_request=[adapter, None])
    fields = dict(prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    served = client.completions.create(model="sql", **fields)
    assert served.model == "sql" and served.choices[0].text == with_adapter.outputs[0].text
    assert client.completions.create(model="tiny", **fields).choices[0].text == base.outputs[0].text
    assert with_adapter.outputs[0].text != base.outputs[0].text
    streamed = client.completions.create(model="sql", stream=True, **fields)
    assert "".join(chunk.choices[0].text for chunk in streamed) == with_adapter.outputs[0].text


def test_metrics_count_slot_loads_and_name_the_adapters(client, url):
    client.completions.create(model="sql", prompt=PROMPT, max_tokens=2)
    text = metrics(url)
    assert text["jaxinfer:lora_slot_loads_total"] >= 1
    assert any(name.startswith('jaxinfer:lora_requests_info{max_lora="1"') for name in text), text


def test_chat_with_an_adapter_and_unknown_names(client):
    reply = client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=5)
    assert reply.model == "sql" and reply.choices[0].message.content is not None
    with pytest.raises(openai.NotFoundError, match="`tiny`, `sql`"):
        client.completions.create(model="nope", prompt=PROMPT, max_tokens=2)


def test_adapters_load_and_unload_while_serving(client, url, llm, text_model_dir, tmp_path):
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter: a loaded adapter is served by name
    (LLM.generate's output with it), a bad one is a 400 naming its path, an unloaded one a 404."""
    path = str(save_adapter(text_model_dir, tmp_path / "fresh", seed=7)[0])
    load = lambda body: httpx.post(url + "/v1/load_lora_adapter", json=body, timeout=60)  # noqa: E731
    unload = lambda body: httpx.post(url + "/v1/unload_lora_adapter", json=body, timeout=60)  # noqa: E731
    done = load({"lora_name": "fresh", "lora_path": path})
    assert done.status_code == 200 and "added successfully" in done.text, done.text
    assert {card.id for card in client.models.list().data} == {"tiny", "sql", "fresh"}
    fields = dict(prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True})
    served = client.completions.create(model="fresh", **fields).choices[0].text
    expected = llm.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
                            lora_request=LoRARequest("fresh-reference", 99, path))[0].outputs[0].text
    assert served == expected
    for body, status, words in [
        ({"lora_name": "fresh", "lora_path": path}, 400, "has already been loaded"),
        ({"lora_name": "tiny", "lora_path": path}, 400, "served model's name"),
        ({"lora_name": "gone", "lora_path": str(tmp_path / "missing")}, 400, "lora_path"),
        ({"lora_name": "fresh"}, 400, "lora_path"),
    ]:
        refused = load(body)
        assert refused.status_code == status and words in refused.json()["error"]["message"], refused.text
    done = unload({"lora_name": "fresh"})
    assert done.status_code == 200 and "removed successfully" in done.text
    with pytest.raises(openai.NotFoundError, match="`tiny`, `sql`"):
        client.completions.create(model="fresh", **fields)
    assert unload({"lora_name": "fresh"}).status_code == 404


def test_lora_modules_take_vllm_json_form_too(adapter):
    """vLLM's '{"name": ..., "path": ...}' beside NAME=PATH, numbered in flag order."""
    values = [json.dumps({"name": "sql", "path": adapter.lora_path}), f"chat={adapter.lora_path}"]
    modules = lora_modules(argparse.Namespace(enable_lora=True, lora_modules=values))
    assert modules == (LoRARequest("sql", 1, adapter.lora_path), LoRARequest("chat", 2, adapter.lora_path))


@pytest.mark.parametrize("flags, words", [
    (["--lora-modules", "a=/tmp"], "needs --enable-lora"),
    (["--allow-runtime-lora-updating"], "needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "no-path"], "'no-path' is not NAME=PATH"),
    (["--enable-lora", "--lora-modules", "a=/nonexistent"], "holds no adapter_config.json"),
    (["--enable-lora", "--lora-modules", "a={ADAPTER}", "b={ADAPTER}", "a={ADAPTER}"], "repeat"),
    (["--served-model-name", "a", "--enable-lora", "--lora-modules", "a={ADAPTER}"], "is the served model's name"),
])
def test_bad_lora_flags_are_one_line_errors(text_model_dir, adapter, flags, words):
    flags = [f.replace("{ADAPTER}", adapter.lora_path) for f in flags]
    command = [sys.executable, "-m", "jaxinfer", "serve", "--model", str(text_model_dir), *flags]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


def test_an_adapter_that_does_not_fit_stops_the_start_naming_its_flag(text_model_dir, adapter):
    """Read at start, before /health turns 200: rank 4 over --max-lora-rank 2."""
    command = [sys.executable, "-m", "jaxinfer", "serve", "--model", str(text_model_dir), "--port", "0",
               "--skip-warmup", "--enable-lora", "--max-lora-rank", "2", "--lora-modules", f"sql={adapter.lora_path}"]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and "--lora-modules sql=" in last and "rank r=4" in last, done.stderr
    assert "Traceback" not in done.stderr


def test_generate_command_runs_through_an_adapter(text_model_dir, llm, adapter):
    params = SamplingParams(max_tokens=8, temperature=0)
    expected = llm.generate([PROMPT], params, lora_request=adapter)[0].outputs[0].text
    command = [sys.executable, "-m", "jaxinfer", "generate", "--model", str(text_model_dir), "--prompt", PROMPT,
               "--max-tokens", "8", "--temperature", "0", "--lora-path", adapter.lora_path]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == PROMPT + expected + "\n", done.stderr
    bad = subprocess.run([*command, "--save-session", "/tmp/x"], env=child_env(), capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--save-session" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
