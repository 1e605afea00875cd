"""The self-contained HTML report: tables and plotly plots with plotly.js inlined (opens offline)."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from jaxinfer.entrypoints.compare.extras import require
from jaxinfer.entrypoints.compare.report import Comparison, cost_rows, describe_config, quality_rows

KL_FLOOR = 1e-10  # KL values below this (equal distributions) are drawn at it on the log axis
STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
td:first-child,th:first-child{text-align:left}.pass{color:#070}.fail{color:#b00;font-weight:bold}"""


def agreement_figure(series: dict[str, Any]) -> Any:
    """Fraction of prompts whose greedy outputs are still identical through each position."""
    import plotly.graph_objects as go

    y = series["agreement_by_position"]
    fig = go.Figure(go.Scatter(x=list(range(len(y))), y=y, mode="lines", line_shape="hv", name="identical so far"))
    fig.update_layout(title="Greedy agreement until first divergence", xaxis_title="output position",
                      yaxis_title="fraction of prompts", yaxis_range=[0, 1.05])
    return fig


def kl_figure(series: dict[str, Any]) -> Any:
    """Histograms of log10 KL(A||B) per teacher-forced position, held-out and generated text."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, key in (("held-out text", "kl_held_out"), ("prompts + A's greedy output", "kl_generated")):
        values = np.log10(np.maximum(np.asarray(series[key], dtype=np.float64), KL_FLOOR))
        fig.add_trace(go.Histogram(x=values.tolist(), name=name, opacity=0.6, nbinsx=60))
    fig.update_layout(title=f"KL(A||B) of next-token distributions (values below {KL_FLOOR:g} drawn at it)",
                      xaxis_title="log10 KL (nats)", yaxis_title="positions", barmode="overlay")
    return fig


def latency_figure(series: dict[str, Any]) -> Any:
    """Empirical CDFs of time to first token and time per output token, A and B."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for metric in ("ttft", "tpot"):
        for side in ("a", "b"):
            values = np.sort(np.asarray(series[metric][side], dtype=np.float64)) * 1e3
            cdf = np.arange(1, len(values) + 1) / max(len(values), 1)
            fig.add_trace(go.Scatter(x=values.tolist(), y=cdf.tolist(), mode="lines", line_shape="hv",
                                     name=f"{metric.upper()} {side.upper()}"))
    fig.update_layout(title="Latency CDFs (greedy pass)", xaxis_title="milliseconds", yaxis_title="fraction of requests",
                      xaxis_type="log")
    return fig


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _verdict_rows(comparison: Comparison) -> list[list[str]]:
    rows = []
    for v in comparison.verdicts:
        cls, word = {True: ("pass", "pass"), False: ("fail", "FAIL"), None: ("", "not measured")}[v.passed]
        value = "-" if v.value is None else f"{v.value:.6g}"
        rows.append([html.escape(v.metric), value, f"{html.escape(v.op)} {v.bound:g}", f'<span class="{cls}">{word}</span>'])
    return rows


def render_html(comparison: Comparison) -> str:
    """The whole page; plotly.js is embedded once, before the first plot."""
    require("plotly")
    figures = [agreement_figure(comparison.series), kl_figure(comparison.series), latency_figure(comparison.series)]
    plots = [fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)]
    outcome = '<p class="pass">All verdicts pass.</p>' if comparison.passed else (
        '<p class="fail">Failed: ' + html.escape(", ".join(v.threshold for v in comparison.failures())) + "</p>")
    quality = [[html.escape(label), html.escape(a), html.escape(b)] for label, _, a, b in quality_rows(comparison.metrics)]
    cost = [[html.escape(c) for c in row] for row in cost_rows(comparison.metrics["cost"])]
    return "\n".join([
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>jaxinfer compare</title>",
        f"<style>{STYLE}</style></head><body><h1>jaxinfer compare</h1>",
        (f"<p><b>A</b>: {html.escape(describe_config(comparison.a))}<br><b>B</b>: "
         f"{html.escape(describe_config(comparison.b))}<br>B changes: {html.escape(', '.join(comparison.kinds))}</p>"),
        outcome, "<h2>Verdicts</h2>", _table(["metric", "value", "threshold", "verdict"], _verdict_rows(comparison)),
        "<h2>Quality</h2>", _table(["metric", "A", "B"], quality),
        "<h2>Cost</h2>", _table(["", "A", "B"], cost),
        "<h2>Plots</h2>", *plots, "</body></html>",
    ])


def write_html(comparison: Comparison, path: Path) -> Path:
    """The report at `path` (its directory made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(comparison))
    comparison.html_path = path
    return path
