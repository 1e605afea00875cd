"""New weights in a running `LLM`, and sleeping between uses: what an RL loop does between rollouts.

vLLM serves RL trainers with `load_weights` (through `collective_rpc`) and `sleep`/`wake_up`,
SGLang with `update_weights_from_disk`; here they are `LLM.update_weights`,
`update_weights_from_disk`, `sleep` and `wake_up`. New leaves are made like the served ones
(`runtime.weight_swap`: quantized as served, cast, in the same shardings), so every compiled
program runs them as they are: an update compiles nothing. An EAGLE head reads the target's
embedding and output head, so it gets the new ones; a checkpoint's own MTP layer (method "mtp") takes
its tensors from the update too (`model.layers.{num_hidden_layers}.*`); a draft model keeps its own weights.

Sleeping frees the device memory the engine holds between uses (a trainer sharing the device
needs it): level 1 moves the weights to host memory and frees the KV pool, level 2 discards the
weights too (the next weights come from `update_weights`/`update_weights_from_disk`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from jaxinfer.checkpoint.converted import is_converted
from jaxinfer.checkpoint.loader import load_weights
from jaxinfer.checkpoint.named_tensors import leaf_updates, named_dict
from jaxinfer.config import validation
from jaxinfer.engine.asleep import EngineAsleep
from jaxinfer.entrypoints.encoder_loading import refuse_weight_calls
from jaxinfer.entrypoints.model_loading import running_weights
from jaxinfer.entrypoints.whisper_loading import refuse_speech_weight_calls
from jaxinfer.models import Weights, load_config
from jaxinfer.models.weight_ops import batch_invariant_weights
from jaxinfer.runtime.weight_swap import leaf_like, replaced, weight_leaves
from jaxinfer.speculative.eagle import EagleParams, eagle_params
from jaxinfer.speculative.mtp import MtpWeights
from jaxinfer.speculative.mtp_checkpoint import load_mtp, mtp_updates

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM

SLEEP_LEVELS = (1, 2)
Updates = Weights | Mapping[str, Any] | Iterable[tuple[str, Any]]


@dataclasses.dataclass
class WeightState:
    """What updates and sleep keep beside an LLM."""

    twin: Any = None  # the model's weights as ShapeDtypeStructs in their shardings (made at the first need)
    asleep: int = 0  # the sleep level, 0 when awake
    woken: bool = False  # level 2 after wake_up: awake, waiting for weights
    host: Any = None  # level 1: the running weights' (and a speech encoder's) leaves as NumPy arrays
    shardings: Any = None  # level 1: where each goes back


def model_twin(llm: "LLM") -> Weights:
    """The model's weights as ShapeDtypeStructs in their shardings: what new leaves are made like."""
    state = llm._weight_state
    if state.twin is None:
        state.twin = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), llm.weights)
    return state.twin


def apply_update(llm: "LLM", weights: Updates) -> None:
    """`LLM.update_weights`: the given leaves replaced, the rest kept (after sleep(level=2): all needed)."""
    check_not_asleep_with_weights(llm)
    head = None
    if isinstance(weights, Weights):
        updates = weight_leaves(weights)
    else:
        named = named_dict(weights)
        updates, head = leaf_updates(named, llm.config, llm.dtype), mtp_head_update(llm, named)
    twin = model_twin(llm)
    missing = [p for p in weight_leaves(twin) if p not in updates]
    if missing and llm._weight_state.asleep == 2:
        raise ValueError(f"sleep(level=2) discarded the weights, so update_weights needs all of them; missing "
                         f"{len(missing)} leaves (first: {missing[:3]})")
    # A whole update needs only the served leaves' formats; a partial one keeps the others' values.
    serve(llm, replaced(llm.weights if missing else twin, updates), head)


def _mtp_head(llm: "LLM") -> MtpWeights | None:
    """The served MTP layer when the LLM speculates with its checkpoint's own (method "mtp"), else None."""
    params = llm.engine.runner.draft_weights
    return params.head if isinstance(params, EagleParams) and isinstance(params.head, MtpWeights) else None


