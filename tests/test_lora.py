"""LoRA adapters: the engine's tokens and logprobs against peft's own model on the same weights,
several adapters and the base model in one batch, slots swapped under load, prefix caching kept
apart per adapter, nothing compiled by a swap after warm-up, and clear errors for what is not served."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from compile_counter import CompileCounter
from hf_models import save_hf_model
from python_subprocess import run_python

pytest.importorskip("peft", reason="the reference adapters are made and run by peft (pip install -e '.[test]')")
from lora_adapters import save_adapter  # noqa: E402

from jaxinfer import LLM, LoRARequest, SamplingParams, SpeculativeConfig
from jaxinfer.engine.adapter_slots import AdapterSlots

KNOBS = dict(dtype="float32", max_seq_len=128, num_pages=48, max_num_seqs=8, max_num_batched_tokens=64)
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1)
PROMPTS = [[1, 5, 9, 33, 71, 100, 4, 8, 15, 16, 23, 42], [1, 77, 3, 3, 91, 200, 17], list(range(3, 40))]


def peft_greedy(model: torch.nn.Module, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """peft's greedy tokens and each one's logprob."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=steps, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(out.scores, tokens)]
    return tokens, logprobs


@pytest.fixture(scope="module")
def adapters(checkpoint_dir, tmp_path_factory) -> dict:
    """Three adapters of the tiny Llama: all projections, attention only, MLP only (other ranks and alphas)."""
    model_dir = checkpoint_dir("llama2")
    root = tmp_path_factory.mktemp("lora")
    specs = {"all": dict(), "attn": dict(targets=["q_proj", "v_proj", "o_proj"], rank=8, alpha=4, seed=2),
             "mlp": dict(targets=["gate_proj", "down_proj"], rank=2, alpha=16, seed=3, use_rslora=True)}
    made = {}
    for i, (name, spec) in enumerate(specs.items()):
        path, model = save_adapter(model_dir, root / name, **spec)
        made[name] = (LoRARequest(name, i + 1, str(path)), model)
    return made


@pytest.fixture(scope="module")
def llm(checkpoint_dir) -> LLM:
    return LLM(checkpoint_dir("llama2"), enable_lora=True, max_loras=2, **KNOBS)


def test_each_adapter_matches_peft_beside_the_base_model(llm, adapters):
    """Every adapter's greedy tokens are peft's, logprobs within float32 noise, in one batch with base rows."""
    names = list(adapters)
    requests = [adapters[n][0] for n in names[:2]] + [None]
    outs = llm.generate([PROMPTS[0]] * 3, GREEDY, lora_request=requests)
    ref_model = adapters[names[0]][1]
    for out, request in zip(outs, requests):
        model = adapters[request.lora_name][1] if request else ref_model
        if request is None:
            with ref_model.disable_adapter():
                tokens, logprobs = peft_greedy(model, PROMPTS[0], 10)
        else:
            tokens, logprobs = peft_greedy(model, PROMPTS[0], 10)
        got = out.outputs[0]
        assert got.token_ids == tokens, request
        ours = [d[t].logprob for d, t in zip(got.logprobs, got.token_ids)]
        np.testing.assert_allclose(ours, logprobs, atol=2e-4)
    assert outs[0].outputs[0].token_ids != outs[2].outputs[0].token_ids  # the adapter changes the output


def test_more_adapters_than_slots_wait_and_swap(llm, adapters):
    """Three adapters, two slots, three prompts each: every output is what it is alone, and slots were reloaded."""
    alone = {name: llm.generate(PROMPTS, GREEDY, lora_request=request)
             for name, (request, _) in adapters.items()}
    loads_before = llm.engine.scheduler.adapters.num_loads
    prompts = PROMPTS * 3
    requests = [adapters[name][0] for name in adapters for _ in PROMPTS]
    order = np.random.default_rng(0).permutation(len(prompts))
    outs = llm.generate([prompts[i] for i in order], GREEDY, lora_request=[requests[i] for i in order])
    for out, i in zip(outs, order):
        expected = alone[requests[i].lora_name][i % len(PROMPTS)]
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids
    assert llm.engine.scheduler.adapters.num_loads > loads_before


