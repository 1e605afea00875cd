"""Bounds of a real server (uvicorn on a thread over an in-process LLM): the waiting queue (503 with
Retry-After), request timeouts (504, pages freed), per-request limits (400 naming the field), and
the API key over every route but /health."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from live_server import metrics, serve_in_thread, wait_until_idle

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.openai import ServerConfig
from jaxinfer.entrypoints.openai.limits import Limits

KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=2, max_num_batched_tokens=64, num_pages=24,
             decode_steps=4)
KEY = "limits-key"


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, **KNOBS)


def _slow_down(llm, monkeypatch, seconds: float) -> None:
    step = llm.engine.step

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return step(*args, **kwargs)

    monkeypatch.setattr(llm.engine, "step", slow)


@pytest.fixture
def slow_steps(llm, monkeypatch):
    """Each engine step takes 30 ms longer: requests stay in flight long enough to queue and time out."""
    _slow_down(llm, monkeypatch, 0.03)


@pytest.fixture
def slower_steps(llm, monkeypatch):
    """Each engine step takes 100 ms longer: a 100-token request (25+ steps) outlives a 1.5 s timeout
    by a wide margin while a 4-token one (1-2 steps) fits it even on a loaded machine."""
    _slow_down(llm, monkeypatch, 0.1)


def _body(max_tokens: int, i: int = 0, **fields) -> dict:
    prompt = [3 + (i * 13 + j * 7) % 290 for j in range(6)]
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **fields}


async def _burst(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=b) for b in bodies))


def test_requests_past_the_waiting_bound_get_503_with_retry_after(llm, slow_steps):
    bodies = [_body(60, i) for i in range(8)]
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    expected = [o.text for o in llm.generate([b["prompt"] for b in bodies], params)]
    with serve_in_thread(llm, ServerConfig("tiny", max_waiting_requests=1)) as (url, _):
        responses = asyncio.run(_burst(url, bodies))
        wait_until_idle(llm.engine)
    codes = [r.status_code for r in responses]
    # Two slots and one waiting place: three taken while the first run, the rest refused at once.
    assert codes.count(200) == 3 and codes.count(503) == 5, codes
    for response, text in zip(responses, expected):
        if response.status_code == 503:
            assert response.headers["retry-after"] == "1" and "--max-waiting-requests" in response.text
        else:
            assert response.json()["choices"][0]["text"] == text


def _streamed(url: str, body: dict) -> list[dict]:
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        lines = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_a_request_past_its_timeout_is_aborted_with_a_504_and_frees_its_pages(llm, slow_steps):
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        httpx.post(url + "/v1/completions", json=_body(8, 2), timeout=60)  # compiles before the 0.3 s budgets
        before = metrics(url)
        whole = httpx.post(url + "/v1/completions", json=_body(100, timeout=0.3), timeout=60)
        events = _streamed(url, _body(100, 1, timeout=0.3))
        wait_until_idle(llm.engine)
        after = metrics(url)
    assert whole.status_code == 504 and whole.json()["error"]["param"] == "timeout", whole.text
    assert "0.3 s" in whole.json()["error"]["message"]
    assert events[-1]["error"]["param"] == "timeout" and events[-1]["error"]["code"] == "GatewayTimeout"
    assert any(e.get("choices") for e in events[:-1])  # it had streamed some text first
    aborted = 'jaxinfer:request_success_total{finished_reason="abort"}'
    assert after[aborted] - before.get(aborted, 0) == 2


async def _long_pair_then(url: str, engine, last: dict) -> list[httpx.Response]:
    """Two 100-token requests, and `last` only once both hold a slot (sent together, `last` could
    take a slot first)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        pair = [asyncio.create_task(client.post("/v1/completions", json=b))
                for b in (_body(100, 0), _body(100, 1, timeout=30))]
        deadline = time.monotonic() + 30
        while len(engine.scheduler.running) < 2:
            assert time.monotonic() < deadline, "the two long requests never both ran"
            await asyncio.sleep(0.01)
        return await asyncio.gather(*pair, client.post("/v1/completions", json=last))


def test_the_servers_timeout_bounds_every_request_and_a_queued_one_times_out_too(llm, slower_steps):
    """--request-timeout applies without the field and caps a longer one; a request still waiting
    for a slot when its time is up leaves the queue."""
    with serve_in_thread(llm, ServerConfig("tiny", request_timeout=1.5)) as (url, _):
        for _ in range(3):  # compiles what a short request runs (a compile could take its whole budget)
            httpx.post(url + "/v1/completions", json=_body(4, 3), timeout=60)
        responses = asyncio.run(_long_pair_then(url, llm.engine, _body(4, 2, timeout=0.5)))
        # the first short request after the burst may meet a step shape the engine has not compiled
        # (this LLM is not warmed up) and spend its budget compiling; the next must be served
        quick = [httpx.post(url + "/v1/completions", json=_body(4, 3), timeout=60) for _ in range(2)][-1]
        wait_until_idle(llm.engine)
    # the third waits behind the two, and its own 0.5 s ends while they still hold both slots
    # (with the server's 1.5 s alone it raced their aborts for a freed slot)
    assert [r.status_code for r in responses] == [504, 504, 504]
    assert quick.status_code == 200


