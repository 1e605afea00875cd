"""Embeddings (`LLM(runner="pooling")`, `LLM.embed`, POST /v1/embeddings): pooled final hidden states
against HF transformers' `AutoModel` on the same weights (a causal LM read without its head, and a
base model saved alone), batches against single prompts, the sentence-transformers and Matryoshka
settings, and the server through the official `openai` client."""

from __future__ import annotations

import base64
import json
import shutil

import numpy as np
import openai
import pytest
import torch
import transformers
from hf_models import make_hf_model

from jaxinfer import LLM, PoolingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.config.pooler import PoolerConfig, resolve_pooler

PROMPTS = [[1, 5, 9, 33, 71, 100, 4, 8], [7], list(range(3, 90))]  # 87 > 64: a second length bucket


def save_base_model(name: str, path):
    """A tiny causal LM's decoder saved alone, as embedding models ship (`Qwen3Model`: no head, no `model.`)."""
    make_hf_model(name).model.save_pretrained(path, safe_serialization=True)
    return path


def hf_embedding(model: torch.nn.Module, ids: list[int], pooling: str, normalize: bool) -> np.ndarray:
    """HF AutoModel's last hidden state (after the final norm) of the prompt, pooled as jaxinfer pools it."""
    with torch.no_grad():
        hidden = model(torch.tensor([ids])).last_hidden_state[0].double().numpy()
    vector = {"last": hidden[-1], "cls": hidden[0], "mean": hidden.mean(axis=0)}[pooling]
    return vector / np.linalg.norm(vector) if normalize else vector


@pytest.fixture(scope="module", params=["llama2", "qwen3_base"])
def pair(request, checkpoint_dir, tmp_path_factory):
    """(pooling LLM, HF AutoModel) of a Llama causal LM with an untied head (not read), or a Qwen3Model saved
    alone; 128 tokens a pass, so 8-, 1- and 87-token prompts take two passes of 64 and one of 128."""
    if request.param == "qwen3_base":
        path = save_base_model("qwen3", tmp_path_factory.mktemp("qwen3_base"))
        assert json.loads((path / "config.json").read_text())["architectures"] == ["Qwen3Model"]
    else:
        path = checkpoint_dir(request.param)
    hf = transformers.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    llm = LLM(path, dtype="float32", max_seq_len=128, max_num_batched_tokens=128, runner="pooling")
    return llm, hf


@pytest.mark.parametrize("pooling, normalize", [("last", True), ("mean", False), ("CLS", True)])
def test_embeddings_match_hf_last_hidden_state(pair, pooling, normalize):
    llm, hf = pair
    outs = llm.embed(PROMPTS, pooling=pooling, normalize=normalize)
    assert [o.prompt_token_ids for o in outs] == PROMPTS and [o.request_id for o in outs] == ["0", "1", "2"]
    for out, ids in zip(outs, PROMPTS):
        expected = hf_embedding(hf, ids, pooling.lower(), normalize)
        assert out.outputs.hidden_size == hf.config.hidden_size
        np.testing.assert_allclose(out.outputs.embedding, expected, atol=1e-5)  # measured <= 2.4e-6


def test_a_prompt_embeds_the_same_alone_and_in_batches_of_other_lengths(pair):
    llm, _ = pair
    prompts = [[9, 8, 7], *PROMPTS, list(range(10, 130)), [4] * 40]  # lengths 3, 8, 1, 87, 120, 40
    together = np.array([o.outputs.embedding for o in llm.embed(prompts)])
    alone = np.array([llm.embed([p])[0].outputs.embedding for p in prompts])
    np.testing.assert_allclose(together, alone, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-6)


def test_encode_is_vllms_pooling_call(pair):
    """`LLM.encode(pooling_task="embed")` gives what `embed` gives, as NumPy rows; PoolingParams' fields reach
    it; the task is required and the per-token ones are refused by name, as are bad params."""
    llm, _ = pair
    pooled = llm.encode(PROMPTS, pooling_task="embed")
    embedded = llm.embed(PROMPTS, normalize=False)
    assert [o.prompt_token_ids for o in pooled] == PROMPTS and pooled[0].outputs.data.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm([o.outputs.data for o in pooled], axis=1), 1.0, atol=1e-6)
    raw = llm.encode(PROMPTS, PoolingParams(normalize=False), pooling_task="embed")
    np.testing.assert_allclose([o.outputs.data for o in raw], [o.outputs.embedding for o in embedded], atol=1e-6)
    with pytest.raises(ValueError, match="pooling_task must be one of embed, classify .* got None"):
        llm.encode(PROMPTS)
    with pytest.raises(ValueError, match="pooling_task 'token_embed' .* is not supported"):
        llm.encode(PROMPTS, pooling_task="token_embed")
    with pytest.raises(ValueError, match="pooling_task 'classify' needs a \\*ForSequenceClassification"):
        llm.encode(PROMPTS, pooling_task="classify")
    with pytest.raises(ValueError, match="PoolingParams.dimensions must be a positive int or None, got 0"):
        PoolingParams(dimensions=0)
    with pytest.raises(ValueError, match="dimensions 16 is not supported by this model"):
        llm.encode(PROMPTS, PoolingParams(dimensions=16), pooling_task="embed")


