"""Every fenced block of README.md and docs/*.md is run as written, from a directory outside the
repository, or is marked on its fence line with why it is not.

A fence's info string is `LANG` or `LANG MODE: REASON`:
- `python` / `py`: run by this interpreter; `bash` / `sh`: run by bash with `set -e`, where
  `jaxinfer` and `python` are this checkout's;
- `text`: not code (synopses, diagrams, output), never run;
- `MODE` `no-run`: skipped, the reason shown in the test report (a server, the network, minutes);
- `MODE` `jaxinfer-only`: a shell block of which only the `jaxinfer ...` commands run;
- `MODE` `cpu-only`: run where jax's backend is a CPU (what the block shows is CPU-only so far),
  skipped elsewhere with the reason.
A block with no language, another language, an unknown mode or no reason fails the test.

Python blocks run in one interpreter per set of XLA flags (tests/block_interpreter.py), each in a fresh
namespace as `python -c` would run it; a block that sets jax's configuration (which must precede jax's
start) gets an interpreter of its own. Blocks run where `import torch` fails, as after the README's
`pip install -e .`: torch is a test dependency only, and where it is installed transformers imports it
(seconds) in every block's process.
The README's blocks and those with batch_invariant=True (bitwise results: they hold at the flags
users compile with) compile with the user's XLA flags; the other docs' with the session's
(tests/xla_flags.py: what a block prints is the same, its compiles several times shorter).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import pytest
from block_interpreter import BlockInterpreter
from python_subprocess import child_env
from xla_flags import user_xla_flags

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
INFO = re.compile(r"^(?P<lang>\w+)(?:\s+(?P<mode>[\w-]+):\s*(?P<reason>\S.*))?$")
LANGUAGES = {"python": "python", "py": "python", "bash": "shell", "sh": "shell", "text": "text"}
MODES = {"no-run", "jaxinfer-only", "cpu-only"}
TIMEOUT_S = 600
# The checkout's interpreter and CLI under the names the shell blocks use.
SHELL_PRELUDE = f"""set -e
python() {{ {shlex.quote(sys.executable)} "$@"; }}
jaxinfer() {{ {shlex.quote(sys.executable)} -m jaxinfer "$@"; }}
"""


@dataclass(frozen=True)
class Block:
    """One fenced block: where it is, its info string and its code."""

    where: str  # file:line of the opening fence
    info: str
    code: str

    def rule(self) -> tuple[str, str | None, str | None]:
        """(kind, mode, reason): kind python | shell | text; ValueError for a fence the rules do not cover."""
        match = INFO.match(self.info.strip())
        if not match or match["lang"] not in LANGUAGES:
            raise ValueError(f"{self.where}: fence info {self.info!r} is not one of {sorted(LANGUAGES)} "
                             "(optionally followed by ' no-run: REASON' or ' jaxinfer-only: REASON')")
        kind, mode = LANGUAGES[match["lang"]], match["mode"]
        if mode is not None and (mode not in MODES or kind == "text"):
            raise ValueError(f"{self.where}: mode {mode!r} is not one of {sorted(MODES)} for {kind} blocks")
        if mode == "jaxinfer-only" and (kind != "shell" or not jaxinfer_commands(self.code)):
            raise ValueError(f"{self.where}: jaxinfer-only needs a shell block with jaxinfer commands")
        return kind, mode, match["reason"]


def blocks() -> list[Block]:
    """Every fenced block of the docs, in document order."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append(Block(f"{doc.relative_to(REPO)}:{line}", match.group(1), match.group(2)))
    return found


def jaxinfer_commands(script: str) -> list[str]:
    """The `jaxinfer ...` parts of a shell block: `a && jaxinfer x` keeps `jaxinfer x`."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            part = part.strip()
            if part.startswith("jaxinfer "):
                commands.append(part)
    return commands


def _env(cwd: Path, as_users: bool) -> dict[str, str]:
    # This checkout, not whatever jaxinfer happens to be installed; no torch (see the module docstring);
    # blocks `as_users` compiling as they do for users (the session's flags are for speed: see
    # xla_flags), and the program store on, as users have it (the session turns it off for tests that
    # patch traced code).
    site = cwd / ".site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text('import sys\nsys.modules["torch"] = None\n')
    flags = {"XLA_FLAGS": user_xla_flags()} if as_users else {}
    return child_env(str(site), JAXINFER_PROGRAM_STORE="1", **flags)


@pytest.fixture(scope="module")
def interpreters(tmp_path_factory: pytest.TempPathFactory):
    """as_users -> the BlockInterpreter that runs this module's python blocks compiled with those flags."""
    shared = {as_users: BlockInterpreter(_env(tmp_path_factory.mktemp("blocks"), as_users))
              for as_users in (False, True)}
    yield shared
    for interpreter in shared.values():
        interpreter.close()


