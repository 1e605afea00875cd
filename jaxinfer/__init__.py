"""jaxinfer: JAX/XLA inference for decoder language models (Llama, Gemma, Phi-3, MoE families) on CPU, GPU and TPU."""

from jaxinfer.checkpoint.converted import save_converted
from jaxinfer.checkpoint.loader import CheckpointError, load_weights
from jaxinfer.config.beam_search import BeamSearchParams
from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.model import ConfigError, ModelConfig
from jaxinfer.config.pooler import PoolerConfig
from jaxinfer.config.pooling_params import PoolingParams
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.config.structured_outputs import StructuredOutputsParams
from jaxinfer.engine import CompletionOutput, EngineConfig, LLMEngine, RequestOutput
from jaxinfer.engine.beams import BeamSearchOutput, BeamSearchSequence
from jaxinfer.engine.outputs import EmbeddingOutput, EmbeddingRequestOutput, PoolingOutput, PoolingRequestOutput
from jaxinfer.entrypoints.compare import Comparison, Configuration, compare
from jaxinfer.entrypoints.llm import DEMO_DRAFT, DEMO_EAGLE, DEMO_MODEL, LLM
from jaxinfer.entrypoints.prompt_types import TextPrompt, TokensPrompt
from jaxinfer.models.registry import from_hf_config, load_config
from jaxinfer.sampling.logprob import Logprob
from jaxinfer.speculative.config import SpeculativeConfig

__all__ = [
    "LLM",
    "compare",
    "Configuration",
    "Comparison",
    "SamplingParams",
    "TextPrompt",
    "TokensPrompt",
    "BeamSearchParams",
    "BeamSearchOutput",
    "BeamSearchSequence",
    "StructuredOutputsParams",
    "SpeculativeConfig",
    "LoRARequest",
    "PoolerConfig",
    "PoolingParams",
    "RequestOutput",
    "CompletionOutput",
    "EmbeddingRequestOutput",
    "EmbeddingOutput",
    "PoolingRequestOutput",
    "PoolingOutput",
    "Logprob",
    "LLMEngine",
    "EngineConfig",
    "DEMO_MODEL",
    "DEMO_DRAFT",
    "DEMO_EAGLE",
    "ModelConfig",
    "ConfigError",
    "CheckpointError",
    "from_hf_config",
    "load_config",
    "load_weights",
    "save_converted",
]
__version__ = "0.1.0"
