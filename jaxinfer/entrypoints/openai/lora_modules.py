"""`jaxinfer serve`'s LoRA flags (vLLM's): --enable-lora, --lora-modules NAME=PATH, --max-loras, --max-lora-rank.

Each adapter is served under its name: a request whose `model` is that name runs with it, and
/v1/models lists it with the served model as its parent. Every adapter is read and checked
before the server reports healthy, so a bad one stops the start with its flag value named.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from jaxinfer.config.lora import LoRARequest

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM

ACCEPTED = 'NAME=PATH or {"name": NAME, "path": PATH} (a PEFT adapter directory)'
RUNTIME_UPDATING_VAR = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"  # vLLM's switch for the same routes


def add_lora_args(serve: argparse.ArgumentParser) -> None:
    add = serve.add_argument
    add("--enable-lora", action="store_true", help="serve LoRA adapters (--lora-modules) beside the model")
    add("--lora-modules", nargs="+", action="extend", default=[], metavar="NAME=PATH",
        help=f"adapters served by name as the request's `model`: {ACCEPTED}")
    add("--max-loras", type=int, default=1, help="adapters one step serves at once (default: %(default)s)")
    add("--max-lora-rank", type=int, default=16, help="the largest adapter rank served (default: %(default)s)")
    add("--allow-runtime-lora-updating", action="store_true",
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (they read directories the client "
             f"names; also on with {RUNTIME_UPDATING_VAR}=true)")


def runtime_lora_updating(args: argparse.Namespace) -> bool:
    """Whether the load/unload routes are served; a ValueError when asked for without --enable-lora."""
    asked = args.allow_runtime_lora_updating or os.environ.get(RUNTIME_UPDATING_VAR, "").lower() in ("1", "true")
    if asked and not args.enable_lora:
        how = "--allow-runtime-lora-updating" if args.allow_runtime_lora_updating else f"{RUNTIME_UPDATING_VAR}"
        raise ValueError(f"{how} needs --enable-lora (the engine's adapter slots)")
    return asked


def lora_modules(args: argparse.Namespace) -> tuple[LoRARequest, ...]:
    """The --lora-modules values as LoRARequests; a ValueError naming the value that is not one."""
    if args.lora_modules and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora (the engine's adapter slots)")
    modules = tuple(_module(value, i + 1) for i, value in enumerate(args.lora_modules))
    names = [m.lora_name for m in modules]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules names {names} repeat; give each adapter its own name")
    return modules


def _module(value: str, int_id: int) -> LoRARequest:
    if value.lstrip().startswith("{"):
        try:
            fields = json.loads(value)
            name, path = fields["name"], fields["path"]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"--lora-modules {value!r} is not {ACCEPTED}") from None
    else:
        name, sep, path = value.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ValueError(f"--lora-modules {value!r} is not {ACCEPTED}")
    if not (Path(path).expanduser() / "adapter_config.json").is_file():
        raise ValueError(f"--lora-modules {value!r}: {path} holds no adapter_config.json; expected a PEFT adapter "
                         "directory")
    return LoRARequest(str(name).strip(), int_id, str(path))


def check_served_name(modules: tuple[LoRARequest, ...], model_name: str | None) -> None:
    """A ValueError when an adapter takes the served model's name: requests naming it would get the base model."""
    for module in modules:
        if module.lora_name == model_name:
            raise ValueError(f"--lora-modules {module.lora_name}={module.lora_path}: `{model_name}` is the served "
                             "model's name (--served-model-name, else the model directory's); give the adapter another")


def register(llm: "LLM", modules: tuple[LoRARequest, ...]) -> None:
    """Read and check every adapter now, each error naming its flag value."""
    for module in modules:
        try:
            llm.engine.add_lora(module)
        except ValueError as error:
            raise ValueError(f"--lora-modules {module.lora_name}={module.lora_path}: {error}") from None
