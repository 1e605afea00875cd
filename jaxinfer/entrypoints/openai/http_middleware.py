"""ASGI middlewares two of vLLM's serve flags add: the proxy's path prefix (--root-path) and X-Request-Id
on every response (--enable-request-id-headers)."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID = b"x-request-id"


class RootPath:
    """Serves routes under `root_path` too (a proxy that forwards /api/v1/models unchanged) as well as without
    it (a proxy that strips it): the prefix moves from the path to scope["root_path"], as ASGI has it."""

    def __init__(self, app: ASGIApp, root_path: str):
        self.app, self.root_path = app, root_path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rest = without_prefix(scope.get("path", ""), self.root_path)
        if scope["type"] in ("http", "websocket") and rest is not None:
            scope = {**scope, "path": rest, "raw_path": rest.encode(),
                     "root_path": scope.get("root_path", "") + self.root_path}
        await self.app(scope, receive, send)


def without_prefix(path: str, root_path: str) -> str | None:
    """`path` less `root_path` ("/api/health" -> "/health", "/api" -> "/"); None for a path not under it
    ("/api2/health") or no prefix."""
    if not root_path or not (path == root_path or path.startswith(root_path + "/")):
        return None
    return path[len(root_path):] or "/"


class RequestIdHeader:
    """Every HTTP response carries X-Request-Id: the request's own, else a fresh one."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(REQUEST_ID)
        request_id = given or uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(name, value) for name, value in message.get("headers", []) if name != REQUEST_ID]
                message = {**message, "headers": [*headers, (REQUEST_ID, request_id)]}
            await send(message)

        await self.app(scope, receive, send_with_id)
