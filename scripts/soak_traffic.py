"""The soak's traffic (scripts/soak.py): mixed request kinds, each sent and judged.

Every request ends as one outcome: `ok` (a complete answer: every choice finished, a stream
ended with [DONE]), `rejected` (the error its kind asks for: malformed, oversized, too long, over
a bound, no key), `busy` (503 from the waiting bound) or `timeout` (504 from its `timeout`), both
errors of its own, `client_disconnect` / `client_abort` (this script hung up on purpose),
`unexpected` (an answer, but not the right one) or `lost` (no answer: a transport error, a stream
cut short, a hang past the client's timeout). A healthy server loses nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from typing import Awaitable, Callable

import httpx

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly pack boxes of jam".split()
GREEDY_RECORDS = 256  # greedy answers kept for the comparison with LLM.generate


@dataclasses.dataclass
class Outcome:
    """How one request ended."""

    kind: str
    result: str
    seconds: float
    ttft: float | None = None
    detail: str = ""


@dataclasses.dataclass
class Traffic:
    """What every request needs: the client, the server's bounds, and the greedy answers recorded."""

    client: httpx.AsyncClient
    rng: random.Random
    max_model_len: int
    max_body_bytes: int
    max_n: int
    greedy: list[tuple[list[int], int, str]] = dataclasses.field(default_factory=list)

    def ids(self, low: int = 4, high: int = 48) -> list[int]:
        """A random id prompt (ids 3-255: inside any test model's vocabulary)."""
        return [self.rng.randrange(3, 256) for _ in range(self.rng.randint(low, high))]

    def text(self) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 30)))

    def record(self, prompt: list[int], max_tokens: int, text: str) -> None:
        if len(self.greedy) < GREEDY_RECORDS:
            self.greedy.append((prompt, max_tokens, text))


def _complete(choices: list[dict], count: int) -> bool:
    return len(choices) == count and all(c.get("finish_reason") in ("stop", "length") for c in choices)


def _error_result(response: httpx.Response) -> str:
    """A well-formed request's error: its own (busy, timeout) or not (anything else)."""
    if response.status_code == 503 and response.headers.get("retry-after"):
        return "busy"
    if response.status_code == 504:
        return "timeout"
    return "unexpected"


async def whole(t: Traffic, path: str, body: dict, count: int) -> tuple[str, str, dict | None]:
    """(result, detail, body) of a non-streaming request whose answer must hold `count` finished choices."""
    response = await t.client.post(path, json=body)
    if response.status_code != 200:
        return _error_result(response), f"{response.status_code} {response.text[:200]}", None
    payload = response.json()
    if not _complete(payload.get("choices", []), count):
        return "unexpected", f"incomplete choices: {json.dumps(payload)[:300]}", None
    return "ok", "", payload


async def streamed(t: Traffic, path: str, body: dict, count: int, hang_up_after: int | None = None):
    """(result, detail, text of choice 0, seconds to the first event) of a streaming request."""
    started, first, text, finished, events = time.monotonic(), None, [], {}, 0
    async with t.client.stream("POST", path, json={**body, "stream": True}) as response:
        if response.status_code != 200:
            await response.aread()
            return _error_result(response), f"{response.status_code} {response.text[:200]}", "", None
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            first = first or time.monotonic() - started
            if line == "data: [DONE]":
                done = len(finished) == count and all(r in ("stop", "length") for r in finished.values())
                return ("ok" if done else "unexpected"), f"finishes {finished}", "".join(text), first
            event = json.loads(line[6:])
            if "error" in event:
                status = event["error"].get("code")
                return ("timeout" if status == "GatewayTimeout" else "unexpected"), str(event)[:200], "", first
            for choice in event["choices"]:
                piece = choice.get("text", choice.get("delta", {}).get("content")) or ""
                text += [piece] if choice["index"] == 0 else []
                if choice.get("finish_reason"):
                    finished[choice["index"]] = choice["finish_reason"]
            events += 1
            if hang_up_after is not None and events >= hang_up_after:
                return "client_disconnect", "", "", first
    return "lost", f"the stream ended without [DONE] after {events} events", "", first


