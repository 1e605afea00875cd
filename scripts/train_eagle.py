"""Train an EAGLE-1 or EAGLE-3 head for any supported target on the target's own outputs; writes the HF layout jaxinfer loads.

Teacher: the target's final hidden states and next-token distributions over a text corpus (default:
the Python standard library's sources, without the ~2% of files `train_demo.py` holds out, which
are used here to report agreement). The head at position i reads the target's feature f_i and the
token t_{i+1} and predicts f_{i+1}; loss as in EAGLE-1: smooth-L1 regression of f_{i+1} plus 0.1 x
cross-entropy of its distribution against the target's, with uniform noise on the input features
(at decode time the head reads its own, imperfect, predictions). `--version 3`: the head reads the
residual stream entering three target layers (low, middle, high) through its fc, with a draft
vocabulary of the target's (the identity map), and learns from the distribution loss alone (its
output feeds its own next step through the same input, not a regression target), at two steps
as EAGLE-3's training-time test does: every position also runs as a draft chain's second step
(reading the head's own output at the position before, attending to the entries the target's
features wrote before it: `chained_head_step`). JAX and optax only, no torch.

    python scripts/train_eagle.py --target DIR --out DIR [--steps N] [--data FILE_OR_DIR ...] [--version 3]
    python -c "from jaxinfer import LLM, SpeculativeConfig as S; LLM(DIR, speculative=S('eagle', OUT_DIR))"
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import sys
import sysconfig
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jaxinfer.cache.contiguous import init_cache  # noqa: E402
from jaxinfer.checkpoint.loader import load_weights  # noqa: E402
from jaxinfer.checkpoint.tokenizer import load_tokenizer  # noqa: E402
from jaxinfer.config.model import ModelConfig  # noqa: E402
from jaxinfer.models import Weights, forward_with_taps, lm_logits  # noqa: E402
from jaxinfer.speculative.eagle import (  # noqa: E402
    EagleConfig,
    EagleWeights,
    chained_head_step,
    eagle_params,
    head_logits,
    head_step,
    init_eagle,
    project_features,
)
from jaxinfer.speculative.eagle_checkpoint import save_eagle  # noqa: E402

EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "pydoc_data", "__pycache__"})
HELD_OUT_ONE_IN = 50  # the split train_demo.py uses, by a hash of the path
CLS_WEIGHT = 0.1  # EAGLE-1's weight of the distribution loss against the regression loss
NOISE = 0.1  # half-width of the uniform noise added to the input features


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True, help="target model directory (HF or converted)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the head (config.json + safetensors)")
    parser.add_argument("--data", nargs="*", type=Path, help="text files or directories of .py files (default: stdlib)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--intermediate-size", type=int, help="head MLP width (default: the target's)")
    parser.add_argument("--max-minutes", type=float,
                        help="stop early (keeping what was learned) this long after the first step, which compiles")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="stored dtype")
    parser.add_argument("--eval-windows", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", type=int, choices=[1, 3], default=1, help="EAGLE-1 or EAGLE-3 head")
    return parser.parse_args()


def is_held_out(relative: str) -> bool:
    """train_demo.py's deterministic ~2% hold-out by path hash."""
    return int(hashlib.sha256(relative.encode()).hexdigest(), 16) % HELD_OUT_ONE_IN == 0


def python_files(root: Path) -> list[Path]:
    """Sorted .py files under root, outside tests and vendored directories."""
    return sorted(p for p in root.rglob("*.py") if not EXCLUDED_DIRS & set(p.relative_to(root).parts[:-1]))


def corpus(data: list[Path] | None) -> tuple[list[str], list[str]]:
    """(train, held-out) texts: the given files split by path hash (the last one held out if the hash
    picks none), or the stdlib split as train_demo.py splits it."""
    if data:
        files = [f for d in data for f in (python_files(d) if d.is_dir() else [d])]
        held = [f for f in files if is_held_out(f.as_posix())] or files[-1:]
        read = lambda paths: [f.read_text(encoding="utf-8", errors="replace") for f in paths]  # noqa: E731
        return read([f for f in files if f not in held] or files), read(held)
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held_out = [], []
    for path in python_files(root):
        relative = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.name.startswith("_sysconfigdata") or "Character Mapping Codec" in text[:200]:
            continue
        (held_out if is_held_out(relative) else train).append(text)
    return train, held_out


