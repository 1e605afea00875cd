"""A/B validation of two configurations (`jaxinfer compare`, `jaxinfer.compare`).

Modules: configs (LLM keyword sets from text), workload (prompts, held-out text), runs (one side
on the engine), hf_reference (HF transformers as side B), quality and two_sample (pure metric
functions, reusable by the server's shadow validation), scores (all metrics of two runs),
verdicts (thresholds by kind of change), report / html_report (JSON, terminal table, HTML), api
(`compare`), cli (the subcommand).
"""

from jaxinfer.entrypoints.compare.api import compare
from jaxinfer.entrypoints.compare.configs import Configuration
from jaxinfer.entrypoints.compare.report import Comparison

__all__ = ["compare", "Configuration", "Comparison"]
