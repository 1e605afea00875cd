"""WAV files as mono float32 samples: 16-bit PCM through the stdlib `wave` module, 32-bit IEEE float from the
file's chunks (`wave` reads PCM only); other encodings are refused by name. Several channels are averaged."""

from __future__ import annotations

import io
import struct
import wave

import numpy as np

FORMATS = {1: "PCM", 3: "IEEE float", 6: "A-law", 7: "mu-law", 0xFFFE: "extensible"}
ACCEPTED = "16-bit PCM or 32-bit IEEE float WAV"


def wav_format(data: bytes) -> tuple[int, int, int, int, bytes]:
    """(format tag, channels, sample rate, bits per sample, the data chunk) of a RIFF/WAVE file; ValueError
    when it is not one."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError(f"the file is not a WAV file (no RIFF/WAVE header); send {ACCEPTED}")
    fmt, samples, at = None, None, 12
    while at + 8 <= len(data):
        kind, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        body = data[at + 8:at + 8 + size]
        if kind == b"fmt " and len(body) >= 16:
            fmt = struct.unpack("<HHIIHH", body[:16])
        elif kind == b"data":
            samples = body
        at += 8 + size + (size & 1)
    if fmt is None or samples is None:
        raise ValueError(f"the WAV file has no {'fmt' if fmt is None else 'data'} chunk; send {ACCEPTED}")
    tag, channels, rate, _, _, bits = fmt
    return tag, channels, rate, bits, samples


def read_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(mono float32 samples in [-1, 1], sample rate) of a WAV file's bytes; ValueError naming an encoding
    that is not read, and what is."""
    tag, channels, rate, bits, body = wav_format(data)
    if (tag, bits) == (1, 16):
        with wave.open(io.BytesIO(data)) as w:
            frames = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
    elif (tag, bits) == (3, 32):
        frames = np.frombuffer(body[: len(body) // 4 * 4], "<f4").astype(np.float32)
    else:
        raise ValueError(f"WAV encoding {FORMATS.get(tag, f'format {tag}')} {bits}-bit is not supported; "
                         f"send {ACCEPTED}")
    if channels < 1:
        raise ValueError("the WAV file names 0 channels")
    return frames[: len(frames) // channels * channels].reshape(-1, channels).mean(axis=1), rate
