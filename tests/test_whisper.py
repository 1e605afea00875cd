"""Whisper (`WhisperForConditionalGeneration`) against transformers on a tiny random checkpoint: the encoder's
output, the decoder's log-probabilities and greedy tokens through the engine, batches of audio requests, the
prompt's checks and the resampler."""

from __future__ import annotations

import io
import struct
import wave

import jax
import numpy as np
import openai
import pytest
import torch
import transformers
from whisper_models import PROMPT, save_whisper, tone

from jaxinfer import LLM, SamplingParams
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.model import ConfigError
from jaxinfer.entrypoints.resample import resample

CLIPS = [(0.6, 440.0), (0.3, 1200.0), (0.9, 300.0)]  # (seconds, pitch) of three requests' audio
MAX_TOKENS = [16, 14, 18]  # with the 4-token prompt 2 pages of 16 each: two running rows outgrow the 3-page pool


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_whisper(tmp_path_factory.mktemp("whisper"))


@pytest.fixture(scope="module")
def hf(model_dir):
    return transformers.WhisperForConditionalGeneration.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module")
def llm(model_dir):
    # 16-token steps: a request's prompt and another's decode share steps; 3 pages of 16 tokens
    return LLM(str(model_dir), max_num_seqs=2, max_num_batched_tokens=16, max_seq_len=32, num_pages=3)


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    return [tone(seconds, pitch=pitch, seed=i) for i, (seconds, pitch) in enumerate(CLIPS)]


@pytest.fixture(scope="module")
def hf_tokens(hf, model_dir, clips, llm) -> list[list[int]]:
    """HF generate's greedy tokens for each clip, in one batched call (~2 s a call here); no row reaches EOS."""
    return hf_greedy(hf, model_dir, clips, prompt_ids(llm), max(MAX_TOKENS))


def features(model_dir, audio: np.ndarray) -> torch.Tensor:
    extractor = transformers.WhisperFeatureExtractor.from_pretrained(model_dir)
    return extractor(audio, sampling_rate=16000, return_tensors="pt").input_features


def prompt_ids(llm: LLM) -> list[int]:
    return llm.tokenizer.encode(PROMPT, add_special_tokens=False)


def hf_greedy(hf, model_dir, clips: list[np.ndarray], ids: list[int], max_tokens: int) -> list[list[int]]:
    """HF generate's greedy tokens after the prompt for each clip, in one batched call (Whisper's generate
    returns the new tokens alone)."""
    feats = torch.cat([features(model_dir, clip) for clip in clips])
    with torch.no_grad():
        out = hf.generate(input_features=feats, decoder_input_ids=torch.tensor([ids] * len(clips)),
                          max_new_tokens=max_tokens, do_sample=False)
    return out.tolist()


def request(audio: np.ndarray, rate: int = 16000) -> dict:
    return {"prompt": PROMPT, "multi_modal_data": {"audio": (audio, rate)}}


def test_encoder_matches_hf(llm, hf, model_dir):
    from jaxinfer.models.whisper_encoder import encode

    feats = features(model_dir, tone(0.6))
    with torch.no_grad():
        want = hf.model.encoder(feats).last_hidden_state.numpy()
    got = np.asarray(jax.jit(encode)(llm._audio[0], feats.numpy()))  # one compile, not one per operation
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    decoder = llm.weights  # the decoder's tree as LLM.weights gives every model's
    np.testing.assert_array_equal(decoder.layers[0].positions, hf.model.decoder.embed_positions.weight.detach().numpy())


def test_logprobs_and_greedy_tokens_match_hf(llm, hf, model_dir, clips, hf_tokens):
    audio, ids = clips[0], prompt_ids(llm)
    out = llm.generate(request(audio), SamplingParams(max_tokens=10, temperature=0, logprobs=20))[0].outputs[0]
    assert out.token_ids == hf_tokens[0][:10]
    with torch.no_grad():
        logits = hf(input_features=features(model_dir, audio),
                    decoder_input_ids=torch.tensor([ids + out.token_ids[:-1]])).logits[0, len(ids) - 1:]
    want = torch.log_softmax(logits, -1).numpy()
    worst = max(abs(lp.logprob - want[step, token]) for step, top in enumerate(out.logprobs)
                for token, lp in top.items())
    assert worst < 1e-4, worst
    streamed = [t for delta in llm.stream(request(audio), SamplingParams(max_tokens=10, temperature=0))
                for t in delta.outputs[0].token_ids]
    assert streamed == out.token_ids
    (beams,) = llm.beam_search([request(audio)], BeamSearchParams(beam_width=1, max_tokens=4))
    assert beams.sequences[0].tokens == ids + out.token_ids[:4]


