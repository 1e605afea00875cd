"""Train the next demo pair on one GPU in minutes: an 11M-parameter target and a 2.6M draft distilled
from it, on the standard library and every permissively licensed package installed (`python_corpus`).

The pair is sized to what the repository can carry (`MAX_PAIR_BYTES`); the draft learns the
target's distributions (KL to the target plus the data's cross-entropy), which is what speculative
acceptance rewards. Each model trains for a share of a wall-clock budget with a
warm-up/cosine schedule over the elapsed time, so the same command fits any device (a CPU runs the
`--quick` sizes). Writes `target/` and `draft/` in Hugging Face layout (bf16, with the tokenizer),
`metrics.json` (held-out bits per byte, draft/target greedy agreement, steps, tokens/s) and
`README.md` (the corpus: every package with its version and license). An EAGLE head for the
target comes from `scripts/train_eagle.py --target OUT/target --out OUT/eagle`.

    python scripts/train_pair.py --out /tmp/pair --minutes 4.5          # one H100: ~8 minutes in all
    python scripts/train_pair.py --out /tmp/pair --quick                # a CPU smoke test (~20 s)
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import python_corpus
import torch
import torch.nn.functional as F
from train_demo import (
    EOT,
    ModelSpec,
    build_model,
    check_round_trip,
    save_model,
    to_windows,
    tokenize_stream,
    train_tokenizer,
)

# bf16 weights: 2 bytes a parameter. Target 11.0M (22.0 MB), draft 2.6M (5.2 MB).
TARGET = ModelSpec("target", 384, 6, 6, 2, 1024, peak_lr=2e-3, steps=0)
DRAFT = ModelSpec("draft", 256, 2, 4, 2, 768, peak_lr=3e-3, steps=0)
# The pair's bf16 weights in the repository. A GPU sitting carries the whole working tree, at most 64 MiB with
# the wheels its serving steps need (~12 MiB); a 19.8M target and a 3.4M draft (46 MB, trained 2026-11-29)
# left too little room. The EAGLE-3 head (`train_eagle.py --intermediate-size 512`, ~3.3 MB) comes on top.
MAX_PAIR_BYTES = 28_000_000
QUICK_TARGET = ModelSpec("target", 64, 3, 2, 1, 128, peak_lr=3e-3, steps=0)  # 3 layers: an EAGLE-3 head taps 3
QUICK_DRAFT = ModelSpec("draft", 32, 1, 2, 1, 64, peak_lr=3e-3, steps=0)
WARMUP_SHARE = 0.05  # of each model's budget, linear warm-up of the learning rate
MIN_LR_RATIO = 0.1
FINISH_SECONDS = 45  # evaluating both models and saving them (67 s on the 2-core CPU, seconds on a GPU)
DISTILL_WEIGHT = 0.7  # the draft's loss: this much KL to the target, the rest cross-entropy on the data


@dataclass(frozen=True)
class Plan:
    """Sizes and budgets of one run."""

    vocab_size: int = 4096
    seq_len: int = 512
    batch_size: int = 64
    target_seconds: float = 180.0
    draft_seconds: float = 90.0
    tokenizer_bytes: int = 20_000_000  # of training text the tokenizer learns from
    max_package_bytes: int = 16_000_000
    max_total_bytes: int = 200_000_000
    eval_windows: int = 256
    stdlib_files: int | None = None  # the stdlib's first files only (None: all of it)


def plan_for(args: argparse.Namespace) -> Plan:
    """The run's plan: --minutes split 2:1 between target and draft, or the --quick sizes."""
    if args.quick:
        return Plan(vocab_size=512, seq_len=64, batch_size=4, target_seconds=4, draft_seconds=3,
                    tokenizer_bytes=400_000, max_package_bytes=0, max_total_bytes=0, eval_windows=8,
                    stdlib_files=120)
    seconds = args.minutes * 60
    return Plan(target_seconds=seconds * 2 / 3, draft_seconds=seconds / 3)


def parameter_count(spec: ModelSpec, vocab_size: int) -> int:
    """Parameters of `build_model(spec)`: tied embeddings, per layer q/k/v/o, the gated MLP and two norms."""
    hidden, head_dim = spec.hidden_size, spec.hidden_size // spec.num_heads
    per_layer = 2 * hidden * hidden + 2 * hidden * spec.num_kv_heads * head_dim + 3 * hidden * spec.intermediate_size
    return vocab_size * hidden + spec.num_layers * (per_layer + 2 * hidden) + hidden