def test_prefix_cache_is_kept_apart_per_adapter(llm, adapters):
    """A prompt cached under the base model is not served to an adapter's request (its K/V differ), and
    the adapter's own repeat hits its own pages."""
    request, model = adapters["all"]
    prompt = list(range(50, 98))  # three pages of 16
    with model.disable_adapter():
        base_tokens, _ = peft_greedy(model, prompt, 10)
    assert llm.generate([prompt], GREEDY)[0].outputs[0].token_ids == base_tokens
    hits = llm.engine.scheduler.prefix_hits
    tokens, _ = peft_greedy(model, prompt, 10)
    assert llm.generate([prompt], GREEDY, lora_request=request)[0].outputs[0].token_ids == tokens
    assert llm.engine.scheduler.prefix_hits == hits
    assert llm.generate([prompt], GREEDY, lora_request=request)[0].outputs[0].token_ids == tokens
    assert llm.engine.scheduler.prefix_hits > hits


def test_streams_and_chat_take_an_adapter(llm, adapters):
    request = adapters["attn"][0]
    whole = llm.generate([PROMPTS[1]], GREEDY, lora_request=request)[0].outputs[0].token_ids
    streamed = [t for delta in llm.stream(PROMPTS[1], GREEDY, lora_request=request) for t in delta.outputs[0].token_ids]
    assert streamed == whole


def test_swapping_adapters_after_warmup_compiles_nothing(checkpoint_dir, adapters):
    llm = LLM(checkpoint_dir("llama2"), enable_lora=True, max_loras=1, **KNOBS)
    llm.engine.warmup()
    counter = CompileCounter()
    counter.active = True
    for request, _ in adapters.values():
        llm.generate(PROMPTS[:2], SamplingParams(max_tokens=3, temperature=0), lora_request=request)
    counter.active = False
    assert counter.count == 0
    assert llm.engine.scheduler.adapters.num_loads == len(adapters)


def test_speculation_verifies_with_the_adapter(checkpoint_dir, adapters):
    """A draft model drafts as the base model it is; the adapted target verifies, so the output is the
    adapter's own greedy output, whatever is accepted."""
    spec = SpeculativeConfig(method="draft", draft_model=str(checkpoint_dir("qwen2")), num_speculative_tokens=3,
                             adaptive=False)
    llm = LLM(checkpoint_dir("llama2"), enable_lora=True, speculative=spec, **KNOBS)
    request, model = adapters["all"]
    repeating = [5, 6, 7, 8] * 5
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    outs = llm.generate([PROMPTS[0], repeating], params, lora_request=request)
    for out, prompt in zip(outs, [PROMPTS[0], repeating]):
        assert out.outputs[0].token_ids == peft_greedy(model, prompt, 10)[0]
    assert llm.metrics()["drafted"] > 0


MESH_RUN = """
import json
from jaxinfer import LLM, LoRARequest, SamplingParams
params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
adapter = LoRARequest("a", 1, adapter_path)
out = {}
for tp, dp in [(1, 1), (4, 2)]:
    llm = LLM(model, enable_lora=True, max_seq_len=64, max_num_seqs=4, tensor_parallel_size=tp, data_parallel_size=dp)
    outs = llm.generate(prompts, params, lora_request=[adapter, None, adapter])
    out[f"{tp}x{dp}"] = [o.outputs[0].token_ids for o in outs]
print(json.dumps(out))
"""


def test_adapters_on_a_mesh_match_one_device(tmp_path):
    """A tensor x data parallel mesh (4 x 2 fake CPU devices) serves adapters with one device's tokens."""
    model = save_hf_model("llama2", tmp_path / "m", num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=1)
    path, _ = save_adapter(model, tmp_path / "a")
    values = dict(model=str(model), adapter_path=str(path), prompts=[PROMPTS[0], PROMPTS[0], PROMPTS[2]])
    script = 'import jax\njax.config.update("jax_num_cpu_devices", 8)\n' + "".join(
        f"{k} = {v!r}\n" for k, v in values.items())
    runs = json.loads(run_python(script + MESH_RUN, kernels=False, JAX_PLATFORMS="cpu").splitlines()[-1])
    assert runs["4x2"] == runs["1x1"]
    assert runs["1x1"][0] != runs["1x1"][1]  # one prompt, with the adapter and without