def test_a_pooling_model_refuses_generation_and_bad_arguments_by_name(pair):
    llm, _ = pair
    assert llm.runner_type == "pooling"
    with pytest.raises(ValueError, match="LLM.generate generates, and this LLM was started with runner='pooling'"):
        llm.generate([[1, 2]])
    with pytest.raises(ValueError, match=r"pooling must be one of last, mean, cls \(any case\), got 'max'"):
        llm.embed([[1, 2]], pooling="max")
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.embed([[]])
    with pytest.raises(ValueError, match="exceeds max_seq_len 128"):
        llm.embed([list(range(3, 140))])
    with pytest.raises(ValueError, match="dimensions 16 is not supported by this model: it is not a Matryoshka"):
        llm.embed([[1, 2]], dimensions=16)


def test_runner_auto_pools_a_base_model_and_generate_is_refused(tmp_path):
    path = save_base_model("llama2", tmp_path)  # LlamaModel
    llm = LLM(path, dtype="float32", max_seq_len=64)
    assert llm.runner_type == "pooling" and llm.weights.lm_head is None
    with pytest.raises(ConfigError, match="runner='generate' needs an output head, and .* names LlamaModel"):
        LLM(path, runner="generate")
    with pytest.raises(ValueError, match="runner must be one of auto, generate, pooling, got 'embed'"):
        LLM(path, runner="embed")
    with pytest.raises(ValueError, match="speculative decodes faster, and runner='pooling' does not decode"):
        LLM(path, speculative=object())


