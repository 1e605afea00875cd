"""Tokenizer loading: a generic fast tokenizer loads without AutoTokenizer (and PyTorch), the same as through it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from hf_models import TOKENIZER_CORPUS, save_tiny_tokenizer
from python_subprocess import python_child

from jaxinfer.checkpoint.tokenizer import load_tokenizer
from jaxinfer.entrypoints.llm import DEMO_MODEL

CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"


def test_generic_tokenizer_matches_auto_tokenizer(tmp_path: Path):
    path = save_tiny_tokenizer(tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATE
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    ours, auto = load_tokenizer(path), transformers.AutoTokenizer.from_pretrained(path)
    assert type(ours) is type(auto)
    for text in TOKENIZER_CORPUS:
        assert ours(text)["input_ids"] == auto(text)["input_ids"]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (auto.bos_token_id, auto.eos_token_id,
                                                                          auto.pad_token_id)
    assert ours.apply_chat_template(CHAT, tokenize=False) == auto.apply_chat_template(CHAT, tokenize=False)


def test_a_model_specific_class_still_goes_through_auto_tokenizer(tmp_path: Path):
    path = save_tiny_tokenizer(tmp_path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["tokenizer_class"] = "GPT2Tokenizer"
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    assert type(load_tokenizer(path)) is type(transformers.AutoTokenizer.from_pretrained(path))


def test_a_transformers_5_tokenizer_loads_where_tokenizers_backend_is_missing(monkeypatch: pytest.MonkeyPatch):
    """The demo's tokenizer_config.json names TokenizersBackend (transformers 5's generic class): where transformers
    lacks that name (4.x, whose AutoTokenizer refuses it), PreTrainedTokenizerFast loads the same tokenizer."""
    import jaxinfer.checkpoint.hf_import as hf_import

    expected = load_tokenizer(DEMO_MODEL)
    real = hf_import.tokenizer_class
    monkeypatch.setattr(hf_import, "tokenizer_class",
                        lambda name: real(name) if name != "TokenizersBackend" else getattr(object, name))
    monkeypatch.setattr(hf_import, "auto_tokenizer", lambda: pytest.fail("AutoTokenizer refuses TokenizersBackend"))
    loaded = load_tokenizer(DEMO_MODEL)
    assert type(loaded) is real("PreTrainedTokenizerFast")  # transformers 5's alias of TokenizersBackend
    assert [loaded(t)["input_ids"] for t in TOKENIZER_CORPUS] == [expected(t)["input_ids"] for t in TOKENIZER_CORPUS]


def test_the_demo_tokenizer_loads_without_importing_torch():
    script = (
        "import sys; from pathlib import Path; from jaxinfer.checkpoint.tokenizer import load_tokenizer; "
        f"tok = load_tokenizer(Path({str(DEMO_MODEL)!r})); assert tok('x = 1')['input_ids']; "
        "print('torch' in sys.modules)"
    )
    out = python_child(script)
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "True" and _tokenizer_class_imports_torch():
        pytest.skip(f"transformers {transformers.__version__}'s fast tokenizer module imports torch itself "
                    "(its GGUF loader, where torch is installed)")
    assert out.stdout.strip() == "False", out.stderr


def _tokenizer_class_imports_torch() -> bool:
    """Whether transformers' generic fast tokenizer class alone imports torch (5.17's does), which no loader can
    avoid."""
    out = python_child("import sys, transformers; transformers.PreTrainedTokenizerFast; print('torch' in sys.modules)")
    return out.stdout.strip() == "True"


def test_the_background_load_gives_the_tokenizer_or_its_error(tmp_path: Path):
    from jaxinfer.checkpoint.tokenizer import load_tokenizer_beside

    path = save_tiny_tokenizer(tmp_path / "ok")
    assert type(load_tokenizer_beside(path).result(timeout=60)) is type(load_tokenizer(path))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="Expecting property name"):  # the parse error, raised in result()
        load_tokenizer_beside(broken).result(timeout=60)


def test_a_tokenizer_load_that_never_ends_does_not_hold_the_exit():
    """An interrupted start can leave the load waiting forever on an import lock: the exit must not join it."""
    script = (
        "import sys, threading\n"
        "import jaxinfer.checkpoint.tokenizer as t\n"
        "t.load_tokenizer = lambda path: threading.Event().wait()\n"
        "t.load_tokenizer_beside('unused')\n"
        "sys.exit(3)\n"
    )
    done = python_child(script, timeout=60)
    assert done.returncode == 3, done.stderr
