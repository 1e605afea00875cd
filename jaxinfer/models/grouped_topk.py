"""DeepSeek-V3's "noaux_tc" routing (GLM-4.5 uses it too): sigmoid scores, experts chosen within the best groups.

Each expert's score is sigmoid(router logit). A learned correction bias (`e_score_correction_bias`)
is added for choosing only: it balances the experts' load without an auxiliary loss and never
weights an output. The experts are split into `groups` equal groups; a group ranks by the sum of
its two best biased scores, the best `groups_per_token` groups stay open, and the top k biased
scores among their experts are chosen. Their weights are the unbiased scores, renormalised to sum
to 1 where the model says so, times `scaling` (`routed_scaling_factor`). All in float32.
Mistral 4 routes the same way with softmax scores and no bias (`softmax`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config.model import ConfigError


def grouped_topk(
    logits: jax.Array,  # [N, E] router logits, float32
    correction: jax.Array | None,  # [E] e_score_correction_bias, float32; None: choose by the scores alone
    k: int,
    groups: int,
    groups_per_token: int,
    renormalise: bool,
    scaling: float,
    epsilon: float = 1e-20,
    softmax: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """Routing weights [N, k] (float32) and expert ids [N, k] of rows with router logits [N, E]; `epsilon` is added
    to the sum the weights are renormalised by (transformers' 1e-20 for DeepSeek-V3 and GLM-4.5, LFM2-MoE's 1e-6);
    `softmax`: scores are the softmax over the experts, not each logit's sigmoid (Mistral 4)."""
    rows, experts = logits.shape
    logits = logits.astype(jnp.float32)
    scores = jax.nn.softmax(logits, axis=-1) if softmax else jax.nn.sigmoid(logits)
    for_choice = scores if correction is None else scores + correction.astype(jnp.float32)
    grouped = for_choice.reshape(rows, groups, experts // groups)
    group_scores = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [N, groups]
    masked = jnp.where(best_groups(group_scores, groups_per_token)[:, :, None], grouped, -jnp.inf)
    _, chosen = jax.lax.top_k(masked.reshape(rows, experts), k)
    weights = jnp.take_along_axis(scores, chosen, axis=-1)
    if renormalise:  # the epsilon keeps an all-zero row finite
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + epsilon)
    return weights * jnp.float32(scaling), chosen


def best_groups(group_scores: jax.Array, count: int) -> jax.Array:
    """[N, groups] True for each row's `count` best-scored groups (the experts a token may choose among)."""
    _, best = jax.lax.top_k(group_scores, count)
    return jnp.any(best[:, :, None] == jnp.arange(group_scores.shape[-1]), axis=1)


def check_groups(experts: int, groups: int, groups_per_token: int, k: int) -> None:
    """Refuse a grouping transformers' router cannot run, naming the fields (n_group, topk_group)."""
    if groups < 1 or experts % groups:
        raise ConfigError(f"n_group {groups} must divide the {experts} routed experts into equal groups")
    if experts // groups < 2:
        raise ConfigError(f"n_group {groups} leaves {experts // groups} expert per group; a group ranks by its two "
                          "best scores, so each needs at least 2 (n_routed_experts / n_group >= 2)")
    if not 1 <= groups_per_token <= groups:
        raise ConfigError(f"topk_group {groups_per_token} must be between 1 and n_group {groups}")
    if k > groups_per_token * (experts // groups):
        raise ConfigError(f"num_experts_per_tok {k} is more than the {groups_per_token * (experts // groups)} "
                          f"experts of the topk_group {groups_per_token} groups a token chooses among")
