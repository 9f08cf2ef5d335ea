"""Upstream llama.cpp runs the converted drafter (pydflash2_testing.upstream, the parity oracle)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pydflash2_testing as testing
import pytest
from pydflash2.convert.cli import main as convert_main
from pydflash2_testing.upstream import Lattice, UpstreamDrafter, UpstreamError

# llama's graph taps layer inputs 0..n_layer-1 only: keep HF ids <= n_layer-2 (GGUF <= n_layer-1)
RUNNABLE_LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def runnable(tmp_path_factory: pytest.TempPathFactory, target_gguf: Path):
    d = tmp_path_factory.mktemp("upstream")

    def get(version: int) -> Path:
        out = d / f"v{version}.gguf"
        if not out.exists():
            spec = testing.DrafterSpec(version=version, target_layer_ids=RUNNABLE_LAYERS)
            ckpt = testing.make_drafter_checkpoint(d / f"ck{version}", target_gguf, spec)
            assert convert_main([str(ckpt), "--target", str(target_gguf), "-o", str(out), "--no-progress"]) == 0
        return out

    return get


PROMPT = [1, 40, 41, 42, 43, 44, 45]


@pytest.mark.parametrize("version", [2, 1])
def test_upstream_drafts_from_converted_file(runnable, target_gguf: Path, version: int) -> None:
    with UpstreamDrafter(target_gguf, runnable(version), n_ctx=256) as up:
        assert up.target_layers == [i + 1 for i in RUNNABLE_LAYERS]
        assert up.is_dflash2 == (version == 2)
        assert up.mask_token_id == testing.MASK_ID and up.block_size == 8
        feats, logits = up.target_decode(PROMPT, 0)
        assert feats.shape == (len(PROMPT), 3 * 64) and np.isfinite(feats).all()
        assert logits.shape == (len(PROMPT), up.n_vocab) and np.isfinite(logits).all()

        up.inject(feats, range(len(PROMPT)))  # one embeddings batch through llama_process
        assert up.pos_max() == len(PROMPT) - 1
        anchor = int(np.argmax(logits[-1]))
        n = up.block_size
        out = up.draft(anchor, len(PROMPT), n)  # one token block through llama_process
        assert up.pos_max() == len(PROMPT) - 1  # the block's K/V rows were removed again

        if version == 2:
            assert isinstance(out, Lattice)
            k = up.top_k
            assert k == 4
            assert out.candidates.shape == (n - 1, k) and out.scores.shape == (n - 1, k, k)
            assert ((out.candidates >= 0) & (out.candidates < up.n_vocab)).all()
            assert np.isfinite(out.scores).all()
            # raw candidate slots hold exact integers
            np.testing.assert_array_equal(out.raw[1:, :k], out.candidates.astype(np.float32))
            # position 1's predecessor is the anchor alone: every predecessor row agrees
            assert np.allclose(out.scores[0], out.scores[0][:1])
            path = out.greedy_path()
            assert len(path) == n - 1 and all(0 <= t < up.n_vocab for t in path)
        else:
            assert out.shape == (n, up.n_vocab) and np.isfinite(out).all()

        # a second round: commit the anchor, inject its row, draft again
        f2, l2 = up.target_decode([anchor], len(PROMPT))
        up.inject(f2, [len(PROMPT)])
        again = up.draft(int(np.argmax(l2[-1])), len(PROMPT) + 1, 4)
        assert up.pos_max() == len(PROMPT)
        if version == 2:
            assert again.candidates.shape == (3, 4)
        up.truncate(2)
        assert up.pos_max() == 1 and up.pos_max("target") == 1


def test_deterministic(runnable, target_gguf: Path) -> None:
    def once() -> Lattice:
        with UpstreamDrafter(target_gguf, runnable(2), n_ctx=256) as up:
            f, lg = up.target_decode(PROMPT, 0)
            up.inject(f, range(len(PROMPT)))
            return up.draft(int(np.argmax(lg[-1])), len(PROMPT))

    a, b = once(), once()
    np.testing.assert_array_equal(a.candidates, b.candidates)
    np.testing.assert_allclose(a.scores, b.scores, rtol=1e-5, atol=1e-5)


def test_untappable_layer_is_an_error_not_an_abort(tmp_path: Path, target_gguf: Path, capsys) -> None:
    # HF id 3 -> GGUF layer 4 == n_layer of the 4-layer llama target, whose input upstream
    # never extracts (it would GGML_ASSERT the whole process)
    spec = testing.DrafterSpec(target_layer_ids=(0, 2, 3))
    ckpt = testing.make_drafter_checkpoint(tmp_path / "ck", target_gguf, spec)
    out = tmp_path / "d.gguf"
    assert convert_main([str(ckpt), "--target", str(target_gguf), "-o", str(out), "--no-progress"]) == 0
    assert "warning: target layer id 3 is the target's last layer" in capsys.readouterr().err
    with pytest.raises(UpstreamError, match="cannot be tapped"):
        UpstreamDrafter(target_gguf, out)
