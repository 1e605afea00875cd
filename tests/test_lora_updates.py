"""Adapters loaded and removed while the engine serves (vLLM's add_lora / remove_lora / list_loras):
a name removed and loaded again from another directory never meets the old one's slot or cached
prefix, and requests running with a removed adapter finish with it."""

from __future__ import annotations

import pytest

pytest.importorskip("peft", reason="the test adapters are made by peft (pip install -e '.[test]')")
from lora_adapters import save_adapter  # noqa: E402

from jaxinfer import LLM, LoRARequest, SamplingParams  # noqa: E402
from jaxinfer.engine.adapter_slots import AdapterSlots  # noqa: E402

KNOBS = dict(dtype="float32", max_seq_len=128, num_pages=48, max_num_seqs=8, max_num_batched_tokens=64)
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPT = list(range(50, 98))  # three full pages of 16: cached when a request finishes


@pytest.fixture(scope="module")
def paths(checkpoint_dir, tmp_path_factory) -> dict[str, str]:
    model_dir = checkpoint_dir("llama2")
    root = tmp_path_factory.mktemp("lora_updates")
    return {name: str(save_adapter(model_dir, root / name, seed=seed)[0]) for name, seed in (("a", 1), ("b", 5))}


@pytest.fixture(scope="module")
def llm(checkpoint_dir) -> LLM:
    return LLM(checkpoint_dir("llama2"), enable_lora=True, max_loras=2, **KNOBS)


def tokens(llm: LLM, adapter: LoRARequest | None) -> list[int]:
    return llm.generate([PROMPT], GREEDY, lora_request=adapter)[0].outputs[0].token_ids


def test_a_name_loaded_again_from_another_directory_serves_the_new_adapter(llm, paths):
    engine = llm.engine
    b_alone = tokens(llm, LoRARequest("reference-b", 9, paths["b"]))
    assert engine.add_lora(LoRARequest("x", 1, paths["a"])) and engine.list_loras() == {1, 9}
    a_tokens = tokens(llm, LoRARequest("x", 1, paths["a"]))  # leaves x's prompt pages in the prefix cache
    assert a_tokens != b_alone
    assert engine.remove_lora("x") and not engine.remove_lora("x") and engine.list_loras() == {9}
    assert engine.remove_lora(9) and engine.list_loras() == set()  # by lora_int_id too
    hits = engine.scheduler.prefix_hits
    assert tokens(llm, LoRARequest("x", 2, paths["b"])) == b_alone
    assert engine.scheduler.prefix_hits == hits  # the old x's pages are not x's any more
    assert tokens(llm, LoRARequest("x", 2, paths["b"])) == b_alone
    assert engine.scheduler.prefix_hits > hits  # the new x's own are
    engine.remove_lora("x")


def test_requests_running_with_a_removed_adapter_finish_with_it(llm, paths):
    engine = llm.engine
    expected = tokens(llm, LoRARequest("ref-a", 3, paths["a"]))
    engine.remove_lora("ref-a")
    engine.add_request("running", PROMPT, GREEDY, final_only=True, lora_request=LoRARequest("y", 4, paths["a"]))
    engine.step()
    engine.step()
    assert engine.remove_lora("y")
    store = engine.runner.adapters
    assert len(store.retired) == 1  # kept while its request runs
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    assert [o.outputs[0].token_ids for o in outputs if o.finished] == [expected]
    assert not store.retired and not store.known  # dropped once its last request finished
    assert engine.scheduler.adapters.held.count(None) >= 1  # its slot emptied


def test_removing_without_adapters_enabled_is_refused(checkpoint_dir):
    llm = LLM(checkpoint_dir("llama2"), **KNOBS)
    with pytest.raises(ValueError, match="enable_lora=True"):
        llm.engine.remove_lora("x")


def test_a_forgotten_slot_is_free_for_the_next_adapter():
    slots = AdapterSlots(2)
    assert [slots.acquire("a#1"), slots.acquire("b#2")] == [0, 1] and slots.take_loads() == {0: "a#1", 1: "b#2"}
    slots.release(0)
    slots.forget("a#1")
    slots.forget("b#2")  # still in use: kept
    assert slots.held == [None, "b#2"]
    assert slots.acquire("c#3") == 0 and slots.take_loads() == {0: "c#3"}