def _run_block(interpreter: BlockInterpreter, code: str, cwd: Path, where: str) -> None:
    result = interpreter.run(code, cwd, TIMEOUT_S)
    assert result.error is None, f"{where} failed:\n{result.error}\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr[-4000:]}"


def _run(argv: list[str], cwd: Path, where: str, as_users: bool) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, cwd=cwd, env=_env(cwd, as_users), capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, f"{where} failed (exit {result.returncode}):\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, f"{where}:\n{result.stderr[-4000:]}"
    return result


def _params() -> list:
    """Each runnable block as a test; a no-run block as a skipped one whose reason the report shows."""
    params = []
    for block in blocks():
        try:
            kind, mode, reason = block.rule()
        except ValueError:
            continue  # test_every_block_is_run_or_marked reports it
        if kind == "text":
            continue
        skipped = mode == "no-run" or (mode == "cpu-only" and jax.default_backend() != "cpu")
        marks = [pytest.mark.skip(reason=f"{block.where}: {reason}")] if skipped else []
        params.append(pytest.param(block, id=block.where, marks=marks))
    return params


def test_every_block_is_run_or_marked():
    problems = []
    for block in blocks():
        try:
            block.rule()
        except ValueError as err:
            problems.append(str(err))
    assert problems == []


def test_the_rules_reject_unmarked_blocks():
    assert Block("x.md:1", "bash", "jaxinfer generate --prompt x").rule() == ("shell", None, None)
    assert Block("x.md:1", "py no-run: needs a server", "").rule() == ("python", "no-run", "needs a server")
    for info in ("", "console", "bash no-run", "bash no-run:", "bash skip: why", "text no-run: why",
                 "python jaxinfer-only: why", "sh jaxinfer-only: only pip here"):
        with pytest.raises(ValueError):
            Block("x.md:1", info, "pip install x").rule()


def test_the_docs_have_examples_to_run():
    ran = [block for block in blocks() if block.rule()[0] != "text" and block.rule()[1] != "no-run"]
    assert sum(block.rule()[0] == "python" for block in ran) >= 4
    assert any(block.where.startswith("docs/speculative.md") for block in ran)
    assert any("jaxinfer generate" in block.code for block in ran if block.rule()[0] == "shell")


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of a markdown file (fenced blocks left out)."""
    text = FENCE.sub("", doc.read_text())
    headings = re.findall(r"^#+\s+(.*?)\s*$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_relative_links_resolve():
    """Every relative link of the docs names a file that exists, and a heading there if it has an anchor."""
    broken = []
    for doc in DOCS:
        for target in LINK.findall(FENCE.sub("", doc.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked offline
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            if not resolved.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_docs_index_lists_every_page():
    index = (REPO / "docs" / "index.md").read_text()
    missing = [p.name for p in DOCS if p.parent == REPO / "docs" and p.name != "index.md" and f"({p.name})" not in index]
    assert missing == []


@pytest.mark.slow
@pytest.mark.parametrize("block", _params())
def test_block_runs(block: Block, tmp_path, interpreters):
    kind, mode, _ = block.rule()
    as_users = block.where.startswith("README.md") or "batch_invariant=True" in block.code
    if kind == "python" and "jax.config" not in block.code:
        _run_block(interpreters[as_users], block.code, tmp_path, block.where)
        return
    if kind == "python":
        _run([sys.executable, "-c", block.code], tmp_path, block.where, as_users)
        return
    scripts = jaxinfer_commands(block.code) if mode == "jaxinfer-only" else [block.code]
    for script in scripts:
        result = _run(["bash", "-c", SHELL_PRELUDE + script], tmp_path, f"{block.where}: {script}", as_users)
        assert result.stdout.strip(), f"{block.where}: {script} printed nothing"
