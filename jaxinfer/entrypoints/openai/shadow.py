"""Shadow validation and automatic fallback (`jaxinfer serve --shadow-fraction F`, docs/validation.md).

`ShadowRouter` stands where the routes expect the AsyncLLMEngine. Each request runs on the served
engine as before; a sampled fraction is, once its output is complete and sent, handed to a
background task that runs it again on the reference configuration (greedy requests: the whole
generation; every request: the served output under teacher forcing by both models) and scores it
with `jaxinfer compare`'s metric functions. Nothing of it sits on a request's path: the scoring
starts after the request finished, one shadow request at a time, and a backlog past
`max_pending` is dropped (counted). The reference shares the served weights when the two differ
only losslessly (an engine of its own on the same arrays); otherwise it is a second LLM.

Fallback: a lossless optimization (speculation, prefix caching) whose greedy output differs from
the reference's once, a lossy one whose mean agreement over the last `window` shadowed requests
falls below `min_agreement`, or any optimization of a request the served engine failed, is
switched to the reference path for good: speculation and prefix caching are turned off in the
served engine, anything else routes every later request to the reference. One log line says why; /metrics shows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from typing import Any, AsyncIterator, Mapping, Sequence

import numpy as np

from jaxinfer.config.lora import LoRARequest
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine import AsyncLLMEngine, RequestOutput
from jaxinfer.engine.async_engine import RequestTimeout
from jaxinfer.engine.outputs import accumulate
from jaxinfer.entrypoints.compare.configs import Configuration, changed_keys
from jaxinfer.entrypoints.compare.quality import greedy_agreement, log_softmax, teacher_forced
from jaxinfer.entrypoints.compare.verdicts import LOSSLESS_KEYS, kind_of_change
from jaxinfer.entrypoints.llm import LLM
from jaxinfer.entrypoints.openai.gate import ServerStopping
from jaxinfer.entrypoints.openai.shadow_stats import Fallbacks, Score, ShadowSettings, ShadowStats

logger = logging.getLogger("jaxinfer.server")
# What the reference turns off unless --shadow-config says otherwise.
REFERENCE_DEFAULTS = {"speculative": None, "quantization": None, "quantize_lm_head": False, "kv_cache_dtype": "auto",
                      "enable_prefix_caching": False}
# Changed LLM keywords that are optimizations, by the name /metrics gives them (others: the key's own name).
OPTIMIZATION_NAMES = {"speculative": "speculation", "enable_prefix_caching": "prefix_caching",
                      "quantization": "quantization", "quantize_lm_head": "quantization"}
SCHEDULING_KEYS = LOSSLESS_KEYS - {"speculative", "enable_prefix_caching"}  # change no output: not optimizations


def reference_kwargs(served: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The reference's LLM kwargs: the served ones without speculation, quantization or prefix caching,
    then --shadow-config's pairs."""
    return {**served, **REFERENCE_DEFAULTS, **overrides}


def optimizations(served: Mapping[str, Any], reference: Mapping[str, Any]) -> dict[str, str]:
    """Each optimization the served configuration adds over the reference, with its kind (lossless, int8, ...)."""
    found: dict[str, str] = {}
    changes = changed_keys(Configuration(dict(reference), "--shadow-config"), Configuration(dict(served), "served"))
    for key, (_, value) in changes.items():
        if key in SCHEDULING_KEYS or (key == "quantize_lm_head" and not value):
            continue
        name = OPTIMIZATION_NAMES.get(key, key)
        kind = kind_of_change(key, value, served)
        found[name] = kind if found.get(name, "lossless") == "lossless" else found[name]
    return found


