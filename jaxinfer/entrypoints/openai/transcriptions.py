"""OpenAI's `POST /v1/audio/transcriptions` and `/v1/audio/translations` for a speech model (Whisper), as vLLM
serves them: a multipart form (`file`: a WAV file, `model`, `language`, `prompt`, `response_format` json or text,
`temperature`) decoded (entrypoints/wav), made into log-mel features (entrypoints/audio_prompts) and run through
the engine after Whisper's decoder prompt, one request per window of the model's length (a longer file is cut
into consecutive windows, run together, their texts joined by spaces, as vLLM's server splits long audio):
`[<|startofprev|> prompt] <|startoftranscript|> <|language|> <|transcribe|>/<|translate|> <|notimestamps|>`.
Another model's server answers both routes with a 400 naming what serves them. Forms need python-multipart
(the `serve` extra); without it these routes answer 400 saying so.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.entrypoints.openai.errors import APIError
from jaxinfer.entrypoints.openai.serving import ServerState, collect, deadline_after, new_id
from jaxinfer.entrypoints.resample import resample
from jaxinfer.entrypoints.wav import read_wav
from jaxinfer.runtime.audio_input import AudioInput

FIELDS = ("file", "model", "language", "prompt", "response_format", "temperature")
RESPONSE_FORMATS = ("json", "text")  # verbose_json, srt and vtt need timestamps, which are not decoded


def add_audio_routes(app: FastAPI, state: ServerState, llm: Any) -> None:
    """The two audio routes over `llm`'s engine (through `state`), its audio prompts if it has them."""
    prompts = getattr(llm, "audio_prompts", None)

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(request: Request) -> Response:
        return await transcribe(request, state, prompts, "transcribe")

    @app.post("/v1/audio/translations")
    async def translations(request: Request) -> Response:
        return await transcribe(request, state, prompts, "translate")


async def read_form(request: Request) -> dict[str, Any]:
    """The form's fields by name (the file as bytes); a 400 naming an unknown field or a missing file."""
    try:
        form = await request.form()
    except AssertionError as error:  # starlette's way of saying python-multipart is not installed
        raise APIError(f"multipart forms need python-multipart on the server ({error}); pip install "
                       "'jaxinfer[serve]'", 400) from None
    unknown = sorted(set(form.keys()) - set(FIELDS))
    if unknown:
        raise APIError(f"{unknown[0]} is not supported; the form takes {', '.join(FIELDS)}", param=unknown[0])
    fields = {name: form[name] for name in form.keys()}
    if "file" not in fields or isinstance(fields["file"], str):
        raise APIError("file: send the audio as a WAV file part named `file`", param="file")
    fields["file"] = await fields["file"].read()
    return fields


def decoder_prompt(tokenizer: Any, task: str, language: str, prompt: str) -> list[int]:
    """Whisper's decoder prefix for the task and language (and the previous text, `prompt`); a 400 naming a
    field whose token the tokenizer lacks."""
    vocab = tokenizer.get_vocab()
    if f"<|{language}|>" not in vocab:
        raise APIError(f"language {language!r} is not one of this model's languages", param="language")
    text = f"<|startoftranscript|><|{language}|><|{task}|><|notimestamps|>"
    if prompt:
        if "<|startofprev|>" not in vocab:
            raise APIError("prompt is not supported by this model's tokenizer (no <|startofprev|>)", param="prompt")
        text = f"<|startofprev|> {prompt.strip()}" + text
    return list(tokenizer.encode(text, add_special_tokens=False))


def _temperature(value: Any) -> float:
    try:
        temperature = float(value)
    except (TypeError, ValueError):
        raise APIError(f"temperature must be a number in [0, 1], got {value!r}", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise APIError(f"temperature must be in [0, 1], got {temperature}", param="temperature")
    return temperature


def _prepare(state: ServerState, prompts: Any, fields: dict[str, Any], task: str
             ) -> tuple[list[int], list[AudioInput]]:
    """The request's decoder ids and each window's audio features (off the event loop: decoding, the extractor)."""
    try:
        samples, rate = read_wav(fields["file"])
        samples = resample(samples, rate, prompts.rate)
        window = prompts.extractor.n_samples
        audio = [AudioInput(prompts.features((samples[start : start + window], prompts.rate), "file"))
                 for start in range(0, len(samples), window)]
    except ValueError as error:
        raise APIError(f"file: {error}", param="file") from None
    ids = decoder_prompt(state.tokenizer, task, str(fields.get("language") or "en"), str(fields.get("prompt") or ""))
    return ids, audio


async def transcribe(request: Request, state: ServerState, prompts: Any, task: str) -> Response:
    """One audio file's text, as OpenAI's json ({"text": ...}) or plain text."""
    route = request.url.path
    if prompts is None:
        raise APIError(f"{route} is served by speech models (Whisper, WhisperForConditionalGeneration); "
                       f"`{state.model_name}` is not one", param="model")
    fields = await read_form(request)
    state.check_model(fields.get("model"))
    response_format = fields.get("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise APIError(f"response_format {response_format!r} is not supported; supported: "
                       f"{', '.join(RESPONSE_FORMATS)}", param="response_format")
    temperature = _temperature(fields.get("temperature", 0.0))
    ids, audio = await asyncio.to_thread(_prepare, state, prompts, fields, task)
    params = SamplingParams(temperature=temperature, max_tokens=max(1, state.max_seq_len - len(ids)))
    timeout = state.timeout(None)
    state.start(request, len(audio))
    deadline, request_id = deadline_after(timeout), new_id("trsc")
    streams = [state.engine.generate(ids, params, f"{request_id}-{i}", deadline, images=(window,))
               for i, window in enumerate(audio)]
    outputs = await collect(streams, request, timeout)  # a refused request: its 400
    text = " ".join(piece for piece in (out.outputs[0].text.strip() for out in outputs) if piece)
    return PlainTextResponse(text) if response_format == "text" else JSONResponse({"text": text})
