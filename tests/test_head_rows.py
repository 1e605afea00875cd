"""HFLeaf's head_rows kinds read any shard of heads and of their rows (what a mesh asks of DBRX's fused experts: ep
splits the experts, tp each expert's hidden units) as that shard of the whole tensor read at once. No model runs."""

from __future__ import annotations

import numpy as np
import pytest

from jaxinfer.checkpoint.hf_names import hf_tensor
from jaxinfer.models.family import HFLeaf

HEADS, STRIDE, D = 4, 6, 3  # 4 heads of 6 stored rows, each 3 wide


@pytest.mark.parametrize("kind, axes", [("head_rows", (0, 1, 2)), ("head_rows_transposed", (0, 2, 1)),
                                        ("in_head_rows", (2, 0, 1))])
@pytest.mark.parametrize("rows, first", [(6, 0), (4, 2)])  # every row of each head (DBRX's), or 4 from row 2
@pytest.mark.parametrize("heads, part", [(slice(0, 4), None), (slice(2, 4), None), (slice(0, 4), slice(1, 3)),
                                         (slice(1, 3), slice(0, 2)), (slice(3, 4), slice(2, 4))])
def test_a_shard_reads_as_the_whole_tensors_shard(kind, axes, rows, first, heads, part):
    stored = np.arange(HEADS * STRIDE * D, dtype=np.float32).reshape(HEADS * STRIDE, D)
    t = hf_tensor(HFLeaf("w", kind, stored.shape, HEADS, rows, row_offset=first))
    whole = t.to_jax(stored)
    part = part or slice(0, rows)
    index = tuple((heads, part, slice(0, D))[axis] for axis in axes)  # jax axis i is the stored [heads, K, D] axis
    np.testing.assert_array_equal(t.to_jax(stored[t.hf_index(index)]), whole[index])