def write_sentence_transformers(path, mode: str, normalize: bool) -> None:
    """modules.json and 1_Pooling/config.json as sentence-transformers saves them."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    modes = ["cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken"]
    settings = {"word_embedding_dimension": 64, **{f"pooling_mode_{m}": m == mode for m in modes}}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(settings))


def test_pooler_settings_come_from_pooler_config_then_sentence_transformers_then_defaults(tmp_path):
    default = resolve_pooler(tmp_path, {}, PoolerConfig.of(None), 64)
    assert (default.pooling, default.normalize, default.matryoshka) == ("last", True, False)
    write_sentence_transformers(tmp_path, "mean_tokens", normalize=False)
    pooler = resolve_pooler(tmp_path, {"matryoshka_dimensions": [16, 32]}, PoolerConfig(), 64)
    assert (pooler.pooling, pooler.normalize, pooler.matryoshka_dimensions) == ("mean", False, (16, 32))
    chosen = resolve_pooler(tmp_path, {"is_matryoshka": True}, PoolerConfig.of({"pooling_type": "CLS"}), 64)
    assert (chosen.pooling, chosen.normalize, chosen.check_dimensions(40)) == ("cls", False, 40)
    with pytest.raises(ValueError, match=r"dimensions must be an integer in \[1, 64\], got 65"):
        chosen.check_dimensions(65)
    with pytest.raises(ValueError, match=r"dimensions must be one of this model's matryoshka_dimensions \[16, 32\]"):
        pooler.check_dimensions(24)
    write_sentence_transformers(tmp_path, "max_tokens", normalize=True)
    with pytest.raises(ConfigError, match=r"turns on pooling modes \['pooling_mode_max_tokens'\]; jaxinfer pools"):
        resolve_pooler(tmp_path, {}, PoolerConfig(), 64)
    with pytest.raises(ValueError, match="pooler_config has unknown field.*'pooling'.*accepted: pooling_type"):
        PoolerConfig.of({"pooling": "MEAN"})
    with pytest.raises(ValueError, match="pooler_config.pooling_type must be one of last, mean, cls"):
        PoolerConfig("MAX")


@pytest.fixture(scope="module")
def served_embedding_model(text_model_dir, tmp_path_factory):
    """(LLM, openai client) of the tiny text model started for embeddings and served as "tiny-embed": a
    sentence-transformers directory pooling the mean, normalized, Matryoshka lengths 16 and 32."""
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    path = tmp_path_factory.mktemp("embed_model")
    shutil.copytree(text_model_dir, path, dirs_exist_ok=True)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "matryoshka_dimensions": [16, 32]}))
    write_sentence_transformers(path, "mean_tokens", normalize=True)
    llm = LLM(path, dtype="float32", max_seq_len=64, runner="pooling")
    with serve_in_thread(llm, ServerConfig("tiny-embed")) as (url, _):
        yield llm, openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)


def test_server_embeddings_through_the_openai_client(served_embedding_model, served_text_model):
    llm, client = served_embedding_model
    assert (llm.pooler.pooling, llm.pooler.normalize) == ("mean", True)
    texts = ["def add(a, b):", "import os", "for i in range(10):"]
    expected = np.array([o.outputs.embedding for o in llm.embed(texts)])
    reply = client.embeddings.create(model="tiny-embed", input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in reply.data] == [0, 1, 2] and reply.model == "tiny-embed"
    np.testing.assert_allclose([d.embedding for d in reply.data], expected, atol=1e-6)
    assert reply.usage.prompt_tokens == sum(len(llm.tokenize(t)) for t in texts) == reply.usage.total_tokens
    floats = client.embeddings.create(model="tiny-embed", input=[[5, 6, 7], [8]], encoding_format="float")
    np.testing.assert_allclose([d.embedding for d in floats.data],
                               [o.outputs.embedding for o in llm.embed([[5, 6, 7], [8]])], atol=1e-6)
    short = client.embeddings.create(model="tiny-embed", input="import os", dimensions=16, encoding_format="float")
    full = llm.embed(["import os"], normalize=False)[0].outputs.embedding
    np.testing.assert_allclose(short.data[0].embedding, full[:16] / np.linalg.norm(full[:16]), atol=1e-6)
    raw = client.with_raw_response.embeddings.create(model="tiny-embed", input="import os", encoding_format="base64")
    vector = np.frombuffer(base64.b64decode(json.loads(raw.text)["data"][0]["embedding"]), "<f4")
    np.testing.assert_allclose(vector, expected[1], atol=1e-6)
    generating, _ = served_text_model  # the same weights started to generate: embed pools as asked
    np.testing.assert_allclose([o.outputs.embedding for o in generating.embed(texts, pooling="mean")], expected,
                               atol=1e-6)


@pytest.mark.parametrize("fields, words", [
    (dict(input="hi", dimensions=24), r"dimensions must be one of this model's matryoshka_dimensions \[16, 32\]"),
    (dict(input="hi", dimensions="16"), "dimensions"),
    (dict(input=[]), "input is empty"),
    (dict(input=[[1, 2], [10_000]]), "outside the vocabulary"),
    (dict(input=[[1, 2], list(range(3, 80))]), r"input\[1\]: .*exceeds max_seq_len 64"),
    (dict(input=[1.5, 2.5]), "input"),
    (dict(input="hi", encoding_format="bytes"), "encoding_format"),
    (dict(input="hi", model="other"), "does not exist"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(served_embedding_model, fields, words):
    _, client = served_embedding_model
    with pytest.raises((openai.BadRequestError, openai.NotFoundError), match=words):
        client.embeddings.create(**{"model": "tiny-embed", **fields})
    assert len(client.embeddings.create(model="tiny-embed", input="hi").data[0].embedding) == 64  # others unharmed


def test_each_server_answers_the_other_kind_of_route_with_how_to_start_it(served_embedding_model, served_text_model):
    _, pooling = served_embedding_model
    _, generating = served_text_model
    with pytest.raises(openai.BadRequestError, match="started to generate; start one with `jaxinfer serve --model "
                                                     "DIR --runner pooling`"):
        generating.embeddings.create(model="tiny", input="hi")
    with pytest.raises(openai.BadRequestError, match="/v1/completions is served by generation models, and "
                                                     "`tiny-embed` was started for embeddings"):
        pooling.completions.create(model="tiny-embed", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="/v1/chat/completions is served by generation models"):
        pooling.chat.completions.create(model="tiny-embed", messages=[{"role": "user", "content": "hi"}])


def test_serve_flags_start_a_pooling_model_and_compile_its_passes(text_model_dir):
    """`jaxinfer serve --runner pooling --pooler-config JSON` as the CLI parses it, loaded and warmed in-process."""
    import argparse
    import io

    from jaxinfer.entrypoints.openai.launch import _load, add_serve_parser, pooler_config
    from jaxinfer.entrypoints.openai.startup import StartingApp

    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", str(text_model_dir), "--runner", "pooling", "--max-model-len", "64",
                              "--max-num-batched-tokens", "256", "--pooler-config", '{"pooling_type": "MEAN"}'])
    log = io.StringIO()
    llm, kwargs = _load(args, StartingApp(log))
    assert (llm.runner_type, llm.pooler.pooling, kwargs["runner"]) == ("pooling", "mean", "pooling")
    assert "3 programs ready" in log.getvalue()  # one 64-token bucket, 1, 2 and 4 rows
    with pytest.raises(ValueError, match=r"--pooler-config must be a JSON object such as"):
        pooler_config("[1]")
