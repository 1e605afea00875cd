"""`vllm serve`'s flags that `jaxinfer serve` has no flag of its own for, so a vLLM command line runs as written
(`jaxinfer serve MODEL --tensor-parallel-size 2 --enable-auto-tool-choice --tool-call-parser hermes --seed 0`).

Flags with a meaning here are served (the positional model, --seed, --scheduling-policy, --tokenizer, --chat-template,
--enable-prefix-caching; --tensor-parallel-size, --data-parallel-size, --block-size and
--no-enable-prefix-caching are other names of ours, given beside them in serve_flags / cli_args); flags
that change nothing here are accepted and say so in --help; a value that would change something not
served is refused before the model loads, naming the flag and why (as `entrypoints.vllm_arguments` does
for `LLM(...)`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from jaxinfer.config import validation
from jaxinfer.config.engine import SCHEDULING_POLICIES
from jaxinfer.entrypoints.content_format import CONTENT_FORMATS
from jaxinfer.entrypoints.openai.cors import Cors, string_list
from jaxinfer.entrypoints.openai.request_log import RequestLog


def add_vllm_flags(serve: argparse.ArgumentParser) -> None:
    """vLLM's serve flags without a jaxinfer flag of their own."""
    add = serve.add_argument
    add("model_tag", nargs="?", default=None, metavar="MODEL",
        help="the model directory, as `vllm serve MODEL` takes it (the same as --model)")
    add("--seed", type=int, default=None,
        help="requests that give no seed draw theirs from a stream this seeds, so sampled outputs repeat from "
        "run to run (default: random)")
    add("--scheduling-policy", default="fcfs", choices=SCHEDULING_POLICIES,
        help="fcfs serves requests in arrival order; priority by each request's `priority` field (lower first), "
        "then arrival, preempting the last in that order when the KV cache is full")
    add("--tokenizer", default=None, metavar="DIR", help="read the tokenizer from DIR instead of the model's")
    add("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
        help="a Jinja chat template (a file, or the template itself) used instead of the tokenizer's")
    add("--chat-template-content-format", default="auto", choices=CONTENT_FORMATS,
        help="how the chat template reads a message's content: as text (string) or as typed parts (openai, "
        "image parts whose marks the template writes); auto tells from the template")
    add("--enable-prefix-caching", action="store_true",
        help="prefix caching (on by default; a model with Mamba2 state layers refuses it)")
    add("--enable-auto-tool-choice", action="store_true",
        help="vLLM's switch for tool_choice \"auto\": accepted with --tool-call-parser, which enables it here")
    add("--trust-remote-code", action="store_true",
        help="accepted for vLLM's command lines: jaxinfer runs no checkpoint code, its families are built in")
    add("--disable-log-requests", "--disable-log-stats", action="store_true",
        help="accepted for vLLM's command lines: requests (unless --enable-log-requests) and periodic stats are "
        "not logged (/metrics has them)")
    add("--enable-log-requests", action="store_true",
        help="log a line per request to stderr: its id, prompt token ids and sampling settings")
    add("--enable-log-outputs", action="store_true",
        help="log a line per finished output to stderr: its text, token ids and finish reason")
    add("--max-log-len", type=int, default=None, metavar="N",
        help="with the two above: at most N prompt ids, output characters and output ids per line (default: all)")
    add("--swap-space", type=float, default=None, metavar="GIB",
        help="accepted for vLLM's command lines: preempted requests are recomputed, never swapped (as in vLLM V1)")
    add("--enforce-eager", action="store_true",
        help="refused: every step is a compiled XLA program (there is no eager mode); the compilation cache "
        "makes restarts fast")
    add("--pipeline-parallel-size", "-pp", type=int, default=1,
        help="only 1: models split over a jax mesh by --tp / --dp / --ep")
    add("--allowed-origins", default=None, metavar="JSON",
        help="origins web pages may call the server from, a JSON list ('[\"https://app.example\"]' or "
        "'[\"*\"]'); default: none (vLLM's default '[\"*\"]' lets any page open in a browser call a local server)")
    add("--allowed-methods", default=None, metavar="JSON", help="with --allowed-origins: a JSON list (default all)")
    add("--allowed-headers", default=None, metavar="JSON", help="with --allowed-origins: a JSON list (default all)")
    add("--allow-credentials", action="store_true", help="with --allowed-origins: cookies and auth headers too")
    add("--response-role", default="assistant", metavar="ROLE",
        help="the role of a chat reply that starts a new turn (add_generation_prompt); a continued message "
        "keeps its own (default: %(default)s)")
    add("--return-tokens-as-token-ids", action="store_true",
        help="logprobs name each token 'token_id:N' instead of its text (for tokens that are not whole "
        "UTF-8 characters)")


