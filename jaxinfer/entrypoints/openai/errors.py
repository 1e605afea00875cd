"""OpenAI-style error bodies, the handlers that produce them, and the request guards (size, API key)."""

from __future__ import annotations

import hmac
import json
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jaxinfer.entrypoints.openai.protocol import UNKNOWN_FIELD

GUARDED_PATHS = ("/v1", "/debug")  # what the API key protects (/health and /metrics stay open)


class APIError(Exception):
    """An error to return as `{"error": {...}}` with an HTTP status."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param = message, status, param
        self.kind = kind or ("invalid_request_error" if status < 500 else "internal_server_error")


def error_body(message: str, kind: str, param: str | None, status: int) -> dict:
    """OpenAI's error shape; code is the HTTP status phrase as vLLM sends it."""
    code = HTTPStatus(status).phrase.replace(" ", "") if status in HTTPStatus._value2member_map_ else str(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(error: APIError) -> JSONResponse:
    """An APIError as a JSON response."""
    return JSONResponse(error_body(error.message, error.kind, error.param, error.status), status_code=error.status)


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
    """ASGI middleware: bodies over max_body_bytes get 413, and with an API key every /v1 call needs it."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, api_key: str | None):
        self.app, self.max_body_bytes, self.api_key = app, max_body_bytes, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.api_key is not None and scope["path"].startswith(GUARDED_PATHS) and not self._authorized(scope):
            return await _send_error(send, APIError("invalid or missing API key", 401, kind="authentication_error"))
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            return await _send_error(send, self._too_large())
        body = await self._read_body(receive)
        if body is None:
            return await _send_error(send, self._too_large())
        await self.app(scope, _replay(body, receive), send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        # compare_digest: the time taken does not tell how much of a guessed key was right.
        return hmac.compare_digest(header.encode(), f"Bearer {self.api_key}".encode())

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


async def _send_error(send: Send, error: APIError) -> None:
    body = json.dumps(error_body(error.message, error.kind, error.param, error.status)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if error.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
