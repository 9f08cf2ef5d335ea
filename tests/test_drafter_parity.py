"""Our drafter graph against upstream llama.cpp's own dflash drafter
(pydflash2_testing.upstream), fed identical features from a real target decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pydflash2_testing as testing
import pytest
from pydflash2.convert.cli import main as convert_main

from pydflash2 import Drafter

upstream = pytest.importorskip("pydflash2_testing.upstream")

# upstream taps target layer INPUTS 0..n_layer-1 on a llama target: HF ids 0..n_layer-2
SPEC_LAYERS = (0, 1, 2)


def with_draft_vocab(ck: Path, target_gguf: Path, out: Path, n_draft: int, seed: int) -> Path:
    """The checkpoint with a reduced draft vocabulary: n_draft target tokens in a
    shuffled order (as frequency orders them), their rows of the target's head as
    its own lm_head, and d2t as EAGLE/DFlash checkpoints store it (offsets)."""
    import gguf
    from safetensors.numpy import load_file, save_file

    reader = gguf.GGUFReader(target_gguf)
    tensors = {t.name: t for t in reader.tensors}
    head_t = tensors.get("output.weight") or tensors["token_embd.weight"]
    head = np.asarray(head_t.data, dtype=np.float32).reshape(-1, int(head_t.shape[0]))  # [V, H]
    ids = np.random.default_rng(seed).permutation(head.shape[0])[:n_draft].astype(np.int64)
    out.mkdir(parents=True, exist_ok=True)
    weights = load_file(str(ck / "model.safetensors"))
    weights["lm_head.weight"] = np.ascontiguousarray(head[ids])
    weights["d2t"] = ids - np.arange(n_draft, dtype=np.int64)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((ck / "config.json").read_text())
    cfg["draft_vocab_size"] = n_draft
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="module")
def parity_drafters(tmp_path_factory: pytest.TempPathFactory, target_gguf: Path) -> dict[Any, Path]:
    d = tmp_path_factory.mktemp("parity")
    out: dict[Any, Path] = {}
    for v in (1, 2):
        ck = testing.make_drafter_checkpoint(
            d / f"ck{v}", target_gguf, testing.DrafterSpec(version=v, target_layer_ids=SPEC_LAYERS, seed=10 + v)
        )
        out[v] = testing.checkpoint_to_gguf(ck, target_gguf, d / f"dflash{v}.gguf")
        # a reduced draft vocabulary (d2t), as the shipped drafter has
        small = with_draft_vocab(ck, target_gguf, d / f"ck{v}-d2t", n_draft=48, seed=v)
        # through the product converter (testing's own writer knows no d2t)
        gguf_path = d / f"dflash{v}-d2t.gguf"
        assert convert_main([str(small), "--target", str(target_gguf), "-o", str(gguf_path), "--outtype", "f32"]) == 0
        out[(v, "d2t")] = gguf_path
    return out


def _compare(ours: Drafter, up, anchor: int, pos: int, n: int) -> None:
    ref = up.draft(anchor, pos, n)
    prop = ours.propose(anchor, pos, n)
    if ours.version == 1:
        want = ref[1:]
        got = prop.logits
        for i in range(n - 1):
            assert set(np.argsort(-got[i])[:4].tolist()) == set(np.argsort(-want[i])[:4].tolist()), f"top-k at {i + 1}"
        # a reduced draft vocabulary leaves the other tokens at -inf, on both sides
        finite = np.isfinite(want)
        assert (np.isfinite(got) == finite).all()
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-3, atol=1e-3 * float(np.abs(want[finite]).max()))
        return
    k = prop.candidates.shape[1]
    for i in range(n - 1):
        assert set(prop.candidates[i].tolist()) == set(ref.candidates[i].tolist()), f"candidates at position {i + 1}"
    scale = float(np.abs(ref.scores).max())
    for i in range(n - 1):
        up_idx = {int(t): j for j, t in enumerate(ref.candidates[i])}
        perm_c = [up_idx[int(t)] for t in prop.candidates[i]]
        if i == 0:
            rows_ours, rows_up = [0], [0]
        else:
            prev_up = {int(t): j for j, t in enumerate(ref.candidates[i - 1])}
            rows_ours = list(range(k))
            rows_up = [prev_up[int(t)] for t in prop.candidates[i - 1]]
        got = prop.scores[i][rows_ours]
        want = ref.scores[i][rows_up][:, perm_c]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * scale, err_msg=f"scores at position {i + 1}")
    assert ours.select_path("greedy").tokens.tolist() == ref.greedy_path()


@pytest.mark.parametrize("version", [1, 2, (1, "d2t"), (2, "d2t")])
def test_parity_with_upstream(version: Any, parity_drafters: dict[Any, Path], target_gguf: Path) -> None:
    path = parity_drafters[version]
    rng = np.random.default_rng(version if isinstance(version, int) else version[0] + 10)
    with upstream.UpstreamDrafter(target_gguf, path, n_ctx=256, n_threads=2) as up:
        ours = Drafter(path, target_gguf, n_ctx=256, n_threads=2, device="CPU")
        V = up.n_vocab
        prompt = rng.integers(8, V, size=20).tolist()
        feats, logits = up.target_decode(prompt, 0)
        up.inject(feats, range(len(prompt)))
        ours.inject(feats, np.arange(len(prompt)))
        pos = len(prompt)
        anchor = int(np.argmax(logits[-1]))
        for n in range(2, ours.block_size + 1):
            _compare(ours, up, anchor, pos, n)

        # several draft/commit rounds, with rollbacks of rejected rows
        for _round in range(3):
            drafted = ours.select_path("greedy").tokens.tolist() if ours.version == 2 else []
            block = [anchor] + (drafted or rng.integers(8, V, size=3).tolist())[:3]
            feats, logits = up.target_decode(block, pos)
            # accept anchor + 1 draft: roll the target back past the rest
            n_acc = 2
            up.truncate(pos + n_acc, drafter=False)
            up.inject(feats[:n_acc], range(pos, pos + n_acc))
            ours.inject(feats[:n_acc], np.arange(pos, pos + n_acc))
            anchor = int(np.argmax(logits[n_acc - 1]))
            pos += n_acc
            _compare(ours, up, anchor, pos, ours.block_size)

        # drafter-side rollback: drop committed rows and recommit different ones
        up.truncate(pos - 3)
        ours.truncate(pos - 3)
        pos -= 3
        assert ours.last_pos == pos - 1 == up.pos_max("drafter")
        block = rng.integers(8, V, size=4).tolist()
        feats, logits = up.target_decode(block, pos)
        up.inject(feats, range(pos, pos + 4))
        ours.inject(feats, np.arange(pos, pos + 4))
        pos += 4
        for n in (2, 3, ours.block_size):
            _compare(ours, up, int(np.argmax(logits[-1])), pos, n)
