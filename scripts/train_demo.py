"""Train the demo target/draft Llama pair shipped in jaxinfer/assets/demo, on CPython's stdlib source.

Everything is derived from files every Python install has, with fixed seeds and a fixed data order:
a byte-level BPE tokenizer, a ~6M-parameter target and a ~1.3M-parameter draft sharing it, held-out
metrics, and the model card. Reproduce with `python scripts/train_demo.py` (about 30-40 min on 2 CPU cores);
`--quick` runs a few steps of everything into a temp dir as a smoke test.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import sysconfig
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
EOT = "<|endoftext|>"
# Test suites and their data, IDLE, third-party packages and 2to3 fixtures are not "stdlib code" proper.
EXCLUDED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "pydoc_data", "__pycache__"})
HELD_OUT_ONE_IN = 50  # ~2% of files, chosen by a hash of the path so the split survives file additions
SAMPLE_PROMPT = "def fibonacci(n):\n"
MAX_POSITIONS = 1024


@dataclass(frozen=True)
class ModelSpec:
    """Architecture and optimiser settings of one model of the pair."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    peak_lr: float
    steps: int


@dataclass(frozen=True)
class TrainSettings:
    """Settings shared by both training runs."""

    vocab_size: int = 4096
    batch_size: int = 8  # small batches, many steps: far below the critical batch size at this scale
    seq_len: int = 256
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    log_every: int = 100
    max_eval_windows: int | None = None
    bf16_autocast: bool = True  # bf16 matmuls over fp32 weights


TARGET = ModelSpec("target", 256, 6, 4, 2, 768, peak_lr=2e-3, steps=1500)
DRAFT = ModelSpec("draft", 128, 4, 2, 1, 384, peak_lr=4e-3, steps=1000)


@dataclass(frozen=True)
class Corpus:
    """Stdlib source split into train and held-out files (paths relative to the stdlib root)."""

    root: Path
    train: dict[str, str]
    held_out: dict[str, str]
    num_excluded: int  # single files dropped outside the excluded directories


def stdlib_sources(root: Path) -> list[Path]:
    """All .py files under the stdlib root outside the excluded directories, in sorted order."""
    paths = []
    for directory, subdirectories, files in os.walk(root):
        subdirectories[:] = [name for name in subdirectories if name not in EXCLUDED_DIRS]
        paths += [Path(directory, name) for name in files if name.endswith(".py")]
    return sorted(paths)


def is_excluded_file(relative: Path, text: str) -> bool:
    """Machine-specific build configuration and generated codec tables are not code worth learning."""
    return relative.name.startswith("_sysconfigdata") or "Character Mapping Codec" in text[:200]


def is_held_out(relative: Path) -> bool:
    """Deterministic ~2% hold-out by path hash."""
    return int(hashlib.sha256(relative.as_posix().encode()).hexdigest(), 16) % HELD_OUT_ONE_IN == 0


