"""Classification and scoring (`LLM.classify`, `LLM.score`, POST /classify, /v1/score, /rerank): tiny HF
`Qwen2ForSequenceClassification` (one label, no pad token: a cross-encoder) and `LlamaForSequenceClassification`
(three labels, pad_token_id 0) checkpoints against transformers on the same weights, an embedding model's
cosine scores against HF AutoModel's, and the routes through HTTP."""

from __future__ import annotations

import re
from types import SimpleNamespace

import httpx
import numpy as np
import pytest
import torch
import transformers
from hf_models import make_hf_classifier, save_tiny_tokenizer

from jaxinfer import LLM, PoolingParams
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.scoring import score_pairs

PROMPTS = [[1, 5, 9, 33, 71, 100, 4, 8], [7], list(range(3, 90)), [5, 6, 0, 0], [0, 0, 9]]  # 87 > 64: two buckets
QUERY = "def add(a, b):"
SENTIMENTS = ("negative", "neutral", "positive")
DOCUMENTS = ["return a + b", "The quick brown fox.", "for i in range(10):", "héllo wörld", "def add(a, b):"]


@pytest.fixture(scope="module")
def classifiers(tmp_path_factory):
    """{name: (LLM, HF model)}: a Qwen2 cross-encoder with a tokenizer, and a 3-label Llama whose pad id is 0
    (labels named in id2label)."""
    out = {}
    for name, labels, pad in [("qwen2", 1, None), ("llama2", 3, 0)]:
        path = tmp_path_factory.mktemp(f"{name}_classifier")
        hf = make_hf_classifier(name, labels, pad_token_id=pad, vocab_size=320)
        if labels == 3:
            hf.config.id2label = dict(enumerate(SENTIMENTS))
        hf.save_pretrained(path)
        save_tiny_tokenizer(path, vocab_size=300)
        out[name] = LLM(path, dtype="float32", max_seq_len=128, max_num_batched_tokens=128), hf
    return out


def hf_logits(hf: torch.nn.Module, prompts: list[list[int]], pad: int) -> np.ndarray:
    """HF's logits of the prompts in one right-padded batch (its classifier picks each row's last non-pad token)."""
    width = max(map(len, prompts))
    ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
    mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in prompts])
    with torch.no_grad():
        return hf(ids, attention_mask=mask).logits.double().numpy()


def test_classifier_probabilities_match_hf(classifiers):
    llm, hf = classifiers["llama2"]
    assert (llm.runner_type, llm.classifier.labels, llm.classifier.pad_token_id) == ("pooling", SENTIMENTS, 0)
    assert llm.weights.lm_head is None
    outs = llm.classify(PROMPTS)
    assert [o.prompt_token_ids for o in outs] == PROMPTS and [o.outputs.num_classes for o in outs] == [3] * 5
    expected = torch.log_softmax(torch.tensor(hf_logits(hf, PROMPTS, 0)), -1).numpy()
    np.testing.assert_allclose(np.log([o.outputs.probs for o in outs]), expected, atol=1e-5)  # measured 2.6e-6 (logits: 2.1e-6)
    pooled = llm.encode(PROMPTS, pooling_task="classify")  # vLLM's encode: the same probabilities
    np.testing.assert_allclose([o.outputs.data for o in pooled], [o.outputs.probs for o in outs], atol=1e-7)
    logits = llm.encode(PROMPTS, PoolingParams(use_activation=False), pooling_task="classify")
    np.testing.assert_allclose([o.outputs.data for o in logits], hf_logits(hf, PROMPTS, 0), atol=1e-5)


