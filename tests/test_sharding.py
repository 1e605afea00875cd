"""Tensor and data parallelism on 8 fake CPU devices, against the unsharded run.

The sharded runs happen in a subprocess (`jax_num_cpu_devices=8` must be set before jax starts,
and the rest of the suite runs on one device): one child runs every section (SECTIONS) once per
module, each against the one unsharded run of the tp/dp matrix where the model and prompts are
its, and prints JSON that the tests check here.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from hf_models import save_hf_model
from jax.sharding import AbstractMesh, AxisType, PartitionSpec
from python_subprocess import child_env, run_python
from test_hybrid_families import BAMBA

from jaxinfer import LLM
from jaxinfer.entrypoints.cli_args import add_distributed_args, distributed_settings
from jaxinfer.parallel.sharding import DP, TP, Layout, check_layout
from jaxinfer.quantization.quantized_weight import quantize, quantized_specs

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [[1, 5, 9, 33, 7, 81], [1, 4, 4, 80]]
MAX_TOKENS = 6
FAKE_DEVICES = 'import jax\njax.config.update("jax_num_cpu_devices", 8)\n'
# Each (tp, dp) on 8 devices; tp=8 x dp=2 needs 16 and is checked as an error.
MESHES = [(2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 heads (tp up to 8), 2 kv heads (fewer than tp = 4 and 8: kept whole), untied head."""
    return save_hf_model(
        "llama2", tmp_path_factory.mktemp("sharded"), num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=1
    )


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A draft with 2 heads: tp = 4 does not divide them, so its heads stay whole on every device."""
    return save_hf_model("llama2", tmp_path_factory.mktemp("draft"), num_attention_heads=2, num_key_value_heads=1)


def run_json(script: str, **values: object) -> dict:
    """The JSON a script on 8 fake devices prints last; `values` become its global variables."""
    header = "".join(f"{name} = {value!r}\n" for name, value in values.items())
    # JAX_PLATFORMS=cpu: on a GPU machine too, the mesh is the 8 fake CPU devices.
    return json.loads(run_python(FAKE_DEVICES + header + script, kernels=False, JAX_PLATFORMS="cpu").splitlines()[-1])


def run_sections(sections: dict[str, str], **values: object) -> dict:
    """Each section's `out` (a script that fills a dict `out`), all run by one child: one interpreter's imports
    and checkpoint reads, and the programs of identical engines compiled once."""
    body = "".join(f"out = {{}}\n{script}\nsections[{name!r}] = out\n" for name, script in sections.items())
    return run_json("import json\nsections = {}\n" + body + "print(json.dumps(sections))\n", **values)


MATRIX = """
import json
import numpy as np
from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.sharding import shard_shapes
from jaxinfer.runtime.memory_maps import compile_count

params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
out = {}
for tp, dp in [(1, 1)] + [tuple(m) for m in meshes]:
    llm = LLM(model, max_seq_len=64, max_num_seqs=2, decode_steps=1, tensor_parallel_size=tp, data_parallel_size=dp)
    w, lw = llm.weights, llm.weights.layers[0]
    tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    before = compile_count()
    llm.generate(prompts, params)  # the same shapes again: each program's state comes back as it went in
    out[f"{tp}x{dp}"] = dict(
        tokens=tokens, recompiles=compile_count() - before,
        logits=llm.logits(prompts[0]).tolist(),
        cpu_kernels=llm.cpu_kernels,
        shards={name: shard_shapes(x) for name, x in dict(
            embed=w.embed, lm_head=w.lm_head, wq=lw.wq, wk=lw.wk, wo=lw.wo, w_gate=lw.w_gate, w_down=lw.w_down,
            pool=llm.engine.runner.pages.k_pages[0],
        ).items()},
    )
    if (tp, dp) != (2, 2):
        continue
    # KV offloading's copies: what device_get gives (all kv heads), written back in the pool's sharding
    runner = llm.engine.runner
    copies, before = runner.offload_pages([1, 2]), runner.read_pages([1, 2])
    runner.load_pages([3, 4], copies, np.zeros((2, 16), np.int32))
    after = runner.read_pages([3, 4])
    out["offload"] = dict(
        kv_heads=copies[0].values()["k_pages"].shape[1], same=all((before[n] == after[n]).all() for n in before),
        used=bool(np.abs(before["k_pages"]).sum() > 0), pool=shard_shapes(runner.pages.k_pages[0]))