@pytest.mark.parametrize("value", [0, -1, "5", None])
def test_a_bad_timeout_field_is_a_400_naming_it(llm, value):
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        response = httpx.post(url + "/v1/completions", json=_body(2, timeout=value), timeout=60)
    if value is None:
        assert response.status_code == 200
    else:
        assert response.status_code == 400 and response.json()["error"]["param"] == "timeout", response.text


LIMITS = Limits(max_n=2, max_tokens=8, max_logprobs=2, max_stop=2, max_prompts=2)
OVER = {  # (route, fields past a bound, the param its 400 names)
    "n": ("completions", {"n": 3}, "n"),
    "max_tokens": ("completions", {"max_tokens": 9}, "max_tokens"),
    "max_completion_tokens": ("chat", {"max_completion_tokens": 9}, "max_completion_tokens"),
    "logprobs": ("completions", {"logprobs": 3}, "logprobs"),
    "top_logprobs": ("chat", {"logprobs": True, "top_logprobs": 3}, "top_logprobs"),
    "stop": ("completions", {"stop": ["a", "b", "c"]}, "stop"),
    "stop_token_ids": ("chat", {"stop_token_ids": [5, 6, 7]}, "stop_token_ids"),
    "prompts": ("completions", {"prompt": ["a", "b", "c"]}, "prompt"),
}


@pytest.fixture(scope="module")
def bounded_url(llm):
    config = ServerConfig("tiny", api_key=KEY, limits=LIMITS, max_body_bytes=2048)
    with serve_in_thread(llm, config) as (url, _):
        yield url


def _post(url: str, route: str, fields: dict, key: str | None = KEY) -> httpx.Response:
    base = {"messages": [{"role": "user", "content": "hi"}]} if route == "chat" else {"prompt": "hi"}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    return httpx.post(url + path, json={**base, "max_tokens": 2, **fields}, headers=headers, timeout=60)


@pytest.mark.parametrize("name", list(OVER))
def test_each_bound_is_a_400_naming_the_field_and_the_flag(bounded_url, name):
    route, fields, param = OVER[name]
    response = _post(bounded_url, route, fields)
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param, response.text
    assert "--max-" in error["message"] and "limit of" in error["message"], error["message"]


def test_requests_at_the_bounds_are_served(bounded_url):
    at = {"n": 2, "max_tokens": 8, "logprobs": 2, "stop": ["zz", "yy"], "stop_token_ids": [5, 6],
          "prompt": ["a", "b"], "seed": 1}
    response = _post(bounded_url, "completions", at)
    assert response.status_code == 200 and len(response.json()["choices"]) == 4, response.text
    chat = _post(bounded_url, "chat", {"max_completion_tokens": 8, "logprobs": True, "top_logprobs": 2})
    assert chat.status_code == 200, chat.text
    assert _post(bounded_url, "completions", {"prompt": "x" * 3000}).status_code == 413


def test_the_default_max_tokens_is_capped_by_the_bound(bounded_url):
    response = _post(bounded_url, "chat", {"max_tokens": None, "ignore_eos": True})
    assert response.json()["usage"]["completion_tokens"] == 8, response.text


ROUTES = [("get", "/metrics", None), ("post", "/tokenize", {"prompt": "hi"}), ("post", "/detokenize", {"tokens": [5]}),
          ("get", "/v1/models", None), ("get", "/no-such-route", None)]


@pytest.mark.parametrize("method,path,body", ROUTES)
def test_every_route_but_health_needs_the_key(bounded_url, method, path, body):
    call = getattr(httpx, method)
    kwargs = {} if body is None else {"json": body}
    refused = call(bounded_url + path, timeout=30, **kwargs)
    wrong = call(bounded_url + path, timeout=30, headers={"Authorization": "Bearer limits-kez"}, **kwargs)
    allowed = call(bounded_url + path, timeout=30, headers={"Authorization": f"Bearer {KEY}"}, **kwargs)
    assert refused.status_code == wrong.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert allowed.status_code == (404 if path == "/no-such-route" else 200), allowed.text
    assert KEY not in refused.text + wrong.text
    assert httpx.get(bounded_url + "/health", timeout=30).status_code == 200


def test_metrics_without_key_opens_metrics_alone(llm):
    with serve_in_thread(llm, ServerConfig("tiny", api_key=KEY, metrics_without_key=True)) as (url, _):
        assert httpx.get(url + "/metrics", timeout=30).status_code == 200
        assert httpx.post(url + "/tokenize", json={"prompt": "hi"}, timeout=30).status_code == 401


def test_the_key_is_compared_as_digests_of_one_length(monkeypatch):
    """hmac.compare_digest over two SHA-256 digests: the time taken tells neither how much of a guess
    matched nor how long the key is."""
    from jaxinfer.entrypoints.openai import errors

    seen = []
    compare = errors.hmac.compare_digest
    monkeypatch.setattr(errors.hmac, "compare_digest", lambda a, b: seen.append((a, b)) or compare(a, b))
    guard = errors.RequestGuard(None, 1024, "a-long-secret-key", frozenset({"/health"}))
    for header in (b"Bearer a", b"Bearer a-long-secret-key", b""):
        guard._authorized({"headers": [(b"authorization", header)]})
    assert [(len(a), len(b)) for a, b in seen] == [(32, 32)] * 3
    assert all(b"a-long-secret-key" not in a + b for a, b in seen)
    assert "a-long-secret-key" not in repr(vars(guard))
