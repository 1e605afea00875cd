"""The speculation plan's rounds and the package's layering, without running a model.

The planning cases are built from fixed costs and acceptance estimates, so the decisions are
exact (no timing enters them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from jaxinfer.speculative.round_plan import CostModel, round_plan

K = 4
PACKAGE = Path(__file__).resolve().parents[1] / "jaxinfer"


def plan_for(acceptance: list[float], can_draft: list[int], round_base: float) -> np.ndarray:
    """The round plan for measured greedy rows with these estimates (min_gain 1.1), a round costing
    round_base plain steps and drafts nothing."""
    batch = len(acceptance)
    accept = np.repeat(np.asarray(acceptance, np.float32)[:, None], K, axis=1)
    available = np.minimum(np.asarray(can_draft, np.int32), K)
    costs = CostModel(np.full((2,), round_base, np.float32), np.zeros((2,), np.float32), np.float32(0.0))
    return round_plan(accept, available, np.ones(batch, bool), np.bool_(True), costs, 1.1)


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


def test_the_engines_step_counters_carry_every_field_the_totals_sum():
    """The verify step's per-row counters (engine) and the running totals (no jax) name the same fields."""
    from jaxinfer.engine.spec_counters import step_counters
    from jaxinfer.speculative.acceptance_summary import COUNTER_FIELDS

    counters = step_counters(np.asarray([2, 0]), np.asarray([1, 0]), K)
    assert tuple(counters) == COUNTER_FIELDS
