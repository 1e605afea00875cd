"""Shape buckets of engine steps (plain Python): padded sizes, so compiled programs are reused.

A step is T tokens over R rows (see runtime/engine_step). T pads to a power of two from
MIN_TOKENS up to the token budget (the budget itself, rounded up to TOKEN_BLOCK, is the top
bucket, so a step that fills the budget pads nothing). All-decode and verify steps pad R to a
power of two (one program each: their cost is per row). A step with prefill chunks has R =
min(T, rows of the widest step): every row holds a token, so R is a function of T and each
token bucket is one program; padded rows cost only their logits and sampling (64 rows of a
576 x 49152 head: ~3% of a 512-token step's FLOPs).
"""

from __future__ import annotations

MIN_TOKENS = 16
TOKEN_BLOCK = 16  # every token bucket is a multiple of this (the jnp attention's token blocks)


def bucket(n: int, floor: int = 1) -> int:
    """Smallest power of two >= max(n, floor); 0 stays 0."""
    return 0 if n == 0 else 1 << (max(n, floor) - 1).bit_length()


def powers_of_two(low: int, high: int) -> list[int]:
    """low, 2*low, ... up to and including bucket(high)."""
    out, n = [], low
    while n <= bucket(high):
        out.append(n)
        n *= 2
    return out


def token_buckets(budget: int) -> list[int]:
    """Every padded token count of a step with prefill chunks under a token budget, ascending."""
    top = -(-max(budget, MIN_TOKENS) // TOKEN_BLOCK) * TOKEN_BLOCK
    return [n for n in powers_of_two(MIN_TOKENS, top) if n < top] + [top]


def token_bucket(n: int, budget: int) -> int:
    """The padded token count of a step of n tokens (n <= the budget's top bucket)."""
    return next(b for b in token_buckets(budget) if b >= n)


def ragged_rows(tokens: int, max_rows: int) -> int:
    """The rows of a step with prefill chunks padded to `tokens` tokens."""
    return min(tokens, bucket(max_rows))


def ragged_shapes(budget: int, max_rows: int) -> list[tuple[int, int]]:
    """Every (tokens, rows) of a step with prefill chunks under the token budget."""
    return [(tokens, ragged_rows(tokens, max_rows)) for tokens in token_buckets(budget)]
