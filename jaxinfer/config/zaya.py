"""ZAYA's settings beyond the shared fields, as a config holds them (`ModelConfig.zaya`; models/zaya, models/cca)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ZayaFields:
    """The router's width and the CCA convs' taps (HF names in comments)."""

    router_hidden_size: int  # router_hidden_size: the router state's width, handed from layer to layer
    cca_taps: tuple[int, int]  # (cca_time0, cca_time1): the depthwise and grouped convs' taps
