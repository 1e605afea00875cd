"""Tiny encoder checkpoints (BERT, XLM-RoBERTa: base models and one-label cross-encoders) saved by
transformers with a WordPiece tokenizer: BERT's [CLS] A [SEP] B [SEP] with token types, or RoBERTa's
<s> A </s></s> B </s> without them."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

WORDS = ("the quick brown fox jumps over lazy dog def add return a b for i in range print hello world what is "
         "python code sum of two numbers").split()
BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]  # ids 0..4: BertConfig's pad_token_id 0
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # ids 0..3: XLM-R's, pad_token_id 1
SHAPE = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=64, initializer_range=0.1)


def save_tokenizer(path: Path, layout: str) -> transformers.PreTrainedTokenizerFast:
    """A WordPiece tokenizer over WORDS and single letters with the layout's special tokens and pair template."""
    specials = BERT_SPECIALS if layout == "bert" else ROBERTA_SPECIALS
    vocab = {token: i for i, token in enumerate(dict.fromkeys([*specials, *WORDS, *"abcdefghijklmnopqrstuvwxyz?.,"]))}
    unk = specials[1] if layout == "bert" else "<unk>"
    tok = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if layout == "bert":
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]", unk_token="[UNK]",
            mask_token="[MASK]", model_input_names=["input_ids", "token_type_ids", "attention_mask"])
    else:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
        fast = transformers.PreTrainedTokenizerFast(
            tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
            pad_token="<pad>", unk_token="<unk>", model_input_names=["input_ids", "attention_mask"])
    fast.save_pretrained(path)
    return fast


def make_encoder(architecture: str, vocab_size: int, type_vocab_size: int) -> torch.nn.Module:
    """A randomly initialized tiny `architecture` (one label for a classifier), norms and biases moved off
    their trivial values so a wrong bias or norm shows."""
    roberta = architecture.startswith("XLMRoberta")
    config_cls = transformers.XLMRobertaConfig if roberta else transformers.BertConfig
    extra = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5) if roberta else {}
    config = config_cls(vocab_size=vocab_size, type_vocab_size=type_vocab_size, num_labels=1, **SHAPE, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 1:
                param.add_(0.1 * torch.randn_like(param))
    return model


def save_encoder(path: Path, architecture: str) -> tuple[torch.nn.Module, transformers.PreTrainedTokenizerFast]:
    """(HF model, tokenizer) of a tiny `architecture` saved with its tokenizer into `path`."""
    layout = "roberta" if architecture.startswith("XLMRoberta") else "bert"
    tokenizer = save_tokenizer(path, layout)
    model = make_encoder(architecture, len(tokenizer), 2 if layout == "bert" else 1)
    model.save_pretrained(path)
    return model, tokenizer
