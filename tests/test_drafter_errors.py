"""Every drafter error case raises a clear exception and leaves the drafter usable."""

from __future__ import annotations

import numpy as np
import pydflash2_testing as testing
import pytest

from pydflash2 import Drafter, DrafterError


@pytest.fixture()
def drafter(drafter2_gguf, target_gguf) -> Drafter:
    d = Drafter(drafter2_gguf, target_gguf, n_ctx=16, device="CPU")
    d.inject(np.ones((4, d.feature_width), np.float32), np.arange(4))
    return d


def _still_works(d: Drafter) -> None:
    n0 = d.n_cached
    p = d.propose(5, d.last_pos + 1, d.block_size)
    assert p.candidates.shape[0] == d.block_size - 1
    assert len(d.select_path().tokens) == d.block_size - 1
    assert d.n_cached == n0


def test_block_longer_than_block_size(drafter: Drafter) -> None:
    with pytest.raises(DrafterError, match="block_size"):
        drafter.propose(5, 4, drafter.block_size + 1)
    with pytest.raises(DrafterError, match="block length"):
        drafter.propose(5, 4, 1)
    _still_works(drafter)


def test_positions_not_after_cache_end(drafter: Drafter) -> None:
    with pytest.raises(DrafterError, match="not after the cache end"):
        drafter.propose(5, 3, 4)
    with pytest.raises(DrafterError, match="after the cache end"):
        drafter.inject(np.ones((2, drafter.feature_width), np.float32), [3, 4])
    with pytest.raises(DrafterError, match="strictly increasing"):
        drafter.inject(np.ones((2, drafter.feature_width), np.float32), [6, 6])
    assert drafter.n_cached == 4
    _still_works(drafter)


def test_feature_width_mismatch(drafter: Drafter) -> None:
    with pytest.raises(DrafterError, match="feature width mismatch"):
        drafter.inject(np.ones((2, drafter.feature_width - 1), np.float32), [4, 5])
    with pytest.raises(DrafterError, match="positions"):
        drafter.inject(np.ones((2, drafter.feature_width), np.float32), [4])
    assert drafter.n_cached == 4
    _still_works(drafter)


def test_cache_full(drafter: Drafter) -> None:
    with pytest.raises(DrafterError, match="cache full"):
        drafter.inject(np.ones((13, drafter.feature_width), np.float32), np.arange(4, 17))
    assert drafter.n_cached == 4
    drafter.inject(np.ones((12, drafter.feature_width), np.float32), np.arange(4, 16))
    assert drafter.n_cached == 16
    _still_works(drafter)  # a full cache still drafts (the block uses scratch rows)
    drafter.truncate(10)
    assert drafter.n_cached == 10 and drafter.last_pos == 9
    _still_works(drafter)


def test_bad_anchor_selector_temperature(drafter: Drafter) -> None:
    with pytest.raises(DrafterError, match="vocabulary"):
        drafter.propose(drafter.n_vocab, 4, 3)
    with pytest.raises(DrafterError, match="truncate"):
        drafter.truncate(-1)
    drafter.propose(5, 4, 3)
    with pytest.raises(DrafterError, match="selector must be one of"):
        drafter.select_path("beam")
    with pytest.raises(DrafterError, match="temperature"):
        drafter.select_path("sample", temperature=0.0)
    _still_works(drafter)


def test_select_path_before_propose(drafter2_gguf, target_gguf) -> None:
    d = Drafter(drafter2_gguf, target_gguf, n_ctx=8, device="CPU")
    with pytest.raises(DrafterError, match="no proposal"):
        d.select_path()


def test_drafter_target_mismatch(tmp_path, drafter2_gguf) -> None:
    other = testing.make_target_gguf(tmp_path / "wide.gguf", testing.TargetSpec(n_embd=96, n_head=4))
    with pytest.raises(DrafterError, match="target/drafter mismatch.*hidden size"):
        Drafter(drafter2_gguf, other)


def test_not_a_drafter_and_unknown_device(drafter2_gguf, target_gguf) -> None:
    with pytest.raises(DrafterError, match="architecture"):
        Drafter(target_gguf, target_gguf)
    with pytest.raises(DrafterError, match="is a dflash drafter"):
        Drafter(drafter2_gguf, drafter2_gguf)
    with pytest.raises(DrafterError, match="unknown device 'NoSuchGPU'"):
        Drafter(drafter2_gguf, target_gguf, device="NoSuchGPU")


def test_sampled_path_is_seeded_and_normalised(drafter: Drafter) -> None:
    drafter.propose(5, 4, drafter.block_size)
    a = drafter.select_path("sample", temperature=2.0, seed=11)
    b = drafter.select_path("sample", temperature=2.0, seed=11)
    assert a.tokens.tolist() == b.tokens.tolist()
    np.testing.assert_allclose(a.q.sum(-1), 1.0, rtol=1e-5)
    for i, t in enumerate(a.tokens):
        assert t in a.q_ids[i]
    v = drafter.select_path("viterbi")
    assert v.q.sum() == pytest.approx(drafter.block_size - 1)
