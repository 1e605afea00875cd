"""DeepSeek-V2's routing (`topk_method` "greedy" or "group_limited_greedy"): softmax scores, then the top k.

Scores are the softmax of the router logits over all experts. "greedy" takes the k best; "group_limited_greedy"
splits the experts into `groups` equal groups ranked by their best score, zeroes every score outside the best
`groups_per_token` groups and takes the k best of what is left. The weights are the chosen scores times
`scaling` (`routed_scaling_factor`), never renormalised (transformers' DeepseekV2TopkRouter). All in float32.
DeepSeek-V3's sigmoid routing is `models.grouped_topk`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError
from jaxinfer.models.grouped_topk import best_groups


def limited_greedy(
    logits: jax.Array,  # [N, E] router logits, float32
    k: int,
    groups: int,
    groups_per_token: int,
    scaling: float,
) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and expert ids [N, k]; groups == groups_per_token is plain greedy."""
    rows, experts = logits.shape
    scores = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    if groups_per_token < groups:
        grouped = scores.reshape(rows, groups, experts // groups)
        is_open = best_groups(grouped.max(axis=-1), groups_per_token)  # [N, groups]
        scores = jnp.where(is_open[:, :, None], grouped, 0.0).reshape(rows, experts)  # transformers zeroes them
    weights, chosen = jax.lax.top_k(scores, k)
    return weights * jnp.float32(scaling), chosen


def check_limited_groups(experts: int, groups: int, groups_per_token: int, k: int) -> None:
    """Refuse a group_limited_greedy grouping transformers' router cannot run, naming the fields."""
    if groups < 1 or experts % groups:
        raise ConfigError(f"n_group {groups} must divide the {experts} routed experts into equal groups "
                          "(topk_method group_limited_greedy)")
    if not 1 <= groups_per_token <= groups:
        raise ConfigError(f"topk_group {groups_per_token} must be between 1 and n_group {groups}")
    if k > groups_per_token * (experts // groups):
        raise ConfigError(f"num_experts_per_tok {k} is more than the {groups_per_token * (experts // groups)} "
                          f"experts of the topk_group {groups_per_token} groups a token chooses among")