def test_cross_encoder_scores_match_hf_and_pair_as_vllm(classifiers):
    llm, hf = classifiers["qwen2"]
    tokenizer = llm.get_tokenizer()
    pairs = [tokenizer(QUERY, text_pair=d)["input_ids"] for d in DOCUMENTS]
    expected = np.array([torch.sigmoid(torch.tensor(hf_logits(hf, [p], 0)[0, 0])).item() for p in pairs])
    one_to_n = llm.score(QUERY, DOCUMENTS)
    assert [o.prompt_token_ids for o in one_to_n] == pairs
    scores = np.array([o.outputs.score for o in one_to_n])
    np.testing.assert_allclose(scores, expected, atol=1e-6)  # measured 3.2e-7
    assert np.argsort(-scores).tolist() == np.argsort(-expected).tolist()
    n_to_n = llm.score([QUERY, *DOCUMENTS[1:]], DOCUMENTS)
    assert n_to_n[0].outputs.score == pytest.approx(scores[0], abs=1e-7)
    assert n_to_n[1].prompt_token_ids == tokenizer(DOCUMENTS[1], text_pair=DOCUMENTS[1])["input_ids"]
    assert score_pairs("a", "b") == [("a", "b")] and score_pairs(["a"], ["b", "c"]) == [("a", "b"), ("a", "c")]
    probs = [o.outputs.probs for o in llm.classify(pairs)]  # one label: a sigmoid, as vLLM's classify
    np.testing.assert_allclose(probs, scores[:, None], atol=1e-7)


def test_scoring_refuses_what_does_not_pair_or_has_no_head_by_name(classifiers, text_model_dir):
    cross, _ = classifiers["qwen2"]
    three, _ = classifiers["llama2"]
    with pytest.raises(ValueError, match=r"text_1 has 2 texts and text_2 3; pairs go 1:1, 1:N"):
        cross.score(["a", "b"], ["c", "d", "e"])
    with pytest.raises(ValueError, match="text_2 must be a string or a non-empty list of strings"):
        cross.score("a", [])
    with pytest.raises(ValueError, match=r"classifies into 3 labels \['negative', 'neutral', 'positive'\]"):
        three.score("a", "b")
    with pytest.raises(ValueError, match="LLM.generate generates, and this LLM was started with runner='pooling'"):
        cross.generate([[1, 2]])
    with pytest.raises(ConfigError, match="names LlamaForSequenceClassification, a model saved without one"):
        LLM(three.model_dir, runner="generate")
    generating = LLM(text_model_dir, dtype="float32", max_seq_len=64)
    with pytest.raises(ValueError, match="LLM.classify needs a \\*ForSequenceClassification checkpoint"):
        generating.classify(["a"])
    with pytest.raises(ValueError, match="LLM.score scores with a cross-encoder or an embedding model started"):
        generating.score("a", "b")


def test_an_embedding_model_scores_by_cosine_similarity(text_model_dir):
    llm = LLM(text_model_dir, dtype="float32", max_seq_len=64, runner="pooling")
    hf = transformers.AutoModel.from_pretrained(text_model_dir, dtype=torch.float32).eval()

    def embedding(text: str) -> np.ndarray:
        with torch.no_grad():
            return hf(torch.tensor([llm.tokenize(text)])).last_hidden_state[0, -1].double().numpy()

    query = embedding(QUERY)
    expected = [query @ (d := embedding(doc)) / np.linalg.norm(query) / np.linalg.norm(d) for doc in DOCUMENTS]
    outs = llm.score(QUERY, DOCUMENTS)
    np.testing.assert_allclose([o.outputs.score for o in outs], expected, atol=1e-6)
    assert outs[-1].outputs.score == pytest.approx(1.0, abs=1e-6)  # the query against itself
    assert outs[0].prompt_token_ids == llm.tokenize(QUERY) + llm.tokenize(DOCUMENTS[0])
    with pytest.raises(ValueError, match="LLM.classify needs a \\*ForSequenceClassification checkpoint"):
        llm.classify(["a"])


@pytest.fixture(scope="module")
def served_cross_encoder(classifiers):
    """(LLM, base URL) of the Qwen2 cross-encoder served as "tiny-rerank"."""
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    llm, _ = classifiers["qwen2"]
    with serve_in_thread(llm, ServerConfig("tiny-rerank")) as (url, _):
        yield llm, url


