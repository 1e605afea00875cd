"""llguidance vs xgrammar on the demo tokenizer and a 128k-token one: grammar compile time and
per-token mask time for a 30-field JSON schema (the measurement behind docs/structured_output.md).

The 128k tokenizer is a byte-level BPE trained here, offline, on the Python sources of the installed
packages (no hub): vocabulary size, not the merges' quality, is what a mask costs.

    python scripts/compare_grammar_libraries.py [--out results/structured_libraries.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEMO_TOKENIZER = ROOT / "jaxinfer" / "assets" / "demo" / "target" / "tokenizer.json"
BIG_VOCAB = 128_000
CORPUS_BYTES = 60_000_000


def thirty_field_schema() -> dict:
    """30 required properties of every common kind: strings (free, enum, pattern, bounded), integers
    with ranges, numbers, booleans, arrays of strings and numbers, and a nested object."""
    kinds: list[dict] = [
        {"type": "string", "maxLength": 24},
        {"type": "integer", "minimum": 0, "maximum": 10000},
        {"type": "number"},
        {"type": "boolean"},
        {"type": "string", "enum": ["red", "green", "blue", "cyan"]},
        {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 4},
        {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{4}$"},
        {"type": "array", "items": {"type": "number"}, "maxItems": 3},
        {"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "string", "maxLength": 8}},
         "required": ["x", "y"], "additionalProperties": False},
        {"type": "string", "format": "date"},
    ]
    properties = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(30)}
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def instance(schema: dict) -> dict:
    """A valid instance of thirty_field_schema (the text whose tokens drive the matchers)."""
    values = {
        "string": "alpha beta", "integer": 42, "number": 3.25, "boolean": True, "array": ["one", "two"],
        "object": {"x": 7, "y": "seven"},
    }
    out = {}
    for name, sub in schema["properties"].items():
        if "enum" in sub:
            out[name] = sub["enum"][1]
        elif "pattern" in sub:
            out[name] = "AB-1234"
        elif sub.get("format") == "date":
            out[name] = "2024-05-17"
        elif sub["type"] == "array" and sub["items"]["type"] == "number":
            out[name] = [1.5, 2.0]
        else:
            out[name] = values[sub["type"]]
    return out


def python_corpus(limit: int) -> list[str]:
    """Up to `limit` bytes of .py files from the interpreter's library and site-packages, in path order."""
    texts, total = [], 0
    for root in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]):
        for path in sorted(Path(root).rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            texts.append(text)
            total += len(text)
            if total >= limit:
                return texts
    return texts


def big_tokenizer(cache: Path) -> Path:
    """A byte-level BPE with BIG_VOCAB tokens, trained once and kept in `cache`."""
    path = cache / f"bpe{BIG_VOCAB}.json"
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BIG_VOCAB, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    started = time.perf_counter()
    tokenizer.train_from_iterator(python_corpus(CORPUS_BYTES), trainer)
    print(f"trained {tokenizer.get_vocab_size()} tokens in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(path))
    return path


def hf_tokenizer(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token="<|endoftext|>")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - started


def summary(seconds: list[float]) -> dict:
    ms = sorted(s * 1e3 for s in seconds)
    return {"mean_ms": statistics.fmean(ms), "p50_ms": ms[len(ms) // 2], "p99_ms": ms[int(len(ms) * 0.99)],
            "tokens": len(ms)}


def measure_llguidance(tok: Any, schema: dict, tokens: list[int]) -> dict:
    import llguidance
    import llguidance.hf
    import llguidance.numpy

    lltok, tok_s = timed(lambda: llguidance.hf.from_tokenizer(tok))
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema))
    matcher, compile_s = timed(lambda: llguidance.LLMatcher(lltok, grammar))
    _, copy_s = timed(matcher.deep_copy)
    mask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
    steps = []
    for token in tokens:
        _, seconds = timed(lambda: llguidance.numpy.fill_next_token_bitmask(matcher, mask, 0))
        steps.append(seconds)
        assert matcher.consume_token(token), matcher.get_error()
    return {"tokenizer_setup_s": tok_s, "compile_s": compile_s, "copy_matcher_s": copy_s, "mask": summary(steps)}


def measure_xgrammar(tok: Any, schema: dict, tokens: list[int], vocab: int) -> dict:
    import xgrammar

    info, tok_s = timed(lambda: xgrammar.TokenizerInfo.from_huggingface(tok, vocab_size=vocab))
    compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(schema)))
    matcher = xgrammar.GrammarMatcher(compiled)
    mask = np.full(xgrammar.get_bitmask_shape(1, vocab), -1, np.int32)
    steps = []
    for token in tokens:
        _, seconds = timed(lambda: matcher.fill_next_token_bitmask(mask, 0))
        steps.append(seconds)
        assert matcher.accept_token(token)
    return {"tokenizer_setup_s": tok_s, "compile_s": compile_s, "mask": summary(steps)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "results" / "structured_libraries.json"))
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "jaxinfer"))
    args = parser.parse_args()
    schema = thirty_field_schema()
    text = json.dumps(instance(schema))
    results = {"schema_fields": 30, "instance_chars": len(text), "tokenizers": {}}
    for name, path in (("demo", DEMO_TOKENIZER), ("bpe128k", big_tokenizer(Path(args.cache)))):
        tok = hf_tokenizer(path)
        tokens = tok.encode(text, add_special_tokens=False)
        vocab = len(tok)
        entry = {"vocab": vocab, "instance_tokens": len(tokens)}
        entry["llguidance"] = measure_llguidance(tok, schema, tokens)
        entry["xgrammar"] = measure_xgrammar(tok, schema, tokens, vocab)
        results["tokenizers"][name] = entry
        print(json.dumps({name: entry}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
