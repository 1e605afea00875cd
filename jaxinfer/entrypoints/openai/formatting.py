"""Pieces of OpenAI response bodies: server-sent events, usage counts and the two logprobs layouts."""

from __future__ import annotations

import json
from typing import Any, Sequence

from jaxinfer.engine import RequestOutput

DONE = "data: [DONE]\n\n"


def sse(payload: dict) -> str:
    """One server-sent event carrying a JSON object."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """OpenAI's usage object."""
    return {
        "prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def count_usage(outputs: Sequence[RequestOutput]) -> dict:
    """Usage of finished requests: each prompt once, every sample's tokens."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs)
    return usage(prompt, sum(len(c.token_ids) for o in outputs for c in o.outputs))


def token_text(tokenizer: Any | None, token_id: int) -> str:
    """A token as text (OpenAI logprobs name tokens by their text); `token_id:N` without a tokenizer."""
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def completion_logprobs(
    tokenizer: Any | None, token_ids: Sequence[int], entries: Sequence[dict[int, float] | None], offset: int
) -> dict:
    """The completions layout: tokens, token_logprobs, top_logprobs and text_offset (from `offset`).

    An entry None (an echoed prompt's first token, which nothing predicts) gives null logprobs.
    """
    tokens = [token_text(tokenizer, t) for t in token_ids]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [None if entry is None else entry.get(t) for t, entry in zip(token_ids, entries)],
        "top_logprobs": [
            None if entry is None else {token_text(tokenizer, i): lp for i, lp in entry.items()} for entry in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(
    tokenizer: Any | None, token_ids: Sequence[int], entries: Sequence[dict[int, float]], top: int
) -> dict:
    """The chat layout: per token its text, logprob, UTF-8 bytes and the `top` most likely alternatives."""

    def item(token_id: int, logprob: float) -> dict:
        text = token_text(tokenizer, token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for token_id, entry in zip(token_ids, entries):
        best = sorted(entry.items(), key=lambda kv: -kv[1])[:top]
        content.append({**item(token_id, entry.get(token_id, -9999.0)), "top_logprobs": [item(*kv) for kv in best]})
    return {"content": content}
