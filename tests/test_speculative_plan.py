"""The speculative loop's round planning and the package's layering, without running a model.

The planning cases are built from fixed costs and acceptance estimates, so the decisions are
exact (no timing enters them).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxinfer import SamplingParams, SpeculativeConfig
from jaxinfer.models.contiguous_decode import DecodeState
from jaxinfer.sampling.sampler import sampling_arrays
from jaxinfer.speculative import loop
from jaxinfer.speculative.round_plan import CostModel

K = 4
PACKAGE = Path(__file__).resolve().parents[1] / "jaxinfer"


@dataclasses.dataclass(frozen=True)
class FixedProposer:
    """A stateless proposer that can always draft `can_draft[b]` tokens for row b."""

    can_draft: tuple[int, ...]
    stateful: bool = False
    draft_cost: float = 0.0

    def available(self, params: Any, state: DecodeState, pstate: Any, k: int) -> jnp.ndarray:
        return jnp.minimum(jnp.asarray(self.can_draft, jnp.int32), k)


def plan_for(acceptance: list[float], can_draft: list[int], round_base: float) -> np.ndarray:
    """The plan _replan makes for measured rows with these estimates, a round costing round_base plain steps."""
    batch = len(acceptance)
    state = DecodeState(
        tokens=jnp.zeros((batch, 32), jnp.int32), lengths=jnp.full((batch,), 8, jnp.int32),
        max_lengths=jnp.full((batch,), 32, jnp.int32), done=jnp.zeros((batch,), bool),
        stop_ids=jnp.full((batch, 4), -1, jnp.int32),
        sampling=sampling_arrays([SamplingParams(temperature=0)] * batch, list(range(batch))), cache=None,
    )
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=K, min_gain=1.1)
    s = loop.initial_state(state, None, spec)
    measured = dataclasses.replace(
        s.adapt,
        acceptance=jnp.repeat(jnp.asarray(acceptance, jnp.float32)[:, None], K, axis=1),
        observed=jnp.ones((batch, K), jnp.int32),
    )
    costs = CostModel(jnp.full((2,), round_base), jnp.zeros((2,)), jnp.float32(0.0))
    s = loop._replan(None, dataclasses.replace(s, adapt=measured), costs, FixedProposer(tuple(can_draft)), spec)
    return np.asarray(s.plan)


def test_plan_counts_only_what_the_proposer_can_draft():
    # Certain drafts: 4 of them would pay (5 tokens for 2 steps), but only 1 is available, and
    # a 1-draft round yields 2 tokens for 2 steps, no gain: the round must not run.
    assert plan_for([1.0], [K], round_base=2.0).tolist() == [K]
    assert plan_for([1.0], [1], round_base=2.0).tolist() == [0]


def test_rows_that_would_not_draft_still_count_in_the_shared_round():
    # One row alone would gain (5 tokens for 2 steps); with three rows that get 1 token each the
    # round yields 8 tokens for 2 steps where plain steps yield 4 per step: no gain, plain.
    assert plan_for([1.0, 0.0, 0.0, 0.0], [K, K, K, K], round_base=2.0).tolist() == [0, 0, 0, 0]
    # Two certain rows carry the batch (12 tokens for 2 steps), and every row drafts in the round.
    assert plan_for([1.0, 1.0, 0.0, 0.0], [K, K, 2, 0], round_base=2.0).tolist() == [K, K, 2, 0]


def _imports(path: Path) -> set[str]:
    """jaxinfer modules `path` imports (a `from pkg import name` counts name when it is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("jaxinfer")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jaxinfer"):
            for alias in node.names:
                sub = PACKAGE.parent / (node.module + "." + alias.name).replace(".", "/")
                is_module = sub.with_suffix(".py").is_file() or sub.is_dir()
                out.add(node.module + "." + alias.name if is_module else node.module)
    return out


def _module_graph() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = _imports(path)
    return graph


def test_speculative_package_has_no_upward_import():
    """What speculative/ imports from the rest of the package never imports speculative/ back."""
    graph = _module_graph()
    inside = lambda name: name.startswith("jaxinfer.speculative")  # noqa: E731
    seen, todo = set(), [d for name, deps in graph.items() if inside(name) for d in deps if not inside(d)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        back = {d for d in graph.get(name, ()) if inside(d)}
        assert not back, f"{name} (imported by jaxinfer.speculative) imports {sorted(back)}"
        todo += [d for d in graph.get(name, ()) if not inside(d)]


def test_host_totals_read_the_device_counters_by_name():
    """The host bookkeeping (no jax) names the device loop's counters itself: the two lists must agree."""
    import dataclasses

    from jaxinfer.speculative.acceptance_summary import COUNTER_FIELDS
    from jaxinfer.speculative.stats import SpecCounters

    assert tuple(f.name for f in dataclasses.fields(SpecCounters)) == COUNTER_FIELDS
