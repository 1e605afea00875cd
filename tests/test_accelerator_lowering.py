"""Every engine step program as a GPU and a TPU would run it, checked on this CPU.

The GPU variant has no host round trip inside a device call (no `cond`, no `while` whose trip
count is data) and orders rows only with XLA:GPU's fast kernels (no sort on a float key, no top_k
over 16: see sampling/row_order), and every step program, Pallas kernels included, lowers for
CUDA and TPU with `jax.export`: plain, prompt-lookup, draft-model, EAGLE, LoRA, mixture-of-experts, Jamba (Mamba-1
state layers) and Whisper engines on one device (Whisper's lowered only), and plain and draft-model engines on a
mesh of fake CPU devices (tp=2, dp=2).
A change that breaks an accelerator's lowering fails here, where no accelerator is at hand.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from accelerator_programs import gpu_jaxprs, gpu_round_trips, lowered_kernels, slow_orderings
from eagle_models import save_eagle1
from gemma4_assistants import make_assistant
from hf_models import save_hf_model
from python_subprocess import run_python
from whisper_models import save_whisper

from jaxinfer import LLM, SpeculativeConfig

TESTS = Path(__file__).parent
# head_dim 64 and pages of 16: shapes both platforms' kernels take. Two rows, one token bucket:
# every kind of step program, few of each.
KNOBS = dict(dtype="float32", max_seq_len=128, max_num_seqs=2, max_num_batched_tokens=16, max_prefill_seqs=1,
             decode_steps=4, num_pages=24, attention_backend="pallas", cpu_kernels=False)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("accelerators")
    target = save_hf_model("llama2", root / "target", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                           num_hidden_layers=1)
    # Routed experts: their products lowered as GPUs and TPUs run them (ragged_dot), not the CPU's tiled loop.
    moe = save_hf_model("mixtral", root / "moe", hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                        num_hidden_layers=1)
    # Whisper: its cross-attention reads each row slot's cross pages through the same paged kernels.
    whisper = save_whisper(root / "whisper", d_model=128, encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_layers=1, decoder_layers=1, max_target_positions=128)
    # Jamba: Mamba-1 layers (their selective scan over the row slots' states, chunked in prefill steps on an
    # accelerator: models/selective_chunks) beside an attention layer and experts.
    jamba = save_hf_model("jamba", root / "jamba", hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    return {"target": target, "eagle": save_eagle1(root / "eagle", target), "moe": moe, "whisper": whisper,
            "jamba": jamba}


def speculation(models: dict, method: str | None) -> SpeculativeConfig | None:
    if method is None:
        return None
    draft = {"ngram": None, "ngram_device": None, "draft": str(models["target"]), "eagle": str(models["eagle"])}[method]
    return SpeculativeConfig(method=method, draft_model=draft, num_speculative_tokens=2, adaptive=False, fallback=False)


@pytest.fixture(scope="module", params=[None, "ngram", "ngram_device", "draft", "eagle", "lora", "moe", "jamba"],
                ids=["plain", "ngram", "ngram-device", "draft", "eagle", "lora", "moe", "jamba"])
def llm(models, request) -> LLM:
    if request.param == "lora":  # LoRA adapter slots on every projection
        return LLM(models["target"], enable_lora=True, max_loras=2, **KNOBS)
    if request.param == "moe":
        return LLM(models["moe"], **KNOBS)
    if request.param == "jamba":  # chunks of 8: its 16-token steps take the chunked selective scan, decode the scan
        llm = LLM(models["jamba"], **KNOBS)
        runner = llm.engine.runner
        ss = dataclasses.replace(runner.model_config.state_space, chunk_size=8)
        runner.model_config = dataclasses.replace(runner.model_config, state_space=ss)
        return llm
    return LLM(models["target"], speculative=speculation(models, request.param), **KNOBS)


def test_gpu_step_programs_have_no_host_round_trips(llm):
    found = gpu_round_trips(llm)
    assert any("verify" in shape for shape in found) == (llm.engine.speculator is not None)
    assert not any(found.values()), found


def test_gpu_step_programs_sort_and_take_top_k_with_the_gpus_fast_kernels(llm):
    found = {shape: slow_orderings(jaxpr) for shape, jaxpr in gpu_jaxprs(llm).items()}
    assert not any(found.values()), found


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_every_step_program_lowers_for_the_accelerators(llm, platform):
    kernels = lowered_kernels(llm, platform)
    assert len(kernels) == len(llm.engine.step_hosts())
    assert all(count > 0 for count in kernels.values()), kernels  # attention runs the platform's kernel


@pytest.fixture(scope="module")
def assistant_llm(tmp_path_factory: pytest.TempPathFactory) -> LLM:
    """A Gemma 4 target (its sliding and global layers' heads of 64) drafting with a Gemma 4 assistant, one row."""
    root = tmp_path_factory.mktemp("gemma4_assistant")
    heads = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=64, global_head_dim=64)
    target = save_hf_model("gemma4_dense", root / "target", hidden_size=128, **heads)
    make_assistant(False, text=heads, backbone_hidden_size=128).save_pretrained(root / "assistant")
    spec = SpeculativeConfig(method="mtp", draft_model=str(root / "assistant"), num_speculative_tokens=2,
                             adaptive=False, fallback=False)
    return LLM(target, speculative=spec, **{**KNOBS, "max_num_seqs": 1})