try:
    LLM(model, tensor_parallel_size=8, data_parallel_size=2)
except ValueError as err:
    out["too_many"] = str(err)
try:
    LLM(model, tensor_parallel_size=2, cpu_kernels=True)
except ValueError as err:
    out["kernels"] = str(err)
"""


@pytest.mark.slow
def test_tp_dp_matrix_matches_unsharded(mesh_runs):
    out = mesh_runs["matrix"]
    ref = out["1x1"]
    V, D, H, KV, K, F = 256, 64, 8, 2, 8, 128
    for tp, dp in MESHES:
        run = out[f"{tp}x{dp}"]
        assert run["tokens"] == ref["tokens"], (tp, dp)
        assert run["recompiles"] == 0, (tp, dp)
        np.testing.assert_allclose(run["logits"], ref["logits"], atol=1e-5, rtol=0, err_msg=f"tp={tp} dp={dp}")
        assert run["cpu_kernels"] is False  # FFI kernels cannot be partitioned: off on any mesh
        shards, kv = run["shards"], KV // tp if tp <= KV else KV  # kv heads < tp: every device holds all
        assert len(shards["wq"]) == tp * dp
        expected = dict(
            embed=[V // tp, D], lm_head=[D, V // tp], wq=[D, H // tp, K], wk=[D, kv, K], wo=[H // tp, K, D],
            w_gate=[D, F // tp], w_down=[F // tp, D],
        )
        for name, shape in expected.items():
            assert {tuple(s) for s in shards[name]} == {tuple(shape)}, (tp, dp, name, shards[name])
        assert {s[0] for s in shards["pool"]} == {kv}, (tp, dp, shards["pool"])
    # KV offloading on tp=2 x dp=2: the host copy has both kv heads, the copy back keeps the pool's sharding
    assert out["offload"] == dict(kv_heads=KV, same=True, used=True, pool=out["2x2"]["shards"]["pool"])
    assert "needs 16 devices" in out["too_many"] and "8 are present" in out["too_many"]
    assert "cpu_kernels=True cannot run on a mesh of 2 devices" in out["kernels"]


SPECULATIVE_AND_ORBAX = """
from jaxinfer import LLM, SamplingParams, SpeculativeConfig, save_converted
from jaxinfer.parallel.sharding import shard_shapes

