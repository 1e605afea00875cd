"""Speculative decoding: proposers, exact rejection sampling and the on-device draft-verify loop."""

from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.rejection import EXACT_RULE, AcceptanceRule

__all__ = ["SpeculativeConfig", "AcceptanceRule", "EXACT_RULE"]