def test_gemma4_assistant_step_programs_lower_for_cuda(assistant_llm):
    """A Gemma 4 assistant reads the target's pages with the platform's paged kernel: its verify programs hold a
    kernel call per assistant layer beyond the target's, no step program a host round trip (its draft steps a
    fixed-trip loop), and every one lowers for CUDA."""
    assert not any(gpu_round_trips(assistant_llm).values())
    kernels = lowered_kernels(assistant_llm, "gpu")
    assert len(kernels) == len(assistant_llm.engine.step_hosts())
    layers = assistant_llm.config.num_layers
    assert {shape.split(",")[0]: count for shape, count in kernels.items()} == {
        "('ragged'": layers, "('decode'": layers, "('verify'": layers + 2}, kernels


@pytest.fixture(scope="module")
def whisper(models) -> LLM:
    return LLM(models["whisper"], **{**KNOBS, "max_num_seqs": 1})  # one row: a ragged and a decode program


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_whisper_step_programs_lower_for_the_accelerators(whisper, platform):
    """Whisper's cross-attention reads its slots' cross pages in place through the platform's paged kernel: one
    call per layer beside self-attention's in every step program."""
    kernels = lowered_kernels(whisper, platform)
    assert len(kernels) == len(whisper.engine.step_hosts())
    assert all(count == 2 * whisper.config.num_layers for count in kernels.values()), kernels


SHARDED = """
import json, sys
sys.path.insert(0, {tests!r})
from accelerator_programs import gpu_round_trips, lowered_kernels
from jaxinfer import LLM, SpeculativeConfig
out = {{}}
for method in (None, "draft"):
    spec = None if method is None else SpeculativeConfig(method="draft", draft_model={target!r},
                                                         num_speculative_tokens=2, adaptive=False, fallback=False)
    llm = LLM({target!r}, speculative=spec, tensor_parallel_size=2, data_parallel_size=2, **{knobs!r})
    out[str(method)] = dict(trips=gpu_round_trips(llm), gpu=lowered_kernels(llm, "gpu"), tpu=lowered_kernels(llm, "tpu"))
print(json.dumps(out))
"""


def test_sharded_step_programs_lower_for_the_accelerators(models):
    knobs = {k: v for k, v in KNOBS.items() if k != "cpu_kernels"}
    script = SHARDED.format(tests=str(TESTS), target=str(models["target"]), knobs=knobs)
    fake = 'import jax\njax.config.update("jax_num_cpu_devices", 4)\n'
    out = json.loads(run_python(fake + script, kernels=False, JAX_PLATFORMS="cpu").splitlines()[-1])
    for method, result in out.items():
        assert not any(result["trips"].values()), (method, result["trips"])
        for platform in ("gpu", "tpu"):
            assert result[platform] and all(n > 0 for n in result[platform].values()), (method, platform, result)
