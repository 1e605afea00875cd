"""Leaves that split in their family's own way, on a mesh of fake CPU devices, against the unsharded run.

Command R+'s q/k LayerNorm weights [heads, K] split with the heads; StarCoder2's MLP biases split
with the hidden units (b_up [F]) or stay whole (b_down and the LayerNorm biases [D]); OLMoE's q/k
RMSNorms span every head, which tp splits (the norm's sum then crosses devices); Llama 4's experts
are read as column halves of one [E, D, 2F] tensor, each device its experts' and hidden units'
columns, and take inputs scaled by their router scores. The sharded runs
happen in a subprocess (`jax_num_cpu_devices` must be set before jax starts); it prints JSON
that the test checks here. Logits only: the engine's sharded steps run the same forward.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from python_subprocess import run_python

FAKE_DEVICES = 'import jax\njax.config.update("jax_num_cpu_devices", 4)\n'
SCRIPT = """
import json
from jaxinfer import LLM
from jaxinfer.parallel.sharding import shard_shapes

prompt = [1, 5, 9, 33, 7, 81, 4, 4, 80, 17, 23, 99, 100, 3, 5, 9, 33, 7, 81, 4]
fields = ("q_norm", "k_norm", "b_up", "b_down", "mlp_norm_bias", "moe_up", "shared_up")
out = {}
for name, model, meshes in runs:
    for tp, ep in meshes:
        llm = LLM(model, dtype="float32", max_seq_len=64, max_num_seqs=2, tensor_parallel_size=tp,
                  expert_parallel_size=ep)
        layer = llm.weights.layers[-1]
        out[f"{name} {tp}x{ep}"] = dict(
            logits=llm.logits(prompt).tolist(),
            leaves={f: shard_shapes(getattr(layer, f)) for f in fields if getattr(layer, f, None) is not None},
        )
print(json.dumps(out))
"""


@pytest.mark.slow
def test_family_leaves_split_on_a_mesh_give_the_unsharded_logits(checkpoint_dir):
    runs = [("cohere", str(checkpoint_dir("cohere")), [(1, 1), (2, 1)]),
            ("starcoder2", str(checkpoint_dir("starcoder2")), [(1, 1), (2, 1)]),
            ("olmoe", str(checkpoint_dir("olmoe")), [(1, 1), (2, 2)]),
            ("llama4", str(checkpoint_dir("llama4")), [(1, 1), (2, 2)])]
    header = f"runs = {runs!r}\n"
    out = json.loads(run_python(FAKE_DEVICES + header + SCRIPT, kernels=False, JAX_PLATFORMS="cpu").splitlines()[-1])
    # Shapes per device at tp=2: 4 heads of 16 dims (2 KV heads), D 64, StarCoder2's F 128.
    expected = {
        "cohere 2x1": dict(q_norm=[2, 16], k_norm=[1, 16]),
        "starcoder2 2x1": dict(b_up=[64], b_down=[64], mlp_norm_bias=[64]),
        "olmoe 2x2": dict(q_norm=[2, 16], k_norm=[1, 16], moe_up=[2, 64, 16]),
        "llama4 2x2": dict(moe_up=[2, 64, 16], shared_up=[64, 16]),  # experts [4, 64, 32], shared expert [64, 32]
    }
    for run, leaves in expected.items():
        reference = out[run.split()[0] + " 1x1"]["logits"]
        np.testing.assert_allclose(out[run]["logits"], reference, atol=1e-5, rtol=0, err_msg=run)
        devices = 2 if run.endswith("2x1") else 4
        assert out[run]["leaves"] == {name: [shape] * devices for name, shape in leaves.items()}, run
