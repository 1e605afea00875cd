"""Shape buckets of engine steps (plain Python): padded lengths, so compiled programs are reused.

Decode rows and prefill rows round up to powers of two, a prefill chunk to a power of two
>= MIN_CHUNK up to a step (CHUNK_STEP on CPU) and to a multiple of it above.
"""

from __future__ import annotations

MIN_CHUNK = 16
CHUNK_STEP = 64


def bucket(n: int, floor: int = 1) -> int:
    """Smallest power of two >= max(n, floor); 0 stays 0."""
    return 0 if n == 0 else 1 << (max(n, floor) - 1).bit_length()


def chunk_bucket(n: int, step: int = CHUNK_STEP) -> int:
    """A prefill chunk's padded length (0 stays 0): a power of two up to `step`, then a multiple of it.

    Padded tokens run through every projection like real ones: rounded to a power of two, a
    300-token prompt computed 512 rows (prompts of 32-512 tokens: about a third of a SmolLM
    serving run's prefill rows were padding on CPU). Multiples of CHUNK_STEP above it waste at
    most 63 rows for a few more programs (10 chunk lengths up to 512 instead of 6). Engines on
    accelerators, where padded rows cost little and each program seconds to compile, pass a step
    as large as the token budget: powers of two throughout.
    """
    return bucket(n, MIN_CHUNK) if n <= step else -(-n // step) * step


def chunk_buckets(high: int, step: int = CHUNK_STEP) -> list[int]:
    """Every chunk_bucket(n, step) for 1 <= n <= high, ascending."""
    small = powers_of_two(MIN_CHUNK, max(min(high, step), MIN_CHUNK))
    return small + list(range(2 * step, chunk_bucket(high, step) + 1, step))


def chunk_step_for(platform: str, max_num_batched_tokens: int) -> int:
    """CHUNK_STEP on CPU; elsewhere the token budget's power of two (chunks pad to powers of two)."""
    return CHUNK_STEP if platform == "cpu" else bucket(max_num_batched_tokens)


def tight_chunk_step(platform: str) -> int | None:
    """The chunk step the scheduler cuts prefill chunks to (CPU), or None where padding is cheap."""
    return CHUNK_STEP if platform == "cpu" else None


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2*low, ... up to and including bucket(high)."""
    out, n = [], low
    while n <= bucket(high):
        out.append(n)
        n *= 2
    return out
