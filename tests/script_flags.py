"""What the parsers of scripts and of the `jaxinfer` CLI reject in given command lines, without running them.

`python -m tests.script_flags` reads a JSON list of argument lists (`["scripts/x.py", "--flag", ...]` or
`["-m", "jaxinfer", "serve", ...]`) on stdin and prints a JSON list of problems, one per command a parser
rejected. A script runs as `python script` would, up to its outermost `parse_args`/`parse_known_args`.
Run it in a child interpreter: it patches argparse and runs scripts' top levels."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from collections.abc import Callable, Iterator
from typing import Any

from jaxinfer.entrypoints.cli import CommandLineError, parse


class Parsed(BaseException):
    """Raised once a script's outermost parse is done; carries what the parse returned."""


def stop_after(parse_method: Callable[..., Any], depth: list[int]) -> Callable[..., Any]:
    """`parse_method` that stops the script when its outermost call returns (subparsers parse inside it)."""
    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        depth[0] += 1
        try:
            result = parse_method(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            raise Parsed(result)
        return result
    return parse_then_stop


@contextlib.contextmanager
def parsing_only() -> Iterator[None]:
    """argparse's parse methods raise Parsed after parsing instead of returning to the script."""
    originals = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    depth = [0]
    argparse.ArgumentParser.parse_args = stop_after(originals[0], depth)
    argparse.ArgumentParser.parse_known_args = stop_after(originals[1], depth)
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args = originals


def script_problem(argv: list[str]) -> str | None:
    """Why the script `argv[0]` rejects `argv[1:]`, or None."""
    errors = io.StringIO()
    sys.argv, sys.path[0] = argv, os.path.abspath(os.path.dirname(argv[0]))  # as `python script`
    try:
        with parsing_only(), contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(argv[0], run_name="__main__")
    except Parsed as parsed:
        if argv[0].endswith("bench_serve_start.py"):  # what it does not know it hands to `jaxinfer serve`
            return cli_problem(["serve", *parsed.args[0][1]])
        return None
    except (SystemExit, Exception) as err:  # noqa: BLE001 - any failure before parsing is the problem
        return f"{type(err).__name__} {err} {errors.getvalue().strip()}"
    return "never parsed its arguments"


def cli_problem(args: list[str]) -> str | None:
    """Why `jaxinfer` rejects `args`, or None."""
    try:
        parse(args)
    except CommandLineError as err:
        return str(err)
    return None


def main() -> None:
    problems = []
    for argv in json.loads(sys.stdin.read()):
        problem = cli_problem(argv[2:]) if argv[:2] == ["-m", "jaxinfer"] else script_problem(argv)
        if problem is not None:
            problems.append(f"{argv}: {problem}")
    print(json.dumps(problems))


if __name__ == "__main__":
    main()