def test_server_score_rerank_and_classify_through_http(served_cross_encoder):
    llm, url = served_cross_encoder
    expected = [o.outputs.score for o in llm.score(QUERY, DOCUMENTS)]
    for path in ("/v1/score", "/score"):
        body = httpx.post(url + path, json={"model": "tiny-rerank", "text_1": QUERY, "text_2": DOCUMENTS}).json()
        assert body["object"] == "list" and body["id"].startswith("score-") and body["model"] == "tiny-rerank"
        assert [d["index"] for d in body["data"]] == list(range(5)) and {d["object"] for d in body["data"]} == {"score"}
        np.testing.assert_allclose([d["score"] for d in body["data"]], expected, atol=1e-7)
    tokenizer = llm.get_tokenizer()
    tokens = sum(len(tokenizer(QUERY, text_pair=d)["input_ids"]) for d in DOCUMENTS)
    assert body["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0, "total_tokens": tokens}
    order = np.argsort(expected)[::-1].tolist()
    for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
        body = httpx.post(url + path, json={"query": QUERY, "documents": DOCUMENTS, "top_n": 3}).json()
        assert [r["index"] for r in body["results"]] == order[:3] and body["usage"] == {"total_tokens": tokens}
        assert [r["document"]["text"] for r in body["results"]] == [DOCUMENTS[i] for i in order[:3]]
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]],
                                   [expected[i] for i in order[:3]], atol=1e-7)
    bare = httpx.post(url + "/rerank", json={"query": QUERY, "documents": DOCUMENTS, "return_documents": False})
    assert [r["index"] for r in bare.json()["results"]] == order and "document" not in bare.json()["results"][0]
    body = httpx.post(url + "/classify", json={"input": [QUERY, "import os"]}).json()
    assert body["id"].startswith("classify-") and [d["label"] for d in body["data"]] == ["LABEL_0"] * 2
    np.testing.assert_allclose([d["probs"] for d in body["data"]],
                               [o.outputs.probs for o in llm.classify([QUERY, "import os"])], atol=1e-7)
    tokens = len(llm.tokenize(QUERY)) + len(llm.tokenize("import os"))
    assert body["data"][1]["num_classes"] == 1 and body["usage"]["prompt_tokens"] == tokens


@pytest.mark.parametrize("path, fields, param, words", [
    ("/v1/score", dict(text_2="a"), "text_1", "Field required"),
    ("/v1/score", dict(text_1=["a", "b"], text_2=["c", "d", "e"]), "text_1", "text_1 has 2 texts and text_2 3"),
    ("/v1/score", dict(text_1="a", text_2="b", extra=1), "extra", "extra"),
    ("/rerank", dict(query="a", documents=[]), "documents", "documents must be a string or a non-empty list"),
    ("/rerank", dict(query="a", documents=["b"], top_n=-1), "top_n", "top_n must be >= 0"),
    ("/rerank", dict(query="a", documents=["b" * 400]), "documents", r"documents\[0\]: .*exceeds max_seq_len 128"),
    ("/classify", dict(input=[]), "input", "input is empty"),
    ("/classify", dict(input="a", model="other"), "model", "does not exist"),
])
def test_bad_scoring_requests_are_errors_naming_the_field(served_cross_encoder, path, fields, param, words):
    _, url = served_cross_encoder
    reply = httpx.post(url + path, json=fields)
    assert reply.status_code in (400, 404) and reply.json()["error"]["param"] == param
    assert re.search(words, reply.json()["error"]["message"])


def test_a_generating_server_refuses_the_pooling_routes_by_name():
    """The routes as build_app adds them for a model started to generate (nothing of it is read but its runner)."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from jaxinfer.entrypoints.openai.errors import install_handlers
    from jaxinfer.entrypoints.openai.scoring import add_scoring_routes

    app = FastAPI()
    install_handlers(app)
    add_scoring_routes(app, SimpleNamespace(model_name="tiny"), None, SimpleNamespace(runner_type="generate"))
    client = TestClient(app)
    for path, body in [("/classify", {"input": "a"}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
                       ("/rerank", {"query": "a", "documents": ["b"]})]:
        reply = client.post(path, json=body)
        assert reply.status_code == 400 and reply.json()["error"]["param"] == "model"
        assert f"{path} is served by pooling models" in reply.json()["error"]["message"]
        assert "was started to generate; start one with `jaxinfer serve --model DIR --runner pooling`" in \
            reply.json()["error"]["message"]
