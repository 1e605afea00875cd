"""scripts/train_pair.py (the GPU training of the next demo pair) and its corpus: only permissively
licensed sources, each named in the card, and a quick run on CPU whose pair jaxinfer loads and
speculates with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from python_subprocess import REPO, child_env

from jaxinfer import LLM, SamplingParams, SpeculativeConfig

sys.path.insert(0, str(Path(REPO) / "scripts"))
import python_corpus  # noqa: E402


@pytest.mark.parametrize(("statements", "accepted"), [
    (["MIT"], "MIT"),
    (["", "BSD License"], "BSD License"),
    (["Apache-2.0 OR BSD-3-Clause"], "Apache-2.0 OR BSD-3-Clause"),
    (["Apache-2.0 AND BSD-3-Clause AND MIT"], "Apache-2.0 AND BSD-3-Clause AND MIT"),
    (["Python Software Foundation License"], "Python Software Foundation License"),
    (["MPL-2.0 AND MIT"], None),  # a file-level copyleft part: left out
    (["public domain, Python, 2-Clause BSD, GPL"], None),
    (["GNU Lesser General Public License v3 (LGPLv3)"], None),
    (["GPL-2.0-or-later OR MIT"], "GPL-2.0-or-later OR MIT"),  # a permissive alternative is offered
    ([], None),  # unknown: left out
    (["Proprietary"], None),
])
def test_only_permissive_licenses_are_taken(statements, accepted):
    assert python_corpus.permissive_license(statements) == accepted


def test_tests_and_vendored_copies_are_skipped():
    paths = [Path(p) for p in ["pkg/a.py", "pkg/tests/test_a.py", "pkg/_vendor/six.py", "pkg/sub/b.py",
                               "pkg/data.json", "pkg/third_party/x.py"]]
    assert python_corpus.own_python_files(paths) == [Path("pkg/a.py"), Path("pkg/sub/b.py")]


def test_a_deadline_cuts_training_by_what_preparing_took():
    import train_pair

    plan = train_pair.Plan(target_seconds=140, draft_seconds=70)
    assert train_pair.fit_deadline(plan, None, 100.0) == plan
    assert train_pair.fit_deadline(plan, 10, 60.0) == plan  # 600 s leave room for all 210
    cut = train_pair.fit_deadline(plan, 5, 150.0)  # 300 - 150 - FINISH_SECONDS left
    left = 300 - 150 - train_pair.FINISH_SECONDS
    assert cut.target_seconds == pytest.approx(left * 2 / 3) and cut.draft_seconds == pytest.approx(left / 3)
    with pytest.raises(SystemExit, match="no time left"):
        train_pair.fit_deadline(plan, 3, 170.0)


def test_the_pair_fits_what_the_repository_carries():
    """The shipped sizes fit MAX_PAIR_BYTES; a bigger target is refused before any training; the
    count the check uses is what transformers builds."""
    import train_pair
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    train_pair.check_pair_bytes((train_pair.TARGET, train_pair.DRAFT), 4096)
    wide = train_pair.ModelSpec("target", 512, 6, 8, 4, 1408, peak_lr=1e-3, steps=0)  # the 2026-11-29 target
    with pytest.raises(SystemExit, match="over MAX_PAIR_BYTES"):
        train_pair.check_pair_bytes((wide, train_pair.DRAFT), 4096)
    vocab = {f"t{i}": i for i in range(96)} | {train_pair.EOT: 96}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")))
    built = train_pair.build_model(train_pair.QUICK_TARGET, tokenizer)
    assert sum(p.numel() for p in built.parameters()) == train_pair.parameter_count(train_pair.QUICK_TARGET, 97)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A pair from a quick run (tiny models, seconds of training on the stdlib)."""
    out = tmp_path_factory.mktemp("train-pair") / "pair"
    run_script("train_pair.py", "--out", str(out), "--quick")
    return out


def run_script(name: str, *args: str) -> None:
    done = subprocess.run([sys.executable, str(Path(REPO) / "scripts" / name), *args], env=child_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def greedy_ids(target: Path, speculative: SpeculativeConfig | None = None) -> tuple[list[int], LLM]:
    llm = LLM(target, dtype="float32", max_seq_len=64, speculative=speculative)
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    return llm.generate(["def f(x):\n"], greedy)[0].token_ids, llm


@pytest.fixture(scope="module")
def plain(pair) -> list[int]:
    """The pair's target decoding on its own: what each draft speculating for it must give."""
    return greedy_ids(pair / "target")[0]


def test_a_quick_run_writes_a_pair_jaxinfer_speculates_with(pair, plain):
    metrics = json.loads((pair / "metrics.json").read_text())
    assert 0 < metrics["eval"]["bits_per_byte"]["target"] < 8 and metrics["training"]["draft"]["steps"] > 0
    card = (pair / "README.md").read_text()
    assert "| python-stdlib |" in card and "PSF" in card
    spec = SpeculativeConfig(method="draft", draft_model=str(pair / "draft"), num_speculative_tokens=3,
                             adaptive=False, fallback=False)
    ids, llm = greedy_ids(pair / "target", spec)
    assert ids == plain and llm.metrics()["drafted"] > 0


def test_an_eagle3_head_trained_for_the_pair_loads_and_drafts(pair, plain, tmp_path):
    """train_eagle.py --version 3: the head taps three of the target's layers and drafts in the engine."""
    run_script("train_eagle.py", "--target", str(pair / "target"), "--out", str(tmp_path / "eagle"), "--version", "3",
               "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--eval-windows", "2",
               "--data", str(Path(json.__file__).parent))  # a dozen stdlib files: tokenizing all of it took ~15 s
    spec = SpeculativeConfig(method="eagle", draft_model=str(tmp_path / "eagle"), num_speculative_tokens=3,
                             adaptive=False, fallback=False)
    ids, llm = greedy_ids(pair / "target", spec)
    assert ids == plain and llm.metrics()["drafted"] > 0
    assert llm.engine.draft_spec.cfg.version == 3 and llm.engine.draft_spec.cfg.feature_layers == (0, 1, 2)
