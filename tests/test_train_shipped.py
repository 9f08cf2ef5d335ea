"""The drafter shipped for the default target (trained by `pydflash2 train`) is a
working file: it loads, it is the default pair, and it is accepted (tau > 1.5) on
a few fixed prompts (see the threshold's comment). The held-out figure is the benchmark's job (README)."""

from __future__ import annotations

import llama_cpp
import pydflash2_testing as testing
import pytest

from pydflash2 import Speculator, inspect_drafter
from pydflash2.models import DEFAULT_DRAFTER, default_drafter, resolve_draft
from pydflash2.train.prompts import DEV_FILE, read_prompts

# The first held-out dev prompts: never distilled or trained on, the set `pydflash2 train`
# evaluates on, so this guards the file on the text it was made for.
PROMPTS = read_prompts(DEV_FILE)[:4]


def test_the_drafter_ships_with_the_package() -> None:
    assert default_drafter() == DEFAULT_DRAFTER and DEFAULT_DRAFTER.is_file()
    assert DEFAULT_DRAFTER.stat().st_size <= 30 * 2**20
    info = inspect_drafter(DEFAULT_DRAFTER)
    assert info["version"] == 2
    assert resolve_draft("smollm2", None) == DEFAULT_DRAFTER
    assert resolve_draft("smollm2", "none") is None and resolve_draft("other.gguf", None) is None


def test_shipped_drafter_is_accepted_on_smollm2() -> None:
    target = testing.default_target_or_skip()
    llm = llama_cpp.Llama(str(target), n_ctx=1024, verbose=False)
    committed = steps = 0
    with Speculator(llm, DEFAULT_DRAFTER, n_max=7) as spec:
        for prompt in PROMPTS:
            out = spec.generate(prompt, max_tokens=64)
            committed += out.stats["n_generated"] - 1
            steps += out.stats["n_steps"]
    tau = committed / steps
    # A random drafter gives tau ~1.00 here; the shipped file measures 2.35 on these four prompts
    # (2.28 on the first 8, 2.07 on all 64 held-out prompts in the README's bench). The bar,
    # 1.5, catches a broken, untrained or mis-wired file: an early, less-trained file measured 1.27
    # on hand-written prompts.
    assert tau > 1.5, tau


def test_the_shipped_drafter_warm_starts_exactly(tmp_path) -> None:
    """`train --init-drafter` reads a q8_0 file back exactly: the shipped drafter, loaded into the
    PyTorch model and exported again at its own draft vocabulary, is the same file, byte for byte."""
    pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")
    from pydflash2.train.export import export_gguf, export_hf
    from pydflash2.train.target import read_target
    from pydflash2.train.trainer import build_model
    from pydflash2.train.warm_start import drafter_config, load_weights

    target = testing.default_target_or_skip()
    info = read_target(target)
    cfg = drafter_config(DEFAULT_DRAFTER, n_embd=info.n_embd, n_vocab=info.n_vocab)
    model = build_model(cfg, target)
    load_weights(model, DEFAULT_DRAFTER)
    out = export_gguf(export_hf(model, tmp_path / "hf"), target, tmp_path / "again.gguf", "q8_0")
    assert out.read_bytes() == DEFAULT_DRAFTER.read_bytes()