def check_pair_bytes(specs: tuple[ModelSpec, ...], vocab_size: int) -> None:
    """Refuse, before any training, a pair whose bf16 weights the repository cannot carry."""
    size = sum(2 * parameter_count(spec, vocab_size) for spec in specs)
    if size > MAX_PAIR_BYTES:
        raise SystemExit(f"the pair's bf16 weights would be {size:,} bytes, over MAX_PAIR_BYTES "
                         f"({MAX_PAIR_BYTES:,}): make TARGET or DRAFT smaller")


def fit_deadline(plan: Plan, deadline_minutes: float | None, elapsed: float) -> Plan:
    """The plan's training cut, keeping its 2:1 split, so the run (`elapsed` seconds of preparation so
    far, then evaluation and saving: FINISH_SECONDS) ends within `deadline_minutes`; as it is without one."""
    if deadline_minutes is None:
        return plan
    left = deadline_minutes * 60 - elapsed - FINISH_SECONDS
    planned = plan.target_seconds + plan.draft_seconds
    if left <= 0:
        raise SystemExit(f"preparing the corpus took {elapsed:.0f}s: no time left to train before the "
                         f"{deadline_minutes} minute deadline")
    share = min(1.0, left / planned)
    return replace(plan, target_seconds=plan.target_seconds * share, draft_seconds=plan.draft_seconds * share)


def lr_factor(progress: float) -> float:
    """Warm-up, then cosine decay to MIN_LR_RATIO, over the fraction of the budget spent."""
    if progress < WARMUP_SHARE:
        return max(progress / WARMUP_SHARE, 0.01)
    decay = (progress - WARMUP_SHARE) / (1 - WARMUP_SHARE)
    return MIN_LR_RATIO + (1 - MIN_LR_RATIO) * 0.5 * (1 + math.cos(math.pi * min(decay, 1.0)))


def logits_of(model, windows: torch.Tensor) -> torch.Tensor:
    """float32 logits of windows[:, :-1], bf16 matmuls on a GPU."""
    with torch.autocast(windows.device.type, dtype=torch.bfloat16, enabled=windows.device.type == "cuda"):
        return model(input_ids=windows[:, :-1]).logits.float()


def data_loss(model, windows: torch.Tensor, teacher=None) -> torch.Tensor:
    """Cross-entropy on the next tokens; with a teacher, mixed with KL to its distributions."""
    logits = logits_of(model, windows).flatten(0, 1)
    loss = F.cross_entropy(logits, windows[:, 1:].flatten())
    if teacher is None:
        return loss
    with torch.no_grad():
        target = F.log_softmax(logits_of(teacher, windows).flatten(0, 1), -1)
    kl = F.kl_div(F.log_softmax(logits, -1), target, log_target=True, reduction="batchmean")
    return DISTILL_WEIGHT * kl + (1 - DISTILL_WEIGHT) * loss


def train_for(model, windows: torch.Tensor, spec: ModelSpec, plan: Plan, seconds: float, teacher=None) -> dict:
    """AdamW on shuffled windows until `seconds` have passed; the learning rate follows the elapsed time."""
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=spec.peak_lr, betas=(0.9, 0.95), fused=windows.device.type == "cuda")
    generator = torch.Generator().manual_seed(0)
    order, step, start, losses = torch.randperm(len(windows), generator=generator), 0, time.perf_counter(), []
    model.train()
    while (elapsed := time.perf_counter() - start) < seconds:
        for group in optimizer.param_groups:
            group["lr"] = spec.peak_lr * lr_factor(elapsed / seconds)
        index = order[(step * plan.batch_size + torch.arange(plan.batch_size)) % len(order)]
        loss = data_loss(model, windows[index.to(windows.device)], teacher)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            losses.append(loss.item())
            tokens = step * plan.batch_size * plan.seq_len
            print(f"[{spec.name}] step {step} loss {losses[-1]:.3f} {tokens / elapsed:,.0f} tok/s {elapsed:.0f}s",
                  flush=True)
    elapsed = time.perf_counter() - start
    tokens = step * plan.batch_size * plan.seq_len
    return {"steps": step, "tokens_seen": tokens, "epochs": round(step * plan.batch_size / len(windows), 2),
            "seconds": round(elapsed, 1), "tokens_per_s": round(tokens / elapsed),
            "final_loss": round(losses[-1] if losses else loss.item(), 4)}


def token_bytes(tokenizer) -> torch.Tensor:
    """UTF-8 bytes each token stands for: byte-level BPE maps one byte to one character; EOT is none."""
    tokens = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    return torch.tensor([0 if t == EOT else len(t) for t in tokens], dtype=torch.float64)


