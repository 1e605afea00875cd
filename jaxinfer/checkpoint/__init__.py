"""HF checkpoints: loading, weight names, orbax conversion, tokenizers."""
