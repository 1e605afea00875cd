"""vLLM's speculative_config (`LLM(speculative_config={...})`, `serve --speculative-config '{...}'`) read into a
SpeculativeConfig: its keys renamed, its method names mapped, what cannot be served refused by name.
(test_engine_speculation runs an engine set up this way.)"""

from __future__ import annotations

import argparse
import json
import re

import pytest

from jaxinfer import SpeculativeConfig
from jaxinfer.entrypoints.openai.launch import speculative_config
from jaxinfer.entrypoints.openai.serve_flags import add_speculative_args
from jaxinfer.speculative.vllm_config import from_vllm, speculative_setting


def test_vllm_keys_and_method_names_read_as_ours():
    ngram = from_vllm({"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2})
    assert ngram == SpeculativeConfig(method="ngram", num_speculative_tokens=5, ngram_max=4, ngram_min=2)
    suffix = from_vllm({"method": "suffix", "suffix_decoding_max_tree_depth": 8, "suffix_decoding_min_token_prob": 0.2,
                        "suffix_decoding_max_cached_requests": 7, "suffix_decoding_max_spec_factor": 2.0})
    assert suffix == SpeculativeConfig(method="suffix", suffix_max_depth=8, suffix_min_token_prob=0.2,
                                       suffix_max_cached_requests=7, suffix_max_spec_factor=2.0)
    assert from_vllm({"method": "draft_model", "model": "/m/draft"}) == SpeculativeConfig("draft", "/m/draft")
    assert from_vllm({"method": "eagle3", "model": "/m/head"}).method == "eagle"
    assert [from_vllm({"method": m}).method for m in ("mtp", "deepseek_mtp", "glm4_moe_mtp")] == ["mtp"] * 3
    # No method: vLLM's guess from the draft's name.
    assert [from_vllm({"model": m}).method for m in ("/m/EAGLE3-LLaMA3.1", "/m/qwen-0.5b")] == ["eagle", "draft"]
    # Our own names are accepted too, and the inert keys at the values that change nothing.
    assert from_vllm({"method": "ngram", "ngram_max": 5, "adaptive": False, "draft_tensor_parallel_size": 1,
                      "quantization": None}) == SpeculativeConfig(method="ngram", ngram_max=5, adaptive=False)
    assert speculative_setting(None, {"method": "ngram"}) == speculative_setting({"method": "ngram"}, None)
    assert speculative_setting(None, None) is None


@pytest.mark.parametrize("settings, message", [
    ({"method": "ngram", "prompt_lookup_maximum": 4}, "unknown key 'prompt_lookup_maximum'; accepted: acceptance"),
    ({"method": "ngram", "prompt_lookup_max": 4, "ngram_max": 3}, "ngram_max=3 and prompt_lookup_max=4 are one"),
    ({"model": "/m/d", "draft_tensor_parallel_size": 2}, "draft_tensor_parallel_size=2 is not served (the draft "
                                                         "runs on the target's devices"),
    ({"method": "ngram", "quantization": "fp8"}, "quantization='fp8' is not served"),
    ({"num_speculative_tokens": 3}, "give a 'method' (ngram, suffix, draft_model"),
    ({"method": "medusa", "model": "/m/h"}, "speculative_config: method must be one of draft, ngram"),
    ({"method": "ngram", "num_speculative_tokens": 40}, "num_speculative_tokens must be in [1, 32], got 40"),
])
def test_what_cannot_be_served_is_refused_by_name(settings, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        from_vllm(settings)


def test_one_setting_under_two_names_and_wrong_types_are_refused():
    with pytest.raises(ValueError, match="speculative and speculative_config are one setting"):
        speculative_setting(SpeculativeConfig(method="ngram"), {"method": "ngram"})
    with pytest.raises(TypeError, match="speculative must be a dict of vLLM's speculative_config keys or a "
                                        "SpeculativeConfig, got str"):
        speculative_setting("ngram", None)


def _serve_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_speculative_args(parser)
    return parser.parse_args(list(flags))


def test_serve_takes_vllms_flag_or_ours_not_both():
    text = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 5})
    assert speculative_config(_serve_args("--speculative-config", text)) == SpeculativeConfig(
        method="ngram", num_speculative_tokens=2, ngram_max=5)
    assert speculative_config(_serve_args("--speculative-method", "suffix")) == SpeculativeConfig(method="suffix")
    assert speculative_config(_serve_args()) is None
    for flags, message in [(("--speculative-config", "{method: ngram}"), "--speculative-config must be a JSON object"),
                           (("--speculative-config", '["ngram"]'), "--speculative-config must be a JSON object such"),
                           (("--speculative-config", '{"method": "ngram", "k": 2}'), "--speculative-config: unknown "
                                                                                   "key 'k'"),
                           (("--speculative-config", text, "--speculative-method", "ngram"), "give it alone")]:
        with pytest.raises(ValueError, match=message):
            speculative_config(_serve_args(*flags))