def settle_vllm_flags(args: argparse.Namespace) -> None:
    """Check vLLM's flags and fold them into ours, in place (before the port is bound): the positional model
    into --model, a --chat-template file into its text; ValueError naming the flag for what is not served."""
    if args.model_tag is not None:
        if args.model is not None and args.model != args.model_tag:
            raise ValueError(f"the model is given twice, as {args.model_tag!r} and as --model {args.model!r}; "
                             "give one of them")
        args.model = args.model_tag
    if args.enforce_eager:
        raise ValueError("--enforce-eager is not served: every step is a compiled XLA program (there is no eager "
                         "mode); leave it out (the compilation cache makes restarts fast)")
    if args.pipeline_parallel_size != 1:
        raise ValueError(f"--pipeline-parallel-size {args.pipeline_parallel_size} is not served: models split over "
                         "a jax mesh by --tp (--tensor-parallel-size), --dp and --ep; accepted: 1")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser NAME (the format the model writes "
                         "its calls in)")
    if args.enable_prefix_caching and args.no_prefix_caching:
        raise ValueError("--enable-prefix-caching and --no-prefix-caching (--no-enable-prefix-caching) disagree; "
                         "give one of them")
    if args.tokenizer is not None:
        validation.model_dir(args.tokenizer, "--tokenizer")
    if args.chat_template is not None:
        args.chat_template = chat_template_text(args.chat_template)
    cors_settings(args)  # checked before the port is bound


def request_log(args: argparse.Namespace) -> RequestLog:
    """The logging flags as settings; --max-log-len below 0 is a ValueError."""
    if args.max_log_len is not None and args.max_log_len < 0:
        raise ValueError(f"--max-log-len must be >= 0, got {args.max_log_len}")
    return RequestLog(args.enable_log_requests, args.enable_log_outputs, args.max_log_len)


def response_role(args: argparse.Namespace) -> str:
    """--response-role, checked: a name, not blank."""
    if not args.response_role.strip():
        raise ValueError(f"--response-role {args.response_role!r} is blank; give a role name such as assistant")
    return args.response_role


def cors_settings(args: argparse.Namespace) -> Cors:
    """The CORS flags as settings; methods, headers or credentials without origins are a ValueError."""
    origins = string_list(args.allowed_origins, "--allowed-origins") or ()
    methods = string_list(args.allowed_methods, "--allowed-methods")
    headers = string_list(args.allowed_headers, "--allowed-headers")
    if not origins and (methods or headers or args.allow_credentials):
        raise ValueError("--allowed-methods, --allowed-headers and --allow-credentials go with --allowed-origins "
                         "(no origins: cross-origin requests are not answered)")
    return Cors(origins, methods or ("*",), headers or ("*",), args.allow_credentials)


def chat_template_text(value: str) -> str:
    """--chat-template's template: a file's text, or the value itself when it is a template (vLLM's rule:
    a value with a Jinja tag or expression in it is the template; anything else must be a file)."""
    if "{%" in value or "{{" in value:
        return value
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template (no '{{%' or '{{{{' "
                         "in it)")
    return path.read_text()


def prefix_caching(args: argparse.Namespace) -> bool | None:
    """LLM's enable_prefix_caching from the flags: False, True, or None (on where the model allows it)."""
    return False if args.no_prefix_caching else True if args.enable_prefix_caching else None
