"""Loading what drafts for the engine: a draft model, an EAGLE head, the target's own MTP layer or a Gemma 4
assistant, checked against the target.

Anything that makes the draft unusable (a missing or unsupported checkpoint, a different
tokenizer) switches speculation off with a warning saying why (unless the config's `fallback`
is False: then it raises); the engine then decodes plainly, so no request is lost. Prompt
lookup (n-gram, suffix) loads nothing.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.checkpoint.tokenizer import load_tokenizer
from jaxinfer.config.model import ModelConfig, read_config_json
from jaxinfer.engine.speculation import EngineDraft
from jaxinfer.models import Weights, weights_to_run
from jaxinfer.parallel.sharding import UNSHARDED, Layout
from jaxinfer.runtime.ngram_rider import NgramLookup
from jaxinfer.speculative.config import SpeculativeConfig
from jaxinfer.speculative.eagle import eagle_params, pack_eagle
from jaxinfer.speculative.eagle_checkpoint import load_eagle
from jaxinfer.speculative.gemma4_assistant import ARCHITECTURE as ASSISTANT
from jaxinfer.speculative.gemma4_assistant import read_assistant_config
from jaxinfer.speculative.gemma4_assistant_checkpoint import load_assistant
from jaxinfer.speculative.mtp_checkpoint import load_mtp


class SpeculativeError(ValueError):
    """A draft model that cannot serve this target; the message says why."""


class SpeculativeFallbackWarning(UserWarning):
    """Speculative decoding was switched off; generation continues with plain decoding."""


def decode_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Multiply-adds of one decode token: projections, MLP, attention over seq_len, LM head."""
    d, k = cfg.hidden_size, cfg.head_dim
    per_layer = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * k + cfg.num_heads * k * d
    per_layer += 3 * d * cfg.intermediate_size + 2 * cfg.num_heads * k * seq_len
    return float(cfg.num_layers * per_layer + d * cfg.vocab_size)


def check_vocab(target: ModelConfig, draft: ModelConfig, target_tok: Any, draft_tok: Any, draft_dir: Path) -> None:
    """Raise SpeculativeError unless the draft's ids mean the same tokens as the target's."""
    if draft.vocab_size > target.vocab_size:
        raise SpeculativeError(
            f"draft {draft_dir} has a larger vocabulary ({draft.vocab_size}) than the target "
            f"({target.vocab_size}); the draft must use the target's tokenizer"
        )
    if target_tok is None or draft_tok is None:
        return  # no tokenizer files to compare: ids are taken to be shared
    target_vocab = target_tok.get_vocab()
    for token, index in sorted(draft_tok.get_vocab().items(), key=lambda item: item[1]):
        if target_vocab.get(token) != index:
            raise SpeculativeError(
                f"draft {draft_dir} has a different tokenizer: {token!r} is id {index} in the draft "
                f"and {target_vocab.get(token)} in the target"
            )


def load_draft(
    config: SpeculativeConfig, target: ModelConfig, target_weights: Weights, target_tok: Any, dtype: Any,
    max_seq_len: int, cpu_kernels: bool = False, layout: Layout = UNSHARDED, model_dir: Path | None = None,
) -> EngineDraft:
    """The draft model, EAGLE head, MTP layer (read from the target's model_dir) or Gemma 4 assistant (method
    "mtp" with a draft_model) of a "draft", "eagle" or "mtp" config, as the engine runs it (weights packed for the
    CPU kernels when they are on; on a mesh laid out by the target's rules, dimensions tp does not divide kept whole
    on every device), with its cost in target decode steps."""
    if config.method == "mtp" and config.draft_model is None:
        return _load_mtp(config, target, target_weights, dtype, max_seq_len, layout, model_dir)
    draft_dir = Path(config.draft_model)
    if not draft_dir.is_dir():
        raise SpeculativeError(f"draft model directory {draft_dir} does not exist")
    if config.method == "mtp":
        return _load_assistant(config, draft_dir, target, target_weights, dtype, max_seq_len, layout)
    _refuse_assistant(draft_dir, target)
    if config.method == "eagle":
        return _load_eagle(config, target, target_weights, dtype, max_seq_len, cpu_kernels, layout)
    draft_cfg, draft_weights = load_weights(draft_dir, dtype, progress=False, layout=layout)
    check_vocab(target, draft_cfg, target_tok, load_tokenizer(draft_dir), draft_dir)
    cost = config.draft_cost
    if cost is None:
        cost = decode_flops(draft_cfg, max_seq_len) / decode_flops(target, max_seq_len)
    return EngineDraft(draft_cfg, weights_to_run(draft_weights, cpu_kernels, False, layout), cost)


def _assistant_config(draft_dir: Path) -> dict[str, Any] | None:
    """The config.json of a Gemma 4 assistant in draft_dir, else None (a converted checkpoint has none)."""
    if not (draft_dir / "config.json").is_file():
        return None
    hf = read_config_json(draft_dir)
    return hf if hf.get("architectures") == [ASSISTANT] else None


def _refuse_assistant(draft_dir: Path, target: ModelConfig) -> None:
    """SpeculativeError for a Gemma 4 assistant given as a draft model: it drafts from the target's K/V, which
    method "mtp" hands it (vLLM's name for it); read against the target first, so a mismatch is named."""
    hf = _assistant_config(draft_dir)
    if hf is None:
        return
    read_assistant_config(hf, target)
    raise SpeculativeError(f"{draft_dir} is a Gemma 4 assistant ({ASSISTANT}): it drafts over the target's K/V, "
                           f'not as a draft model; use method="mtp" with draft_model={str(draft_dir)!r} '
                           "(vLLM's {\"method\": \"mtp\", \"model\": ...})")


