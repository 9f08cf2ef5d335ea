"""Our ggml drafter graph against a float64 NumPy reference written from the
doc's math, on the small random fixture weights."""

from __future__ import annotations

import numpy as np
import pytest
from drafter_ref import RefDrafter

from pydflash2 import Drafter


def _features(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    return rng.standard_normal((n, width)).astype(np.float32)


def _compare_v2(d: Drafter, ref: RefDrafter, anchor: int, pos: int, n: int) -> None:
    prop = d.propose(anchor, pos, n)
    hidden, logits = ref.forward(anchor, pos, n)
    cand_sets, score = ref.selector(anchor, hidden, logits)
    assert prop.candidates.shape == (n - 1, ref.top_k)
    for i in range(n - 1):
        assert set(prop.candidates[i].tolist()) == cand_sets[i], f"candidate set differs at position {i + 1}"
        for p in range(ref.top_k):
            p_tok = anchor if i == 0 else int(prop.candidates[i - 1, p])
            want = np.array([score(i, p_tok, int(c)) for c in prop.candidates[i]])
            np.testing.assert_allclose(prop.scores[i, p], want, rtol=1e-4, atol=1e-3)
    # the greedy selector is the reference greedy path over the reference scores
    prev, toks = anchor, []
    for i in range(n - 1):
        cs = sorted(cand_sets[i])
        c = max(cs, key=lambda t: score(i, prev, t))
        toks.append(c)
        prev = c
    assert d.select_path("greedy").tokens.tolist() == toks


def _compare_v1(d: Drafter, ref: RefDrafter, anchor: int, pos: int, n: int) -> None:
    prop = d.propose(anchor, pos, n)
    _, logits = ref.forward(anchor, pos, n)
    np.testing.assert_allclose(prop.logits, logits[1:], rtol=1e-4, atol=1e-3)
    for i in range(n - 1):
        assert set(np.argsort(-prop.logits[i])[:8].tolist()) == set(np.argsort(-logits[i + 1])[:8].tolist())
    assert d.select_path("greedy").tokens.tolist() == logits[1:].argmax(-1).tolist()


@pytest.mark.parametrize("which", ["drafter1_gguf", "drafter2_gguf"])
def test_reference_block_sizes_and_truncate(which: str, request: pytest.FixtureRequest, target_gguf) -> None:
    path = request.getfixturevalue(which)
    d = Drafter(path, target_gguf, n_ctx=256, cache_type="f32", device="CPU")
    ref = RefDrafter(path, target_gguf)
    compare = _compare_v2 if d.version == 2 else _compare_v1
    rng = np.random.default_rng(7)

    feats = _features(rng, 12, d.feature_width)
    d.inject(feats, np.arange(12))
    ref.inject(feats, np.arange(12))
    for n in range(2, d.block_size + 1):
        compare(d, ref, anchor=int(rng.integers(8, d.n_vocab)), pos=12, n=n)

    # roll back past committed rows, commit different ones, draft again
    d.truncate(7)
    ref.truncate(7)
    assert d.n_cached == 7
    feats2 = _features(rng, 4, d.feature_width)
    d.inject(feats2, np.arange(7, 11))
    ref.inject(feats2, np.arange(7, 11))
    for n in (2, 5, d.block_size):
        compare(d, ref, anchor=int(rng.integers(8, d.n_vocab)), pos=11, n=n)


def test_reference_gapped_positions_and_chunked_inject(drafter2_gguf, target_gguf) -> None:
    """Positions need not be contiguous; long injects run in chunks."""
    d = Drafter(drafter2_gguf, target_gguf, n_ctx=512, cache_type="f32", device="CPU")
    ref = RefDrafter(drafter2_gguf, target_gguf)
    rng = np.random.default_rng(3)
    pos = np.cumsum(rng.integers(1, 3, size=150))
    feats = _features(rng, 150, d.feature_width)
    d.inject(feats, pos)
    ref.inject(feats, pos)
    assert d.n_cached == 150
    _compare_v2(d, ref, anchor=42, pos=int(pos[-1]) + 3, n=d.block_size)


def test_f16_cache_close_to_reference(drafter2_gguf, target_gguf) -> None:
    """The default f16 cache (as llama.cpp's) stays close to the reference."""
    d = Drafter(drafter2_gguf, target_gguf, n_ctx=64, device="CPU")
    ref = RefDrafter(drafter2_gguf, target_gguf)
    rng = np.random.default_rng(5)
    feats = _features(rng, 10, d.feature_width)
    d.inject(feats, np.arange(10))
    ref.inject(feats, np.arange(10))
    prop = d.propose(17, 10, d.block_size)
    hidden, logits = ref.forward(17, 10, d.block_size)
    cand_sets, score = ref.selector(17, hidden, logits)
    for i in range(d.block_size - 1):
        want = np.array(
            [score(i, 17 if i == 0 else int(prop.candidates[i - 1, 0]), int(c)) for c in prop.candidates[i]]
        )
        np.testing.assert_allclose(prop.scores[i, 0], want, rtol=2e-2, atol=0.2)
