"""The program store: a warm start loads every program without tracing it, and runs the same tokens;
keys follow what decides a program; a damaged entry compiles again."""

from __future__ import annotations

import json
import logging
import shutil

import jax
import numpy as np
import pytest
from engine_knobs import ENGINE
from hf_models import save_hf_model
from python_subprocess import run_python

from jaxinfer import LLM, SamplingParams
from jaxinfer.runtime import program_store
from jaxinfer.runtime.executables import Executables, Program
from jaxinfer.runtime.memory_maps import compile_count, drop_compiled_programs
from jaxinfer.runtime.program_store import ProgramStore, program_key, store_beside
from jaxinfer.runtime.step_programs import static_argnames

KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=4, max_num_batched_tokens=32, decode_steps=4)

# A fresh process: load, warm up, then a mixed generate; what warm-up took and what came out.
START = """
import json
from jaxinfer import LLM, SamplingParams
from jaxinfer.runtime.memory_maps import compile_count
llm = LLM({model!r}, compile_cache={cache!r}, **{knobs!r})
programs = llm.engine.warmup()
before = compile_count()
params = [SamplingParams(max_tokens=12, temperature=0, logprobs=2),
          SamplingParams(max_tokens=9, temperature=0.9, seed=4, presence_penalty=0.4, prompt_logprobs=1)]
outs = llm.generate([[5, 9, 14, 3, 77], list(range(3, 60))], params)
print(json.dumps(dict(programs=programs, seconds=llm.engine.runner.warmup_seconds,
                      compiles=compile_count() - before, tokens=[o.outputs[0].token_ids for o in outs])))
"""


def start(model, cache, kernels: bool) -> dict:
    script = START.format(model=str(model), cache=str(cache), knobs=KNOBS)
    return json.loads(run_python(script, kernels=kernels, JAXINFER_PROGRAM_STORE="1").splitlines()[-1])


def test_warm_start_loads_every_program_untraced_and_runs_the_same_tokens(tmp_path):
    """The second process traces nothing (with the CPU kernels where they build: registered from the
    entries, as nothing traced registers them), compiles nothing under traffic, and its tokens equal
    the first's."""
    kernels = jax.default_backend() == "cpu" and bool(shutil.which("g++") or shutil.which("clang++"))
    model = save_hf_model("llama3", tmp_path / "model")
    cold = start(model, tmp_path / "xla", kernels)
    warm = start(model, tmp_path / "xla", kernels)
    # Every program loaded from the store, which never lowers (traces) one: Executables._compile_job.
    assert cold["seconds"]["stored"] == 0 and warm["seconds"]["stored"] == warm["programs"] == cold["programs"]
    assert warm["compiles"] == cold["compiles"] == 0
    assert warm["tokens"] == cold["tokens"]
    # A new store over a warm JAX cache, as after an upgrade: programs that cache held are not stored
    # (XLA:CPU serializes them again without all of their code), and the next start runs the same tokens.
    shutil.rmtree(tmp_path / "xla" / program_store.SUBDIR)
    again = start(model, tmp_path / "xla", kernels)
    after = start(model, tmp_path / "xla", kernels)
    assert again["tokens"] == after["tokens"] == cold["tokens"] and after["compiles"] == 0


MESH_START = """
import json
import jax
jax.config.update("jax_num_cpu_devices", 4)
from jaxinfer import LLM, SamplingParams
llm = LLM({model!r}, compile_cache={cache!r}, tensor_parallel_size=2, **{knobs!r})
out = llm.generate([[5, 9, 14, 3, 77]], SamplingParams(max_tokens=6, temperature=0))[0].outputs[0]
print(json.dumps(dict(tokens=out.token_ids, finish=out.finish_reason,
                      stored=len(llm.engine.runner.executables.from_store))))
"""


def test_sharded_programs_are_stored_and_load_on_the_same_mesh(tmp_path):
    """A mesh's programs hold its devices (which do not pickle as they are): stored by platform and
    id, a warm start on the same mesh loads them and runs the same tokens. The mesh is 2 of the 4
    devices: a program loads onto the devices it was compiled for (loaded onto all 4, XLA aborted)."""
    model = save_hf_model("llama2", tmp_path / "model", num_attention_heads=4, num_key_value_heads=2,
                          num_hidden_layers=1)
    script = MESH_START.format(model=str(model), cache=str(tmp_path / "xla"), knobs=KNOBS)
    cold, warm = (json.loads(run_python(script, kernels=False, JAXINFER_PROGRAM_STORE="1", JAX_PLATFORMS="cpu")
                             .splitlines()[-1]) for _ in range(2))
    assert cold["finish"] == "length" and cold["stored"] == 0
    assert warm["tokens"] == cold["tokens"] and warm["stored"] > 0


def toy(x: jax.Array, scale: float) -> jax.Array:
    return x * scale


TOY = jax.jit(toy, static_argnames=("scale",))
# A scale of its own per session: the toy's first compile is never a hit in JAX's persistent cache
# (which the session's other tests may have turned on), so the store takes it.
SCALE = float(np.random.default_rng().integers(2, 1_000_000))


def toy_program(x: jax.Array, scale: float = SCALE) -> Program:
    return Program(TOY, [x], dict(scale=scale))


def toy_statics(function) -> tuple[str, ...]:
    return ("scale",) if function is TOY else static_argnames(function)


