"""Encoder-only models (BERT, XLM-RoBERTa) as pooling models: tiny `BertModel`, `XLMRobertaModel` and one-label
`*ForSequenceClassification` checkpoints saved by transformers, against HF on the same weights: pooled embeddings
(cls and mean, prompts of different lengths padded in one batch), classifier logits, cross-encoder scores on the
tokenizer's pair encoding (BERT's token types), a sentence-transformers directory's pooling, bfloat16, the
server's routes, the refusals, and the pooled pass lowered for CUDA and TPU."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import torch
from encoder_models import SHAPE, save_encoder
from test_embeddings import write_sentence_transformers

from jaxinfer import LLM
from jaxinfer.config.model import ConfigError
from jaxinfer.models.encoder_config import read_encoder_config

TEXTS = ["the quick brown fox jumps over the lazy dog", "hello", "what is python code?", "sum of two numbers"]
QUERY = "what is the sum of two numbers"
DOCUMENTS = ["def add a b return a b", "the lazy dog", "sum of two numbers", "hello world"]
ARCHITECTURES = ["BertModel", "BertForSequenceClassification", "XLMRobertaModel",
                 "XLMRobertaForSequenceClassification"]


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """architecture -> (LLM, HF model, tokenizer); BertModel's directory is a sentence-transformers one (mean
    pooling, not normalized), the others pool as the model's default (cls, normalized)."""
    out = {}
    for arch in ARCHITECTURES:
        path = tmp_path_factory.mktemp(arch)
        hf, tokenizer = save_encoder(path, arch)
        if arch == "BertModel":
            write_sentence_transformers(path, "mean_tokens", normalize=False)
        out[arch] = LLM(path, dtype="float32", max_num_batched_tokens=128), hf, tokenizer
    return out


def hf_hidden(hf: torch.nn.Module, batch: list[list[int]], pad: int, types: list[list[int]] | None = None,
              ) -> np.ndarray:
    """HF's last_hidden_state [B, T, D] (a classifier's logits [B, num_labels]) of right-padded rows."""
    width = max(map(len, batch))
    ids = torch.tensor([p + [pad] * (width - len(p)) for p in batch])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in batch])
    kwargs = {} if types is None else dict(token_type_ids=torch.tensor([t + [0] * (width - len(t)) for t in types]))
    with torch.no_grad():
        out = hf(ids, attention_mask=mask, **kwargs)
    return (out.logits if hasattr(out, "logits") else out.last_hidden_state).double().numpy()


@pytest.mark.parametrize("arch", ["BertModel", "XLMRobertaModel"])
def test_embeddings_match_hf_with_padding_in_the_batch(encoders, arch):
    llm, hf, tokenizer = encoders[arch]
    batch = [tokenizer(t)["input_ids"] for t in TEXTS]
    if arch == "XLMRobertaModel":  # a pad id inside a prompt: HF gives it position pad_token_id, not a count
        batch.append([0, 9, 1, 12, 2])
    hidden = hf_hidden(hf, batch, hf.config.pad_token_id)
    lengths = np.array(list(map(len, batch)))
    mask = np.arange(hidden.shape[1])[None, :, None] < lengths[:, None, None]
    expected = {"cls": hidden[:, 0], "mean": (hidden * mask).sum(1) / lengths[:, None]}
    assert llm.runner_type == "pooling" and llm.pooler.pooling == ("mean" if arch == "BertModel" else "cls")
    assert llm.pooler.normalize == (arch != "BertModel")  # sentence-transformers' modules: no Normalize
    default = np.array([o.outputs.embedding for o in llm.embed(batch)])
    chosen = expected[llm.pooler.pooling]
    if llm.pooler.normalize:
        chosen = chosen / np.linalg.norm(chosen, axis=-1, keepdims=True)
    np.testing.assert_allclose(default, chosen, atol=1e-5)
    for pooling in ("cls", "mean"):
        outs = llm.embed(batch, pooling=pooling, normalize=False)
        assert [o.prompt_token_ids for o in outs] == batch
        np.testing.assert_allclose([o.outputs.embedding for o in outs], expected[pooling], atol=1e-5)
    alone = llm.embed(TEXTS[:1])[0].outputs.embedding  # one row, not four: padding changes nothing
    np.testing.assert_allclose(alone, llm.embed(TEXTS)[0].outputs.embedding, atol=1e-6)


