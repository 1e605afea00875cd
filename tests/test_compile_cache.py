"""The persistent compilation cache: settings, and a warm second process reaches tokens sooner."""

from __future__ import annotations

import json
from pathlib import Path

from hf_models import save_hf_model
from python_subprocess import run_python
from xla_flags import user_xla_flags

from jaxinfer.runtime import compile_cache

# Times LLM load plus the first generate (prefill and decode compiles) in a fresh process.
FIRST_CALL = """
import json, sys, time
start = time.perf_counter()
from jaxinfer import LLM, SamplingParams
llm = LLM({model!r}, dtype="float32", max_seq_len=64, compile_cache={setting!r})
loaded = time.perf_counter()
out = llm.generate([[5, 9, 14, 3, 77]], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
done = time.perf_counter()
print(json.dumps(dict(load=loaded - start, first_generate=done - loaded, tokens=out[0].token_ids)))
"""


def first_call(model: Path, setting: bool | str) -> dict:
    """Seconds to load and to finish the first generate, in a fresh interpreter.

    The CPU kernels are off: what is cached is XLA's compiled programs, and the test must run (not
    fail) where there is no C++ compiler to build the kernels. XLA compiles as it does for users
    (not at the session's -O0), so the cache saves what it saves them.
    """
    script = FIRST_CALL.format(setting=setting if isinstance(setting, bool) else str(setting), model=str(model))
    out = run_python(script, kernels=False, JAXINFER_COMPILE_CACHE="1", XLA_FLAGS=user_xla_flags())
    return json.loads(out.splitlines()[-1])


def test_warm_cache_reaches_first_tokens_faster(tmp_path):
    model = save_hf_model("llama2", tmp_path / "model")
    cache_dir = tmp_path / "xla"
    off = first_call(model, False)
    cold = first_call(model, cache_dir)
    assert any(cache_dir.iterdir()), "nothing was written to the cache"
    warm = first_call(model, cache_dir)
    assert warm["tokens"] == cold["tokens"] == off["tokens"]
    # Compiling dominates the uncached first call; a warm cache leaves mostly the run itself.
    print(f"first generate: off {off['first_generate']:.2f}s, cold {cold['first_generate']:.2f}s, "
          f"warm {warm['first_generate']:.2f}s")
    assert warm["first_generate"] < 0.6 * off["first_generate"]


def test_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert compile_cache.default_cache_dir() == tmp_path / "jaxinfer" / "xla"
    monkeypatch.setenv(compile_cache.ENV_SWITCH, "0")
    assert not compile_cache.cache_requested() and compile_cache.cache_requested(True)
    assert compile_cache.compile_cache_setting(None) is None
    monkeypatch.setenv(compile_cache.ENV_SWITCH, "1")
    assert compile_cache.cache_requested() and not compile_cache.cache_requested(False)
    assert compile_cache.compile_cache_setting(False) is None