def test_keys_follow_shapes_dtypes_statics_and_the_function():
    x = jax.numpy.ones((4, 8), jax.numpy.float32)
    key = program_key(TOY, [x], dict(scale=2.0), {})
    assert key == program_key(TOY, [jax.numpy.zeros((4, 8), jax.numpy.float32)], dict(scale=2.0), {})  # values: no
    others = [
        program_key(TOY, [jax.numpy.ones((4, 9), jax.numpy.float32)], dict(scale=2.0), {}),
        program_key(TOY, [jax.numpy.ones((4, 8), jax.numpy.bfloat16)], dict(scale=2.0), {}),
        program_key(TOY, [np.ones((4, 8), np.float32)], dict(scale=2.0), {}),
        program_key(TOY, [x], dict(scale=3.0), {}),
        program_key(jax.jit(lambda x, scale: x + scale, static_argnames="scale"), [x], dict(scale=2.0), {}),
    ]
    assert len({key, *others}) == 1 + len(others)


def test_a_key_with_no_stable_text_is_never_stored():
    """A static argument whose text holds an address would differ in every process."""
    assert program_key(TOY, [jax.numpy.ones(2)], dict(scale=object()), {}) is None


def test_a_program_jax_compiled_earlier_in_the_process_is_not_stored(tmp_path):
    """A second compile of the same program returns jax's in-memory executable, which may have come
    from JAX's persistent cache (XLA:CPU would serialize it without all of its code): only a
    compile XLA ran then is stored."""
    x, scale = jax.numpy.arange(3.0), SCALE + 1
    Executables(None, toy_statics)(toy_program(x, scale))
    store = ProgramStore(tmp_path)
    assert not Executables(store, toy_statics).plan(toy_program(x, scale))().stored
    assert not store.directory.exists() or not any(store.directory.iterdir())
    Executables(store, toy_statics)(toy_program(x, scale + 1))  # compiled here and now: stored
    assert len(list(store.directory.iterdir())) == 1


def test_programs_from_the_store_are_compiled_again_after_one_fails_for_lack_of_its_code(tmp_path):
    """XLA's missing-code error from a call means a stored copy is damaged in a way loading cannot
    see: every program the table loaded from the store leaves the store and the table."""
    store, x = ProgramStore(tmp_path), jax.numpy.arange(4.0)
    Executables(store, toy_statics)(toy_program(x, SCALE + 2))
    table = Executables(store, toy_statics)
    assert table.plan(toy_program(x, SCALE + 2))().stored
    assert not table.distrust_store_after(RuntimeError("RESOURCE_EXHAUSTED: out of memory"))
    missing = RuntimeError("NOT_FOUND: Function slice_bitcast-convert_fusion.5 not found (type id: 1)")
    assert table.distrust_store_after(missing)
    assert not table.table and not any(store.directory.iterdir())
    assert np.array_equal(table(toy_program(x, SCALE + 2)), (SCALE + 2) * np.arange(4.0))
    assert not table.distrust_store_after(missing)  # nothing loaded from the store any more


def test_a_damaged_entry_is_removed_and_compiled_again(tmp_path, caplog):
    store = ProgramStore(tmp_path)
    x = jax.numpy.arange(6.0)
    Executables(store, toy_statics)(toy_program(x))
    [entry] = store.directory.iterdir()
    entry.write_bytes(b"not a program")
    with caplog.at_level(logging.WARNING, logger=program_store.__name__):
        out = Executables(store, toy_statics)(toy_program(x))
    assert np.array_equal(out, SCALE * np.arange(6.0))
    assert "does not load" in caplog.text
    # gone, or stored again whole (not when JAX's persistent cache, if on, held the recompile)
    assert not entry.exists() or Executables(store, toy_statics).plan(toy_program(x))().stored


def test_table_calls_what_it_holds_and_drop_empties_it(tmp_path):
    table = Executables(ProgramStore(tmp_path), toy_statics)
    x, y = jax.numpy.arange(4.0), jax.numpy.ones(4)
    table(toy_program(x))
    before = compile_count()
    assert np.array_equal(table(toy_program(y)), SCALE * np.ones(4)) and compile_count() == before
    drop_compiled_programs()
    assert not table.table
    assert table.plan(toy_program(x))().stored  # back from the store, untraced
    with pytest.raises(TypeError):  # a table entry never runs on arguments it was not compiled for
        table.table[next(iter(table.table))](jax.numpy.arange(5.0))


def test_store_is_off_without_the_compile_cache_or_when_switched_off(monkeypatch, tmp_path):
    monkeypatch.setenv(program_store.ENV_SWITCH, "1")
    assert store_beside(None) is None and store_beside("gs://bucket/xla") is None
    assert store_beside(str(tmp_path)).root == tmp_path / program_store.SUBDIR
    monkeypatch.setenv(program_store.ENV_SWITCH, "0")
    assert store_beside(str(tmp_path)) is None


def test_only_the_newest_stores_are_kept(tmp_path):
    for n in range(program_store.KEEP_STORES + 2):
        (tmp_path / f"old-{n}").mkdir()
    store = ProgramStore(tmp_path)
    store.save("k", jax.jit(toy, static_argnames="scale").lower(jax.numpy.ones(2), scale=1.0).compile())
    kept = sorted(d.name for d in tmp_path.iterdir())
    assert len(kept) == program_store.KEEP_STORES and store.directory.name in kept


def test_llm_without_the_store_still_calls_programs_from_its_table(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama3"), compile_cache=False, **ENGINE)
    assert llm.engine.runner.executables.store is None
    out = llm.generate([[5, 9, 14]], SamplingParams(max_tokens=4, temperature=0))
    assert len(out[0].outputs[0].token_ids) == 4 and llm.engine.runner.executables.table