@pytest.mark.parametrize("arch", ["BertForSequenceClassification", "XLMRobertaForSequenceClassification"])
def test_cross_encoder_logits_and_scores_match_hf(encoders, arch):
    llm, hf, tokenizer = encoders[arch]
    assert llm.classifier.labels == ("LABEL_0",) and llm.classifier.token_types == (arch.startswith("Bert"))
    batch = [tokenizer(t)["input_ids"] for t in TEXTS]
    logits = hf_hidden(hf, batch, hf.config.pad_token_id)
    probs = [o.outputs.probs for o in llm.classify(batch)]
    np.testing.assert_allclose(probs, 1 / (1 + np.exp(-logits)), atol=1e-6)
    pairs = [tokenizer(QUERY, text_pair=d) for d in DOCUMENTS]
    ids = [p["input_ids"] for p in pairs]
    types = [p["token_type_ids"] for p in pairs] if arch.startswith("Bert") else None
    assert types is None or all(1 in t for t in types)
    expected = 1 / (1 + np.exp(-hf_hidden(hf, ids, hf.config.pad_token_id, types)[:, 0]))
    outs = llm.score(QUERY, DOCUMENTS)
    assert [o.prompt_token_ids for o in outs] == ids
    np.testing.assert_allclose([o.outputs.score for o in outs], expected, atol=1e-6)


def test_bfloat16_runs_close_to_float32(encoders, tmp_path):
    _, hf, tokenizer = encoders["XLMRobertaForSequenceClassification"]
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    llm = LLM(tmp_path, dtype="bfloat16", max_num_batched_tokens=128)
    scores = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    expected = [o.outputs.score for o in encoders["XLMRobertaForSequenceClassification"][0].score(QUERY, DOCUMENTS)]
    np.testing.assert_allclose(scores, expected, atol=2e-2)
    vector = llm.embed(TEXTS[:1], pooling="mean")[0].outputs.embedding
    assert np.isfinite(vector).all() and abs(np.linalg.norm(vector) - 1) < 1e-3


def test_server_scores_reranks_and_embeds_as_the_llm(encoders):
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    llm = encoders["BertForSequenceClassification"][0]
    expected = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    with serve_in_thread(llm, ServerConfig("tiny-bert")) as (url, _):
        body = httpx.post(url + "/v1/score", json={"text_1": QUERY, "text_2": DOCUMENTS}).json()
        np.testing.assert_allclose([d["score"] for d in body["data"]], expected, atol=1e-7)
        body = httpx.post(url + "/rerank", json={"query": QUERY, "documents": DOCUMENTS, "top_n": 2}).json()
        assert [r["index"] for r in body["results"]] == np.argsort(expected)[::-1][:2].tolist()
        body = httpx.post(url + "/v1/embeddings", json={"input": TEXTS[:2]}).json()
        np.testing.assert_allclose([d["embedding"] for d in body["data"]],
                                   [o.outputs.embedding for o in llm.embed(TEXTS[:2])], atol=1e-6)


def test_encoders_refuse_generation_and_what_they_do_not_run_by_name(encoders):
    llm = encoders["BertModel"][0]
    with pytest.raises(ValueError, match="LLM.generate generates, and this LLM was started with runner='pooling'"):
        llm.generate(["hello"])
    with pytest.raises(ConfigError, match="names BertModel, an encoder .*never generates"):
        LLM(llm.model_dir, runner="generate")
    with pytest.raises(ValueError, match="tensor_parallel_size=2 is not supported for encoder models"):
        LLM(llm.model_dir, tensor_parallel_size=2)
    with pytest.raises(ValueError, match="LLM.sleep is not supported for encoder models"):
        llm.sleep()
    assert llm.weights.config.layout == "bert" and llm.engine.runner.num_pages == 64 // 16 + 1  # one sequence's
    with pytest.raises(ValueError, match="exceeds max_seq_len 64"):
        llm.embed([[5] * 70])
    base = dict(json.loads((llm.model_dir / "config.json").read_text()))
    assert read_encoder_config(base).max_len == SHAPE["max_position_embeddings"]
    roberta = encoders["XLMRobertaModel"][0]
    assert roberta.max_seq_len == SHAPE["max_position_embeddings"] - 2  # positions start at pad_token_id + 1
    for field, value, words in [("position_embedding_type", "relative_key", "absolute position embeddings only"),
                                ("is_decoder", True, "is_decoder=True is not supported"),
                                ("hidden_act", "swish", "hidden_act 'swish' is not supported for BertModel")]:
        with pytest.raises(ConfigError, match=words):
            read_encoder_config({**base, field: value})


def test_the_pooled_pass_lowers_for_gpus_and_tpus(encoders):
    from jax import export

    from jaxinfer.runtime.embeddings import pooled_program

    llm = encoders["BertForSequenceClassification"][0]
    program = pooled_program(llm.weights, llm.config, 64, 2, llm.dtype, "cls", head=llm.classifier.weight)
    for platform in ("cuda", "tpu"):
        exported = export.export(program.function, platforms=(platform,))(*program.args, **program.kwargs)
        assert exported.out_avals[0].shape == (2, 1)
