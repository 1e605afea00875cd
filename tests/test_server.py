"""The OpenAI-compatible server, started for real on a free localhost port (one per module)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest
import uvicorn
from hf_models import save_hf_model
from python_subprocess import child_env

from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.metrics import StepClock
from jaxinfer.entrypoints.openai import ServerConfig, build_app
from jaxinfer.entrypoints.openai.chat import DEFAULT_CHAT_TEMPLATE
from jaxinfer.entrypoints.openai.cors import Cors

KEY = "test-key"
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=16, max_num_batched_tokens=128, num_pages=96, decode_steps=4)
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "x = [1, 2"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def reference(text_model_dir):
    """A second LLM on the same model: what the server's greedy outputs must equal."""
    return LLM(text_model_dir, **KNOBS)


@pytest.fixture(scope="module")
def served(text_model_dir):
    """The LLM behind the server."""
    return LLM(text_model_dir, **KNOBS)


@contextlib.contextmanager
def _serving(llm: LLM) -> Iterator[str]:
    """The app over `llm` on a free localhost port, in a thread; yields its base URL."""
    app = build_app(llm, ServerConfig("tiny", api_key=KEY, max_body_bytes=64 * 1024))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def base_url(served):
    with _serving(served) as url:
        yield url


@pytest.fixture(scope="module")
def client(base_url):
    return openai.OpenAI(base_url=base_url + "/v1", api_key=KEY, max_retries=0)


def _greedy(max_tokens: int, **fields) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **fields)


AUTH = {"Authorization": f"Bearer {KEY}"}


def _metrics(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics", headers=AUTH).text
    values = {}
    for line in text.splitlines():
        match = re.match(r"^(jaxinfer:[^ ]+) ([0-9.e+-]+)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def test_models_health_and_tokenize(client, base_url, reference):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(base_url + "/health").status_code == 200
    ids = httpx.post(base_url + "/tokenize", json={"prompt": "def add"}, headers=AUTH).json()["tokens"]
    assert ids == reference.tokenize("def add")
    assert httpx.post(base_url + "/detokenize", json={"tokens": ids}, headers=AUTH).json()["prompt"] == "def add"


def test_model_retrieval_version_and_ping(client, base_url):
    """OpenAI's models.retrieve, and vLLM's /version and /ping (SageMaker's probe), the last two without a key."""
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        client.models.retrieve("nope")
    from jaxinfer import __version__

    assert httpx.get(base_url + "/version").json() == {"version": __version__}
    assert httpx.get(base_url + "/ping").status_code == httpx.post(base_url + "/ping").status_code == 200
    assert httpx.get(base_url + "/v1/models").status_code == 401  # the API itself still needs the key


def test_cross_origin_requests_are_answered_only_for_the_origins_given(served, base_url):
    """--allowed-origins: a browser's preflight is answered (before the API key is asked) for those origins alone;
    the default server sends no CORS headers at all."""
    preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    assert "access-control-allow-origin" not in httpx.options(base_url + "/v1/completions", headers=preflight).headers
    app = build_app(served, ServerConfig("tiny", api_key=KEY, cors=Cors(("https://app.example",))))

    async def ask() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as http:
            return [await http.options("/v1/completions", headers=preflight),
                    await http.options("/v1/completions", headers={**preflight, "Origin": "https://evil.example"}),
                    await http.get("/health", headers={"Origin": "https://app.example"})]

    allowed, other, simple = asyncio.run(ask())
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    assert simple.headers["access-control-allow-origin"] == "https://app.example"


def test_completions_equal_llm_generate(client, reference):
    expected = reference.generate(PROMPTS, _greedy(12))
    out = client.completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert [c.text for c in sorted(out.choices, key=lambda c: c.index)] == [e.text for e in expected]
    assert out.usage.completion_tokens == 12 * len(PROMPTS)
    assert out.usage.prompt_tokens == sum(len(reference.tokenize(p)) for p in PROMPTS)


def test_vllms_token_filters_equal_llm_generate(client, reference):
    """allowed_token_ids, bad_words and truncate_prompt_tokens (vLLM's extra fields) as SamplingParams takes them."""
    allowed = list(range(200, 300))
    plain = reference.generate(PROMPTS[0], _greedy(8, allowed_token_ids=allowed))[0].outputs[0]
    word = reference.get_tokenizer().decode(plain.token_ids[1:2]).strip() or "x"
    fields = dict(allowed_token_ids=allowed, bad_words=[word], truncate_prompt_tokens=3)
    expected = reference.generate(PROMPTS[0], _greedy(8, **fields))[0].outputs[0]
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, **fields})
    assert out.choices[0].text == expected.text and set(expected.token_ids) <= set(allowed)
    assert out.usage.prompt_tokens == 3
    with pytest.raises(openai.BadRequestError, match="truncate_prompt_tokens must be >= 1"):
        client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=2,
                                  extra_body={"truncate_prompt_tokens": -1})