def windows(tokenizer, texts: list[str], seq_len: int, separator: int) -> np.ndarray:
    """Non-overlapping [N, seq_len] token windows of the files joined by `separator`."""
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    stream = np.asarray([t for file in encoded for t in [separator, *file.ids]], np.int32)
    count = len(stream) // seq_len
    return stream[: count * seq_len].reshape(count, seq_len)


def feature_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's low, middle and high layers: the reference code's (2, L/2, L-3) where distinct, else
    the nearest distinct choice a shallow target allows."""
    for layers in ((2, num_layers // 2, num_layers - 3), (1, num_layers // 2, num_layers - 2),
                   (0, num_layers // 2, num_layers - 1)):
        if len(set(layers)) == 3 and 0 <= min(layers) and max(layers) < num_layers:
            return tuple(sorted(layers))
    raise SystemExit(f"an EAGLE-3 head reads 3 distinct target layers; the target has {num_layers}")


def head_shape(target: ModelConfig, intermediate: int | None, version: int = 1) -> EagleConfig:
    """A one-layer Llama head as wide as the target (EAGLE-1 with its fc bias; EAGLE-3 over the
    target's whole vocabulary)."""
    layer = ModelConfig(
        architecture="LlamaForCausalLM", vocab_size=target.vocab_size, hidden_size=target.hidden_size,
        intermediate_size=intermediate or target.intermediate_size, num_layers=1, num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads, head_dim=target.head_dim, rms_norm_eps=target.rms_norm_eps,
        rope_theta=target.rope_theta, rope_scaling=target.rope_scaling,
        max_position_embeddings=target.max_position_embeddings,
    )
    if version == 3:
        return EagleConfig(layer, 3, draft_vocab=target.vocab_size, feature_layers=feature_layers(target.num_layers))
    return EagleConfig(layer, 1, fc_bias=True)


def teacher(
    weights: Weights, tokens: jax.Array, cfg: ModelConfig, taps: tuple[int, ...] = ()
) -> tuple[jax.Array, jax.Array]:
    """The target's features [B, T, F] (its final hidden states, or the residual stream entering the
    `taps` layers, concatenated) and next-token log-probabilities [B, T, V]."""
    batch, seq = tokens.shape
    cache = init_cache(cfg, batch, seq, jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), tokens.shape)
    hidden, tapped, _ = forward_with_taps(weights, tokens, positions, cache, cfg, taps)
    features = jnp.concatenate(tapped, axis=-1) if taps else hidden
    return features, jax.nn.log_softmax(lm_logits(weights, hidden), axis=-1)


