"""The engine knobs the tiny-model engine tests share, so that their step programs compile once.

The knobs that shape an engine's step programs (dtype, max_seq_len, max_num_seqs, max_num_batched_tokens,
num_pages, page_size, decode_steps) are part of every program's key: test files that each picked their own
pool size or context compiled the same tiny model's programs again, file after file, and a cold suite spent
minutes doing it. With one set, the first engine compiles them and every later engine of that model, in any
file and on either xdist worker, loads them from the persistent compilation cache.

A test changes a knob only where that knob is what it checks (a smaller pool to preempt, a wider table,
one decode step a call), and says so; behaviour knobs that shape no program (max_prefill_seqs,
enable_prefix_caching, overlap_outputs, async_scheduling) may differ freely.
"""

from __future__ import annotations

# A tiny model served by the engine: four rows, 32-token steps, a pool of 15 usable pages (four
# 70-token sequences do not fit: longer workloads preempt), four decode steps a call.
ENGINE = dict(dtype="float32", max_seq_len=96, max_num_seqs=4, max_num_batched_tokens=32, max_prefill_seqs=2,
              decode_steps=4, num_pages=16)

# Page tables wider than a step ships entries for: a prefix hit of more pages than that sends the tables
# whole (test_program_set's workload, test_input_bytes' context widths).
WIDE = {**ENGINE, "max_seq_len": 160, "num_pages": 40}

# A draft model or EAGLE head speculating: eight decode steps a call, so one call runs up to four verify
# rounds of three drafts; the pool cannot hold four 70-token sequences either.
SPECULATION = {**ENGINE, "decode_steps": 8, "num_pages": 14}

# The shipped demo target (a 6-layer Llama) and its draft and EAGLE head, at the other knobs' defaults.
DEMO = dict(dtype="float32", max_seq_len=128)
