"""OpenAI-style error bodies, the handlers that produce them, and the request guard (size, API key)."""

from __future__ import annotations

import hashlib
import hmac
import json
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxinfer.entrypoints.openai.protocol import UNKNOWN_FIELD


class APIError(Exception):
    """An error to return as `{"error": {...}}` with an HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.headers = message, status, param, headers or {}
        self.kind = kind or ("invalid_request_error" if status < 500 else "internal_server_error")


def error_body(message: str, kind: str, param: str | None, status: int) -> dict:
    """OpenAI's error shape; code is the HTTP status phrase as vLLM sends it."""
    code = HTTPStatus(status).phrase.replace(" ", "") if status in HTTPStatus._value2member_map_ else str(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    """An APIError as a JSON response."""
    body = error_body(error.message, error.kind, error.param, error.status)
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def _validation_error(exc: RequestValidationError) -> APIError:
    """The first pydantic problem, named by its field path (malformed JSON says so)."""
    first = exc.errors()[0] if exc.errors() else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        return APIError(f"request body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    if first.get("type") == UNKNOWN_FIELD:  # named by the field itself, at whatever depth it sits
        field = ".".join([*loc, first["ctx"]["field"]])
        return APIError(f"{param}: {first['msg']}" if param else first["msg"], param=field)
    return APIError(f"{param or 'body'}: {first['msg']}", param=loc[0] if loc else None)


def install_handlers(app: FastAPI) -> None:
    """Every error the app can raise leaves as an OpenAI error body, never as a traceback."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(APIError(str(exc.detail), exc.status_code))

    @app.exception_handler(Exception)
    async def _internal(_: Request, exc: Exception) -> JSONResponse:
        return error_response(APIError(f"{type(exc).__name__}: {exc}", 500))


class RequestGuard:
    """ASGI middleware: bodies over max_body_bytes get 413, and with an API key every route but the
    public ones (/health; /metrics too when asked) needs it: /tokenize and /detokenize run the
    tokenizer and /metrics tells the load, so a key that guards /v1 alone guards little."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: str | None, public_paths: frozenset[str]):
        self.app, self.max_body_bytes, self.public_paths = app, max_body_bytes, public_paths
        # Only the key's digest is kept: compared digests have one length, so the time taken tells
        # neither how much of a guess was right nor how long the key is.
        self._key_digest = None if api_key is None else _digest(f"Bearer {api_key}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self._key_digest is not None and scope["path"] not in self.public_paths and not self._authorized(scope):
            return await send_error(send, APIError("invalid or missing API key", 401, kind="authentication_error",
                                                   headers={"www-authenticate": "Bearer"}))
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await send_error(send, self._too_large())
        body = await self._read_body(receive)
        if body is None:
            return await send_error(send, self._too_large())
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        return hmac.compare_digest(_digest(header), self._key_digest)

    def _too_large(self) -> APIError:
        return APIError(f"request body exceeds {self.max_body_bytes} bytes", 413)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None once it passes the limit (a chunked body declares no length)."""
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body_bytes:
                return None
            more = message.get("more_body", False)
        return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives the buffered body once, then the client's own messages (disconnects)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("latin-1", "replace")).digest()


async def send_error(send: Send, error: APIError) -> None:
    """An APIError as a whole response, from ASGI middleware (outside FastAPI's handlers)."""
    body = json.dumps(error_body(error.message, error.kind, error.param, error.status)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(name.lower().encode(), value.encode()) for name, value in error.headers.items()]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
