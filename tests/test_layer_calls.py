"""Decoder layers alike share one trace: a step program holds one layer function per kind of layer."""

from __future__ import annotations

import re

import pytest
from hf_models import save_hf_model

from jaxinfer import LLM


def layer_functions(path) -> tuple[int, int]:
    """(layer functions defined, calls of them) in the lowered text of the engine's first step program."""
    llm = LLM(str(path), max_seq_len=64, max_num_seqs=2, max_num_batched_tokens=16, compile_cache=False)
    runner = llm.engine.runner
    function, args, kwargs, _ = runner.programs(llm.engine.step_hosts())[0]()
    text = function.lower(*args, **kwargs).as_text()
    defined = len(re.findall(r"func\.func private @_one_layer\w*\(", text))
    calls = len(re.findall(r"call @_one_layer\w*\(", text))
    return defined, calls


@pytest.mark.parametrize("name, kinds", [("llama3", 1), ("gemma2", 2)])
def test_one_layer_function_per_kind_of_layer(tmp_path, name, kinds):
    """Llama's layers are all alike; Gemma 2's alternate local (sliding) and global attention."""
    path = save_hf_model(name, tmp_path / name, num_hidden_layers=4)
    defined, calls = layer_functions(path)
    assert (defined, calls) == (kinds, 4)
