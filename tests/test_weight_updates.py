"""New weights in a running LLM (`update_weights`, `update_weights_from_disk`) and sleep mode.

Each updated engine must decode exactly as a fresh LLM loaded from a checkpoint of the new
weights does (greedy tokens), without compiling a step program; sleeping must free the weights
and the pool and refuse requests until they are back.
"""

from __future__ import annotations

from pathlib import Path

import jax
import pytest
import torch
from transformers import AutoModelForCausalLM

from jaxinfer import DEMO_EAGLE, DEMO_MODEL, LLM, LoRARequest, SamplingParams, SpeculativeConfig
from jaxinfer.config.errors import CheckpointError
from jaxinfer.models.lora_weight import adapter_factors

KNOBS = dict(max_seq_len=64, num_pages=32, max_num_seqs=4, max_num_batched_tokens=64)
GREEDY = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
PROMPTS = [list(range(5, 40)), list(range(60, 71))]


@pytest.fixture(scope="module")
def trained(checkpoint_dir, tmp_path_factory) -> tuple[dict[str, torch.Tensor], Path]:
    """(state dict, saved directory) of the tiny llama2 checkpoint's weights after a 'training step'."""
    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir("llama2"), dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("trained")
    model.save_pretrained(path)
    return model.state_dict(), path


def tokens(llm: LLM) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY)]


def step_compiles(llm: LLM) -> int:
    """Generate, counting the programs compiled meanwhile."""
    before = llm.engine.runner.compiled_programs()
    tokens(llm)
    return llm.engine.runner.compiled_programs() - before


@pytest.fixture(scope="module")
def expected(trained) -> dict[str, list[list[int]]]:
    """Greedy tokens of fresh LLMs on the trained checkpoint, float32 and int8."""
    return {q: tokens(LLM(trained[1], dtype="float32", quantization=q, **KNOBS)) for q in (None, "int8")}


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_update_from_named_tensors_in_buckets_decodes_as_a_fresh_load(checkpoint_dir, trained, expected, quantization):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", quantization=quantization, **KNOBS)
    before = tokens(llm)
    assert before != expected[quantization]
    state = {n: t.clone() for n, t in trained[0].items()}  # a trainer's tensors, written to after the update
    layer0 = {n: t for n, t in state.items() if ".layers.0." in n}
    llm.update_weights(list(layer0.items()))  # one bucket, as (name, tensor) pairs
    assert tokens(llm) not in (before, expected[quantization])  # half new, half old
    llm.update_weights({n: t for n, t in state.items() if n not in layer0})
    for t in state.values():
        t.zero_()  # the served weights are copies
    assert step_compiles(llm) == 0  # float values quantized as served: the programs run them as they are
    assert tokens(llm) == expected[quantization]
    llm.update_weights_from_disk(checkpoint_dir("llama2"))
    assert tokens(llm) == before


def test_update_from_a_pytree_and_the_prefix_cache_forgotten(checkpoint_dir, trained, expected):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", **KNOBS)
    tokens(llm)  # leaves the prompts' full pages cached
    hits = llm.engine.scheduler.prefix_hits
    given = LLM(trained[1], dtype="float32", **KNOBS).weights
    llm.update_weights(given)
    assert tokens(llm) == expected[None]
    assert not any(x.is_deleted() for x in jax.tree.leaves(given))  # the caller's arrays stay its own
    assert llm.engine.scheduler.prefix_hits == hits  # K/V of the old weights never served


def test_bad_updates_are_refused_by_name(checkpoint_dir, trained):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", **KNOBS)
    state = trained[0]
    q = "model.layers.1.self_attn.q_proj.weight"
    with pytest.raises(CheckpointError, match="not weights of this model.*model.layers.9.mlp"):
        llm.update_weights({"model.layers.9.mlp.up_proj.weight": state[q]})
    with pytest.raises(CheckpointError, match=f"tensor {q} has shape"):
        llm.update_weights({q: state[q][:, :4]})
    with pytest.raises(ValueError, match=r"weights\['embed'\] has shape"):
        llm.update_weights(jax.tree.map(lambda x: x[:3] if x.shape == llm.weights.embed.shape else x, llm.weights))
    llm.engine.add_request("running", PROMPTS[0], GREEDY)
    with pytest.raises(RuntimeError, match="1 request.* in flight"):
        llm.update_weights({q: state[q]})


def test_sleep_frees_the_weights_and_pool_and_wakes_decoding_as_before(checkpoint_dir, trained, expected):
    llm = LLM(checkpoint_dir("llama2"), dtype="float32", **KNOBS)
    before = tokens(llm)
    held = jax.tree.leaves(llm._run_weights)
    llm.sleep(level=1)
    assert llm.is_sleeping and all(x.is_deleted() for x in held) and llm.engine.runner.pages is None
    with pytest.raises(RuntimeError, match="asleep"):
        llm.generate(PROMPTS, GREEDY)
    with pytest.raises(RuntimeError, match="wake_up"):
        llm.update_weights_from_disk(trained[1])
    llm.wake_up()
    assert not llm.is_sleeping and step_compiles(llm) == 0
    assert tokens(llm) == before
    llm.sleep(level=2)
    llm.wake_up()
    with pytest.raises(RuntimeError, match="discarded the weights"):
        llm.generate(PROMPTS, GREEDY)
    with pytest.raises(ValueError, match="needs all of them"):
        llm.update_weights({n: t for n, t in trained[0].items() if ".layers.0." in n})
    llm.update_weights_from_disk(trained[1])
    assert tokens(llm) == expected[None]
    with pytest.raises(ValueError, match="level must be 1"):
        llm.sleep(level=3)


def test_an_eagle_head_reads_the_new_embedding_and_head(trained):
    spec = SpeculativeConfig(method="eagle", draft_model=str(DEMO_EAGLE), num_speculative_tokens=2)
    llm = LLM(DEMO_MODEL, dtype="float32", speculative=spec, **KNOBS)
    for change in (lambda: llm.update_weights_from_disk(DEMO_MODEL), lambda: (llm.sleep(1), llm.wake_up())):
        change()
        params = llm.engine.runner.draft_weights
        assert params.embed is llm._run_weights.embed and params.lm_head is llm._run_weights.lm_head


def test_lora_slots_keep_their_adapters(checkpoint_dir, trained, tmp_path):
    pytest.importorskip("peft", reason="the test adapter is made by peft (pip install -e '.[test]')")
    from lora_adapters import save_adapter

    llm = LLM(checkpoint_dir("llama2"), dtype="float32", enable_lora=True, **KNOBS)
    llm.engine.add_lora(LoRARequest("a", 1, str(save_adapter(checkpoint_dir("llama2"), tmp_path / "a", seed=1)[0])))
    factors = adapter_factors(llm.engine.runner.weights)
    llm.update_weights(trained[0])
    assert all(new is old for new, old in zip(adapter_factors(llm.engine.runner.weights), factors, strict=True))
