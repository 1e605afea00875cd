"""Shared fixtures: tiny HF checkpoints on disk, built once per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from xla_flags import compile_tests_fast  # noqa: E402

compile_tests_fast()
# Tests patch traced functions, which the program store cannot see (its own tests turn it on).
os.environ.setdefault("JAXINFER_PROGRAM_STORE", "0")

import compile_log  # noqa: E402
import torch  # noqa: E402
from hf_models import save_hf_model, save_tiny_tokenizer  # noqa: E402

# The HF reference models are tiny: their ops take microseconds, and torch's intra-op threads (one per core) spend
# them waiting on two cores that the other xdist worker and XLA also run on. One thread: HF's 32-token greedy
# generate of a tiny family took 0.6-2.5 s of CPU on two threads, 0.04 s on one (the same tokens).
torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """Test files go to xdist's workers in collection order (see pytest_collection_modifyitems),
    not reordered by test count; and the opt-in compile log (JAXINFER_TESTS_COMPILE_LOG=DIR)."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    compile_log.pytest_configure(config)


# Files whose programs a later test loads from the compilation cache instead of compiling them: batch invariance's
# child compiles (at the user's XLA flags) the very programs of docs/engine.md's batch-invariant example, which
# test_docs_examples reaches two minutes in; run first, it has them cached by then (~30 s of compiling saved).
FIRST = ("tests/test_batch_invariant.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """FIRST, then files with slow tests, then the rest by test count, each file's tests in their order.

    A worker that takes a minute-long file last runs alone for that minute while the other waits:
    xdist's default order (most tests first) put the one-test soak at the very end of the session.
    """
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = {name for name, tests in files.items() if any(t.get_closest_marker("slow") for t in tests)}
    order = sorted(files, key=lambda name: (name not in FIRST, name not in slow, -len(files[name])))
    items[:] = [item for name in order for item in files[name]]


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory):
    """A function name -> directory of a saved tiny float32 HF checkpoint (cached per session)."""
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = save_hf_model(name, tmp_path_factory.mktemp(name))
        return cache[name]

    return get


@pytest.fixture(scope="session")
def text_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint with a real (tiny) tokenizer, for text in / text out tests."""
    path = tmp_path_factory.mktemp("llama_text")
    save_hf_model("llama2", path, vocab_size=320)
    save_tiny_tokenizer(path, vocab_size=300)
    return path


@pytest.fixture(scope="module")
def served_text_model(text_model_dir):
    """(LLM, official openai client) of the tiny text model served in a thread as "tiny", per module."""
    import openai
    from live_server import serve_in_thread

    from jaxinfer import LLM
    from jaxinfer.entrypoints.openai import ServerConfig

    llm = LLM(text_model_dir, dtype="float32", max_seq_len=128)
    with serve_in_thread(llm, ServerConfig("tiny")) as (url, _):
        yield llm, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drop every compiled program after each test module.

    XLA:CPU maps each compiled kernel into memory separately (hundreds of regions per step
    program), and a pytest worker that keeps every module's programs runs into Linux's
    vm.max_map_count (65530) and segfaults in the JIT. Programs come back from the persistent
    compilation cache or the program store when a later module needs them.
    """
    yield
    from jaxinfer.runtime.memory_maps import drop_compiled_programs

    drop_compiled_programs()