def mtp_head_update(llm: "LLM", named: Mapping[str, Any]) -> MtpWeights | None:
    """The MTP layer drafting with the first MTP layer's tensors among `named` (others kept); None when the
    LLM drafts no MTP or `named` holds none of its tensors (a trainer that updates the decoder alone)."""
    head = _mtp_head(llm)
    if head is None:
        return None
    updates = mtp_updates(named, llm.config, llm.dtype, head)
    return replaced(head, updates) if updates else None


def check_not_asleep_with_weights(llm: "LLM") -> None:
    """RuntimeError while level 1's weights wait in host memory: wake_up brings them back first."""
    if llm._weight_state.asleep == 1:
        raise RuntimeError("the LLM is asleep (sleep(level=1)), its weights in host memory: call wake_up() first")


def apply_from_disk(llm: "LLM", model: str | Path) -> None:
    """`LLM.update_weights_from_disk`: a checkpoint of the served architecture and shapes, each leaf made
    like the served one as it is read (a quantized model's float checkpoint is never held whole)."""
    check_not_asleep_with_weights(llm)
    model_dir = validation.model_dir(model, "model")
    served = model_twin(llm)
    leaves = weight_leaves(served)
    stored = load_config(model_dir)
    if stored.architecture != llm.config.architecture:
        raise ValueError(f"{model_dir} holds a {stored.architecture}, this LLM serves a {llm.config.architecture}")
    make_like = lambda path, leaf: leaf_like(leaf, leaves[path], path, owned=True)  # noqa: E731
    head = _mtp_head(llm)
    if head is not None:  # the new checkpoint's MTP layer drafts for its decoder
        head = replaced(head, weight_leaves(load_mtp(model_dir, llm.config, llm.dtype, llm.layout)[1]), owned=True)
    if is_converted(model_dir):
        _, weights = load_weights(model_dir, llm.dtype, False, llm.layout, cfg=llm.config)
        serve(llm, replaced(served, weight_leaves(weights), owned=True), head)
        return
    _, weights = load_weights(model_dir, llm.dtype, False, llm.layout, transform=make_like, cfg=llm.config)
    serve(llm, weights, head)


def serve(llm: "LLM", weights: Weights, mtp_head: MtpWeights | None = None) -> None:
    """Make `weights` (the model's, made like the served ones) what the engine runs, awake; `mtp_head`: a new
    MTP layer to draft with (None: the served one kept)."""
    spec = llm.cache_spec
    shaped = running_weights(weights, llm.config, llm.layout, llm.cpu_kernels, llm._quantized_kernel, spec.interpret,
                             spec.batch_invariant)
    llm.engine.replace_weights(shaped.engine, served_head(llm, shaped.run, mtp_head))
    llm._run_weights, llm._engine_weights = shaped.run, shaped.engine
    llm._weights_fingerprint = None  # saved sessions name the weights they were computed by
    llm._weight_state = dataclasses.replace(llm._weight_state, asleep=0, woken=False, host=None, shardings=None)


def served_head(llm: "LLM", run: Weights, mtp_head: MtpWeights | None = None) -> EagleParams | None:
    """An EAGLE head's or MTP layer's parameters with the target's new embedding and head (and `mtp_head` for
    the MTP layer where given); None for other drafts (kept)."""
    params = llm.engine.runner.draft_weights
    if not isinstance(params, EagleParams):
        return None
    return eagle_params(params.head if mtp_head is None else mtp_head, run)