def collect_corpus(quick: bool) -> Corpus:
    """Read the stdlib source in sorted path order and split it into train and held-out files."""
    root = Path(sysconfig.get_paths()["stdlib"])
    train, held_out, num_excluded = {}, {}, 0
    for path in stdlib_sources(root):
        relative = path.relative_to(root)
        text = path.read_text(encoding="utf-8")
        if is_excluded_file(relative, text):
            num_excluded += 1
            continue
        (held_out if is_held_out(relative) else train)[relative.as_posix()] = text
    if quick:
        train = dict(list(train.items())[:40])
        held_out = dict(list(held_out.items())[:2])
    return Corpus(root, train, held_out, num_excluded)


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the training files; EOT is bos, eos, pad and the file separator."""
    tokenizer = Tokenizer(models.BPE())
    # Newlines stand alone so a prompt ending in "\n" matches training: GPT-2's regex alone glues a newline
    # to the following indentation, which makes a bare "\n" token mean "next line is not indented".
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    # The default clean_up_tokenization_spaces rewrites " ." and similar, which breaks code round trips.
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=EOT, eos_token=EOT, pad_token=EOT,
                                   model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False)


def check_round_trip(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> None:
    """decode(encode(x)) must reproduce code exactly, indentation and blank lines included."""
    tricky = ["def f(x):\n\tif x:\n        return  x\n\n\n# tab\t, trailing space \n", "é ✓ 中文 🐍\r\n"]
    samples = texts + tricky
    for text in samples:
        decoded = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
        if decoded != text:
            raise ValueError(f"tokenizer round trip failed for {text[:80]!r}")


def tokenize_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """Concatenate files into one token stream, each file preceded by EOT (NumPy per file: 10^8
    tokens as Python ints would take minutes and gigabytes, as train_pair.py's corpus has)."""
    encoded = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    eot = np.asarray([tokenizer.convert_tokens_to_ids(EOT)], np.int64)
    parts = [part for file in encoded for part in (eot, np.asarray(file.ids, np.int64))]
    return torch.from_numpy(np.concatenate(parts))


def to_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping [num_windows, seq_len + 1] windows; each token is predicted once."""
    num_windows = (len(stream) - 1) // seq_len
    starts = torch.arange(num_windows) * seq_len
    return stream[starts[:, None] + torch.arange(seq_len + 1)]


def build_model(spec: ModelSpec, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A freshly initialised Llama with tied embeddings and grouped-query attention."""
    eot_id = tokenizer.convert_tokens_to_ids(EOT)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads, num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.hidden_size // spec.num_heads, max_position_embeddings=MAX_POSITIONS, rms_norm_eps=1e-5,
        tie_word_embeddings=True, bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    # GPT-2-style scaling of the projections that write into the residual stream: without it the 6-layer target
    # trains slower than a 2-layer model over the first few hundred steps.
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(1 / math.sqrt(2 * spec.num_layers))
            layer.mlp.down_proj.weight.mul_(1 / math.sqrt(2 * spec.num_layers))
    model.generation_config.update(bos_token_id=eot_id, eos_token_id=eot_id, pad_token_id=eot_id)
    return model


def cosine_lr_factor(step: int, total_steps: int, settings: TrainSettings) -> float:
    """Linear warmup, then cosine decay from 1 to min_lr_ratio."""
    if step < settings.warmup_steps:
        return (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, total_steps - settings.warmup_steps)
    return settings.min_lr_ratio + (1 - settings.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_order(num_windows: int, steps: int, batch_size: int) -> torch.Tensor:
    """Window indices for every step: seeded shuffled epochs, identical for both models."""
    generator = torch.Generator().manual_seed(SEED)
    epochs = math.ceil(steps * batch_size / num_windows)
    order = torch.cat([torch.randperm(num_windows, generator=generator) for _ in range(epochs)])
    return order[: steps * batch_size].view(steps, batch_size)


def cpu_has_bf16_dots() -> bool:
    """Whether oneDNN runs bf16 matmuls natively here: bf16 autocast is ~1.7x faster than fp32 with
    AVX512-BF16/AMX, and 27x slower on an AVX2-only CPU (a Zen 3 VM: 25 s vs 0.95 s per step)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def next_token_loss(model: LlamaForCausalLM, windows: torch.Tensor, bf16: bool) -> torch.Tensor:
    """Mean cross-entropy of predicting windows[:, 1:] from windows[:, :-1] (bf16 matmuls when asked), fp32 weights."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(input_ids=windows[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())


def train(model: LlamaForCausalLM, windows: torch.Tensor, spec: ModelSpec, settings: TrainSettings) -> dict:
    """AdamW + warmup/cosine schedule over a fixed batch order; returns a training summary."""
    decay = [p for p in model.parameters() if p.ndim >= 2]  # no weight decay on norm gains
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=spec.peak_lr, betas=(0.9, 0.95))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: cosine_lr_factor(step, spec.steps, settings))
    order = batch_order(len(windows), spec.steps, settings.batch_size)
    model.train()
    start, recent_losses = time.perf_counter(), []
    for step in range(spec.steps):
        loss = next_token_loss(model, windows[order[step]], settings.bf16_autocast)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        recent_losses.append(loss.item())
        if (step + 1) % settings.log_every == 0 or step + 1 == spec.steps:
            elapsed = time.perf_counter() - start
            tokens_per_s = (step + 1) * settings.batch_size * settings.seq_len / elapsed
            mean_loss = sum(recent_losses) / len(recent_losses)
            print(f"[{spec.name}] step {step + 1}/{spec.steps} loss {mean_loss:.3f} "
                  f"lr {schedule.get_last_lr()[0]:.2e} {tokens_per_s:.0f} tok/s {elapsed:.0f}s", flush=True)
            recent_losses = []
    seconds = time.perf_counter() - start
    tokens = spec.steps * settings.batch_size * settings.seq_len
    epochs = spec.steps * settings.batch_size / len(windows)
    return {"steps": spec.steps, "tokens_seen": tokens, "epochs": round(epochs, 2), "seconds": round(seconds, 1),
            "final_train_loss": round(mean_loss, 4)}


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerFast, path: Path) -> None:
    """Write the model in bfloat16 with its tokenizer, in plain Hugging Face layout."""
    model.to(torch.bfloat16).save_pretrained(path)
    tokenizer.save_pretrained(path)