def _load_assistant(
    config: SpeculativeConfig, draft_dir: Path, target: ModelConfig, target_weights: Weights, dtype: Any,
    max_seq_len: int, layout: Layout,
) -> EngineDraft:
    """A Gemma 4 assistant (method "mtp" with a draft_model) with the target's embedding; a draft step costs its
    layers' projections and MLPs, its attention over the target's keys, its two projections and its LM head (all
    V rows, also under ordered embeddings: an upper bound) in target decode steps. One device only: its reads of
    a target's pages split over a mesh are not written (nor tested) yet."""
    if layout.size > 1:
        raise SpeculativeError(f"a Gemma 4 assistant drafts on one device; this engine spans a mesh of {layout.size} "
                               "(tensor_parallel_size x data_parallel_size): use 1 and 1, or method ngram or suffix")
    if _assistant_config(draft_dir) is None:
        raise SpeculativeError(f'method="mtp" with a draft_model runs a Gemma 4 assistant ({ASSISTANT}); '
                               f"{draft_dir} holds none (no config.json naming it): for the target's own MTP layers "
                               "give no draft_model")
    acfg, weights = load_assistant(draft_dir, target, dtype)
    cost = config.draft_cost
    if cost is None:
        layers = acfg.layers
        own = decode_flops(layers, max_seq_len) - layers.num_layers * layers.hidden_size * (
            2 * layers.num_kv_heads * layers.head_dim)  # no k/v projections: the target's K/V
        cost = (own + 3 * acfg.backbone_hidden_size * layers.hidden_size) / decode_flops(target, max_seq_len)
    return EngineDraft(acfg, eagle_params(weights, target_weights), cost)


def _load_eagle(
    config: SpeculativeConfig, target: ModelConfig, target_weights: Weights, dtype: Any, max_seq_len: int,
    cpu_kernels: bool, layout: Layout,
) -> EngineDraft:
    """An EAGLE head with the target's embedding and LM head; a draft step costs its layer, fc and LM
    head in target steps."""
    ecfg, head = load_eagle(config.draft_model, target, dtype, layout)
    cost = config.draft_cost
    if cost is None:
        layer = ecfg.layer
        fc = ecfg.feature_size * layer.hidden_size if ecfg.version == 3 else 2 * layer.hidden_size**2
        vocab = ecfg.draft_vocab if ecfg.version == 3 else layer.vocab_size
        flops = decode_flops(layer, max_seq_len) - layer.hidden_size * (layer.vocab_size - vocab)
        cost = (flops + fc) / decode_flops(target, max_seq_len)
    head = pack_eagle(head) if cpu_kernels else head
    return EngineDraft(ecfg, eagle_params(head, target_weights), cost)


def _load_mtp(
    config: SpeculativeConfig, target: ModelConfig, target_weights: Weights, dtype: Any, max_seq_len: int,
    layout: Layout, model_dir: Path | None,
) -> EngineDraft:
    """The target's first MTP layer with the target's embedding (and LM head where it stores none); a draft
    step costs that layer, eh_proj and the head in target steps. Its weights stay unpacked with the CPU
    kernels on (the family's layer reads either layout)."""
    if model_dir is None:
        raise SpeculativeError('method="mtp" reads the target\'s checkpoint directory; none was given')
    ecfg, head = load_mtp(model_dir, target, dtype, layout)
    cost = config.draft_cost
    if cost is None:
        cost = (decode_flops(ecfg.layer, max_seq_len) + 2 * target.hidden_size**2) / decode_flops(target, max_seq_len)
    return EngineDraft(ecfg, eagle_params(head, target_weights), cost)


def engine_speculation(
    config: SpeculativeConfig | None, target: ModelConfig, target_weights: Weights, target_tok: Any, dtype: Any,
    max_seq_len: int, cpu_kernels: bool = False, layout: Layout = UNSHARDED, model_dir: Path | None = None,
) -> tuple[SpeculativeConfig | None, EngineDraft | None, str | None]:
    """(the config the engine speculates with, its draft, why speculation is off): a draft that cannot
    load leaves the engine plain with the reason (and a warning), unless `config.fallback` is False.
    model_dir: the target's checkpoint, where method "mtp" finds its layer."""
    if config is None or config.drafts_on_host:
        return config, None, None
    if config.looks_up_on_device:  # nothing to load: a lookup over a pool of tokens, ~free per draft
        lookup = NgramLookup(config.ngram_min, config.ngram_max)
        return config, EngineDraft(lookup, None, config.draft_cost or 0.0), None
    try:
        draft = load_draft(config, target, target_weights, target_tok, dtype, max_seq_len, cpu_kernels, layout,
                           model_dir)
    except Exception as err:  # noqa: BLE001 - an unusable draft must not stop the target from serving
        reason = f"{type(err).__name__}: {err}"
        if not config.fallback:
            if isinstance(err, SpeculativeError):
                raise
            raise SpeculativeError(f"draft {config.draft_model or config.method} cannot be used: {reason}") from err
        warnings.warn(f"speculative decoding disabled, continuing with plain decoding: {reason}",
                      SpeculativeFallbackWarning, stacklevel=3)
        return None, None, reason
    return config, draft, None
