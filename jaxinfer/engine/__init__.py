"""The serving engine: continuous batching over the paged KV cache (see engine.engine)."""

from jaxinfer.engine.async_engine import AsyncLLMEngine
from jaxinfer.config.engine import EngineConfig
from jaxinfer.engine.engine import LLMEngine
from jaxinfer.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput

__all__ = ["AsyncLLMEngine", "EngineConfig", "LLMEngine", "CompletionOutput", "RequestMetrics", "RequestOutput"]