def head_outputs(
    head: EagleWeights, target: Weights, tokens: jax.Array, features: jax.Array, ecfg: EagleConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Teacher-forced head: predicted f_{i+1} [B, T-1, D] and log q [B, T-1, V] from (f_i, t_{i+1});
    then log q [B, T-2, V] of each position i >= 1 as a draft chain's second step (reading its own
    output at i-1 and t_{i+1}), which also predicts t_{i+2}."""
    batch, seq = tokens.shape
    params = eagle_params(head, target)
    cache = init_cache(ecfg.layer, batch, seq - 1, jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(seq - 1, dtype=jnp.int32), (batch, seq - 1))
    inputs = project_features(params, features[:, :-1], ecfg)
    predicted, cache = head_step(params, tokens[:, 1:], inputs, positions, cache, ecfg)
    second = chained_head_step(params, tokens[:, 2:], predicted[:, :-1], positions[:, 1:], cache, ecfg)
    logp = lambda p: jax.nn.log_softmax(head_logits(params, p, ecfg), axis=-1)  # noqa: E731
    return predicted, logp(predicted), logp(second)


def soft_cross_entropy(target_logp: jax.Array, head_logp: jax.Array) -> jax.Array:
    """Mean cross-entropy of the head's distributions against the target's (a draft vocabulary's -inf
    logits would make 0 * -inf: such tokens count as never drafted)."""
    return -jnp.mean(jnp.sum(jnp.exp(target_logp) * jnp.maximum(head_logp, -1e9), axis=-1))


def loss_fn(
    head: EagleWeights, target: Weights, tokens: jax.Array, key: jax.Array, cfg: ModelConfig, ecfg: EagleConfig,
    d2t: jax.Array | None = None,
) -> tuple[jax.Array, dict]:
    """EAGLE-1's loss (EAGLE-3's: the distribution's alone) on one batch, and the head's top-1
    agreement with the target."""
    head = head if d2t is None else dataclasses.replace(head, d2t=d2t)  # EAGLE-3's id map: an input, not trained
    features, target_logp = jax.lax.stop_gradient(teacher(target, tokens, cfg, ecfg.feature_layers))
    noisy = features + jax.random.uniform(key, features.shape, minval=-NOISE, maxval=NOISE)
    predicted, head_logp, second_logp = head_outputs(head, target, tokens, noisy, ecfg)
    cross_entropy = soft_cross_entropy(target_logp[:, 1:], head_logp)
    agree = jnp.mean(jnp.argmax(head_logp, -1) == jnp.argmax(target_logp[:, 1:], -1))
    if ecfg.version == 3:
        second = soft_cross_entropy(target_logp[:, 2:], second_logp)
        agree2 = jnp.mean(jnp.argmax(second_logp, -1) == jnp.argmax(target_logp[:, 2:], -1))
        return cross_entropy + second, {"ce": cross_entropy, "ce2": second, "agree": agree, "agree2": agree2}
    regression = jnp.mean(optax.huber_loss(predicted, features[:, 1:], delta=1.0))
    return regression + CLS_WEIGHT * cross_entropy, {"regression": regression, "ce": cross_entropy, "agree": agree}


def evaluate(head: EagleWeights, target: Weights, held_out: np.ndarray, cfg: ModelConfig, ecfg: EagleConfig) -> float:
    """Teacher-forced top-1 agreement on held-out windows: the greedy acceptance of a first draft."""
    run = jax.jit(lambda h, w, t: loss_fn(h, w, t, jax.random.key(0), cfg, ecfg)[1]["agree"])
    return float(np.mean([run(head, target, held_out[i : i + 8]) for i in range(0, len(held_out), 8)]))


def main() -> None:
    args = parse_args()
    cfg, target = load_weights(args.target, jnp.float32, progress=False)
    tokenizer = load_tokenizer(args.target)
    separator = cfg.bos_token_id if cfg.bos_token_id is not None else (cfg.eos_token_ids or (0,))[0]
    train_texts, held_texts = corpus(args.data)
    train = windows(tokenizer, train_texts, args.seq_len, separator)
    held_out = windows(tokenizer, held_texts, args.seq_len, separator)[: args.eval_windows]
    print(f"{len(train)} training windows of {args.seq_len} tokens, {len(held_out)} held out", flush=True)
    ecfg = head_shape(cfg, args.intermediate_size, args.version)
    head = init_eagle(ecfg, jax.random.key(args.seed), jnp.float32)
    d2t, head = head.d2t, dataclasses.replace(head, d2t=None)  # gradients for the float weights only
    schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, args.warmup, max(args.steps, args.warmup + 1),
                                                  end_value=args.lr * 0.1)
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(schedule, weight_decay=0.01))
    opt_state = optimizer.init(head)

    @jax.jit
    def update(head, opt_state, target, tokens, key):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(head, target, tokens, key, cfg, ecfg, d2t)
        updates, opt_state = optimizer.update(grads, opt_state, head)
        return optax.apply_updates(head, updates), opt_state, metrics

    rng = np.random.default_rng(args.seed)
    start = time.time()
    for step in range(args.steps):
        batch = jnp.asarray(train[rng.integers(0, len(train), args.batch_size)])
        head, opt_state, metrics = update(head, opt_state, target, batch, jax.random.key(step))
        if step % 25 == 0 or step == args.steps - 1:
            m = {k: round(float(v), 4) for k, v in metrics.items()}
            print(f"step {step} {m} {time.time() - start:.0f}s", flush=True)
        if step == 0:  # the first step compiles (117 s on an H200): the time limit counts the training after it
            trained_from = time.time()
        if args.max_minutes and time.time() - trained_from > 60 * args.max_minutes:
            print(f"stopping at step {step}: --max-minutes {args.max_minutes} reached", flush=True)
            break
    head = dataclasses.replace(head, d2t=d2t)
    agreement = evaluate(head, target, held_out, cfg, ecfg) if len(held_out) else math.nan
    print(f"held-out teacher-forced top-1 agreement with the target: {agreement:.4f}", flush=True)
    stored = jax.tree.map(lambda x: x.astype(args.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, head)
    save_eagle(stored, ecfg, args.out, json.loads((args.target / "config.json").read_text()))
    summary = {"steps": step + 1, "seconds": round(time.time() - start, 1), "held_out_agreement": round(agreement, 4),
               "held_out_windows": len(held_out), "seq_len": args.seq_len, "batch_size": args.batch_size,
               "version": args.version}
    (args.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}", flush=True)


if __name__ == "__main__":
    main()