def test_a_priority_is_a_400_unless_the_server_schedules_by_priority(client):
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=1, extra_body={"priority": 0})
    assert out.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1,
                                       extra_body={"priority": 3})
    assert info.value.param == "priority" and "--scheduling-policy priority" in info.value.message


def test_chat_continues_the_final_message_as_llm_chat_does(client, reference):
    messages = [{"role": "user", "content": "def add"}, {"role": "assistant", "content": "def add(a"}]
    expected = reference.chat(messages, _greedy(6), add_generation_prompt=False, continue_final_message=True)[0]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True, "add_generation_prompt": False,
                                                     "continue_final_message": True})
    assert out.choices[0].message.content == expected.outputs[0].text
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids)
    with pytest.raises(openai.BadRequestError, match="continue_final_message=True continues the last message"):
        client.chat.completions.create(model="tiny", messages=messages, max_tokens=2,
                                       extra_body={"continue_final_message": True})


def test_chat_equals_llm_generate_on_the_default_template(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def add"}]
    text = reference.tokenizer.apply_chat_template(messages, chat_template=DEFAULT_CHAT_TEMPLATE, tokenize=False,
                                                  add_generation_prompt=True)
    ids = reference.tokenizer.encode(text, add_special_tokens=False)
    expected = reference.generate([ids], _greedy(10))[0]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == expected.text and out.choices[0].message.role == "assistant"
    assert out.usage.prompt_tokens == len(ids) and out.choices[0].finish_reason == "length"


def test_streams_equal_whole_responses_and_end_with_usage(client):
    args = dict(model="tiny", max_tokens=10, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt=PROMPTS[0], **args).choices[0].text
    chunks = list(client.completions.create(prompt=PROMPTS[0], stream=True,
                                            stream_options={"include_usage": True}, **args))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole
    assert chunks[-1].usage.completion_tokens == 10 and not chunks[-1].choices
    messages = [{"role": "user", "content": "hi"}]
    reply = client.chat.completions.create(messages=messages, **args).choices[0].message.content
    stream = list(client.chat.completions.create(messages=messages, stream=True, **args))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == reply
    assert stream[-1].choices[0].finish_reason == "length"


def test_stop_strings_cut_or_kept(client):
    args = dict(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0)
    whole = client.completions.create(**args, extra_body={"ignore_eos": True}).choices[0].text
    stop = whole[2:5]
    cut = client.completions.create(**args, stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    kept = client.completions.create(
        **args, stop=[stop], extra_body={"ignore_eos": True, "include_stop_str_in_output": True}
    ).choices[0]
    assert cut.text == whole[: whole.index(stop)] and cut.finish_reason == "stop"
    assert kept.text == cut.text + stop and kept.finish_reason == "stop"


def test_logprobs_in_both_layouts(client):
    out = client.completions.create(model="tiny", prompt="def", max_tokens=4, temperature=0, logprobs=2)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == 4 and all(len(t) >= 2 for t in lp.top_logprobs)
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert content[0].top_logprobs[0].logprob == pytest.approx(content[0].logprob)  # greedy takes the best


def test_logit_bias_steers_completions_and_chat(client, reference):
    plain = reference.generate([PROMPTS[0]], _greedy(8))[0]
    forced = {plain.token_ids[1]: 100.0}  # a bias of 100 all but forces a token, every step
    out = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=8, temperature=0,
                                    logit_bias={str(t): b for t, b in forced.items()}, extra_body={"ignore_eos": True})
    expected = reference.generate([PROMPTS[0]], _greedy(8, logit_bias=forced))[0]
    assert out.choices[0].text == expected.text != plain.text and set(expected.token_ids) == set(forced)
    chat = dict(model="tiny", messages=[{"role": "user", "content": "def add"}], max_tokens=6, temperature=0,
                extra_body={"ignore_eos": True})
    word = reference.tokenize("return")[-1]
    plain_reply = client.chat.completions.create(**chat).choices[0].message.content
    reply = client.chat.completions.create(**chat, logit_bias={str(word): 100}).choices[0].message.content
    assert reply == reference.tokenizer.decode([word] * 6) != plain_reply


@pytest.mark.parametrize("bias,needle", [
    ({"abc": 1}, "'abc' is not a token id"), ({"5": 150}, "[-100, 100]"), ({"1000000": 1}, "vocabulary [0, 320)"),
    ({"5": "1"}, "number"),
])
def test_bad_logit_bias_is_a_400_naming_it(client, bias, needle):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, logit_bias=bias)
    assert info.value.param.startswith("logit_bias") and needle in info.value.message, info.value.message


