"""Faults under a real server (uvicorn on a thread, over an in-process LLM whose engine the tests break
by monkeypatching): each fails only its own requests, nothing hangs, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import pytest
from live_server import metrics, serve_in_thread, wait_until_idle

from jaxinfer import LLM, SamplingParams
from jaxinfer.entrypoints.openai import ServerConfig

# Two slots and a pool of 23 usable pages of 16 tokens, where one full-length sequence takes 16: two
# long samples cannot hold their pages at once.
KNOBS = dict(dtype="float32", max_seq_len=256, max_num_seqs=2, max_num_batched_tokens=64, num_pages=24,
             decode_steps=4)


@pytest.fixture(scope="module")
def llm(text_model_dir):
    return LLM(text_model_dir, **KNOBS)


def _prompts(count: int, length: int = 6) -> list[list[int]]:
    return [[3 + (i * 11 + j * 5) % 290 for j in range(length)] for i in range(count)]


def _body(prompt: list[int], max_tokens: int, **fields) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **fields}


def _expected(llm: LLM, prompts: list[list[int]], max_tokens: int) -> list[str]:
    """What the server must answer, from the same engine while the server is idle."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [o.text for o in llm.generate(prompts, params)]


async def _stream_events(client: httpx.AsyncClient, body: dict) -> list[dict]:
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        lines = [line[6:] async for line in response.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def _until(condition, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_a_failed_device_call_fails_its_own_requests_and_the_waiting_ones_finish(llm, monkeypatch):
    engine = llm.engine
    running, waiting = _prompts(2), _prompts(5)[2:]
    expected = _expected(llm, waiting, 8)
    dispatch, armed, failed_rows = engine.runner.dispatch, [False], []

    def device_error(host, lap=lambda phase: None):
        if armed[0]:
            armed[0] = False
            failed_rows.extend(r.prompt_ids for r in host.requests if r is not None)
            raise RuntimeError("injected device error")
        return dispatch(host, lap)

    monkeypatch.setattr(engine.runner, "dispatch", device_error)

    async def scenario(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            streamed = asyncio.create_task(_stream_events(client, _body(running[0], 60)))
            whole = asyncio.create_task(client.post("/v1/completions", json=_body(running[1], 60)))
            await _until(lambda: len(engine.scheduler.running) == 2)  # both slots taken
            queued = [asyncio.create_task(client.post("/v1/completions", json=_body(p, 8))) for p in waiting]
            await _until(lambda: len(engine.scheduler.waiting) == len(waiting))
            armed[0] = True
            return await streamed, await whole, await asyncio.gather(*queued)

    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        events, whole, queued = asyncio.run(scenario(url))
        wait_until_idle(engine)
        after = httpx.post(url + "/v1/completions", json=_body(waiting[0], 8), timeout=60)
    assert sorted(failed_rows) == sorted(running)  # the failed call held the two running requests alone
    error = events[-1]["error"]
    assert "injected device error" in error["message"] and error["code"] == "InternalServerError"
    assert whole.status_code == 500 and "injected device error" in whole.json()["error"]["message"]
    assert [r.status_code for r in queued] == [200] * len(waiting)
    assert [r.json()["choices"][0]["text"] for r in queued] == expected
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == expected[0]


def test_a_step_failing_outside_the_device_call_fails_what_is_in_flight_and_serving_goes_on(llm, monkeypatch):
    """A host-side failure (here the scheduler) leaves no state to trust: every request in flight fails
    with a 500 of its own, none hangs, no page stays taken, and the next request is served."""
    engine = llm.engine
    schedule, armed = engine.scheduler.schedule, [True]

    def broken():
        if armed[0]:
            armed[0] = False
            raise RuntimeError("injected scheduler bug")
        return schedule()

    monkeypatch.setattr(engine.scheduler, "schedule", broken)
    prompt = _prompts(1)[0]
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        whole = httpx.post(url + "/v1/completions", json=_body(prompt, 8), timeout=30)
        with httpx.stream("POST", url + "/v1/completions", json=_body(prompt, 8, stream=True), timeout=30) as r:
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        wait_until_idle(engine)
    assert whole.status_code == 500 and "injected scheduler bug" in whole.json()["error"]["message"]
    assert events[-1] == "data: [DONE]" and len(events) > 2  # the second request ran after the failure


def test_a_detokenizer_failure_fails_only_its_request(llm, monkeypatch):
    """The poisoned request joins a step beside a running one, with another waiting: both finish."""
    import jaxinfer.checkpoint.tokenizer as tokenizer_module

    engine = llm.engine
    prompts = _prompts(3)
    expected = _expected(llm, prompts, 40)
    generated = {t for ids in (llm.tokenize(text) for text in expected) for t in ids}
    poison = next(t for t in range(3, 256) if t not in generated and t not in sum(prompts, []))
    decode = tokenizer_module.decode_text

    def choking(tokenizer, token_ids, *rest):
        if poison in token_ids:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer failure")
        return decode(tokenizer, token_ids, *rest)

    monkeypatch.setattr(tokenizer_module, "decode_text", choking)

    async def scenario(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            good = [asyncio.create_task(client.post("/v1/completions", json=_body(p, 40))) for p in prompts[:2]]
            await _until(lambda: len(engine.scheduler.running) == 2)
            bad = asyncio.create_task(
                client.post("/v1/completions", json=_body(prompts[0], 8, logit_bias={str(poison): 100})))
            good.append(asyncio.create_task(client.post("/v1/completions", json=_body(prompts[2], 40))))
            return await bad, await asyncio.gather(*good)

    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        bad, good = asyncio.run(scenario(url))
        wait_until_idle(engine)
    assert bad.status_code == 500 and "injected detokenizer failure" in bad.json()["error"]["message"]
    assert [r.json()["choices"][0]["text"] for r in good] == expected


def test_a_grammar_failure_fails_only_its_request(llm, monkeypatch):
    """A constrained request whose matcher raises (a token its mask should have forbidden) fails with a
    500 of its own; an unconstrained one running beside it and one waiting finish as LLM.generate does."""
    pytest.importorskip("llguidance")
    from jaxinfer.engine.structured.request_grammar import RequestGrammar

    engine = llm.engine
    prompts = _prompts(3)
    expected = _expected(llm, prompts, 40)

    def broken(grammar, token):
        raise ValueError(f"injected grammar failure at token {token}")

    monkeypatch.setattr(RequestGrammar, "accept", broken)

    async def scenario(url: str):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            good = [asyncio.create_task(client.post("/v1/completions", json=_body(p, 40))) for p in prompts[:2]]
            await _until(lambda: len(engine.scheduler.running) == 2)
            bad = asyncio.create_task(client.post("/v1/completions", json=_body(prompts[0], 8, guided_regex="[a-z]+")))
            good.append(asyncio.create_task(client.post("/v1/completions", json=_body(prompts[2], 40))))
            return await bad, await asyncio.gather(*good)

    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        bad, good = asyncio.run(scenario(url))
        wait_until_idle(engine)
        after = httpx.post(url + "/v1/completions", json=_body(prompts[1], 40), timeout=60)
    assert bad.status_code == 500 and "injected grammar failure" in bad.json()["error"]["message"]
    assert [r.json()["choices"][0]["text"] for r in good] == expected
    assert after.status_code == 200 and after.json()["choices"][0]["text"] == expected[1]


def test_one_request_larger_than_the_pool_is_preempted_in_turns_never_deadlocked(llm):
    """Four samples of 220 tokens need 56 pages of a 23-page pool, two running at once 28: they run by
    preemption, beside a small request, and every page comes back."""
    prompt = _prompts(1, 20)[0]
    body = _body(prompt, 200, n=4, temperature=1.0, seed=7)
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        before = metrics(url)

        async def scenario():
            async with httpx.AsyncClient(base_url=url, timeout=300) as client:
                return await asyncio.gather(client.post("/v1/completions", json=body),
                                            client.post("/v1/completions", json=_body(_prompts(2)[1], 8)))

        huge, small = asyncio.run(asyncio.wait_for(scenario(), 300))
        wait_until_idle(llm.engine)
        after = metrics(url)
    assert huge.status_code == 200 and small.status_code == 200
    assert [c["finish_reason"] for c in huge.json()["choices"]] == ["length"] * 4
    assert huge.json()["usage"]["completion_tokens"] == 800
    assert after["jaxinfer:num_preemptions_total"] > before["jaxinfer:num_preemptions_total"]


def _stalled_stream(url: str, body: dict) -> socket.socket:
    """A connection that asks for a stream and then reads nothing (a tiny receive window)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # before connecting: it sets the window
    sock.connect((host, int(port)))
    payload = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def _decoding(engine) -> bool:
    return any(not r.prefilling for group in list(engine.groups.values()) for r in group)


async def _side_by_side(url: str, engine, body: dict, other: dict) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        stream = asyncio.create_task(_stream_events(client, body))
        await _until(lambda: _decoding(engine))
        assert (await client.post("/v1/completions", json=other)).status_code == 200
        await stream


def test_a_client_that_stops_reading_is_dropped_and_never_blocks_the_step_loop(llm, monkeypatch):
    engine = llm.engine
    step = engine.step

    def slow_step(*args, **kwargs):  # long enough for the stall to come before the end of generation
        time.sleep(0.15)
        return step(*args, **kwargs)

    # The first event echoes 200 prompt tokens with 20 logprobs each (~90 kB): more than the socket
    # buffers and asyncio's 64 kB hold, so a later event's send waits for a reader that never comes.
    warm, stalled_prompt = _prompts(2, 200)  # two prompts: no prefix-cache hit changes the shapes
    body = _body(stalled_prompt, 50, logprobs=20, echo=True, stream=True)  # one slot stays free
    other = _body(_prompts(2)[1], 8)
    config = ServerConfig("tiny", write_timeout=0.3)
    with serve_in_thread(llm, config, send_buffer=4096) as (url, app):
        monkeypatch.setattr(engine, "step", slow_step)
        asyncio.run(_side_by_side(url, engine, {**body, "prompt": warm}, other))  # the same mix with a reader: compiled
        before = metrics(url)
        stalled = _stalled_stream(url, body)
        try:
            deadline = time.monotonic() + 60
            while not _decoding(engine):  # as in the warm-up: the other request comes during decode steps
                assert time.monotonic() < deadline
                time.sleep(0.01)
            started = time.monotonic()
            other = httpx.post(url + "/v1/completions", json=other, timeout=30)
            served_in = time.monotonic() - started
            deadline = time.monotonic() + 30
            while app.state.traffic.active:  # the stalled response is given up on
                assert time.monotonic() < deadline, "the stalled response was never dropped"
                time.sleep(0.05)
            wait_until_idle(engine)
            after = metrics(url)
        finally:
            stalled.close()
    assert other.status_code == 200 and served_in < 3, served_in
    aborted = 'jaxinfer:request_success_total{finished_reason="abort"}'
    assert after.get(aborted, 0) - before.get(aborted, 0) == 1  # cut short, not run to its end


def test_merge_holds_one_delta_per_stream_for_a_reader_that_falls_behind():
    """A slow reader leaves deltas in the streams (where the engine's collectors merge them), not in a
    queue that grows with the output."""
    from jaxinfer.entrypoints.openai.serving import merge

    pulled = [0, 0]

    async def stream(i: int):
        for _ in range(1000):
            pulled[i] += 1
            yield i

    async def scenario():
        merged = merge([stream(0), stream(1)])
        first = await merged.__anext__()
        await asyncio.sleep(0.05)  # the reader stalls: the pumps must wait for it
        await merged.aclose()
        return first

    assert asyncio.run(scenario())[0] in (0, 1)
    assert sum(pulled) <= 6, pulled  # taken, queued (two at most) and one waiting per pump; not 2000


def test_merge_hands_a_streams_error_to_its_reader():
    from jaxinfer.entrypoints.openai.serving import merge

    async def failing():
        yield 1
        raise RuntimeError("engine failed")

    async def scenario():
        return [item async for item in merge([failing()])]

    with pytest.raises(RuntimeError, match="engine failed"):
        asyncio.run(asyncio.wait_for(scenario(), 5))