@torch.no_grad()
def evaluate(target_path: Path, draft_path: Path, windows: torch.Tensor, batch_size: int) -> dict:
    """Held-out loss, perplexity and accuracy of the saved (bf16) models, and draft/target greedy agreement."""
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.float32).eval()
    loss_sums, correct = {"target": 0.0, "draft": 0.0}, {"target": 0, "draft": 0}
    agree, positions = 0, 0
    for batch in windows.split(batch_size):
        inputs, labels = batch[:, :-1], batch[:, 1:]
        predictions = {}
        for name, model in (("target", target), ("draft", draft)):
            logits = model(input_ids=inputs).logits
            loss_sums[name] += F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum").item()
            predictions[name] = logits.argmax(-1)
            correct[name] += (predictions[name] == labels).sum().item()
        agree += (predictions["target"] == predictions["draft"]).sum().item()
        positions += labels.numel()
    metrics = {"held_out_tokens_scored": positions, "draft_target_greedy_agreement": round(agree / positions, 4)}
    for name in ("target", "draft"):
        loss = loss_sums[name] / positions
        metrics[name] = {"loss": round(loss, 4), "perplexity": round(math.exp(loss), 3),
                         "top1_accuracy": round(correct[name] / positions, 4)}
    return metrics


def greedy_completion(path: Path, prompt: str, max_new_tokens: int) -> str:
    """Greedy continuation of prompt by the saved model, loaded the way users load it."""
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)
    output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0], skip_special_tokens=False)