async def greedy(t: Traffic, stream: bool) -> tuple[str, str, float | None]:
    prompt, max_tokens = t.ids(), t.rng.randint(4, 48)
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if stream:
        result, detail, text, first = await streamed(t, "/v1/completions", body, 1)
    else:
        result, detail, payload = await whole(t, "/v1/completions", body, 1)
        text, first = (payload["choices"][0]["text"] if payload else ""), None
        if payload and payload["usage"]["completion_tokens"] != max_tokens:
            return "unexpected", f"{payload['usage']} for max_tokens {max_tokens}", None
    if result == "ok":
        t.record(prompt, max_tokens, text)
    return result, detail, first


async def chat(t: Traffic, stream: bool, logprobs: bool = False) -> tuple[str, str, float | None]:
    body = {"messages": [{"role": "user", "content": t.text()}], "max_tokens": t.rng.randint(4, 40),
            "temperature": 0.8, "seed": t.rng.randrange(1 << 30)}
    if logprobs:
        body.update(logprobs=True, top_logprobs=t.rng.randint(0, 5))
    if stream:
        result, detail, _, first = await streamed(t, "/v1/chat/completions", body, 1)
        return result, detail, first
    result, detail, _ = await whole(t, "/v1/chat/completions", body, 1)
    return result, detail, None


async def sampled(t: Traffic, **fields) -> tuple[str, str, float | None]:
    """A completion with sampling settings (n, stop strings, logprobs, penalties, echo)."""
    n = fields.pop("n", 1)
    body = {"prompt": t.text() if t.rng.random() < 0.5 else t.ids(), "max_tokens": t.rng.randint(4, 40),
            "temperature": 0.9, "seed": t.rng.randrange(1 << 30), "n": n, **fields}
    stream = t.rng.random() < 0.4
    if stream:
        result, detail, _, first = await streamed(t, "/v1/completions", body, n)
        return result, detail, first
    result, detail, payload = await whole(t, "/v1/completions", body, n)
    if payload and "stop" in fields and not fields.get("include_stop_str_in_output"):
        if any(s in c["text"] for c in payload["choices"] for s in fields["stop"]):
            return "unexpected", f"a stop string in the text: {payload['choices']}", None
    return result, detail, None


async def disconnect(t: Traffic) -> tuple[str, str, float | None]:
    """A stream the client leaves after a few events (its request must be aborted, its pages freed)."""
    body = {"prompt": t.ids(), "max_tokens": t.rng.randint(20, 80), "temperature": 0, "ignore_eos": True}
    result, detail, _, first = await streamed(t, "/v1/completions", body, 1, hang_up_after=t.rng.randint(1, 4))
    return result, detail, first


async def abort(t: Traffic) -> tuple[str, str, float | None]:
    """A whole response the client stops waiting for after a random moment (it closes the connection)."""
    body = {"prompt": t.ids(), "max_tokens": t.rng.randint(20, 80), "temperature": 0.7, "n": t.rng.randint(1, 2)}
    try:
        result, detail, _ = await asyncio.wait_for(whole(t, "/v1/completions", body, body["n"]),
                                                   t.rng.uniform(0.02, 0.5))
    except asyncio.TimeoutError:
        return "client_abort", "", None
    return result, detail, None


async def timed_out(t: Traffic) -> tuple[str, str, float | None]:
    """A request with a short `timeout`: a complete answer if it makes it, else its own 504."""
    body = {"prompt": t.ids(), "max_tokens": t.rng.randint(30, 100), "temperature": 0, "ignore_eos": True,
            "timeout": round(t.rng.uniform(0.05, 0.5), 3)}
    if t.rng.random() < 0.5:
        result, detail, _, first = await streamed(t, "/v1/completions", body, 1)
        return result, detail, first
    result, detail, _ = await whole(t, "/v1/completions", body, 1)
    return result, detail, None


async def refused(t: Traffic, kind: str) -> tuple[str, str, float | None]:
    """A request the server must refuse with a status of its own, and an OpenAI error body."""
    content, status, headers = _bad_request(t, kind)
    response = await t.client.post("/v1/completions", content=content, headers=headers)
    try:
        well_formed = set(response.json()["error"]) == {"message", "type", "param", "code"}
    except (ValueError, KeyError, TypeError):
        well_formed = False
    if response.status_code == status and well_formed:
        return "rejected", "", None
    return "unexpected", f"{kind}: {response.status_code} {response.text[:200]} (expected {status})", None