params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
tokens = lambda llm: [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
spec = SpeculativeConfig(draft_model=draft, num_speculative_tokens=3, adaptive=False, fallback=False)
llm = LLM(model, speculative=spec, tensor_parallel_size=4, data_parallel_size=2, max_seq_len=64, max_num_seqs=2)
out.update(spec=tokens(llm), spec_on=llm.metrics()["speculative"], drafted=llm.metrics()["drafted"])
pool = llm.engine.runner.draft.pages.k_pages[0]  # read after the steps: each donates the one before
out.update(
           draft_pool=shard_shapes(pool), draft_pool_whole=list(pool.shape),
           draft_wq=shard_shapes(llm.engine.runner.draft_weights.layers[0].wq))
save_converted(llm.weights, model, converted)  # saved from the 4 x 2 mesh
# The matrix's knobs on its 2 x 1 mesh: the same programs, loaded from the compilation cache.
restored = LLM(converted, max_seq_len=64, max_num_seqs=2, decode_steps=1, tensor_parallel_size=2, data_parallel_size=1)
out.update(restored=tokens(restored), restored_logits=restored.logits(prompts[0]).tolist(),
           restored_wq=shard_shapes(restored.weights.layers[0].wq))
"""


@pytest.mark.slow
def test_speculative_and_orbax_on_a_mesh(mesh_runs):
    out, ref = mesh_runs["speculative_and_orbax"], mesh_runs["matrix"]["1x1"]
    assert out["spec_on"] and out["drafted"] > 0  # the engine's drafts ran sharded, no fallback
    assert out["spec"] == ref["tokens"]
    assert {tuple(s) for s in out["draft_pool"]} == {tuple(out["draft_pool_whole"])}  # 2 kv heads < tp=4: whole
    assert {tuple(s) for s in out["draft_wq"]} == {(64, 2, 32)}  # 2 draft heads, tp=4: replicated
    assert out["restored"] == ref["tokens"]
    np.testing.assert_allclose(out["restored_logits"], ref["logits"], atol=1e-5, rtol=0)
    assert {tuple(s) for s in out["restored_wq"]} == {(64, 4, 8)}


DISTRIBUTED = """
import argparse, json, jax
jax.config.update("jax_num_cpu_devices", 2)
from jaxinfer.entrypoints.cli_args import add_distributed_args, initialize_distributed
parser = argparse.ArgumentParser()
add_distributed_args(parser)  # the CLI's flags, parsed and passed on as `jaxinfer generate` does
flags = ["--coordinator-address", coordinator, "--num-processes", "2", "--process-id", str(process_id)]
initialize_distributed(parser.parse_args(flags))
from jaxinfer import LLM, SamplingParams

llm = LLM(model, max_seq_len=64, max_num_seqs=2, decode_steps=4, tensor_parallel_size=2, data_parallel_size=2)
outs = llm.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))
print(json.dumps(dict(tokens=[o.outputs[0].token_ids for o in outs], devices=jax.device_count(),
                      local=jax.local_device_count(), process=jax.process_index())))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_processes_match_one(model_dir, mesh_runs):
    """Two localhost processes (2 CPU devices each, gloo collectives) run one 2 x 2 mesh, joined by the CLI's flags,
    decoding 4 steps a call (the one multi-step decode on a mesh without speculation) as the matrix's one device."""
    values = dict(coordinator=f"127.0.0.1:{free_port()}", model=str(model_dir), prompts=PROMPTS, max_tokens=MAX_TOKENS)
    env = child_env(JAXINFER_CPU_KERNELS="0", JAX_PLATFORMS="cpu")
    procs = []
    for process_id in range(2):
        header = "".join(f"{k} = {v!r}\n" for k, v in {**values, "process_id": process_id}.items())
        procs.append(subprocess.Popen([sys.executable, "-c", header + DISTRIBUTED], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.splitlines()[-1]))
    single = mesh_runs["matrix"]["1x1"]["tokens"]
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["devices"] == 4 and r["local"] == 2 for r in results)
    assert results[0]["tokens"] == results[1]["tokens"] == single


@pytest.mark.parametrize(
    "heads, kv, tp, dp, devices, words",
    [
        (8, 2, 3, 1, 8, "does not divide the model's 8 attention heads; use one of [1, 2, 4, 8]"),
        (8, 2, 16, 1, 8, "needs 16 devices, but 8 are present"),
        (12, 4, 6, 1, 8, "splits the model's 4 kv heads unevenly"),
    ],
)
def test_impossible_layouts_name_sizes_that_work(heads, kv, tp, dp, devices, words):
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        check_layout(heads, kv, tp, dp, devices)


def test_llm_rejects_more_devices_than_present(model_dir):
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2 x data_parallel_size=1 needs 2 devices, but 1"):
        LLM(model_dir, tensor_parallel_size=2)
    with pytest.raises(TypeError, match="data_parallel_size must be an integer"):
        LLM(model_dir, data_parallel_size=1.5)


