"""Request state helpers (host side)."""

from __future__ import annotations

import pytest

from jaxinfer import SamplingParams
from jaxinfer.engine.request import Request


@pytest.mark.parametrize("start, end", [(0, 0), (0, 3), (2, 5), (4, 5), (5, 7), (6, 7), (0, 7), (3, 9), (7, 9)])
def test_ids_between_is_a_slice_of_all_ids(start, end):
    request = Request("r", 0, None, [10, 11, 12, 13, 14], SamplingParams(max_tokens=4), seed=0, stop_ids=())
    request.output_ids = [20, 21]
    assert request.ids_between(start, end) == request.all_ids[start:end]