@pytest.mark.parametrize("name, targets", [("phi3", ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
                                           ("gemma4", None)])
def test_fused_and_per_layer_projections_match_peft(checkpoint_dir, tmp_path, name, targets):
    """Phi-3 stores q/k/v and gate/up fused: one adapter module feeds several projections. Gemma 4's layers
    differ (its global layers' k serves as v, KV-sharing layers have no k): each layer's own projections."""
    model_dir = checkpoint_dir(name)
    path, model = save_adapter(model_dir, tmp_path / "a", targets)
    llm = LLM(model_dir, enable_lora=True, **KNOBS)
    out = llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("a", 1, str(path)))[0].outputs[0]
    tokens, logprobs = peft_greedy(model, PROMPTS[0], 10)
    assert out.token_ids == tokens
    np.testing.assert_allclose([lp[t].logprob for lp, t in zip(out.logprobs, tokens)], logprobs, atol=2e-4)


def test_adapter_slots_reuse_idle_slots_oldest_first():
    slots = AdapterSlots(2)
    assert [slots.acquire("a"), slots.acquire("b"), slots.acquire("c")] == [0, 1, None]
    assert slots.take_loads() == {0: "a", 1: "b"}
    slots.release(1)
    slots.release(0)
    assert slots.acquire("a") == 0 and slots.take_loads() == {}  # still held: no load
    assert slots.acquire("c") == 1 and slots.take_loads() == {1: "c"}  # b was idle
    assert slots.acquire("d") is None


def _edited(adapter: Path, dest: Path, **changes) -> str:
    dest.mkdir()
    for f in adapter.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    settings = json.loads((dest / "adapter_config.json").read_text())
    (dest / "adapter_config.json").write_text(json.dumps({**settings, **changes}))
    return str(dest)


def test_adapters_that_cannot_be_served_are_refused_alone(llm, adapters, checkpoint_dir, tmp_path):
    """Each refusal names what is wrong, raises before queueing, and leaves the engine serving."""
    source = Path(adapters["all"][0].lora_path)
    cases = {
        "rank r=32": _edited(source, tmp_path / "rank", r=32),
        "use_dora": _edited(source, tmp_path / "dora", use_dora=True),
        "does not exist": str(tmp_path / "missing"),
    }
    for i, (message, path) in enumerate(cases.items()):
        with pytest.raises(ValueError, match=message):
            llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest(f"bad{i}", 50 + i, path))
    llm.generate([PROMPTS[0]], SamplingParams(max_tokens=1), lora_request=adapters["all"][0])
    with pytest.raises(ValueError, match="already served from"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("all", 9, str(tmp_path / "rank")))
    with pytest.raises(ValueError, match="prompt_logprobs"):
        llm.generate([PROMPTS[0]], SamplingParams(prompt_logprobs=1), lora_request=adapters["all"][0])
    head, _ = save_adapter(checkpoint_dir("llama2"), tmp_path / "head", ["q_proj", "lm_head"])
    with pytest.raises(ValueError, match="'lm_head'.*adaptable modules: down_proj, gate_proj"):
        llm.generate([PROMPTS[0]], GREEDY, lora_request=LoRARequest("head", 60, str(head)))
    assert not llm.engine.has_unfinished()
    assert llm.generate([PROMPTS[0]], GREEDY)[0].outputs[0].token_ids  # still serving


def test_lora_knobs_are_checked(checkpoint_dir, adapters):
    model_dir = checkpoint_dir("llama2")
    with pytest.raises(ValueError, match="max_loras"):
        LLM(model_dir, enable_lora=True, max_loras=0)
    with pytest.raises(ValueError, match="batch_invariant"):
        LLM(model_dir, enable_lora=True, batch_invariant=True)
    plain = LLM(model_dir, **KNOBS)
    with pytest.raises(ValueError, match="enable_lora=True"):
        plain.generate([PROMPTS[0]], GREEDY, lora_request=adapters["all"][0])
    with pytest.raises(ValueError, match="2 lora_requests for 1 prompts"):
        plain.generate([PROMPTS[0]], GREEDY, lora_request=[None, None])