PALLAS = """
import json
import jax
import jax.numpy as jnp
import numpy as np
from jaxinfer import LLM, SamplingParams
from jaxinfer.models.attention import paged_rows_attend
from jaxinfer.cache.paged import POOL_AXES, PagedKVCache
from jaxinfer.parallel.sharding import Layout, make_mesh

params = SamplingParams(max_tokens=pallas_tokens, temperature=0, ignore_eos=True)
knobs = dict(max_seq_len=32, max_num_seqs=2, decode_steps=1)
tokens = lambda llm: [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
for tp, dp in pallas_meshes:
    llm = LLM(model, attention_backend="pallas", interpret_kernels=True, tensor_parallel_size=tp,
              data_parallel_size=dp, **knobs)
    out[f"{tp}x{dp}"] = tokens(llm)
# The kernel call itself (traced only): it must sit inside a shard_map on a mesh.
layout = Layout(make_mesh(tp=4))
pool = layout.put(np.zeros((2, 4, 16, 16), np.float32), POOL_AXES)
cache = PagedKVCache([pool], [pool], None, None, layout.put(np.zeros((2, 2), np.int32)), backend="pallas",
                     interpret=True, layout=layout)
rows = jnp.ones((2,), jnp.int32)
jaxpr = jax.make_jaxpr(lambda q: paged_rows_attend(q, cache, 0, 0, rows, cache.page_table, rows))(
    jnp.zeros((2, 1, 8, 16), jnp.float32))
out["shard_map"] = "shard_map" in str(jaxpr)
"""
PALLAS_MESHES = [(2, 2), (4, 1)]
PALLAS_TOKENS = 3  # interpreted kernels are slow


@pytest.mark.slow
def test_pallas_kernels_per_shard_match_unsharded(mesh_runs):
    """Interpreted Pallas kernels under shard_map: kv heads split (tp=2, dp=2) and kept whole (tp=4 > 2 kv heads),
    against the matrix's one device (the engine's own attention there)."""
    out, ref = mesh_runs["pallas"], [t[:PALLAS_TOKENS] for t in mesh_runs["matrix"]["1x1"]["tokens"]]
    for tp, dp in PALLAS_MESHES:
        assert out[f"{tp}x{dp}"] == ref, (tp, dp)
    assert out["shard_map"]


QUANTIZED = """
from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.sharding import shard_shapes

params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
# quantize_lm_head: int8 projections and head. (The float head beside int8 projections splits as the matrix's.)
for tp, dp in [(1, 1), (2, 2)]:
    llm = LLM(model, quantization="int8", max_seq_len=32, max_num_seqs=2, decode_steps=1, tensor_parallel_size=tp,
              data_parallel_size=dp, quantize_lm_head=True)
    lw, run_head = llm.weights.layers[0], llm._run_weights.lm_head
    out[f"{tp}x{dp}"] = dict(
        tokens=[o.outputs[0].token_ids for o in llm.generate(prompts, params)],
        shards={name: [shard_shapes(getattr(lw, name).values), shard_shapes(getattr(lw, name).scales)]
                for name in ("wq", "wo", "w_down")},
        head=[shard_shapes(run_head.values), shard_shapes(run_head.scales)],
    )
"""


@pytest.mark.slow
def test_int8_weights_sharded_match_unsharded(mesh_runs):
    """int8 projections and head (quantize_lm_head) on a 2 x 2 mesh == one device."""
    out = mesh_runs["int8"]
    assert out["2x2"]["tokens"] == out["1x1"]["tokens"]
    shards = {name: [{tuple(s) for s in parts} for parts in pair] for name, pair in out["2x2"]["shards"].items()}
    # wq [64, 8 heads x 8] by output columns, wo [8 heads x 8, 64] and w_down [128, 64] by input rows.
    assert shards == dict(wq=[{(64, 32)}, {(32,)}], wo=[{(32, 64)}, {(64,)}], w_down=[{(64, 64)}, {(64,)}])
    # The int8 head [64, 256 vocab] splits its vocabulary columns over tp=2.
    assert [{tuple(s) for s in part} for part in out["2x2"]["head"]] == [{(64, 128)}, {(128,)}]


HYBRID = """
from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.sharding import shard_shapes
params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
for tp in (1, 2):
    llm = LLM(bamba, dtype="float32", max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16,
              tensor_parallel_size=tp)
    out[tp] = dict(tokens=[o.outputs[0].token_ids for o in llm.generate(bamba_prompts, params)],
                   empty=shard_shapes(llm.engine.runner.pages.k_pages[0]))
"""
SECTIONS = dict(matrix=MATRIX, speculative_and_orbax=SPECULATIVE_AND_ORBAX, pallas=PALLAS, int8=QUANTIZED,
                hybrid=HYBRID)


