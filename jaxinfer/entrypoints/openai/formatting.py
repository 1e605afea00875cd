"""Pieces of OpenAI response bodies: server-sent events, usage counts and the two logprobs layouts."""

from __future__ import annotations

import json
from typing import Any, Sequence

from jaxinfer.engine import RequestOutput
from jaxinfer.sampling.logprob import Logprob

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


def token_text(token_id: int, logprob: Logprob | None, tokenizer: Any | None = None, as_id: bool = False) -> str:
    """A token as text (OpenAI logprobs name tokens by their text): its Logprob's, else the tokenizer's;
    `token_id:N` without either, or when `as_id` asks for it (vLLM's --return-tokens-as-token-ids)."""
    if as_id:
        return f"token_id:{token_id}"
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    if tokenizer is None:
        return f"token_id:{token_id}"
    return tokenizer.decode([token_id], skip_special_tokens=False, clean_up_tokenization_spaces=False)


def completion_logprobs(
    token_ids: Sequence[int], entries: Sequence[dict[int, Logprob] | None], offset: int, tokenizer: Any | None = None,
    as_ids: bool = False,
) -> dict:
    """The completions layout: tokens, token_logprobs, top_logprobs and text_offset (from `offset`).

    An entry None (an echoed prompt's first token, which nothing predicts) gives null logprobs; its
    text comes from the tokenizer.
    """
    tokens = [token_text(t, None if entry is None else entry[t], tokenizer, as_ids)
              for t, entry in zip(token_ids, entries)]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": tokens,
        "token_logprobs": [None if entry is None else entry[t].logprob for t, entry in zip(token_ids, entries)],
        "top_logprobs": [
            None if entry is None else {token_text(i, lp, as_id=as_ids): lp.logprob for i, lp in entry.items()}
            for entry in entries
        ],
        "text_offset": offsets,
    }


def chat_logprobs(token_ids: Sequence[int], entries: Sequence[dict[int, Logprob]], top: int,
                  as_ids: bool = False) -> dict:
    """The chat layout: per token its text (`token_id:N` with as_ids), logprob, UTF-8 bytes and the `top` most
    likely alternatives."""

    def item(token_id: int, logprob: Logprob) -> dict:
        text = token_text(token_id, logprob, as_id=as_ids)
        return {"token": text, "logprob": logprob.logprob, "bytes": list(text.encode())}

    content = []
    for token_id, entry in zip(token_ids, entries):
        best = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top]
        content.append({**item(token_id, entry[token_id]), "top_logprobs": [item(*kv) for kv in best]})
    return {"content": content}
