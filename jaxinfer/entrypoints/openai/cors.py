"""Cross-origin requests from web pages (vLLM's --allowed-origins, --allowed-methods, --allowed-headers,
--allow-credentials), answered by Starlette's CORS middleware.

Off unless origins are given: vLLM answers every origin by default, which lets any page open in a browser on
the machine drive a server bound to localhost; here a deployment names the origins it serves (or "*").
"""

from __future__ import annotations

import json
from typing import NamedTuple

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware


class Cors(NamedTuple):
    """The origins, methods and headers browsers may use; no origins: no CORS headers at all."""

    origins: tuple[str, ...] = ()
    methods: tuple[str, ...] = ("*",)
    headers: tuple[str, ...] = ("*",)
    credentials: bool = False


def add_cors(app: FastAPI, cors: Cors) -> None:
    """The CORS middleware over what is added so far (preflights answered before the API key is asked)."""
    if cors.origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(cors.origins), allow_methods=list(cors.methods),
                           allow_headers=list(cors.headers), allow_credentials=cors.credentials)


def string_list(text: str | None, flag: str) -> tuple[str, ...] | None:
    """A flag's JSON list of strings (vLLM's form, '["https://app.example"]'); None when not given."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{flag} must be a JSON list of strings such as '[\"https://app.example\"]', got {text!r}")
    return tuple(value)