@pytest.fixture(scope="module")
def mesh_runs(model_dir, draft_dir, tmp_path_factory) -> dict:
    """Every section's output, from one child on 8 fake devices."""
    bamba = tmp_path_factory.mktemp("bamba")
    torch.manual_seed(0)
    transformers.BambaForCausalLM(transformers.BambaConfig(**BAMBA)).save_pretrained(bamba)
    converted = tmp_path_factory.mktemp("orbax") / "converted"
    return run_sections(
        SECTIONS, model=str(model_dir), draft=str(draft_dir), converted=str(converted), bamba=str(bamba),
        prompts=PROMPTS, max_tokens=MAX_TOKENS, meshes=MESHES, pallas_meshes=PALLAS_MESHES,
        pallas_tokens=PALLAS_TOKENS, bamba_prompts=[PROMPTS[0], list(range(3, 31))],
    )


def test_a_hybrid_on_a_mesh_matches_unsharded(mesh_runs):
    """Bamba (Mamba2, attention, Mamba2) on tp=2: the Mamba2 layers' empty K/V buffers stay replicated, so the
    16-token step program runs again after its first call (it returned them replicated; compiled for kv heads over
    tp, its second call refused them: the 28-token prompt's second chunk failed)."""
    out = mesh_runs["hybrid"]
    assert out["2"]["tokens"] == out["1"]["tokens"] and all(len(t) == 4 for t in out["2"]["tokens"])
    assert out["2"]["empty"] == [[2, 5, 16, 0]] * 2  # [kv heads, pages, page size, 0] whole on each device


def _abstract_layout(tp: int) -> Layout:
    """A (1, tp) layout over an abstract mesh: specs without devices."""
    return Layout(AbstractMesh((1, tp), (DP, TP), axis_types=(AxisType.Auto, AxisType.Auto)))


@pytest.mark.parametrize(
    "mode, shape, contract, axes, group, values, scales",
    [
        ("int8", (64, 8, 8), 1, ("embed", "q_heads", "head_dim"), 32, (None, TP), (TP,)),
        ("fp8", (128, 64), 1, ("mlp", "embed"), 32, (TP, None), (None,)),
        # int4: 64 input rows in 2 groups of 32 split over tp=2, each device holding one group.
        ("int4", (8, 8, 64), 2, ("q_heads", "head_dim", "embed"), 32, (TP, None), (TP, None)),
        # One group of 64 rows cannot split over 2 devices: the input stays whole.
        ("int4", (8, 8, 64), 2, ("q_heads", "head_dim", "embed"), 64, (None, None), (None, None)),
        # 3 heads do not split over tp=2: the merged output dim stays whole.
        ("int8", (64, 3, 8), 1, ("embed", "q_heads", "head_dim"), 32, (None, None), (None,)),
    ],
)
def test_quantized_leaves_shard_by_the_weight_axes(mode, shape, contract, axes, group, values, scales):
    q = quantize(jnp.ones(shape, jnp.float32), contract, mode, group)
    assert quantized_specs(q, axes, _abstract_layout(2)) == (PartitionSpec(*values), PartitionSpec(*scales))


def _flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_distributed_args(parser)
    return parser.parse_args(list(argv))


def test_multi_host_flags_become_initialize_arguments():
    assert distributed_settings(_flags()) is None  # no flags: one process, jax.distributed untouched
    assert distributed_settings(_flags("--coordinator-address", "10.0.0.1:1234", "--num-processes", "4",
                                       "--process-id", "3")) == dict(
        coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3)
    auto = dict(coordinator_address=None, num_processes=None, process_id=None)  # JAX detects them
    assert distributed_settings(_flags("--distributed")) == auto


@pytest.mark.parametrize(
    "argv, error, words",
    [
        (("--coordinator-address", "10.0.0.1"), ValueError, "--coordinator-address '10.0.0.1' is not HOST:PORT"),
        (("--coordinator-address", "h:99999"), ValueError, "port in 1..65535"),
        (("--num-processes", "0"), ValueError, "--num-processes must be an integer >= 1, got 0"),
        (("--num-processes", "2", "--process-id", "2"), ValueError, r"--process-id must be an integer in \[0, 1\]"),
    ],
)
def test_multi_host_flags_name_the_bad_flag(argv, error, words):
    with pytest.raises(error, match=words):
        distributed_settings(_flags(*argv))