def machine_description() -> str:
    """CPU model and thread count, for the model card."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    names = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
    cpu = names[0] if names else platform.machine()
    return f"{cpu} ({os.cpu_count()} cores), torch {torch.__version__} with {torch.get_num_threads()} threads"


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "jaxinfer/assets/demo")
    parser.add_argument("--target-steps", type=int, default=TARGET.steps)
    parser.add_argument("--draft-steps", type=int, default=DRAFT.steps)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads; 1 is faster on a busy machine")
    parser.add_argument("--quick", action="store_true", help="a few steps of everything into a temp dir (smoke test)")
    parser.add_argument("--bf16-autocast", choices=["auto", "on", "off"], default="auto",
                        help="bf16 matmuls in training; auto: where the CPU computes bf16 dot products natively")
    return parser.parse_args()


def configure(args: argparse.Namespace) -> tuple[TrainSettings, list[ModelSpec], Path]:
    """Settings, model specs and output folder for this run (tiny ones under --quick)."""
    bf16 = {"on": True, "off": False}.get(args.bf16_autocast, None)
    bf16 = cpu_has_bf16_dots() if bf16 is None else bf16
    if args.quick:
        settings = TrainSettings(vocab_size=512, batch_size=4, seq_len=64, warmup_steps=2, log_every=1,
                                 max_eval_windows=8, bf16_autocast=bf16)
        specs = [replace(TARGET, steps=3), replace(DRAFT, steps=3)]
        return settings, specs, Path(tempfile.mkdtemp(prefix="train_demo_quick_"))
    specs = [replace(TARGET, steps=args.target_steps), replace(DRAFT, steps=args.draft_steps)]
    return TrainSettings(bf16_autocast=bf16), specs, args.out


def main() -> None:
    """Tokenizer, target, draft, evaluation, metrics and model card."""
    args = parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    settings, specs, out = configure(args)
    corpus = collect_corpus(args.quick)
    train_texts, held_out_texts = list(corpus.train.values()), list(corpus.held_out.values())
    tokenizer = train_tokenizer(train_texts, settings.vocab_size)
    check_round_trip(tokenizer, held_out_texts)
    train_stream, held_out_stream = tokenize_stream(tokenizer, train_texts), tokenize_stream(tokenizer, held_out_texts)
    print(f"corpus: {len(train_texts)} train files ({len(train_stream)} tokens), {len(held_out_texts)} held-out "
          f"({len(held_out_stream)} tokens); vocab {len(tokenizer)}; {time.perf_counter() - start:.0f}s", flush=True)

    train_windows, summaries, parameters = to_windows(train_stream, settings.seq_len), {}, {}
    for spec in specs:
        model = build_model(spec, tokenizer)
        parameters[spec.name] = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
        print(f"[{spec.name}] {parameters[spec.name]:,} parameters", flush=True)
        summaries[spec.name] = train(model, train_windows, spec, settings)
        save_model(model, tokenizer, out / spec.name)

    held_out_windows = to_windows(held_out_stream, settings.seq_len)[: settings.max_eval_windows]
    report = evaluate(out / "target", out / "draft", held_out_windows, settings.batch_size)
    report |= {
        "parameters": parameters,
        "vocab_size": len(tokenizer),
        "training": summaries,
        "settings": asdict(settings),
        "specs": {spec.name: asdict(spec) for spec in specs},
        "corpus": {"python_version": platform.python_version(), "train_files": len(train_texts),
                   "held_out_files": len(held_out_texts), "excluded_files": corpus.num_excluded,
                   "train_bytes": sum(len(text.encode()) for text in train_texts), "train_tokens": len(train_stream),
                   "held_out_tokens": len(held_out_stream), "held_out_paths": sorted(corpus.held_out)},
        "sample": {"prompt": SAMPLE_PROMPT, "target_greedy": greedy_completion(out / "target", SAMPLE_PROMPT, 64)},
        "machine": machine_description(),
        "command": " ".join(["python", "scripts/train_demo.py", *sys.argv[1:]]),
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    (out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "README.md").write_text(model_card(report))
    headline = ("target", "draft", "draft_target_greedy_agreement", "wall_seconds")
    print(json.dumps({key: report[key] for key in headline}))
    print(f"sample:\n{report['sample']['target_greedy']}\nwrote {out}", flush=True)


def model_card(report: dict) -> str:
    """The README of the asset folder: a template filled with the measured numbers."""
    specs, training, corpus, settings = report["specs"], report["training"], report["corpus"], report["settings"]
    columns = {
        "parameters": lambda m: f"{report['parameters'][m]:,}",
        "layers / hidden / MLP": lambda m: f"{specs[m]['num_layers']} / {specs[m]['hidden_size']} / "
                                           f"{specs[m]['intermediate_size']}",
        "heads / kv heads / head dim": lambda m: f"{specs[m]['num_heads']} / {specs[m]['num_kv_heads']} / "
                                                 f"{specs[m]['hidden_size'] // specs[m]['num_heads']}",
        "training steps (batch x seq)": lambda m: f"{training[m]['steps']} "
                                                  f"({settings['batch_size']} x {settings['seq_len']})",
        "tokens seen (epochs)": lambda m: f"{training[m]['tokens_seen']:,} ({training[m]['epochs']})",
        "peak learning rate": lambda m: specs[m]["peak_lr"],
        "training time": lambda m: f"{training[m]['seconds'] / 60:.1f} min",
        "final train loss": lambda m: training[m]["final_train_loss"],
        "**held-out loss**": lambda m: f"**{report[m]['loss']}**",
        "**held-out perplexity**": lambda m: f"**{report[m]['perplexity']}**",
        "held-out top-1 accuracy": lambda m: report[m]["top1_accuracy"],
    }
    table = "\n".join(f"| {label} | {value('target')} | {value('draft')} |" for label, value in columns.items())
    held_out = ", ".join(f"`{path}`" for path in corpus["held_out_paths"])
    return f"""# jaxinfer demo models: `target` and `draft`