class ShadowRouter:
    """The routes' engine: requests to the served engine or, after a routing fallback, the reference;
    a sampled fraction shadowed on the reference after they finish."""

    def __init__(self, llm: LLM, served_kwargs: Mapping[str, Any], settings: ShadowSettings):
        self.llm, self.settings = llm, settings
        self.engine = llm.engine  # what the routes read (structured outputs compile against it)
        self.primary = AsyncLLMEngine(llm.engine)
        ref_kwargs = reference_kwargs(served_kwargs, settings.reference)
        self.optimizations = optimizations(served_kwargs, ref_kwargs)
        if settings.fraction == 0:  # no shadowing: the router only turns a failing speculation off
            self.optimizations = {k: v for k, v in self.optimizations.items() if k == "speculation"}
        self.lossy = sorted(name for name, kind in self.optimizations.items() if kind != "lossless")
        self.shares_weights = not self.lossy
        self.reference_llm: LLM | None = None
        self.reference: AsyncLLMEngine | None = None  # none without shadowing: only in-engine fallbacks then
        if settings.fraction > 0:
            self.reference_llm, reference_engine = self._load_reference(ref_kwargs)
            self.reference = AsyncLLMEngine(reference_engine)
        self.stats = ShadowStats(settings.window, settings.keep)
        self.fallbacks = Fallbacks()
        self.routed = False  # every request goes to the reference once a routing fallback switched on
        self.random = random.Random(settings.seed)
        self.pending = 0
        self.slot = asyncio.Semaphore(1)  # one shadow request at a time
        self.tasks: set[asyncio.Task] = set()
        self.told_unpaid = False

    def _load_reference(self, ref_kwargs: dict[str, Any]) -> tuple[LLM | None, Any]:
        """(a second LLM or None, the reference's engine): the served weights when only lossless things differ."""
        if self.shares_weights:
            engine = self.llm.engine
            pages = max(engine.blocks.num_pages // 4, 2 * engine.config.pages_per_seq + 1)
            return None, self.llm.plain_engine(num_pages=min(pages, engine.blocks.num_pages))
        reference = LLM(**ref_kwargs)
        return reference, reference.engine

    @property
    def waiting(self) -> int:
        """Sequences waiting for a slot in the engine serving new requests (the server's queue bound)."""
        route = self.reference if self.routed else self.primary
        return route.waiting

    def abort_all(self, error: BaseException) -> int:
        """Hand every reader on both engines `error` and abort its request (a server that stops)."""
        return self.primary.abort_all(error) + (self.reference.abort_all(error) if self.reference is not None else 0)

    async def generate(
        self, prompt: Sequence[int], params: SamplingParams | None = None, request_id: str | None = None,
        deadline: float | None = None, streamed: bool = False, lora_request: LoRARequest | None = None,
        images: tuple = (), priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """The request's deltas from whichever engine serves it now; shadowed afterwards when sampled.
        A request past its deadline or stopped by a shutdown is no optimization's failure. A LoRA
        adapter's request, or one with images, runs on the served engine, unshadowed: the reference
        has no adapter slots and no vision tower."""
        plain = lora_request is None and not images
        route = self.reference if self.routed and plain else self.primary
        params = params or self.llm.default_params
        # Shared weights give the same logits: only a greedy rerun has something to compare then.
        shadowed = (route is self.primary and plain and self.settings.fraction > 0
                    and self.random.random() < self.settings.fraction
                    and (params.greedy or self.reference_llm is not None))
        total: RequestOutput | None = None
        try:
            async with contextlib.aclosing(route.generate(prompt, params, request_id, deadline, streamed,
                                                          lora_request, images, priority)) as deltas:
                async for delta in deltas:  # closed with this generator: an early close aborts the request
                    if shadowed:
                        total = accumulate(total, delta)
                    if delta.error or any(o.finish_reason == "error" for o in delta.outputs):
                        self._failed(route, delta.error or "the engine failed the request")
                    yield delta
        except (ValueError, TypeError, RequestTimeout, ServerStopping):
            raise  # a request the engine refused, or one out of time: no optimization's failure
        except Exception as error:
            self._failed(route, f"{type(error).__name__}: {error}")
            raise
        self._note_speculation()
        if shadowed and total is not None and total.finished and not total.error:
            self._submit(total.request_id, list(prompt), params, list(total.outputs[0].token_ids))

    async def abort(self, request_id: str) -> None:
        """Abort on both engines (a request lives on one of them)."""
        await self.primary.abort(request_id)
        if self.reference is not None:
            await self.reference.abort(request_id)

    def _submit(self, request_id: str, prompt: list[int], params: SamplingParams, output: list[int]) -> None:
        """Queue a shadow request, or drop it when the backlog is full."""
        if self.pending >= self.settings.max_pending or not output:
            self.stats.count("dropped")
            return
        self.pending += 1
        task = asyncio.get_running_loop().create_task(self._shadow(request_id, prompt, params, output))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _shadow(self, request_id: str, prompt: list[int], params: SamplingParams, output: list[int]) -> None:
        """Run the reference on one finished request and fold its score in."""
        try:
            async with self.slot:
                reference = None
                if params.greedy:
                    one = dataclasses.replace(params, n=1, logprobs=None, prompt_logprobs=None)
                    reference = await self._reference_output(prompt, one, f"shadow-{request_id}")
                score = await asyncio.to_thread(self._score, request_id, prompt, output, reference)
                await asyncio.to_thread(self._record, score)
        except Exception as error:  # noqa: BLE001 - a failed shadow never touches serving
            self.stats.count("errors")
            logger.warning("shadow validation of %s failed: %s: %s", request_id, type(error).__name__, error)
        finally:
            self.pending -= 1

    async def _reference_output(self, prompt: list[int], params: SamplingParams, request_id: str) -> list[int]:
        """The reference engine's tokens for the request."""
        total = None
        async for delta in self.reference.generate(prompt, params, request_id):
            total = accumulate(total, delta)
        return list(total.outputs[0].token_ids)

    def _score(self, request_id: str, prompt: list[int], output: list[int], reference: list[int] | None) -> Score:
        """Greedy agreement with the reference's output, and the served output under teacher forcing by both."""
        greedy = None if reference is None else greedy_agreement([output], [reference])
        top1 = kl = diverged = None
        if self.reference_llm is not None:  # shared weights give the same logits: nothing to measure
            ids = prompt + output
            start = len(prompt) - 1  # the row that predicts the first output token
            served = log_softmax(self.llm.logits(ids)[start:])
            expected = log_softmax(self.reference_llm.logits(ids)[start:])
            forced = teacher_forced(expected, served, ids[start:])
            top1, kl = float(forced.top1_agree.mean()), float(forced.kl.mean())
            differ = np.flatnonzero(~forced.top1_agree)
            diverged = int(differ[0]) if differ.size else None
        if greedy is not None:
            diverged = greedy.first_divergence[0]
        return Score(request_id, prompt, output, reference, diverged,
                     None if greedy is None else greedy.position_match, top1, kl)

    def _record(self, score: Score) -> None:
        """Fold the score into the stats and switch what it condemns to the reference path."""
        tokenizer = self.llm.tokenizer
        decode = None if tokenizer is None else (lambda ids: tokenizer.decode(ids, skip_special_tokens=False))
        mean = self.stats.record(score, None if decode is None else decode(score.prompt_ids), decode)
        if not self.settings.fallback:
            return
        if not self.lossy and score.reference_ids is not None and score.mismatch:
            where = f"request {score.request_id} differs from the reference at token {score.first_divergence}"
            for name in self.optimizations:
                self._switch(name, "shadow_mismatch", f"{name} is lossless but its greedy output of {where}")
        if self.lossy and mean is not None and mean < self.settings.min_agreement:
            line = f"shadow agreement {mean:.3f} < {self.settings.min_agreement} over the last {self.settings.window} requests"
            for name in self.lossy:
                self._switch(name, "low_agreement", f"{name}: {line}")

    def _failed(self, route: AsyncLLMEngine, reason: str) -> None:
        """The served engine failed a request: every optimization still on goes to the reference path."""
        if route is self.primary:
            for name in self.optimizations:
                self._switch(name, "error", f"{name}: a request failed on the served engine ({reason})")

    def _switch(self, name: str, cause: str, reason: str) -> None:
        """One optimization to the reference path, logged once. Routing requests to the reference
        turns every other optimization off with it; without a reference (no shadowing) only
        speculation and prefix caching can fall back."""
        engine = self.llm.engine
        in_engine = name == "prefix_caching" or (name == "speculation" and engine.speculator is not None)
        if not (in_engine or self.reference is not None) or not self.fallbacks.switch(name, cause, reason):
            return
        if name == "speculation" and engine.speculator is not None:
            engine.speculator.disable(reason)  # the same engine, plain from its next step
        elif name == "prefix_caching":
            engine.blocks.prefix_caching = False  # no lookups or new entries from the next admission on
        else:
            self.routed = True
            for other in self.optimizations:
                self.fallbacks.switch(other, cause, f"{other}: requests routed to the reference ({reason})")
        logger.warning("jaxinfer: fallback to the reference: %s", reason)

    def _note_speculation(self) -> None:
        """Log once that speculation paused itself because it did not pay (the gauge shows while it lasts)."""
        speculator = self.llm.engine.speculator
        if not self.told_unpaid and speculator is not None and speculator.unpaid and speculator.disabled_reason is None:
            self.told_unpaid = True
            logger.warning("jaxinfer: speculation paused: %s", speculator.fallback_reason())

    def fallback_states(self) -> dict[str, tuple[str, str] | None]:
        """Per optimization: (cause, reason) while it runs on the reference path, else None."""
        active = self.fallbacks.snapshot()
        states = {name: None if name not in active else (active[name].cause, active[name].reason)
                  for name in self.optimizations}
        if "speculation" in states and states["speculation"] is None:
            states["speculation"] = speculation_fallback(self.llm)
        return states

    def debug(self) -> dict:
        """GET /debug/shadow: settings, counters, fallbacks and the last mismatches."""
        return {
            "fraction": self.settings.fraction, "window": self.settings.window,
            "min_agreement": self.settings.min_agreement, "reference_shares_weights": self.shares_weights,
            "optimizations": self.optimizations, "routed_to_reference": self.routed,
            "fallbacks": {name: None if state is None else {"cause": state[0], "reason": state[1]}
                          for name, state in self.fallback_states().items()},
            "counts": {k: v for k, v in self.stats.snapshot().items() if isinstance(v, int)},
            "mismatches": self.stats.last_mismatches(),
        }


def speculation_fallback(llm: LLM) -> tuple[str, str] | None:
    """(cause, reason) when the LLM was asked to speculate and does not now: a draft that failed to load,
    or the engine's plan finding that drafting does not pay; None otherwise."""
    speculator = llm.engine.speculator
    if speculator is not None:
        reason = speculator.fallback_reason()
        if reason is None:
            return None
        return ("disabled" if speculator.disabled_reason is not None else "does_not_pay", reason)
    if llm.speculation_failure is not None:
        return "load_failed", llm.speculation_failure
    return None
