"""Audio resampling in NumPy: a windowed-sinc low-pass (when going down, so no frequency above the new
Nyquist folds back), then linear interpolation onto the new rate's sample times."""

from __future__ import annotations

import numpy as np

TAPS = 64  # half-width of the low-pass filter, in input samples


def lowpass(samples: np.ndarray, cutoff: float) -> np.ndarray:
    """samples through a Hann-windowed sinc low-pass at `cutoff` (a fraction of the sample rate, < 0.5)."""
    n = np.arange(-TAPS, TAPS + 1)
    kernel = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hanning(len(n))
    return np.convolve(samples, kernel / kernel.sum(), mode="same")


def resample(samples: np.ndarray, rate: int, target: int) -> np.ndarray:
    """float32 samples at `rate` Hz as samples at `target` Hz (unchanged when the rates agree)."""
    samples = np.asarray(samples, np.float64)
    if rate == target or len(samples) == 0:
        return samples.astype(np.float32)
    if target < rate:
        samples = lowpass(samples, 0.5 * target / rate * 0.95)
    count = int(round(len(samples) * target / rate))
    times = np.arange(count) * (rate / target)
    return np.interp(times, np.arange(len(samples)), samples).astype(np.float32)
