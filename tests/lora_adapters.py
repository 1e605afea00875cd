"""Tiny PEFT LoRA adapters for the tiny HF checkpoints, made and saved by peft itself."""

from __future__ import annotations

from pathlib import Path

import peft
import torch
import transformers

ALL_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def peft_model(model_dir: Path, targets: list[str], rank: int = 4, alpha: int = 8, seed: int = 1,
               use_rslora: bool = False) -> torch.nn.Module:
    """The checkpoint under a fresh LoRA adapter whose factors are all random (peft starts B at zero,
    which would adapt nothing)."""
    base = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0,
                             use_rslora=use_rslora)
    model = peft.get_peft_model(base, config)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(0.3 * torch.randn_like(param))
    return model.eval()


def save_adapter(
    model_dir: Path, out: Path, targets: list[str] | None = None, **kwargs
) -> tuple[Path, torch.nn.Module]:
    """An adapter saved as peft saves one (adapter_config.json, adapter_model.safetensors), and the
    peft model that serves as its reference."""
    model = peft_model(model_dir, targets or ALL_PROJECTIONS, **kwargs)
    model.save_pretrained(out)
    return out, model