A small Llama-architecture pair trained from scratch on the Python standard library's own source, shipped
so that tests, examples and speculative decoding run offline on real weights. They write Python-looking
text and are toys otherwise. Generated by `scripts/train_demo.py`; every number below was measured by
that run (all of them are also in `metrics.json`).

| | target | draft |
|---|---|---|
{table}

Draft/target greedy agreement on held-out text (fraction of positions where the draft's argmax equals
the target's): **{report['draft_target_greedy_agreement']}**.

## Architecture and files
`LlamaForCausalLM`: RMSNorm, RoPE (theta 10000), SwiGLU MLP, grouped-query attention, no biases, tied
input/output embeddings, vocab {report['vocab_size']}, `max_position_embeddings` {MAX_POSITIONS}; initialised with std 0.02, divided
by sqrt(2 x layers) for `o_proj`/`down_proj`. Each folder holds `config.json`, `generation_config.json`,
`model.safetensors` (bfloat16), `tokenizer.json` and `tokenizer_config.json`, loadable unchanged with
`AutoModelForCausalLM.from_pretrained` and `AutoTokenizer.from_pretrained`.

## Tokenizer
Byte-level BPE (`tokenizers`), {report['vocab_size']} tokens, trained on the training files only and shared by both
models. Pre-tokenization: every `\\n` is its own piece, then GPT-2's regex without prefix space, so indentation
is a separate token and a prompt ending in a newline looks like training text. `{EOT}` (id 0) is bos,
eos, pad and the separator placed before every file; encoding adds no special tokens.
`decode(encode(x)) == x` is checked on every held-out file (indentation, tabs and blank lines survive).

## Corpus
The `.py` files of CPython {corpus['python_version']}'s standard library (`sysconfig.get_paths()["stdlib"]`), in sorted
path order. Left out: the directories {", ".join(f"`{name}`" for name in sorted(EXCLUDED_DIRS))}
(test suites and their data, IDLE, third-party packages, generated docs), and {corpus['excluded_files']} more files: the
machine-specific `_sysconfigdata*` and the generated character-map codec tables in `encodings/`.
Training: {corpus['train_files']} files, {corpus['train_bytes']:,} bytes, {corpus['train_tokens']:,} tokens.
Held out: {corpus['held_out_files']} files ({corpus['held_out_tokens']:,} tokens), those with
`sha256(path) % {HELD_OUT_ONE_IN} == 0`: {held_out}.

## Training
Torch AdamW (betas 0.9/0.95, weight decay {settings['weight_decay']} on matrices only, gradient clipping 1.0),
{settings['warmup_steps']} warmup steps then cosine decay to {settings['min_lr_ratio']} x peak, fp32 weights with
{"bf16 autocast" if settings.get("bf16_autocast", True) else "fp32"} matmuls, seed {SEED}.
The training stream is cut into non-overlapping windows of {settings['seq_len'] + 1} tokens, shuffled by a seeded
generator each epoch; both models see the same order.

## Evaluation
Scored on the saved bfloat16 weights (computed in fp32) over {report['held_out_tokens_scored']:,} held-out next-token
predictions in windows of {settings['seq_len']} tokens. Greedy completion of `{SAMPLE_PROMPT!r}` by the target:

```python
{report['sample']['target_greedy']}
```

## Reproduce
`{report['command']}` took {report['wall_seconds'] / 60:.1f} min wall time (tokenizer, both models, evaluation) on
{report['machine']}. The same machine and thread count reproduce the weights exactly;
other CPUs, thread counts or torch versions give slightly different numbers, another Python version
a different corpus.

## License
Corpus: CPython source, under the Python Software Foundation License Version 2. Weights and tokenizer:
Apache-2.0, like the rest of jaxinfer.
"""


if __name__ == "__main__":
    main()
