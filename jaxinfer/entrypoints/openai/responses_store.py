"""Responses kept for `previous_response_id` and GET /v1/responses/{id}: in memory, the least recently
used dropped past `--max-stored-responses` (a server that keeps every response grows without bound)."""

from __future__ import annotations

import collections
import dataclasses

from jaxinfer.config import validation
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.protocol import ChatMessage

DEFAULT_MAX_STORED_RESPONSES = 1024


@dataclasses.dataclass(frozen=True)
class StoredResponse:
    """A finished Response and the conversation a later turn continues (chat messages, the reply last)."""

    response: dict
    conversation: list[ChatMessage]


class ResponseStore:
    """An LRU map of response id -> StoredResponse holding at most `limit` (0: none is kept)."""

    def __init__(self, limit: int = DEFAULT_MAX_STORED_RESPONSES):
        self.limit = validation.integer(limit, "--max-stored-responses", 0)
        self._entries: collections.OrderedDict[str, StoredResponse] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def save(self, entry: StoredResponse) -> None:
        """Keep `entry`, dropping the least recently used past the limit."""
        if self.limit == 0:
            return
        self._entries[entry.response["id"]] = entry
        self._entries.move_to_end(entry.response["id"])
        while len(self._entries) > self.limit:
            self._entries.popitem(last=False)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response (now the most recently used); a 404 naming `param` when none is kept."""
        entry = self._entries.get(response_id)
        if entry is None:
            raise APIError(f"no stored response with id {response_id!r:.80}: it was never stored (store: false), or "
                           f"was dropped as one of the least recently used past this server's {self.limit} "
                           "(--max-stored-responses), or the server restarted", 404, param, kind="NotFoundError")
        self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> None:
        """Forget a stored response (a 404 when none is kept)."""
        self.get(response_id)
        del self._entries[response_id]
