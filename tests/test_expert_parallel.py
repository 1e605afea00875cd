"""Expert parallelism (ep, with and without tp) on fake CPU devices, against the unsharded run.

The sharded runs happen in a subprocess (`jax_num_cpu_devices` must be set before jax starts);
it prints JSON that the test checks here. Every run's logits are compared (the experts split in
the model's forward, which the engine's steps run too: one program a run); the engine's tokens
where its paged steps hold something of the family's own (ENGINE_RUNS), each run two programs more.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from python_subprocess import run_python

FAKE_DEVICES = 'import jax\njax.config.update("jax_num_cpu_devices", 4)\n'
SCRIPT = """
import json
from jaxinfer import LLM, SamplingParams
from jaxinfer.parallel.sharding import shard_shapes

prompts = [[1, 5, 9, 33, 7, 81, 4, 4, 80, 17, 23, 99, 100, 3, 5, 9, 33, 7, 81, 4], [1, 4, 4, 80]]
values = lambda w: getattr(w, "values", w)  # quantized leaves: their values
params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
out = {}
for name, model, meshes, extra in runs:
    for tp, ep in meshes:
        llm = LLM(model, dtype="float32", max_seq_len=64, max_num_seqs=2, tensor_parallel_size=tp,
                  expert_parallel_size=ep, **extra)
        layer, run = llm.weights.layers[-1], f"{name} {tp}x{ep}"
        out[run] = dict(
            logits=llm.logits(prompts[0]).tolist(),
            tokens=[o.outputs[0].token_ids for o in llm.generate(prompts, params)] if run in engine_runs else None,
            gate=shard_shapes(values(layer.moe_gate)), down=shard_shapes(values(layer.moe_down)),
            wq=shard_shapes(values(layer.wq)),
            shared=shard_shapes(layer.shared_gate) if hasattr(layer, "shared_gate") else None,
            w_uk=shard_shapes(layer.w_uk) if hasattr(layer, "w_uk") else None,
            wkv_a=shard_shapes(layer.wkv_a) if hasattr(layer, "wkv_a") else None,
        )
print(json.dumps(out))
"""


# The engine's paged steps on a mesh: Mixtral's experts over both axes (and its unsharded run), GPT-OSS's sinks in the
# Pallas kernel under shard_map, DeepSeek-V3's one cached latent row on every device. Multi-step decode of a dense
# model on a mesh: test_sharding.py (two processes, decode_steps=4; speculation on 4 x 2).
ENGINE_RUNS = ("mixtral 1x1", "mixtral 2x2", "gpt_oss 1x1", "gpt_oss pallas 2x2", "deepseek_v3 1x1", "deepseek_v3 2x2")


@pytest.mark.slow
def test_expert_and_tensor_parallel_give_the_unsharded_logits_and_tokens(checkpoint_dir):
    meshes = [(1, 1), (2, 1), (1, 2), (2, 2)]
    # Qwen3-MoE's layer 0 is dense (mlp_only_layers): a Llama layer inside the expert-parallel model.
    runs = [(name, str(checkpoint_dir(name)), meshes, {}) for name in ("mixtral", "qwen3_moe")]
    # Qwen2-MoE's shared expert splits like a dense MLP, over tp only (one 2 x 2 mesh covers both axes).
    runs.append(("qwen2_moe", str(checkpoint_dir("qwen2_moe")), [(1, 1), (2, 2)], {}))
    # Granite-MoE's experts are read as row ranges of one fused [E, 2F, D] tensor (each device its experts' and
    # hidden units' rows), its shared MLP's gate and up from one [2S, D] tensor, split like Qwen2-MoE's.
    runs.append(("granitemoe_shared", str(checkpoint_dir("granitemoe_shared")), [(1, 1), (2, 2)], {}))
    # GPT-OSS's expert biases split like the experts (one 2 x 2 mesh covers both axes); then its attention
    # sinks split like the query heads into the Pallas kernel each device runs (interpreted) under shard_map.
    runs.append(("gpt_oss", str(checkpoint_dir("gpt_oss")), [(1, 1), (2, 2)], {}))
    runs.append(("gpt_oss pallas", str(checkpoint_dir("gpt_oss")), [(2, 2)],
                 dict(attention_backend="pallas", interpret_kernels=True)))
    # GLM-4.5's grouped routing (float32 router and bias, replicated) chooses among 8 experts before they split;
    # its ungated shared experts [D=64, 64] split like Qwen2-MoE's.
    runs.append(("glm4_moe", str(checkpoint_dir("glm4_moe")), [(1, 1), (2, 2)], {}))
    # DeepSeek-V3's latent attention: the one cached row (and kv_a, which makes it) on every device, the query heads
    # and each head's W_UK / W_UV split over tp; grouped routing and shared experts as GLM-4.5's.
    runs.append(("deepseek_v3", str(checkpoint_dir("deepseek_v3")), [(1, 1), (2, 2)], {}))
    # Quantized experts (values and scales) split as the experts they replace: int8 over both axes; int4 over ep
    # (its groups of 32 input rows do not split over tp here: down's 32 hidden units).
    runs.append(("mixtral int8", str(checkpoint_dir("mixtral")), [(1, 1), (2, 2)], dict(quantization="int8")))
    runs.append(("mixtral int4", str(checkpoint_dir("mixtral")), [(1, 1), (1, 2)], dict(quantization="int4")))
    header = f"runs = {runs!r}\nengine_runs = {ENGINE_RUNS!r}\n"
    out = json.loads(run_python(FAKE_DEVICES + header + SCRIPT, kernels=False, JAX_PLATFORMS="cpu").splitlines()[-1])
    assert all(out[run]["tokens"] for run in ENGINE_RUNS)  # each named run exists and generated
    for name, _, sizes, _ in runs:
        reference = out.get(f"{name} 1x1", out[f"{name.split()[0]} 1x1"])
        for tp, ep in sizes:
            key = f"{name} {tp}x{ep}"
            run = out[key]
            np.testing.assert_allclose(run["logits"], reference["logits"], atol=1e-5, rtol=0, err_msg=key)
            if run["tokens"] is not None:
                assert run["tokens"] == reference["tokens"], (name, tp, ep)
            # 4 experts (GLM-4.5 8) [E, D=64, F=32]: split by ep on experts and by tp on each expert's hidden units
            # (int4 values hold two input rows a byte).
            packed, experts = 2 if "int4" in name else 1, 8 if name in ("glm4_moe", "deepseek_v3") else 4
            assert run["gate"] == [[experts // ep, 64 // packed, 32 // tp]] * (tp * ep), (name, tp, ep, run["gate"])
            assert run["down"] == [[experts // ep, 32 // tp // packed, 64]] * (tp * ep)
            if "int" not in name:  # heads: tp only, replicated over ep
                assert [shape[1] for shape in run["wq"]] == [4 // tp] * (tp * ep)
            if name in ("qwen2_moe", "granitemoe_shared"):  # the shared expert's [D=64, 48]
                assert run["shared"] == [[64, 48 // tp]] * (tp * ep), (tp, ep, run["shared"])
            if name in ("glm4_moe", "deepseek_v3"):  # n_shared_experts 2 x 32 hidden units
                assert run["shared"] == [[64, 64 // tp]] * (tp * ep), (tp, ep, run["shared"])
            if name == "deepseek_v3":  # W_UK [4 heads, R 32, N 16] by heads; kv_a [D 64, R + P 48] whole
                assert (run["w_uk"], run["wkv_a"]) == ([[4 // tp, 32, 16]] * (tp * ep), [[64, 48]] * (tp * ep))
