"""Shadow validation and automatic fallback in the server (issue 50 parts 2-3), on real servers
driven by the official `openai` client: a lossy served model falls back to the reference, lossless
n-gram speculation never does, /debug/shadow needs the key, bad flags are one line."""

from __future__ import annotations

import re
import shutil
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import uvicorn
from engine_knobs import ENGINE
from safetensors.numpy import load_file, save_file

from jaxinfer import LLM, SamplingParams, SpeculativeConfig
from jaxinfer.entrypoints.cli import main as cli_main
from jaxinfer.entrypoints.openai import ServerConfig, build_app
from jaxinfer.entrypoints.openai.shadow import ShadowRouter, optimizations, reference_kwargs
from jaxinfer.entrypoints.openai.shadow_stats import ShadowSettings

KEY = "shadow-key"
PROMPTS = ["def add(a, b):", "class Stack:", "import os\n", "x = [1, 2"]
REPEATING = ["a b c a b c a b c a b", "for i in range(10): for i in range(10):", "x = 1\nx = 1\nx = 1\n"]


def perturbed_model(source: Path, directory: Path, noise: float) -> Path:
    """The model with noise on its final norm's channels: the logits change (the lossy B of
    test_compare.py's broken configurations, with no option in the engine)."""
    shutil.copytree(source, directory)
    tensors = load_file(str(directory / "model.safetensors"))
    norm = tensors["model.norm.weight"]
    factor = 1.0 + noise * np.random.default_rng(0).standard_normal(norm.shape)
    tensors["model.norm.weight"] = (norm.astype(np.float32) * factor).astype(norm.dtype)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory


def serve(llm: LLM, router: ShadowRouter):
    """A uvicorn server over build_app on a free port, in a thread; yields its base URL and the router."""
    app = build_app(llm, ServerConfig("tiny", api_key=KEY), router)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", router
    server.should_exit = True
    thread.join(timeout=30)


def metrics(base_url: str) -> dict[str, float]:
    values = {}
    # /metrics sits behind the key like every route but /health (--metrics-without-key opens it)
    for line in httpx.get(base_url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text.splitlines():
        match = re.match(r"^(jaxinfer:[^ ]+) ([0-9.e+-]+|NaN)$", line)
        if match:
            values[match.group(1)] = float(match.group(2))
    return values


def debug(base_url: str) -> dict:
    response = httpx.get(base_url + "/debug/shadow", headers={"Authorization": f"Bearer {KEY}"})
    assert response.status_code == 200, response.text
    return response.json()


def wait_for_shadows(base_url: str, count: int) -> dict:
    """/debug/shadow once `count` shadow requests were scored (they run after their requests finish)."""
    deadline = time.monotonic() + 120
    while (state := debug(base_url))["counts"]["requests"] < count:
        assert time.monotonic() < deadline and not state["counts"]["errors"], state
        time.sleep(0.1)
    return state


def complete(client: openai.OpenAI, prompt: str, max_tokens: int = 12) -> str:
    out = client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    extra_body={"ignore_eos": True})
    return out.choices[0].text


