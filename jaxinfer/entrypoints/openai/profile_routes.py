"""vLLM's profiling routes: POST /start_profile and /stop_profile, a device trace of the live server.

Served when $JAXINFER_PROFILER_DIR names where traces go, as vLLM serves them when its profiler
directory variable is set: a server started without it exposes no way to fill a disk. The trace
starts and stops between engine steps (runtime/profiling.py says what it holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from jaxinfer.engine import AsyncLLMEngine
from jaxinfer.entrypoints.openai.errors import APIError


def add_profile_routes(app: FastAPI, engine: AsyncLLMEngine) -> None:
    """The two routes over `engine`; starting twice or stopping with nothing started is a 400."""

    @app.post("/start_profile")
    async def start_profile() -> PlainTextResponse:
        return await _answer(engine.start_profile, "Profiling into")

    @app.post("/stop_profile")
    async def stop_profile() -> PlainTextResponse:
        return await _answer(engine.stop_profile, "Profile written to")


async def _answer(action: Callable[[], Awaitable[Path]], words: str) -> PlainTextResponse:
    try:
        directory = await action()
    except RuntimeError as error:
        raise APIError(str(error)) from None
    return PlainTextResponse(f"{words} {directory}.")
