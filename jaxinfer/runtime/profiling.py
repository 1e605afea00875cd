"""Device traces of a running model (vLLM's `start_profile` / `stop_profile`) through `jax.profiler`.

A trace directory holds what TensorBoard's profile plugin and XProf read (`*.xplane.pb`) and a
`*.trace.json.gz` that Perfetto (ui.perfetto.dev) opens: each step program's device ops, the
host threads and the transfers between them.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

PROFILER_DIR_VAR = "JAXINFER_PROFILER_DIR"  # the server's profile routes exist when it is set


class Profiler:
    """One trace at a time, into a directory given or named by $JAXINFER_PROFILER_DIR."""

    def __init__(self) -> None:
        self.directory: Path | None = None

    def start(self, trace_dir: str | Path | None = None) -> Path:
        """Start recording; returns the directory the trace goes to."""
        if self.directory is not None:
            raise RuntimeError(f"a profile is already being recorded into {self.directory}; call stop_profile first")
        given = trace_dir if trace_dir is not None else os.environ.get(PROFILER_DIR_VAR)
        if not given:
            raise ValueError(f"start_profile needs a directory for the trace: give trace_dir or set {PROFILER_DIR_VAR}")
        directory = Path(given).expanduser()
        directory.mkdir(parents=True, exist_ok=True)
        jax.profiler.start_trace(str(directory))
        self.directory = directory
        return directory

    def stop(self) -> Path:
        """Stop recording and write the trace; returns the directory it went to."""
        if self.directory is None:
            raise RuntimeError("no profile is being recorded; call start_profile first")
        jax.profiler.stop_trace()
        directory, self.directory = self.directory, None
        return directory
