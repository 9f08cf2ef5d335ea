"""The drafter uses the target's token embedding and output head in place: the
target GGUF is mapped shared and read-only, not copied, so its pages are the
same ones llama.cpp's own mapping of that file uses."""

from __future__ import annotations

import os

import llama_cpp
import pytest

from pydflash2 import Drafter, DrafterError


def _mappings_of(path) -> list[str]:
    real = os.path.realpath(path)
    return [line for line in open("/proc/self/maps") if line.rstrip().endswith(real)]


def test_target_head_is_mapped_in_place(target_gguf, drafter2_gguf) -> None:
    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, verbose=False, use_mmap=True)
    before = len(_mappings_of(target_gguf))
    with Drafter(drafter2_gguf, target_gguf, n_ctx=256, device="CPU") as d:
        assert d.info["target_head_mapped"] is True
        maps = _mappings_of(target_gguf)
        assert len(maps) > before
        # read-only and shared: the page cache backs both llama.cpp's view and ours
        assert all(line.split()[1].startswith("r") and line.split()[1].endswith("s") for line in maps[before:])
        # and it computes with it
        p = d.propose(anchor=5, pos=0, n=4)
        assert p.candidates is not None and p.candidates.shape == (3, 4)
    del llm


def test_drafters_sharing_weights_have_their_own_caches(target_gguf, drafter2_gguf) -> None:
    # one copy of the weights for many sequences (the server's slots): each drafter proposes from its own
    # cache exactly what a drafter with weights of its own proposes after the same injections
    import numpy as np

    rng = np.random.default_rng(11)
    with Drafter(drafter2_gguf, target_gguf, n_ctx=256, n_threads=1, device="CPU") as a:
        b = Drafter.sharing_weights(a, n_ctx=128)
        alone = Drafter(drafter2_gguf, target_gguf, n_ctx=128, n_threads=1, device="CPU")
        assert a.info["weights_users"] == b.info["weights_users"] == 2 and alone.info["weights_users"] == 1
        assert a.info["weights_address"] == b.info["weights_address"] != alone.info["weights_address"]
        assert b.info["n_ctx"] == 128 and b.info["device"] == "CPU"
        pos_a = pos_b = 0
        for step in range(6):  # alternate: a's graphs and cache must not leak into b's
            m = int(rng.integers(1, 9))
            a.inject(rng.standard_normal((m, a.feature_width)).astype(np.float32), np.arange(pos_a, pos_a + m))
            pos_a += m
            a.propose(3, pos_a, 4)
            fb = rng.standard_normal((2, b.feature_width)).astype(np.float32)
            b.inject(fb, [pos_b, pos_b + 1])
            alone.inject(fb, [pos_b, pos_b + 1])
            pos_b += 2
            got, want = b.propose(7, pos_b, 5), alone.propose(7, pos_b, 5)
            assert np.array_equal(got.candidates, want.candidates) and np.array_equal(got.scores, want.scores), step
            if step == 3:
                b.truncate(pos_b - 1)
                alone.truncate(pos_b - 1)
                pos_b -= 1
        assert a.n_cached == pos_a and b.n_cached == pos_b
        alone.close()
    # the shared weights outlive the drafter that loaded them
    assert b.propose(7, pos_b, 3).candidates is not None
    b.close()
    with pytest.raises(DrafterError, match="closed"):
        Drafter.sharing_weights(b)


def test_graph_shapes_stay_bounded(target_gguf, drafter2_gguf) -> None:
    """Injects of any length reuse a few inject graphs (64 rows and powers of two), and a
    drafter keeps at most set_max_graphs shapes allocated: a server's memory does not grow
    with the lengths its requests happen to have."""
    import numpy as np

    rng = np.random.default_rng(5)
    with Drafter(drafter2_gguf, target_gguf, n_ctx=4096, device="CPU") as d:
        pos = 0
        for n in range(1, 80):  # 79 different lengths
            feats = rng.standard_normal((n, d.feature_width)).astype(np.float32)
            d.inject(feats, np.arange(pos, pos + n))
            pos += n
        # 64, 32, 16, 8, 4, 2, 1 rows: seven shapes
        assert d.info["graph_slots"] == 7
        d.set_max_graphs(3)
        assert d.info["graph_slots"] == 3
        for n in range(2, d.block_size + 1):
            d.propose(anchor=5, pos=pos, n=n)
        assert d.info["graph_slots"] == 3
        ref = d.propose(anchor=5, pos=pos, n=d.block_size).candidates.copy()
        d.propose(anchor=5, pos=pos, n=2)
        d.propose(anchor=5, pos=pos, n=3)
        d.propose(anchor=5, pos=pos, n=4)  # the block-size graph was evicted: rebuilt, same answer
        np.testing.assert_array_equal(d.propose(anchor=5, pos=pos, n=d.block_size).candidates, ref)
        with pytest.raises(DrafterError, match="at least one graph|>= 1"):
            d.set_max_graphs(0)