def test_batched_requests_equal_each_alone_and_hf(llm, clips, hf_tokens):
    """Three clips of different lengths in one call (16-token steps mixing prefill and decode, one request
    preempted and recomputed) give each one's tokens alone, which are HF's."""
    params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True) for n in MAX_TOKENS]
    encoded, preempted = llm.engine.runner.audio.encoded, llm.engine.scheduler.num_preemptions
    together = [r.outputs[0].token_ids for r in llm.generate([request(c) for c in clips], params)]
    preemptions = llm.engine.scheduler.num_preemptions - preempted
    assert preemptions > 0  # a preempted request recomputes: its encoder runs again from the features it keeps
    assert llm.engine.runner.audio.encoded - encoded == len(clips) + preemptions
    alone = [llm.generate(request(c), p)[0].outputs[0].token_ids for c, p in zip(clips, params)]
    assert together == alone
    assert together == [row[:n] for row, n in zip(hf_tokens, MAX_TOKENS)]
    assert len({tuple(t[:6]) for t in together}) == len(clips)  # the audio decides the tokens


def test_sleep_and_wake_up_keep_the_transcription_and_weight_updates_are_refused(llm, model_dir, hf_tokens, clips):
    """sleep(level=1) frees the weights (the encoder's too) and the pools (the cross pages too); wake_up brings
    them back: HF's tokens again. Weight updates (and sleep(level=2), which needs one) are refused by name: the
    encoder and the cross k/v projections live beside the decoder's weights, so a new checkpoint would be half
    served."""
    greedy = SamplingParams(max_tokens=6, temperature=0)
    llm.sleep(level=1)
    assert llm.is_sleeping and llm.engine.runner.pages is None
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves((llm.weights, llm.engine.runner.audio.encoder)))
    llm.wake_up()
    assert llm.generate(request(clips[0]), greedy)[0].outputs[0].token_ids == hf_tokens[0][:6]
    for call, argument in ((llm.update_weights, llm.weights), (llm.update_weights_from_disk, model_dir),
                           (llm.sleep, 2)):
        with pytest.raises(ValueError, match=r"not supported for Whisper yet: it swaps the decoder's weights"):
            call(argument)
    assert not llm.is_sleeping


def test_prompt_checks(llm, model_dir):
    greedy = SamplingParams(max_tokens=2, temperature=0)
    with pytest.raises(ValueError, match="multi_modal_data.audio: WhisperForConditionalGeneration transcribes"):
        llm.generate(PROMPT, greedy)
    with pytest.raises(ValueError, match=r"longer than the model's 1 s window"):
        llm.generate(request(tone(1.5)), greedy)
    with pytest.raises(ValueError, match=r"1-D \(mono\)"):
        llm.generate(request(np.stack([tone(0.2), tone(0.2)], axis=1)), greedy)
    with pytest.raises(ValueError, match="sample_rate must be a positive integer"):
        llm.generate(request(tone(0.2), rate=0), greedy)
    with pytest.raises(ValueError, match="prompt_logprobs is not served"):
        llm.generate(request(tone(0.2)), SamplingParams(max_tokens=2, prompt_logprobs=1))
    with pytest.raises(ConfigError, match="enable_prefix_caching=True is not supported"):
        LLM(str(model_dir), enable_prefix_caching=True)
    with pytest.raises(ConfigError, match="kv_cache_dtype='int8' is not supported for Whisper"):
        LLM(str(model_dir), kv_cache_dtype="int8")  # the cross pages hold the encoder's keys unquantized