def _bad_request(t: Traffic, kind: str) -> tuple[bytes, int, dict]:
    """(body, the status it must get, extra headers) of a request that must be refused."""
    json_type = {"content-type": "application/json"}
    if kind == "malformed":
        return t.rng.choice([b'{"prompt": [1, 2', b"[1, 2]", b'{"prompt": "x", "max_tokens": "5"}']), 400, json_type
    if kind == "oversized":
        return json.dumps({"prompt": "x" * (t.max_body_bytes + 100)}).encode(), 413, json_type
    if kind == "too_long":
        prompt = [5] * (t.max_model_len + t.rng.randint(1, 50))
        return json.dumps({"prompt": prompt, "max_tokens": 4}).encode(), 400, json_type
    if kind == "bad_field":
        return json.dumps({"prompt": "x", "temprature": 0.5}).encode(), 400, json_type
    if kind == "over_limit":
        return json.dumps({"prompt": "x", "n": t.max_n + 1}).encode(), 400, json_type
    if kind == "no_key":
        return json.dumps({"prompt": "x", "max_tokens": 2}).encode(), 401, {**json_type, "authorization": "Bearer no"}
    raise ValueError(f"unknown kind {kind!r}")


Kind = Callable[[Traffic], Awaitable[tuple[str, str, float | None]]]
KINDS: dict[str, tuple[int, Kind]] = {  # name: (weight, request)
    "greedy": (14, lambda t: greedy(t, stream=False)),
    "greedy_stream": (10, lambda t: greedy(t, stream=True)),
    "chat": (5, lambda t: chat(t, stream=False)),
    "chat_stream": (5, lambda t: chat(t, stream=True)),
    "chat_logprobs": (3, lambda t: chat(t, stream=t.rng.random() < 0.5, logprobs=True)),
    "n_samples": (6, lambda t: sampled(t, n=t.rng.randint(2, t.max_n))),
    "stop": (6, lambda t: sampled(t, stop=t.rng.sample(["e", " the", "\n", "o", "ck"], t.rng.randint(1, 3)))),
    "logprobs": (5, lambda t: sampled(t, logprobs=t.rng.randint(0, 5))),
    "penalties": (5, lambda t: sampled(t, presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.2)),
    "echo": (2, lambda t: sampled(t, echo=True, logprobs=1)),
    "disconnect": (5, disconnect),
    "abort": (4, abort),
    "timeout": (3, timed_out),
    **{kind: (weight, lambda t, kind=kind: refused(t, kind)) for kind, weight in [
        ("malformed", 3), ("oversized", 2), ("too_long", 3), ("bad_field", 2), ("over_limit", 2), ("no_key", 1)]},
}


async def one_request(t: Traffic, name: str) -> Outcome:
    """Send one request of kind `name`; a transport error or a hang past the client's timeout is `lost`."""
    started = time.monotonic()
    try:
        result, detail, first = await KINDS[name][1](t)
    except (httpx.TransportError, json.JSONDecodeError) as error:
        result, detail, first = "lost", f"{type(error).__name__}: {error}", None
    return Outcome(name, result, time.monotonic() - started, first, detail)


async def run(t: Traffic, concurrency: int, seconds: float, max_requests: int) -> list[Outcome]:
    """Requests of random kinds from `concurrency` workers until `seconds` pass or `max_requests` are sent."""
    names = list(KINDS)
    weights = [KINDS[n][0] for n in names]
    deadline, outcomes, sent = time.monotonic() + seconds, [], 0

    async def worker() -> None:
        nonlocal sent
        while time.monotonic() < deadline and sent < max_requests:
            sent += 1
            outcomes.append(await one_request(t, t.rng.choices(names, weights)[0]))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


async def run_each_kind(t: Traffic, concurrency: int, rounds: int = 2) -> list[Outcome]:
    """Every kind `rounds` times, `concurrency` at once: the warm-up's sure coverage of what the server
    compiles on first use (sampling variants, logprobs, echo), before the random traffic."""
    names = [name for _ in range(rounds) for name in KINDS]
    t.rng.shuffle(names)
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str) -> Outcome:
        async with gate:
            return await one_request(t, name)

    return list(await asyncio.gather(*(one(name) for name in names)))
