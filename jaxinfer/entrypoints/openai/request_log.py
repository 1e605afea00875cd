"""vLLM's --enable-log-requests, --enable-log-outputs and --max-log-len: a line per request (its id, prompt
ids and sampling settings) and per finished output (its text and token ids) on the jaxinfer.requests logger,
which `jaxinfer serve` prints to stderr when either flag is given."""

from __future__ import annotations

import dataclasses
import logging
import sys
from typing import TYPE_CHECKING, AsyncIterator, Sequence

if TYPE_CHECKING:  # `jaxinfer serve --help` reads this file: no engine imports
    from jaxinfer.engine.outputs import RequestOutput

LOGGER = "jaxinfer.requests"
log = logging.getLogger(LOGGER)


@dataclasses.dataclass(frozen=True)
class RequestLog:
    """What is logged: requests, outputs, and how many prompt ids or characters at most (None: all)."""

    requests: bool = False
    outputs: bool = False
    max_len: int | None = None

    def clip(self, items: Sequence | str) -> Sequence | str:
        return items if self.max_len is None else items[:self.max_len]

    def request(self, request_id: str, ids: Sequence[int], params: object) -> None:
        if self.requests:
            log.info("request %s: prompt_token_ids %s (%d), params %s", request_id, list(self.clip(ids)), len(ids),
                     params)

    async def outputs_of(self, request_id: str, stream: AsyncIterator[RequestOutput]) -> AsyncIterator[RequestOutput]:
        """`stream` (the engine's deltas) as it is, each finished output logged once and whole (its deltas joined)."""
        texts: dict[int, str] = {}
        ids: dict[int, list[int]] = {}
        logged: set[int] = set()
        async for delta in stream:
            for out in delta.outputs:
                texts[out.index] = texts.get(out.index, "") + out.text
                ids.setdefault(out.index, []).extend(out.token_ids)
                if out.finish_reason is not None and out.index not in logged:
                    logged.add(out.index)
                    log.info("output %s[%d]: %r, token_ids %s (%d), finish_reason %s", request_id, out.index,
                             self.clip(texts[out.index]), list(self.clip(ids[out.index])), len(ids[out.index]),
                             out.finish_reason)
            yield delta


def print_request_log() -> None:
    """The jaxinfer.requests logger's INFO lines to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("jaxinfer: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
