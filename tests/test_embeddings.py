"""Embeddings (`LLM.embed`, POST /v1/embeddings): pooled final hidden states against HF
transformers' own on the same weights, and the server through the official `openai` client."""

from __future__ import annotations

import numpy as np
import openai
import pytest
import torch
import transformers

from jaxinfer import LLM

PROMPTS = [[1, 5, 9, 33, 71, 100, 4, 8], [7], list(range(3, 90))]  # 90 > 64: a second length bucket


def hf_embedding(model: torch.nn.Module, ids: list[int], pooling: str, normalize: bool) -> np.ndarray:
    """HF's final-norm hidden states of the prompt, pooled as jaxinfer pools them."""
    with torch.no_grad():
        hidden = model.model(torch.tensor([ids])).last_hidden_state[0].double().numpy()
    vector = {"last": hidden[-1], "cls": hidden[0], "mean": hidden.mean(axis=0)}[pooling]
    return vector / np.linalg.norm(vector) if normalize else vector


@pytest.fixture(scope="module", params=["llama2", "gemma"])
def pair(request, checkpoint_dir):
    path = checkpoint_dir(request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return LLM(path, dtype="float32", max_seq_len=128), hf


@pytest.mark.parametrize("pooling, normalize", [("last", True), ("mean", False), ("CLS", True)])
def test_embeddings_match_hf_hidden_states(pair, pooling, normalize):
    llm, hf = pair
    outs = llm.embed(PROMPTS, pooling=pooling, normalize=normalize)
    assert [o.prompt_token_ids for o in outs] == PROMPTS and [o.request_id for o in outs] == ["0", "1", "2"]
    for out, ids in zip(outs, PROMPTS):
        expected = hf_embedding(hf, ids, pooling.lower(), normalize)
        assert out.outputs.hidden_size == hf.config.hidden_size
        np.testing.assert_allclose(out.outputs.embedding, expected, atol=2e-5 if normalize else 2e-4)


def test_bad_embedding_arguments_name_what_is_accepted(pair):
    llm, _ = pair
    with pytest.raises(ValueError, match="pooling must be one of last, mean, cls, got 'max'"):
        llm.embed([[1, 2]], pooling="max")
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.embed([[]])
    with pytest.raises(ValueError, match="exceeds max_seq_len 128"):
        llm.embed([list(range(3, 140))])


def test_server_embeddings_through_the_openai_client(served_text_model):
    llm, client = served_text_model
    texts = ["def add(a, b):", "import os"]
    expected = [o.outputs.embedding for o in llm.embed(texts)]
    reply = client.embeddings.create(model="tiny", input=texts)  # the client asks for base64 and decodes it
    assert [d.index for d in reply.data] == [0, 1] and reply.model == "tiny"
    np.testing.assert_allclose([d.embedding for d in reply.data], expected, atol=1e-6)
    assert reply.usage.prompt_tokens == sum(len(llm.encode(t)) for t in texts) == reply.usage.total_tokens
    floats = client.embeddings.create(model="tiny", input=[5, 6, 7], encoding_format="float")
    np.testing.assert_allclose(floats.data[0].embedding, llm.embed([[5, 6, 7]])[0].outputs.embedding, atol=1e-6)


@pytest.mark.parametrize("fields, words", [
    (dict(input="hi", dimensions=8), "dimensions is not supported"),
    (dict(input=[]), "input is empty"),
    (dict(input=[[1, 2], [10_000]]), "outside the vocabulary"),
    (dict(input="hi", model="other"), "does not exist"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(served_text_model, fields, words):
    _, client = served_text_model
    with pytest.raises((openai.BadRequestError, openai.NotFoundError), match=words):
        client.embeddings.create(**{"model": "tiny", **fields})