def test_a_fused_inject_proposes_what_inject_then_propose_does(target_gguf, drafter2_gguf) -> None:
    """propose(features=, positions=) injects the rows in the propose's own graph (the engine's
    step): the same proposals, step after step, as inject() then propose(), for every row count
    up to the block. Its graphs take the rows padded to a power of two (a graph per count was a
    build each), so the padding must stay out of every proposal and out of the cache."""
    import numpy as np

    rng = np.random.default_rng(13)
    with (Drafter(drafter2_gguf, target_gguf, n_ctx=512, n_threads=1, device="CPU") as fused,
          Drafter(drafter2_gguf, target_gguf, n_ctx=512, n_threads=1, device="CPU") as apart):
        prompt = rng.standard_normal((9, fused.feature_width)).astype(np.float32)
        fused.inject(prompt, np.arange(9))
        apart.inject(prompt, np.arange(9))
        builds = fused.info["n_graph_builds"]
        pos = 9
        for m in [*range(1, fused.block_size + 1), 3, 7, 5]:
            rows = rng.standard_normal((m, fused.feature_width)).astype(np.float32)
            got = fused.propose(4, pos + m, fused.block_size, features=rows, positions=np.arange(pos, pos + m))
            apart.inject(rows, np.arange(pos, pos + m))
            want = apart.propose(4, pos + m, fused.block_size)
            # (equal but for float rounding: ggml's matmuls round by the shapes they are given)
            np.testing.assert_array_equal(got.candidates, want.candidates, err_msg=f"m={m}")
            np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=1e-4 * np.abs(want.scores).max(),
                                       err_msg=f"m={m}")
            pos += m
        assert fused.n_cached == apart.n_cached == pos
        # row counts 1..block_size in graphs of 1, 2, 4, 8, ... rows (block_size included)
        shapes = {min(1 << (m - 1).bit_length(), fused.block_size) for m in range(1, fused.block_size + 1)}
        assert fused.info["n_graph_builds"] - builds == len(shapes) < fused.block_size
        with pytest.raises(DrafterError, match="together"):
            fused.propose(4, pos + 1, features=rows)


def test_reserved_graph_slots_do_not_grow(target_gguf, drafter2_gguf) -> None:
    """reserve_graphs (the server's drafters, at startup) creates every graph slot with its
    buffers at the largest shapes: inject and propose of any length and context afterwards
    add no slot and no buffer byte, and propose the same as a drafter that grew lazily."""
    import numpy as np

    rng = np.random.default_rng(7)
    with (Drafter(drafter2_gguf, target_gguf, n_ctx=1024, n_threads=1, device="CPU") as d,
          Drafter(drafter2_gguf, target_gguf, n_ctx=1024, n_threads=1, device="CPU") as lazy):
        d.set_max_graphs(3)
        lazy.set_max_graphs(3)
        assert d.info["graph_slots"] == 0
        d.reserve_graphs()
        reserved = d.info
        assert reserved["graph_slots"] == 3 and reserved["compute_buffer_bytes"] > 0
        pos = 0
        for n in [1, 70, 5, 300, 2, 600]:  # contexts up to the cache's end, every block length
            feats = rng.standard_normal((n, d.feature_width)).astype(np.float32)
            d.inject(feats, np.arange(pos, pos + n))
            lazy.inject(feats, np.arange(pos, pos + n))
            pos += n
            for b in range(2, d.block_size + 1):
                got, want = d.propose(anchor=9, pos=pos, n=b), lazy.propose(anchor=9, pos=pos, n=b)
                np.testing.assert_array_equal(got.candidates, want.candidates)
        # the lazy drafter's buffers grew to the shapes it met; the reserved ones did not move
        assert d.info["graph_slots"] == 3
        assert d.info["compute_buffer_bytes"] == reserved["compute_buffer_bytes"]
        assert lazy.info["compute_buffer_bytes"] <= reserved["compute_buffer_bytes"]
