"""vLLM's --generation-config and --override-generation-config: where the server's default sampling settings
(those a request leaves out) come from, over config/generation.py's reading of generation_config.json."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from jaxinfer.config.generation import FILENAME, SAMPLING_FIELDS, from_dict, generation_defaults
from jaxinfer.config.sampling_params import SamplingParams

SOURCES = ("auto", "vllm")
OVERRIDABLE = tuple(SAMPLING_FIELDS)  # max_new_tokens: the cap on every request's max_tokens (serving.ServerState)


def add_generation_flags(serve: argparse.ArgumentParser) -> None:
    """The two flags, with vLLM's meanings."""
    serve.add_argument("--generation-config", default="auto", metavar="auto|vllm|DIR",
                       help=f"the default sampling settings requests leave out: auto the model's {FILENAME}, "
                       f"vllm none (SamplingParams' own), DIR the {FILENAME} in DIR (default: %(default)s); "
                       "its EOS ids are the model's either way")
    serve.add_argument("--override-generation-config", default=None, metavar="JSON",
                       help=f"a JSON object of {FILENAME} keys ({', '.join(OVERRIDABLE)}) merged over "
                       "--generation-config's settings, e.g. '{\"temperature\": 0.5}'")


def override(args: argparse.Namespace) -> dict[str, Any]:
    """--override-generation-config's settings as SamplingParams fields; a ValueError naming the flag for JSON
    that is not an object, a key it cannot take or a value SamplingParams refuses."""
    if args.override_generation_config is None:
        return {}
    flag = "--override-generation-config"
    try:
        raw = json.loads(args.override_generation_config)
    except json.JSONDecodeError as error:
        raise ValueError(f"{flag} must be a JSON object, got {args.override_generation_config!r} ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{flag} must be a JSON object such as '{{\"temperature\": 0.5}}', got {raw!r}")
    unknown = sorted(set(raw) - set(OVERRIDABLE))
    if unknown:
        raise ValueError(f"{flag}: {', '.join(map(repr, unknown))} cannot be set here; accepted: "
                         f"{', '.join(OVERRIDABLE)}")
    sampling = dict(from_dict(raw).sampling)
    try:
        SamplingParams(**sampling)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{flag}: {_in_file_terms(str(error))}") from None
    return sampling


def _in_file_terms(message: str) -> str:
    """A SamplingParams error naming the generation_config.json key given ("max_tokens ..." -> "max_new_tokens ...")."""
    for key, field in SAMPLING_FIELDS.items():
        if key != field and message.startswith(field + " "):
            return key + message[len(field):]
    return message


def check_generation_flags(args: argparse.Namespace) -> None:
    """Both flags checked before the model loads (a DIR without the file, a bad override: a ValueError)."""
    source = args.generation_config
    if source not in SOURCES and not (Path(source) / FILENAME).is_file():
        raise ValueError(f"--generation-config {source!r}: give auto, vllm or a directory holding {FILENAME} "
                         "(this one does not)")
    override(args)


def generation_settings(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """The SamplingParams fields --generation-config sets, with the override merged over them (vLLM's
    get_diff_sampling_param): what requests leave out, and in max_tokens the cap on every request's."""
    source = args.generation_config
    base = {} if source == "vllm" else dict(generation_defaults(model_dir if source == "auto" else source).sampling)
    return {**base, **override(args)}


def sampling_defaults(args: argparse.Namespace, model_dir: Path) -> SamplingParams:
    """The server's default SamplingParams: generation_settings over SamplingParams' own."""
    return SamplingParams(**generation_settings(args, model_dir))


def served_defaults(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """ServerConfig's default_params and max_new_tokens (the cap on every request's max_tokens, or None)."""
    settings = generation_settings(args, model_dir)
    return dict(default_params=SamplingParams(**settings), max_new_tokens=settings.get("max_tokens"))
