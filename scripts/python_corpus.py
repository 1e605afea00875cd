"""A Python-source corpus for training the demo pair: the standard library plus every installed
distribution whose license is permissive, each named with its license.

A distribution counts when its metadata (`License-Expression`, a short `License` field, or the
`License ::` classifiers) names only permissive licenses (MIT, BSD, Apache, PSF, ISC, ...); one
that names a copyleft or proprietary license anywhere is left out, unless its license expression
offers a permissive alternative ("Apache-2.0 OR BSD-3-Clause"). Unknown licenses are left out.
Test suites and vendored copies of other projects (whose licenses the metadata does not state)
are skipped; identical files are read once. Files are split into train and held-out sets by a
hash of their path, as `train_demo.py` splits the standard library.
"""

from __future__ import annotations

import hashlib
import re
import sysconfig
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

PERMISSIVE = ("MIT", "BSD", "APACHE", "PSF", "PYTHON SOFTWARE FOUNDATION", "PYTHON-2.0", "ISC", "ZLIB", "UNLICENSE",
              "HPND", "CC0", "PUBLIC DOMAIN")
RESTRICTIVE = ("GPL", "MPL", "MOZILLA", "EPL", "ECLIPSE", "CDDL", "EUPL", "PROPRIETARY", "COMMERCIAL", "SSPL", "BUSL")
# Directories whose files are not the distribution's own code (tests, other projects' vendored copies).
SKIPPED_DIRS = frozenset({"test", "tests", "testing", "_vendor", "vendor", "vendored", "_vendored", "third_party",
                          "externals", "__pycache__", "idlelib", "lib2to3", "pydoc_data", "site-packages"})
HELD_OUT_ONE_IN = 50
LONGEST_LICENSE_FIELD = 120  # longer `License` fields hold the license's text, not its name


@dataclass
class Source:
    """One distribution's contribution: its name, version, license and what was read from it."""

    name: str
    version: str
    license: str
    files: int = 0
    bytes: int = 0


@dataclass
class Corpus:
    """Train and held-out files (keyed "distribution/relative path") and where they came from."""

    train: dict[str, str] = field(default_factory=dict)
    held_out: dict[str, str] = field(default_factory=dict)
    sources: list[Source] = field(default_factory=list)


def license_statements(meta) -> list[str]:
    """What a distribution's metadata says of its license: the expression, a short License field, classifiers."""
    statements = [meta.get("License-Expression") or ""]
    text = (meta.get("License") or "").strip()
    if text and len(text) <= LONGEST_LICENSE_FIELD and text.upper() != "UNKNOWN":
        statements.append(text)
    statements += [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return [s for s in statements if s and s != "OSI Approved"]


def _names(statement: str, words: tuple[str, ...]) -> bool:
    upper = statement.upper()
    return any(re.search(rf"(^|[^A-Z]){re.escape(word)}", upper) for word in words)


def permissive_license(statements: list[str]) -> str | None:
    """The permissive license the statements name, or None when any names a restrictive one (and no
    expression offers a permissive alternative) or none names a permissive one."""
    for statement in statements:  # "Apache-2.0 OR BSD-3-Clause": a permissive branch is enough
        branches = [b.strip(" ()") for b in re.split(r"\s+OR\s+", statement)]
        if len(branches) > 1 and any(_names(b, PERMISSIVE) and not _names(b, RESTRICTIVE) for b in branches):
            return statement
    if not statements or any(_names(s, RESTRICTIVE) for s in statements):
        return None
    named = [s for s in statements if _names(s, PERMISSIVE)]
    return named[0] if named else None


def is_held_out(key: str) -> bool:
    """Deterministic ~2% hold-out by a hash of the file's key."""
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % HELD_OUT_ONE_IN == 0


def own_python_files(paths: list[Path]) -> list[Path]:
    """The .py files among relative paths, outside skipped directories, sorted."""
    return sorted(p for p in paths if p.suffix == ".py" and not SKIPPED_DIRS.intersection(p.parts[:-1]))


def _add(corpus: Corpus, source: Source, key: str, text: str, seen: set[str]) -> None:
    digest = hashlib.sha256(text.encode()).hexdigest()
    if digest in seen or "Character Mapping Codec" in text[:200] or Path(key).name.startswith("_sysconfigdata"):
        return
    seen.add(digest)
    (corpus.held_out if is_held_out(key) else corpus.train)[key] = text
    source.files += 1
    source.bytes += len(text.encode())


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def collect(max_package_bytes: int, max_total_bytes: int, packages: bool = True, max_stdlib_files: int | None = None
            ) -> Corpus:
    """The stdlib, then permissively licensed installed distributions in name order, each up to
    max_package_bytes, until max_total_bytes."""
    corpus, seen, total = Corpus(), set(), 0
    root = Path(sysconfig.get_paths()["stdlib"])
    stdlib = Source("python-stdlib", sysconfig.get_python_version(), "PSF-2.0")
    files = own_python_files([p.relative_to(root) for p in root.rglob("*.py")])
    for relative in files[:max_stdlib_files]:
        text = _read(root / relative)
        if text is not None:
            _add(corpus, stdlib, f"stdlib/{relative.as_posix()}", text, seen)
    corpus.sources.append(stdlib)
    total = stdlib.bytes
    distributions = {d.metadata["Name"].lower(): d for d in metadata.distributions() if d.metadata["Name"]}
    for name in sorted(distributions) if packages else []:
        dist = distributions[name]
        license_name = permissive_license(license_statements(dist.metadata))
        if license_name is None or total >= max_total_bytes:
            continue
        source = Source(dist.metadata["Name"], dist.version, license_name)
        for relative in own_python_files([Path(str(f)) for f in dist.files or []]):
            if source.bytes >= max_package_bytes or total + source.bytes >= max_total_bytes:
                break
            text = _read(Path(dist.locate_file(relative)))
            if text is not None:
                _add(corpus, source, f"{name}/{relative.as_posix()}", text, seen)
        if source.files:
            corpus.sources.append(source)
            total += source.bytes
    return corpus