def put_to_sleep(llm: "LLM", level: int) -> None:
    """`LLM.sleep`: free the KV pool and the weights' device memory (level 1: kept in host memory)."""
    if level not in SLEEP_LEVELS:
        raise ValueError(f"level must be 1 (weights kept in host memory) or 2 (weights discarded), got {level!r}")
    state = llm._weight_state
    if state.asleep:
        raise RuntimeError(f"already asleep (level {state.asleep}); call wake_up() first")
    llm.engine.release()  # refuses while requests are in flight
    model_twin(llm)  # new weights are made like these after level 2
    held = (llm._run_weights, _speech_encoder(llm))
    if level == 1:
        state.shardings = jax.tree.map(lambda x: x.sharding, held)
        state.host = jax.device_get(held)
    for x in jax.tree.leaves(held):
        x.delete()
    state.asleep = level
    llm.engine.no_weights = EngineAsleep(
        "the LLM is asleep (sleep(level=1)): call wake_up() first" if level == 1 else
        "sleep(level=2) discarded the weights: call update_weights(...) or update_weights_from_disk(...) first",
        level,
    )


def _speech_encoder(llm: "LLM") -> Any:
    """A speech model's encoder weights (beside the decoder's, in its audio runner); None for other models."""
    audio = llm.engine.runner.audio
    return None if audio is None else audio.encoder


def wake(llm: "LLM") -> None:
    """`LLM.wake_up`: level 1's weights back on their devices (the KV pool is made on the next step);
    after level 2 only the pool, the weights waiting for an update."""
    state = llm._weight_state
    if state.asleep == 2:
        state.woken = True
    if state.asleep != 1:
        return
    run, encoder = jax.tree.map(jax.device_put, state.host, state.shardings)
    if encoder is not None:
        llm.engine.runner.audio.encoder = encoder
    engine = batch_invariant_weights(run) if llm.cache_spec.batch_invariant else run
    llm.engine.replace_weights(engine, served_head(llm, run))
    llm._run_weights, llm._engine_weights = run, engine
    llm._weight_state = dataclasses.replace(state, asleep=0, host=None, shardings=None)


class WeightCalls:
    """`LLM`'s weight-update and sleep-mode calls (mixed into it: `self` is the LLM)."""

    def update_weights(self: LLM, weights: Updates) -> None:
        """Serve new weights from the next request on (an RL loop's new policy); nothing recompiles.

        weights: a pytree like `LLM.weights` (a JAX trainer's), or tensors under their HF checkpoint names,
        as a mapping or (name, tensor) pairs (vLLM's `load_weights`; torch, NumPy or jax arrays), all or
        some of the model's (pushed in buckets; each leaf's tensors together, e.g. a layer's q/k/v). Float
        values for quantized leaves are quantized as served; each leaf goes where the served one is.
        Cached prefixes are dropped. Refused while requests are in flight.
        """
        refuse_weight_calls(self._run_weights, "LLM.update_weights")
        refuse_speech_weight_calls(self._audio, "LLM.update_weights")
        apply_update(self, weights)

    def update_weights_from_disk(self: LLM, model: str | Path) -> None:
        """Serve the weights of checkpoint `model` (HF or converted; this model's architecture and
        shapes), read leaf by leaf into the served format (SGLang's update_weights_from_disk)."""
        refuse_weight_calls(self._run_weights, "LLM.update_weights_from_disk")
        refuse_speech_weight_calls(self._audio, "LLM.update_weights_from_disk")
        apply_from_disk(self, model)

    def sleep(self: LLM, level: int = 1) -> None:
        """Free the device memory the model holds between uses (vLLM's sleep mode): the KV pool, and the
        weights, kept in host memory (level 1) or discarded (level 2: the next come from update_weights).
        Requests are refused until `wake_up`; refused while requests are in flight."""
        refuse_weight_calls(self._run_weights, "LLM.sleep")
        if level == 2:  # the next weights would come from update_weights
            refuse_speech_weight_calls(self._audio, "LLM.sleep(level=2)")
        put_to_sleep(self, level)

    def wake_up(self: LLM) -> None:
        """Undo `sleep`: level 1's weights back on the devices (the KV pool is made on the next step)."""
        wake(self)

    @property
    def is_sleeping(self: LLM) -> bool:
        """Between `sleep` and `wake_up` (after level 2, weights are needed too before requests run)."""
        return self._weight_state.asleep > 0 and not self._weight_state.woken
