"""One child interpreter that runs many docs blocks, each in a fresh namespace, as `python -c` would.

A block run by `python -c` pays for importing jax and jaxinfer (~3 s of CPU) and its engine's
programs come back from the persistent cache; a child that stays up pays the import once and keeps
the programs in memory, which 6 of the docs' blocks took 99 s of CPU instead of 122 s.
Each block still gets what a fresh `python -c` gives it where it matters to the block: a new
`__main__` namespace, its own working directory, `sys.argv == ["-c"]`, no stdin; its stdout and
stderr (Python's and the C libraries' alike: fds 1 and 2) go to its own files.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The child's loop: a request per line on its stdin ({"code", "cwd", "out", "err"}), a reply per line on the fd
# that was its stdout ({"error": traceback or null}). Blocks see /dev/null as stdin.
CHILD = r"""
import gc, json, os, sys, traceback
requests, replies = os.fdopen(os.dup(0)), os.fdopen(os.dup(1), "w")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
for line in requests:
    request, error = json.loads(line), None
    os.chdir(request["cwd"])
    sys.argv = ["-c"]
    with open(request["out"], "w") as out, open(request["err"], "w") as err:
        sys.stdout.flush(), sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1), os.dup2(err.fileno(), 2)
        try:
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except BaseException:
            error = traceback.format_exc()
        finally:
            gc.collect()
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])
    replies.write(json.dumps({"error": error}) + "\n")
    replies.flush()
"""


@dataclass(frozen=True)
class BlockResult:
    """What a block left: its traceback (None when it ran to its end), stdout and stderr."""

    error: str | None
    stdout: str
    stderr: str


class BlockInterpreter:
    """A child interpreter with environment `env`, started on first use and again after one dies."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process: subprocess.Popen | None = None

    def run(self, code: str, cwd: Path, timeout: float) -> BlockResult:
        """Run `code` in a fresh namespace in `cwd`; a child that dies or overruns `timeout` is replaced."""
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen([sys.executable, "-c", CHILD], env=self.env, stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, text=True)
        out, err = cwd / ".block_stdout", cwd / ".block_stderr"
        request = dict(code=code, cwd=str(cwd), out=str(out), err=str(err))
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        reply = self.process.stdout.readline() if ready else ""
        if not reply:
            self.close()
            died = f"the interpreter died (exit {self.process.returncode})" if ready else f"no reply in {timeout} s"
            reply = json.dumps({"error": died})
        return BlockResult(json.loads(reply)["error"], _read(out), _read(err))

    def close(self) -> None:
        """Stop the child (its blocks are done or it overran)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""
