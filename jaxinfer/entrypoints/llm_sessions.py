"""`LLM.save_session` and `load_session`: a prompt's KV saved to disk and restored into a later LLM's
prefix cache (entrypoints/sessions; mixed into LLM)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from jaxinfer.checkpoint.kv_session import SessionInfo, weights_fingerprint
from jaxinfer.config.sampling_params import SamplingParams
from jaxinfer.engine.prompt_checks import check_prompt
from jaxinfer.entrypoints import sessions
from jaxinfer.entrypoints.call_arguments import Prompt

if TYPE_CHECKING:
    from jaxinfer.entrypoints.llm import LLM


class SessionCalls:
    """The session calls of `LLM` (mixed into it: `self` is the LLM)."""

    def save_session(self: LLM, path: str | Path, prompt: Prompt, overwrite: bool = False) -> SessionInfo:
        """Save the KV cache of `prompt` (str or token ids; its whole pages) to the directory `path`,
        computing it first where the prefix cache does not hold it. `load_session` restores it in any
        later LLM on the same weights, dtype and cache settings: prompts that start with it then skip
        its prefill (a long document or system prompt, a conversation to resume)."""
        self._check_generating("LLM.save_session (a prefill)")
        token_ids = self.tokenize(prompt)
        check_prompt(token_ids, 1, self.config.vocab_size, self.max_seq_len)
        sessions.check_engine(self.engine)
        self._engine_generate([token_ids], [SamplingParams(max_tokens=1, temperature=0)])  # cached pages: no work
        return sessions.save_session(self.engine, path, token_ids, self._fingerprint(), overwrite)

    def load_session(self: LLM, path: str | Path) -> SessionInfo:
        """Restore a session saved by `save_session` into the prefix cache; its `token_ids` are the
        prompt it was saved from (prompts starting with them reuse its KV)."""
        return sessions.load_session(self.engine, path, self._fingerprint())

    def _fingerprint(self: LLM) -> str:
        """The model's weights' fingerprint (computed once), as loaded and quantized: what a saved
        session must come from, however they run (packed for the CPU kernels or not, sharded or not)."""
        if self._weights_fingerprint is None:
            self._weights_fingerprint = weights_fingerprint(self.weights)
        return self._weights_fingerprint