def test_other_rates_are_resampled(llm):
    at_16k, at_44k = tone(0.5, rate=16000, seed=3), tone(0.5, rate=44100, seed=3)
    resampled = resample(np.sin(2 * np.pi * 440 * np.arange(22050) / 44100), 44100, 16000)
    assert len(resampled) == 8000
    np.testing.assert_allclose(resampled[200:-200], np.sin(2 * np.pi * 440 * np.arange(8000) / 16000)[200:-200],
                               atol=2e-3)
    above_nyquist = resample(np.sin(2 * np.pi * 10000 * np.arange(22050) / 44100), 44100, 16000)
    assert np.abs(above_nyquist[200:-200]).max() < 0.02  # filtered out, not folded back to 6 kHz
    greedy = SamplingParams(max_tokens=4, temperature=0)
    assert llm.generate(request(at_44k, 44100), greedy)[0].outputs[0].token_ids
    assert len(at_16k) == 8000


def wav_bytes(samples: np.ndarray, rate: int = 16000, float32: bool = False) -> bytes:
    """A mono WAV file: 16-bit PCM through the stdlib, or 32-bit IEEE float written by hand (wave writes PCM only)."""
    if not float32:
        buffer = io.BytesIO()
        with wave.open(buffer, "wb") as w:
            w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate)
            w.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
        return buffer.getvalue()
    data = samples.astype("<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, rate, rate * 4, 4, 32)
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + struct.pack("<I", 16) + fmt + b"data" + \
        struct.pack("<I", len(data)) + data


def test_server_transcriptions_with_the_openai_client(llm):
    """client.audio.transcriptions.create: the engine's greedy text (HF's: the tests above) for a float and a PCM
    WAV, json and text formats, a file longer than the window as its windows' texts joined; refusals by field."""
    from live_server import serve_in_thread

    from jaxinfer.entrypoints.openai import ServerConfig

    audio = tone(0.6)
    max_tokens = llm.engine.config.max_seq_len - len(prompt_ids(llm))
    expected = llm.generate(request(audio), SamplingParams(max_tokens=max_tokens, temperature=0))[0].outputs[0].text
    with serve_in_thread(llm, ServerConfig("whisper")) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        reply = client.audio.transcriptions.create(file=("a.wav", wav_bytes(audio, float32=True)), model="whisper")
        assert reply.text == expected.strip() and reply.text
        # 16-bit PCM rounds the samples: its text is the engine's on the rounded ones
        in_pcm = client.audio.transcriptions.create(file=("a.wav", wav_bytes(audio)), model="whisper",
                                                    response_format="text", language="en", temperature=0.0)
        rounded = np.frombuffer(wav_bytes(audio)[44:], "<i2").astype(np.float32) / 32768.0
        alone = llm.generate(request(rounded), SamplingParams(max_tokens=max_tokens, temperature=0))
        assert in_pcm.strip() == alone[0].outputs[0].text.strip()
        # 2.5 s in the model's 1 s window: three windows run together, their texts joined (as vLLM's server)
        long = tone(2.5, seed=5)
        parts = llm.generate([request(long[i : i + 16000]) for i in range(0, len(long), 16000)],
                             SamplingParams(max_tokens=max_tokens, temperature=0))
        joined = client.audio.transcriptions.create(file=("a.wav", wav_bytes(long, float32=True)), model="whisper")
        assert joined.text == " ".join(p.outputs[0].text.strip() for p in parts) and len(parts) == 3
        for kwargs, message in ((dict(response_format="srt"), "response_format 'srt' is not supported"),
                                (dict(language="xx"), "language 'xx' is not one"),
                                (dict(file=("a.wav", b"RIFF....WAVEjunk")), "no fmt chunk")):
            with pytest.raises(openai.BadRequestError, match=message):
                client.audio.transcriptions.create(**{"file": ("a.wav", wav_bytes(audio)), "model": "whisper",
                                                      **kwargs})


def test_audio_routes_of_another_model_are_400s():
    """A server of a model without audio answers both routes with a 400 naming what serves them."""
    import asyncio
    import types

    from jaxinfer.entrypoints.openai.errors import APIError
    from jaxinfer.entrypoints.openai.transcriptions import transcribe

    state = types.SimpleNamespace(model_name="llama")
    call = types.SimpleNamespace(url=types.SimpleNamespace(path="/v1/audio/translations"))
    with pytest.raises(APIError, match="/v1/audio/translations is served by speech models") as error:
        asyncio.run(transcribe(call, state, None, "translate"))
    assert error.value.status == 400 and error.value.param == "model"