UNIMPLEMENTED = {  # (route, extra fields, the param the 400 names)
    "functions": ("chat", {"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    "bad tool": ("chat", {"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools"),
    "bad response_format": ("chat", {"response_format": {"type": "xml"}}, "response_format.type"),
    "suffix": ("completions", {"suffix": " end"}, "suffix"),
    "unknown": ("completions", {"temprature": 0.5}, "temprature"),
    "unknown nested": ("completions", {"stream": True, "stream_options": {"include_usage": True, "x": 1}},
                       "stream_options.x"),
    "unknown in a message": ("chat", {"messages": [{"role": "user", "content": "hi", "weight": 2}]}, "messages.0.weight"),
}


@pytest.mark.parametrize("name", list(UNIMPLEMENTED))
def test_fields_the_server_does_not_implement_are_400s_naming_them(client, name):
    route, fields, param = UNIMPLEMENTED[name]
    create = client.chat.completions.create if route == "chat" else client.completions.create
    base = dict(messages=[{"role": "user", "content": "hi"}]) if route == "chat" else dict(prompt="hi")
    with pytest.raises(openai.BadRequestError) as info:
        create(model="tiny", max_tokens=2, **base, extra_body=fields)  # extra_body's messages replace base's
    assert info.value.param == param and param.split(".")[-1] in info.value.message, info.value.message


def _prompt_logprobs(reference: LLM, ids: list[int]) -> np.ndarray:
    """log p(ids[j] | ids[:j]) for j >= 1, from the reference model's logits."""
    logits = reference.logits(ids).astype(np.float64)[:-1]
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    return logp[np.arange(len(ids) - 1), ids[1:]]


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_logprobs_score_prompts_as_lm_eval_asks(client, reference, max_tokens):
    """lm-eval's local-completions loglikelihood request: id prompts, echo, logprobs=1, max_tokens 0 or 1;
    it sums token_logprobs[ctxlen:-1] and calls a continuation greedy when each is its top_logprobs' max."""
    prompts = [reference.tokenize(p) for p in PROMPTS[:2]]
    out = client.completions.create(model="tiny", prompt=prompts, max_tokens=max_tokens, temperature=0, logprobs=1,
                                    echo=True, seed=1234)
    choices = sorted(out.choices, key=lambda c: c.index)
    for ids, text, choice in zip(prompts, PROMPTS, choices):
        lp = choice.logprobs
        assert len(lp.token_logprobs) == len(ids) + max_tokens and choice.text.startswith(text)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        expected = _prompt_logprobs(reference, ids)
        np.testing.assert_allclose(lp.token_logprobs[1 : len(ids)], expected, atol=1e-4)
        assert all(max(top.values()) >= t - 1e-6 for t, top in zip(lp.token_logprobs[1:], lp.top_logprobs[1:]))
    assert out.usage.completion_tokens == len(prompts) * max_tokens
    if max_tokens == 0:
        assert [c.text for c in choices] == PROMPTS[:2]
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(model="tiny", prompt="x", max_tokens=0)
        assert info.value.param == "max_tokens" and "echo" in info.value.message


def test_echo_streams_the_prompt_first(client):
    args = dict(model="tiny", prompt=PROMPTS[1], max_tokens=5, temperature=0, echo=True, extra_body={"ignore_eos": True})
    whole = client.completions.create(**args).choices[0].text
    chunks = [c.choices[0].text for c in client.completions.create(stream=True, **args) if c.choices]
    assert whole.startswith(PROMPTS[1]) and len(whole) > len(PROMPTS[1])
    assert chunks[0].startswith(PROMPTS[1]) and "".join(chunks) == whole


def _post(base_url: str, body: bytes | dict, key: str | None = KEY, path: str = "/v1/completions") -> httpx.Response:
    headers = {"content-type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(base_url + path, content=content, headers=headers, timeout=60)


BAD_REQUESTS = {
    "no key": (dict(prompt="x"), None, 401),
    "wrong key": (dict(prompt="x"), "nope", 401),
    "malformed json": (b'{"prompt": "x",', KEY, 400),
    "not an object": (b'[1, 2]', KEY, 400),
    "string max_tokens": (dict(prompt="x", max_tokens="5"), KEY, 400),
    "bool temperature": (dict(prompt="x", temperature=True), KEY, 400),
    "top_p zero": (dict(prompt="x", top_p=0), KEY, 400),
    "negative max_tokens": (dict(prompt="x", max_tokens=-1), KEY, 400),
    "n too large": (dict(prompt="x", n=1000), KEY, 400),
    "too long": (dict(prompt="a b " * 400), KEY, 400),
    "too big": (dict(prompt="x" * 70_000), KEY, 413),
    "unknown model": (dict(prompt="x", model="gpt-4"), KEY, 404),
    "empty prompt": (dict(prompt=[]), KEY, 400),
    "id outside vocab": (dict(prompt=[1, 10**6]), KEY, 400),
}


@pytest.mark.parametrize("name", list(BAD_REQUESTS))
def test_bad_requests_get_openai_errors(base_url, name):
    body, key, status = BAD_REQUESTS[name]
    response = _post(base_url, body, key)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]


def test_chat_errors(base_url):
    assert _post(base_url, {"messages": []}, path="/v1/chat/completions").status_code == 400
    bad_part = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert _post(base_url, bad_part, path="/v1/chat/completions").status_code == 400
    no_logprobs = {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    assert _post(base_url, no_logprobs, path="/v1/chat/completions").json()["error"]["param"] == "top_logprobs"


async def _stream_text(client: httpx.AsyncClient, url: str, body: dict) -> str:
    events = []
    async with client.stream("POST", url, json=body) as response:
        assert response.status_code == 200
        events = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])


async def _load(base_url: str, prompts: list[list[int]]) -> tuple[list[str], int]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
        body = lambda p: {"prompt": p, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": True}
        streams = [_stream_text(client, "/v1/completions", body(p)) for p in prompts]
        malformed = client.post("/v1/completions", content=b'{"prompt": [1, 2', headers={"content-type": "application/json"})
        results = await asyncio.gather(*streams[:32], malformed, *streams[32:])
    return [r for r in results if isinstance(r, str)], results[32].status_code


def test_64_concurrent_streams_and_a_malformed_request(base_url, reference):
    prompts = [[3 + (i * 7 + j) % 290 for j in range(5 + i % 20)] for i in range(64)]
    before = _metrics(base_url)
    texts, malformed_status = asyncio.run(_load(base_url, prompts))
    assert malformed_status == 400
    assert texts == [o.text for o in reference.generate(prompts, _greedy(8))]
    after = _metrics(base_url)
    finished = 'jaxinfer:request_success_total{finished_reason="length"}'
    assert after[finished] - before.get(finished, 0) == 64
    assert after["jaxinfer:generation_tokens_total"] - before["jaxinfer:generation_tokens_total"] == 64 * 8
    assert after["jaxinfer:num_requests_running"] == 0 and after["jaxinfer:kv_cache_usage_perc"] == 0
    phases = 'jaxinfer:engine_phase_seconds_total{phase="%s"}'
    spent = sum(after.get(phases % p, 0) - before.get(phases % p, 0) for p in StepClock.PHASES)
    stepped = after["jaxinfer:engine_step_seconds_total"] - before["jaxinfer:engine_step_seconds_total"]
    assert spent > 0 and spent == pytest.approx(stepped, rel=1e-6)


# vLLM's bucket boundaries (vllm/v1/metrics/loggers.py): dashboards query histogram_quantile over them.
VLLM_BUCKETS = {
    "time_to_first_token_seconds": [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                                    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
    "inter_token_latency_seconds": [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                                    10.0, 20.0, 40.0, 80.0],
    "e2e_request_latency_seconds": [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                                    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0],
}
VLLM_BUCKETS["request_time_per_output_token_seconds"] = VLLM_BUCKETS["inter_token_latency_seconds"]
VLLM_BUCKETS["request_queue_time_seconds"] = VLLM_BUCKETS["e2e_request_latency_seconds"]


def test_latencies_are_prometheus_histograms_with_vllms_buckets(client, base_url):
    before = _metrics(base_url)
    client.completions.create(model="tiny", prompt="def add", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    text = httpx.get(base_url + "/metrics", headers=AUTH).text
    after = _metrics(base_url)
    for name, bounds in VLLM_BUCKETS.items():
        metric = "jaxinfer:" + name
        assert f"# TYPE {metric} histogram" in text
        buckets = re.findall(rf'^{metric}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)
        assert [le for le, _ in buckets] == [str(b) for b in bounds] + ["+Inf"]
        counts = [float(count) for _, count in buckets]
        assert counts == sorted(counts) and counts[-1] == after[metric + "_count"]
        assert after[metric + "_count"] > before.get(metric + "_count", 0)
    gaps = after["jaxinfer:inter_token_latency_seconds_count"] - before["jaxinfer:inter_token_latency_seconds_count"]
    assert gaps == 5 and "quantile=" not in text


def test_each_sample_of_a_stream_finishes_once(base_url):
    # Sample 1 prefills a step after sample 0, so it finishes a step later.
    body = {"prompt": "def add", "max_tokens": 6, "temperature": 0.8, "seed": 1, "n": 2, "ignore_eos": True,
            "stream": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, headers=headers, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    finishes = [c["index"] for e in events for c in e["choices"] if c["finish_reason"]]
    assert sorted(finishes) == [0, 1]


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def test_a_slow_step_blocks_neither_health_nor_new_requests(served, base_url, monkeypatch):
    """While a step takes 2 s (a long device call, or a compile), the event loop keeps answering:
    /health, a new stream's acceptance (its 200) and a bad request's 400 each well within the step (a
    blocked loop makes a call wait for the rest of its 2 s; most take a few ms, and 1 s leaves room for a
    2-core machine whose other test worker is compiling: 0.62 s was seen once so)."""
    step, entered, left = served.engine.step, threading.Event(), threading.Event()

    def slow_once(*args, **kwargs):
        if not entered.is_set():
            entered.set()
            time.sleep(2)
            left.set()
        return step(*args, **kwargs)

    monkeypatch.setattr(served.engine, "step", slow_once)
    body = {"prompt": "def add", "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as client:

        def accepted() -> None:
            with client.stream("POST", "/v1/completions", json=body) as response:
                assert response.status_code == 200  # leaving unread disconnects: the request is aborted

        def rejected() -> None:
            assert client.post("/v1/completions", json={"prompt": "a b " * 400}).status_code == 400

        with client.stream("POST", "/v1/completions", json=body) as first:  # runs the slow step
            assert first.status_code == 200 and entered.wait(30)
            latencies = [_seconds(call) for call in [accepted, lambda: client.get("/health"), rejected] * 2]
            assert not left.is_set(), f"the step ended before the measurements did: {latencies}"
            assert max(latencies) < 1.0 and sorted(latencies)[len(latencies) // 2] < 0.1, latencies
            assert "".join(line for line in first.iter_lines())  # the slow step's request still completes
    deadline = time.monotonic() + 30
    while served.engine.has_unfinished():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_client_that_disconnects_mid_stream_frees_its_pages(base_url):
    # Disconnect right after the first chunk (no round trip first: a loaded machine let the tiny
    # model finish in between); the abort count proves the request was still running.
    body = {"prompt": "def add", "max_tokens": 120, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base_url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 30
    while (m := _metrics(base_url))["jaxinfer:num_requests_running"] or m["jaxinfer:kv_cache_usage_perc"]:
        assert time.monotonic() < deadline, m
        time.sleep(0.1)
    assert m.get('jaxinfer:request_success_total{finished_reason="abort"}', 0) >= 1


def test_bench_serve_without_a_server_is_one_line():
    env = child_env()
    url = f"http://127.0.0.1:{_free_port()}"
    command = [sys.executable, "-m", "jaxinfer", "bench", "serve", "--base-url", url, "--num-prompts", "1"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--base-url" in done.stderr, done.stderr


def _turn(role: str, text: str) -> dict:
    return {"from": role, "value": text}


def test_bench_serve_reads_sharegpt_like_vllm(tmp_path):
    from jaxinfer.entrypoints.openai.bench_data import detect_format, sharegpt_pairs, sharegpt_workload

    entries = [
        {"conversations": [_turn("human", "hi there"), _turn("gpt", "one two three"), _turn("human", "more")]},
        {"conversations": [_turn("human", "no reply")]},  # skipped: no gpt turn
        {"conversations": [_turn("gpt", "greeting"), _turn("human", "why"), _turn("gpt", "because of it")]},
        {"id": "no conversations"},  # skipped
        {"conversations": [_turn("human", "empty reply"), _turn("gpt", "")]},  # skipped
        {"conversations": [_turn("human", "last"), _turn("gpt", "a b")]},
    ]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(entries))
    assert detect_format(path) == "sharegpt"
    pairs = sharegpt_pairs(path)
    assert pairs == [("hi there", "one two three"), ("why", "because of it"), ("last", "a b")]
    work = sharegpt_workload(pairs, 2, lambda text: len(text.split()))
    assert [(w.prompt, w.max_tokens) for w in work] == [("hi there", 3), ("why", 3)]


def test_bench_serve_reads_jsonl(tmp_path):
    from jaxinfer.entrypoints.openai.bench_data import detect_format, jsonl_workload, resolve_dataset_name

    path = tmp_path / "work.jsonl"
    path.write_text('{"prompt": "a", "max_tokens": 5}\n\n{"prompt": [7, 8]}\n{"prompt": "c", "max_tokens": 2}\n')
    assert detect_format(path) == resolve_dataset_name(None, path) == "jsonl"
    assert resolve_dataset_name(None, None) == "random"
    assert [(w.prompt, w.max_tokens) for w in jsonl_workload(path, 2)] == [("a", 5), ([7, 8], 64)]


@pytest.mark.parametrize("name,content,flags,message", [
    ("bad.json", "[{\"conversations\": ", [], "not JSON"),
    ("obj.json", "{\"a\": 1}", ["--dataset-name", "sharegpt"], "holds a dict"),
    ("none.json", "[{\"conversations\": []}]", [], "none of 1 entries"),
    ("bad.jsonl", "{\"prompt\": \"x\"}\n{\"max_tokens\": 3}\n", [], "line 2"),
    ("ok.jsonl", "{\"prompt\": \"x\"}\n", ["--dataset-name", "random"], "--dataset-name random takes no"),
    ("missing.jsonl", None, [], "cannot read it"),
])
def test_bench_serve_bad_dataset_is_one_line_naming_the_flag(tmp_path, capsys, name, content, flags, message):
    from jaxinfer.entrypoints.cli import main

    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    url = f"http://127.0.0.1:{_free_port()}"  # never asked: the file is read first
    assert main(["bench", "serve", "--base-url", url, "--dataset", str(path), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "--dataset" in err, err


def test_bench_serve_against_the_server(base_url, tmp_path, capsys):
    from jaxinfer.entrypoints.cli import main

    out = tmp_path / "bench.json"
    argv = ["bench", "serve", "--base-url", base_url, "--api-key", KEY, "--num-prompts", "6", "--input-len", "8",
            "--output-len", "6", "--max-token-id", "64", "--max-concurrency", "3", "--result-file", str(out)]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["completed"] == 6 and summary["failed"] == 0 and summary["max_concurrency"] == 3
    assert summary["total_output_tokens"] >= 6 and summary["mean_ttft_ms"] > 0
    assert summary["median_e2el_ms"] >= summary["median_ttft_ms"]
    captured = capsys.readouterr()
    assert "output_throughput" in captured.out
    assert "6/6" in captured.err  # the progress bar counted every request


def test_bench_serve_times_tokens_of_a_model_without_tokenizer_files(tmp_path):
    """Random-weight benchmark checkpoints ship no tokenizer: chunks carry ids and no text, and
    TTFT and ITL must still be measured (vLLM counts every chunk with a choice)."""
    from jaxinfer.entrypoints.cli import main

    model = save_hf_model("llama2", tmp_path / "ids_only", num_hidden_layers=1)
    out = tmp_path / "bench.json"
    argv = ["bench", "serve", "--api-key", KEY, "--num-prompts", "2", "--input-len", "8", "--output-len", "5",
            "--max-token-id", "64", "--disable-tqdm", "--result-file", str(out)]
    with _serving(LLM(model, **KNOBS)) as url:
        assert main([*argv, "--base-url", url]) == 0
    summary = json.loads(out.read_text())
    assert summary["completed"] == 2 and summary["total_output_tokens"] > 2
    assert summary["mean_ttft_ms"] > 0 and summary["mean_itl_ms"] > 0


def test_bench_serve_sharegpt_counts_replies_with_the_servers_tokenizer(base_url, tmp_path, capsys):
    from jaxinfer.entrypoints.cli import main

    replies = ["x = 1", "return a + b"]
    entries = [{"conversations": [_turn("human", f"write {r}"), _turn("gpt", r)]} for r in replies]
    path, out = tmp_path / "sharegpt.json", tmp_path / "bench.json"
    path.write_text(json.dumps(entries))
    argv = ["bench", "serve", "--base-url", base_url, "--api-key", KEY, "--dataset", str(path),
            "--disable-tqdm", "--result-file", str(out)]
    assert main(argv) == 0
    summary = json.loads(out.read_text())
    counts = [httpx.post(base_url + "/tokenize", json={"prompt": r, "add_special_tokens": False},
                         headers={"Authorization": f"Bearer {KEY}"}).json()["count"] for r in replies]
    assert summary["completed"] == 2 and summary["total_output_tokens"] == sum(counts)


def test_jaxinfer_serve_command(text_model_dir, tmp_path):
    env = child_env()
    base = [sys.executable, "-m", "jaxinfer", "serve", str(text_model_dir)]  # the model positional, as vLLM's
    for flags, field in [(["--api-key", " "], "--api-key"), (["--speculative-method", "draft"], "--speculative-model"),
                         (["--speculative-method", "eagle"], "--speculative-model"),
                         (["--speculative-method", "suffix", "--speculative-model", "/tmp"], "--speculative-model"),
                         (["--speculative-method", "draft", "--speculative-model", "/nonexistent"], "--speculative-model"),
                         (["--load-session", str(text_model_dir)], "--load-session")]:
        bad = subprocess.run([*base, *flags], env=env, capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and field in bad.stderr, bad.stderr
    session_text = "a b c " * 5 + "a b"  # 22 tokens: its first page is restored at start
    LLM(text_model_dir, max_seq_len=64).save_session(tmp_path / "session", session_text)
    port = _free_port()
    flags = ["--port", str(port), "--skip-warmup", "--max-model-len", "64", "--served-model-name", "m",
             "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2}',  # vLLM's flags
             "--tensor-parallel-size", "1", "--trust-remote-code", "--seed", "0", "--disable-log-requests",
             "--chat-template", "{% for m in messages %}<{{ m['content'] }}>{% endfor %}",
             "--load-session", str(tmp_path / "session")]
    process = subprocess.Popen([*base, *flags], env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:  # the port answers at once; /health says when the model is ready
            assert process.poll() is None and time.monotonic() < deadline, "jaxinfer serve did not come up"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "m" and models["data"][0]["max_model_len"] == 64
        body = {"model": "m", "prompt": session_text, "max_tokens": 12, "temperature": 0}
        completion = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=120).json()
        assert completion["usage"]["completion_tokens"] >= 1
        chat = {"model": "m", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 1}
        rendered = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat, timeout=120).json()
        template_ids = httpx.post(f"http://127.0.0.1:{port}/tokenize", json={"prompt": "<a b>"}, timeout=5).json()
        assert rendered["usage"]["prompt_tokens"] == template_ids["count"]  # --chat-template's rendering
        metrics = _metrics(f"http://127.0.0.1:{port}")
        assert metrics["jaxinfer:prefix_cache_hits_total"] == 16  # the session's page: the first request hits it
        assert metrics.get("jaxinfer:spec_decode_num_draft_tokens_total", 0) > 0  # prompt lookup finds the repeats
        per_pos = [metrics[f'jaxinfer:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(2)]
        assert per_pos[0] >= per_pos[1]  # a draft token is accepted only after every one before it
        assert sum(per_pos) == metrics["jaxinfer:spec_decode_num_accepted_tokens_total"] > 0
        assert 'jaxinfer:fallback_active{optimization="speculation"}' in metrics  # its own switch, shown
    finally:
        process.terminate()
        process.wait(timeout=30)
