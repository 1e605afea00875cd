"""Qwen4-Exp's settings beyond Qwen3.5-MoE's, as a config holds them (`ModelConfig.qwen4_exp`; models/qwen4_exp).

Qwen4-Exp carries `streams` copies of the residual (transformers' hyper-connections: `hc_count`, mixed through a
rank-`stream_rank` gate), adds hashed n-gram embeddings to the streams on its PLE layers, and lets each attention
query see only the `indexer_budget` tokens of the key blocks its QSA indexer scores highest, plus the tail of the
last incomplete block. The n-gram hash is transformers' (`Qwen4ExpTextNGramEmbedding`): each head's table is a
distinct prime number of rows and each PLE layer has its own odd 64-bit multipliers, derived here once from the
config (`seed`, `ngram_vocab_size_base`), so nothing derived is read from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math

_MASK64 = (1 << 64) - 1
_SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
_SPLITMIX_M1 = 0xBF58476D1CE4E5B9
_SPLITMIX_M2 = 0x94D049BB133111EB
_LAYER_SEED_STRIDE = 10007  # transformers' _PRIME_1: each PLE layer's seed is seed + stride * its PLE index


@dataclasses.dataclass(frozen=True)
class NgramTable:
    """One PLE layer's hashed n-gram table: the hash's multipliers and each head's row count and first row."""

    multipliers: tuple[int, ...]  # [ngram_size] odd 64-bit multipliers, token i back times multipliers[i]
    head_rows: tuple[int, ...]  # [heads] a prime per head: the head's hash is taken modulo it
    head_offsets: tuple[int, ...]  # [heads] each head's first row in the concatenated table
    rows: int  # the table's rows, padded to make_ngram_vocab_size_divisible_by


@dataclasses.dataclass(frozen=True)
class Qwen4ExpFields:
    """The residual streams, the PLE layers' n-gram embeddings and the QSA indexer (HF names in comments)."""

    streams: int  # hc_count: copies of the residual each layer reads through a gate and writes back to
    stream_rank: int  # hc_lowrank: the streams' gate's rank
    ple_layers: tuple[int, ...]  # ple_layer_ids less 1: the layers adding n-gram embeddings to the streams
    ple_width: int  # ple_embed_dim: every n-gram head's embedding, concatenated
    ple_kernel: int  # ple_conv_kernel_size: taps of the PLE's depthwise conv, ngram_size tokens apart
    ngram_size: int  # ngram_size: the longest n-gram (orders 2..ngram_size)
    heads_per_ngram: int  # heads_per_ngram: hashed heads per order
    tables: tuple[NgramTable, ...]  # one per PLE layer, in layer order
    table_parts: int  # split_ngram_parts: the shards each table is stored in
    eos_token_id: int  # eos_token_id (the first): n-grams do not reach back past it, and read it before a sequence
    indexer_heads: int  # indexer_n_heads
    indexer_dim: int  # indexer_head_dim
    indexer_budget: int  # indexer_budget: tokens of whole blocks each query may keep
    indexer_block: int  # indexer_compress_ratio: tokens averaged into one scored block key
    fused_experts: bool = False  # the checkpoint stores each layer's experts fused (gate_up_proj, down_proj)

    @property
    def ngram_heads(self) -> int:
        """Hashed heads of one PLE layer: heads_per_ngram for each order 2..ngram_size."""
        return (self.ngram_size - 1) * self.heads_per_ngram

    def table(self, layer: int) -> NgramTable | None:
        """Layer `layer`'s n-gram table; None off the PLE layers."""
        return self.tables[self.ple_layers.index(layer)] if layer in self.ple_layers else None

    def for_layer(self, layer: int) -> Qwen4ExpFields:
        """These fields as layer `layer` alone sees them, as layer 0 (models/layer_calls' one-layer view): its own
        table only, so PLE layers alike in shapes still differ in their hash's constants."""
        table = self.table(layer)
        return dataclasses.replace(self, ple_layers=() if table is None else (0,),
                                   tables=() if table is None else (table,))


def _splitmix64(value: int) -> int:
    value = (value + _SPLITMIX_GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _SPLITMIX_M1) & _MASK64
    value = ((value ^ (value >> 27)) * _SPLITMIX_M2) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def layer_multipliers(vocab_size: int, ngram_size: int, ple_index: int, seed: int) -> tuple[int, ...]:
    """transformers' `_build_layer_multipliers`: odd multipliers below 2**63 / vocab_size, one per n-gram position."""
    half_bound = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _LAYER_SEED_STRIDE * ple_index
    return tuple(2 * (_splitmix64((base + _SPLITMIX_GAMMA * (i + 1)) & _MASK64) % half_bound) + 1
                 for i in range(ngram_size))


def _is_prime(value: int) -> bool:
    if value < 2 or value % 2 == 0:
        return value == 2
    return all(value % d for d in range(3, math.isqrt(value) + 1, 2))


def primes_from(start: int, count: int) -> list[int]:
    """The first `count` primes at least `start` (transformers' heads take them in turn across the PLE layers)."""
    primes, value = [], start
    while len(primes) < count:
        if _is_prime(value):
            primes.append(value)
        value += 1
    return primes


def ngram_tables(vocab_size: int, ngram_size: int, heads: int, layers: int, base: int, divisor: int,
                 seed: int) -> tuple[NgramTable, ...]:
    """Each PLE layer's table: its heads take the next `heads` primes from `base` on, padded to `divisor` rows."""
    primes = primes_from(base, heads * layers)
    tables = []
    for index in range(layers):
        rows = primes[index * heads:(index + 1) * heads]
        offsets = tuple(sum(rows[:h]) for h in range(heads))
        tables.append(NgramTable(layer_multipliers(vocab_size, ngram_size, index, seed), tuple(rows), offsets,
                                 -(-sum(rows) // divisor) * divisor))
    return tuple(tables)