@torch.no_grad()
def evaluate(target, draft, windows: torch.Tensor, sizes: torch.Tensor, batch_size: int) -> dict:
    """Held-out bits per byte of both models and how often their greedy choices agree."""
    nats, agree, positions = {"target": 0.0, "draft": 0.0}, 0, 0
    nbytes = 0.0
    for batch in windows.split(batch_size):
        labels = batch[:, 1:]
        picks = {}
        for name, model in (("target", target), ("draft", draft)):
            logits = logits_of(model.eval(), batch)
            nats[name] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
            picks[name] = logits.argmax(-1)
        agree += (picks["target"] == picks["draft"]).sum().item()
        positions += labels.numel()
        nbytes += sizes[labels.cpu()].sum().item()
    bits = {name: round(total / math.log(2) / nbytes, 4) for name, total in nats.items()}
    return {"held_out_tokens": positions, "held_out_bytes": int(nbytes), "bits_per_byte": bits,
            "greedy_agreement": round(agree / positions, 4)}


def write_readme(out: Path, corpus: python_corpus.Corpus, metrics: dict) -> None:
    """The pair's card: corpus sources with their licenses, sizes and held-out figures."""
    rows = "\n".join(f"| {s.name} | {s.version} | {s.license} | {s.files} | {s.bytes:,} |" for s in corpus.sources)
    bits = metrics["eval"]["bits_per_byte"]
    text = f"""# Demo pair trained by scripts/train_pair.py

Target {metrics['parameters']['target']:,} parameters, draft {metrics['parameters']['draft']:,} (distilled from
the target); held-out bits per byte: target {bits['target']}, draft {bits['draft']}; greedy agreement
{metrics['eval']['greedy_agreement']}. Device: {metrics['device']}. Full figures in metrics.json.

## Corpus

The `.py` files of these distributions (tests and vendored copies of other projects left out,
identical files read once); {len(corpus.held_out)} files (~2%, by a hash of the path) held out.

| source | version | license | files | bytes |
|---|---|---|---|---|
{rows}
"""
    (out / "README.md").write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=4.5, help="training time of both models together")
    parser.add_argument("--deadline-minutes", type=float, default=None,
                        help="end the whole run within this (a GPU sitting's step limit): training is cut by "
                        "what preparing the corpus took")
    parser.add_argument("--quick", action="store_true", help="tiny models, a few stdlib files, seconds (smoke test)")
    args = parser.parse_args()
    plan = plan_for(args)
    specs = (QUICK_TARGET, QUICK_DRAFT) if args.quick else (TARGET, DRAFT)
    check_pair_bytes(specs, plan.vocab_size)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    started = time.perf_counter()
    corpus = python_corpus.collect(plan.max_package_bytes, plan.max_total_bytes, packages=not args.quick,
                                   max_stdlib_files=plan.stdlib_files)
    train_texts, held_out_texts = list(corpus.train.values()), list(corpus.held_out.values())
    stride = max(1, sum(map(len, train_texts)) // plan.tokenizer_bytes)  # every stride-th file, ~tokenizer_bytes
    tokenizer = train_tokenizer(train_texts[::stride], plan.vocab_size)
    check_round_trip(tokenizer, held_out_texts[:5])
    windows = to_windows(tokenize_stream(tokenizer, train_texts), plan.seq_len).to(device)
    held_out = to_windows(tokenize_stream(tokenizer, held_out_texts), plan.seq_len)[: plan.eval_windows].to(device)
    print(f"corpus: {len(corpus.sources)} sources, {len(train_texts)} train files ({windows.numel():,} tokens), "
          f"{len(held_out_texts)} held out; prepared in {time.perf_counter() - started:.0f}s on {device}", flush=True)
    plan = fit_deadline(plan, args.deadline_minutes, time.perf_counter() - started)
    target = build_model(specs[0], tokenizer).to(device)
    training = {"target": train_for(target, windows, specs[0], plan, plan.target_seconds)}
    draft = build_model(specs[1], tokenizer).to(device)
    training["draft"] = train_for(draft, windows, specs[1], plan, plan.draft_seconds, teacher=target.eval())
    metrics = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "plan": asdict(plan), "specs": {s.name: asdict(replace(s, steps=training[s.name]["steps"])) for s in specs},
        "parameters": {name: sum(p.numel() for p in m.parameters()) for name, m in (("target", target),
                                                                                     ("draft", draft))},
        "training": training, "eval": evaluate(target, draft, held_out, token_bytes(tokenizer), 16),
        "seconds": round(time.perf_counter() - started, 1),
    }
    for name, model in (("target", target), ("draft", draft)):
        save_model(model.cpu(), tokenizer, args.out / name)
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    write_readme(args.out, corpus, metrics)
    print(json.dumps({k: metrics[k] for k in ("parameters", "eval", "seconds")}))


if __name__ == "__main__":
    main()