def greedy(max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(text_model_dir):
    """The reference configuration as its own LLM: what outputs after a fallback must equal."""
    return LLM(text_model_dir, **ENGINE)


@pytest.fixture(scope="module")
def lossy(text_model_dir, tmp_path_factory):
    """A server on a perturbed copy of the model, shadowed (every request) on the real one."""
    model = perturbed_model(text_model_dir, tmp_path_factory.mktemp("lossy") / "model", 1.0)
    served_kwargs = {"model": str(model), **ENGINE}
    llm = LLM(**served_kwargs)
    settings = ShadowSettings(1.0, {"model": str(text_model_dir)}, min_agreement=0.9, window=2, seed=0)
    router = ShadowRouter(llm, served_kwargs, settings)
    yield from serve(llm, router)


def test_a_lossy_model_falls_back_to_the_reference(lossy, reference):
    lossy, _ = lossy
    client = openai.OpenAI(base_url=lossy + "/v1", api_key=KEY, max_retries=0, timeout=60)
    expected = [o.text for o in reference.generate(PROMPTS, greedy())]
    served = [complete(client, p) for p in PROMPTS[:2]]
    assert served != expected[:2]  # the perturbation shows in greedy outputs
    state = wait_for_shadows(lossy, 2)
    assert state["optimizations"] == {"model": "numerics", "prefix_caching": "lossless"}
    assert not state["reference_shares_weights"] and state["routed_to_reference"]
    assert state["fallbacks"]["model"]["cause"] == state["fallbacks"]["prefix_caching"]["cause"] == "low_agreement"
    mismatch = state["mismatches"][0]
    assert mismatch["output"] != mismatch["reference_output"] and mismatch["kl_mean"] > 0
    assert mismatch["first_divergence"] < 12 and mismatch["prompt"] == PROMPTS[0]
    values = metrics(lossy)
    assert values["jaxinfer:shadow_requests_total"] == 2 and values["jaxinfer:shadow_mismatches_total"] >= 1
    agreement = values['jaxinfer:shadow_agreement_sum{kind="greedy"}'] / values['jaxinfer:shadow_agreement_count{kind="greedy"}']
    assert agreement < 0.9 and values["jaxinfer:shadow_kl_count"] == 2
    assert values['jaxinfer:fallback_active{optimization="model"}'] == 1
    assert values['jaxinfer:fallback_cause{cause="low_agreement",optimization="model"}'] == 1
    # From now on the reference serves: greedy outputs equal the reference LLM's, and nothing is shadowed.
    assert [complete(client, p) for p in PROMPTS] == expected
    assert debug(lossy)["counts"]["requests"] == 2


def test_debug_shadow_needs_the_key(lossy):
    lossy, _ = lossy
    assert httpx.get(lossy + "/debug/shadow").status_code == 401
    assert httpx.get(lossy + "/debug/shadow", headers={"Authorization": "Bearer wrong"}).status_code == 401
    # /metrics too, unless --metrics-without-key (issue 47: every route but /health behind the key)
    assert httpx.get(lossy + "/metrics").status_code == 401
    assert httpx.get(lossy + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def lossless_kwargs(model: Path) -> dict:
    """n-gram drafts on every step (not adaptive), so it speculates whatever it costs."""
    return {"model": str(model), **ENGINE,
            "speculative": SpeculativeConfig(method="ngram", num_speculative_tokens=3, adaptive=False)}


@pytest.fixture(scope="module")
def lossless(text_model_dir):
    """A server speculating, shadowed on its own weights."""
    served_kwargs = lossless_kwargs(text_model_dir)
    llm = LLM(**served_kwargs)
    router = ShadowRouter(llm, served_kwargs, ShadowSettings(1.0, window=2, seed=0))
    yield from serve(llm, router)


def test_lossless_speculation_never_falls_back(lossless, reference):
    lossless, _ = lossless
    client = openai.OpenAI(base_url=lossless + "/v1", api_key=KEY, max_retries=0, timeout=60)
    prompts = REPEATING + PROMPTS[:2]
    served = [complete(client, p, 16) for p in prompts]
    assert served == [o.text for o in reference.generate(prompts, greedy(16))]
    state = wait_for_shadows(lossless, len(prompts))
    assert state["optimizations"] == {"speculation": "lossless", "prefix_caching": "lossless"}
    assert state["reference_shares_weights"] and not state["routed_to_reference"]
    assert state["counts"]["mismatches"] == 0 and state["fallbacks"] == {"speculation": None, "prefix_caching": None}
    values = metrics(lossless)
    assert values["jaxinfer:spec_decode_num_accepted_tokens_total"] > 0  # it did speculate
    assert values['jaxinfer:fallback_active{optimization="speculation"}'] == 0
    assert values['jaxinfer:shadow_agreement_sum{kind="greedy"}'] == values["jaxinfer:shadow_requests_total"] == 5
    assert "jaxinfer:shadow_kl_count" in values and values["jaxinfer:shadow_kl_count"] == 0  # same weights: no KL


def test_a_client_that_disconnects_aborts_through_the_router(lossless):
    lossless, router = lossless
    before = debug(lossless)["counts"]["requests"]
    body = {"prompt": "def add", "max_tokens": 90, "temperature": 0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", lossless + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}) as r:
        assert next(line for line in r.iter_lines() if line.startswith("data: "))
    deadline = time.monotonic() + 30
    while (m := metrics(lossless))["jaxinfer:num_requests_running"] or m["jaxinfer:kv_cache_usage_perc"]:
        assert time.monotonic() < deadline, m
        time.sleep(0.1)
    assert m.get('jaxinfer:request_success_total{finished_reason="abort"}', 0) >= 1
    assert debug(lossless)["counts"]["requests"] == before and not router.pending  # an aborted request is not shadowed


def test_a_request_past_its_timeout_is_a_504_and_no_optimizations_failure(lossless):
    """A timeout through the router aborts the request as on the engine, and speculation stays on: the
    client's deadline says nothing about the optimization (before the draft test turns it off)."""
    lossless, _ = lossless
    body = {"prompt": "def add", "max_tokens": 90, "temperature": 0, "ignore_eos": True, "timeout": 0.001}
    response = httpx.post(lossless + "/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"},
                          timeout=60)
    assert response.status_code == 504 and response.json()["error"]["param"] == "timeout", response.text
    deadline = time.monotonic() + 30
    while (m := metrics(lossless))["jaxinfer:num_requests_running"] or m["jaxinfer:kv_cache_usage_perc"]:
        assert time.monotonic() < deadline, m
        time.sleep(0.1)
    assert m['jaxinfer:fallback_active{optimization="speculation"}'] == 0


def test_a_draft_that_raises_turns_speculation_off_and_serving_goes_on(lossless, reference, monkeypatch):
    lossless, router = lossless
    client = openai.OpenAI(base_url=lossless + "/v1", api_key=KEY, max_retries=0, timeout=60)

    def broken(*args, **kwargs):
        raise RuntimeError("draft exploded")

    monkeypatch.setattr("jaxinfer.engine.speculation.ngram_draft", broken)
    with pytest.raises(openai.InternalServerError):
        complete(client, REPEATING[0], 16)
    state = debug(lossless)
    assert state["fallbacks"]["speculation"]["cause"] == "error"
    assert "draft exploded" in state["fallbacks"]["speculation"]["reason"]
    assert metrics(lossless)['jaxinfer:fallback_active{optimization="speculation"}'] == 1
    # The next requests are served, plainly, and still equal the reference's.
    assert complete(client, REPEATING[1], 16) == reference.generate([REPEATING[1]], greedy(16))[0].text
    # Without shadowing the router still turns a failing speculation off (no reference is loaded).
    bare = ShadowRouter(router.llm, lossless_kwargs(router.llm.model_dir), ShadowSettings(0.0))
    assert bare.reference is None and bare.optimizations == {"speculation": "lossless"}
    router.fallbacks.active.clear()  # switched back by hand for the next test
    router.llm.engine.speculator.disabled_reason = None
    router.llm.engine.blocks.prefix_caching = True


def test_a_greedy_mismatch_turns_speculation_off_in_the_engine(lossless, monkeypatch, caplog):
    """A lossless optimization that disagrees once is switched off: here the reference is made to
    disagree (its engine's outputs shifted), which the router cannot tell from a broken draft."""
    lossless, router = lossless
    real = router._reference_output

    async def shifted(prompt, params, request_id):
        return [(t + 1) % 300 for t in await real(prompt, params, request_id)]

    monkeypatch.setattr(router, "_reference_output", shifted)
    client = openai.OpenAI(base_url=lossless + "/v1", api_key=KEY, max_retries=0, timeout=60)
    before = debug(lossless)["counts"]["requests"]
    complete(client, REPEATING[0], 16)
    state = wait_for_shadows(lossless, before + 1)
    assert state["fallbacks"]["speculation"]["cause"] == "shadow_mismatch"
    assert state["fallbacks"]["prefix_caching"]["cause"] == "shadow_mismatch"
    engine = router.llm.engine  # both switched off in the served engine: no routing for lossless ones
    assert engine.speculator.disabled_reason is not None and not engine.blocks.prefix_caching and not router.routed
    assert "fallback to the reference" in caplog.text
    drafts = metrics(lossless)["jaxinfer:spec_decode_num_draft_tokens_total"]
    complete(client, REPEATING[0], 16)
    values = metrics(lossless)
    assert values["jaxinfer:spec_decode_num_draft_tokens_total"] == drafts  # no more drafting
    assert values['jaxinfer:fallback_active{optimization="speculation"}'] == 1


def test_optimizations_and_the_reference_follow_the_served_settings():
    served = {"model": "m", "quantization": "int8", "speculative": SpeculativeConfig(method="ngram"), "max_num_seqs": 4}
    ref = reference_kwargs(served, {"dtype": "bfloat16"})
    assert ref["quantization"] is None and ref["speculative"] is None and ref["dtype"] == "bfloat16"
    assert ref["max_num_seqs"] == 4 and ref["enable_prefix_caching"] is False
    assert optimizations(served, ref) == {"quantization": "int8", "speculation": "lossless",
                                          "prefix_caching": "lossless", "dtype": "numerics"}
    assert optimizations({"kv_cache_dtype": "fp8"}, reference_kwargs({"kv_cache_dtype": "fp8"}, {})) == {
        "kv_cache_dtype": "kv_fp8", "prefix_caching": "lossless"}


@pytest.mark.parametrize("flags, flag", [
    (["--shadow-fraction", "1.5"], "--shadow-fraction"),
    (["--shadow-fraction", "x"], "--shadow-fraction"),
    (["--shadow-fraction", "0.5", "--shadow-config", "colour=red"], "--shadow-config"),
    (["--shadow-fraction", "0.5", "--shadow-config", "dtype"], "--shadow-config"),
    (["--shadow-config", "dtype=float32"], "--shadow-fraction"),
    (["--shadow-fraction", "0.5", "--shadow-window", "0"], "--shadow-window"),
    (["--shadow-fraction", "0.5", "--shadow-min-agreement", "2"], "--shadow-min-agreement"),
])
def test_bad_shadow_flags_are_one_line_naming_the_flag(flags, flag, capsys):
    assert cli_main(["serve", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and flag in err, err
