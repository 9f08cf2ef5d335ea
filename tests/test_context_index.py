"""The context index (prompt lookup), the cache of past outputs and the per-key caches
(native/src/engine/context_index.h) against brute-force references of their definitions: random
token streams over small alphabets (so that matches recur), proposals compared node for node after
every append or add, with weakened hashes so that collisions are common too."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydflash2_testing.context_index import (
    ContextIndexError,
    ContextProposal,
    NativeContextCache,
    NativeContextCaches,
    NativeContextIndex,
    reference_cache_documents,
    reference_cache_propose,
    reference_index_propose,
)

from pydflash2._native import ffi, lib
from pydflash2._native import last_error as _last_error

# (max_ngram, min_ngram, max_occurrences): the long, the short and the single-occurrence settings
SETTINGS = [(12, 1, 8), (3, 1, 4), (4, 2, 2), (2, 2, 1), (1, 1, 3)]
DEPTHS = (0, 1, 3, 7)
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def chunked_stream(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    alphabet = draw(st.integers(2, 6))
    chunks = draw(st.lists(st.lists(st.integers(0, alphabet - 1), min_size=0, max_size=7), min_size=1, max_size=12))
    return alphabet, chunks


@FAST
@given(stream=chunked_stream(), hash_bits=st.sampled_from([64, 64, 2, 1]))
def test_index_matches_the_reference_after_every_append(stream: tuple[int, list[list[int]]], hash_bits: int) -> None:
    _, chunks = stream
    indexes = [(s, NativeContextIndex(*s, hash_bits=hash_bits)) for s in SETTINGS]
    tokens: list[int] = []
    for chunk in chunks:
        tokens += chunk
        for (max_ngram, min_ngram, max_occ), idx in indexes:
            idx.append(chunk)
            assert len(idx) == len(tokens)
            for depth in DEPTHS:
                want = reference_index_propose(tokens, depth, max_ngram, min_ngram, max_occ)
                assert idx.propose(depth) == want, (tokens, depth, max_ngram, min_ngram, max_occ)


def test_index_proposal_shape() -> None:
    # a b c a b d a b | suffix "a b" ends at 1 and 4: continuations "d a b" (most recent), "c a b"
    idx = NativeContextIndex(12, 1, 8)
    idx.append([0, 1, 2, 0, 1, 3, 0, 1])
    got = idx.propose(3)
    assert got.match_length == 2 and got.n_occurrences == 2
    assert got.token == (3, 0, 1, 2, 0, 1) and got.parent == (-1, 0, 1, -1, 3, 4)
    assert got.count == (1, 1, 1, 1, 1, 1) and got.depth == (1, 2, 3, 1, 2, 3)
    # 5 7 5 7 5 8 | 5: "5" ends at 4, 2, 0; the two "7 5" continuations share their nodes
    idx2 = NativeContextIndex(12, 1, 8)
    idx2.append([5, 7, 5, 7, 5, 8, 5])
    got2 = idx2.propose(2)
    assert got2.match_length == 1 and got2.n_occurrences == 3
    assert got2.token == (8, 5, 7, 5) and got2.parent == (-1, 0, -1, 2) and got2.count == (1, 1, 2, 2)


def test_index_min_ngram_and_no_match() -> None:
    idx = NativeContextIndex(4, 2, 8)
    idx.append([1, 2, 3, 4, 1])  # only a 1-gram recurs, below min_ngram
    assert idx.propose(4) == ContextProposal()
    empty = NativeContextIndex(4, 1, 8)
    assert empty.propose(4) == ContextProposal()
    empty.append([9])
    assert empty.propose(4) == ContextProposal()


@st.composite
def cache_case(draw: st.DrawFn) -> tuple[int, list[list[int]], list[list[int]]]:
    alphabet = draw(st.integers(2, 6))
    symbol = st.integers(0, alphabet - 1)
    docs = draw(st.lists(st.lists(symbol, min_size=0, max_size=18), min_size=1, max_size=14))
    queries = draw(st.lists(st.lists(symbol, min_size=0, max_size=8), min_size=1, max_size=4))
    return alphabet, docs, queries


@FAST
@given(case=cache_case(), hash_bits=st.sampled_from([64, 64, 2, 1]))
def test_cache_matches_the_reference_after_every_add(case: tuple[int, list[list[int]], list[list[int]]],
                                                     hash_bits: int) -> None:
    _, docs, queries = case
    max_documents, max_tokens = 3, 40
    caches = [(s, NativeContextCache(*s, max_documents, max_tokens, hash_bits=hash_bits)) for s in SETTINGS]
    added: list[list[int]] = []
    for doc in docs:
        added.append(doc)
        kept = reference_cache_documents(added, max_documents, max_tokens)
        for (max_ngram, min_ngram, max_occ), cache in caches:
            cache.add(doc)
            assert cache.n_documents == len(kept)
            assert cache.n_tokens == sum(map(len, kept))
            # queries that end like a kept document's parts match; the random ones mostly shorter
            probes = queries + [d[: len(d) // 2 + 1] for d in kept[-2:]]
            for query in probes:
                for depth in (1, 4):
                    want = reference_cache_propose(kept, query, depth, max_ngram, min_ngram, max_occ)
                    assert cache.propose(query, depth) == want, (kept, query, depth, max_ngram, min_ngram, max_occ)


@pytest.mark.parametrize("hash_bits", [64, 6])
def test_long_stream_and_many_evictions(hash_bits: int) -> None:
    # beyond the hypothesis sizes: the tables grow and rehash many times, the cache evicts hundreds
    # of documents (and erases their n-grams) before the checks
    rng = random.Random(hash_bits)
    for alphabet in (3, 40):
        tokens = [rng.randrange(alphabet) for _ in range(1500)]
        idx = NativeContextIndex(12, 1, 8, hash_bits=hash_bits)
        for start in range(0, len(tokens), 100):
            idx.append(tokens[start : start + 100])
            assert idx.propose(6) == reference_index_propose(tokens[: start + 100], 6, 12, 1, 8)
        cache = NativeContextCache(8, 1, 4, max_documents=50, max_tokens=300, hash_bits=hash_bits)
        added: list[list[int]] = []
        for k in range(400):
            doc = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 30))]
            cache.add(doc)
            added.append(doc)
            if k % 50 == 49:
                kept = reference_cache_documents(added, 50, 300)
                assert (cache.n_documents, cache.n_tokens) == (len(kept), sum(map(len, kept)))
                for _ in range(5):
                    query = [rng.randrange(alphabet) for _ in range(rng.randrange(1, 6))]
                    assert cache.propose(query, 5) == reference_cache_propose(kept, query, 5, 8, 1, 4)
                d = rng.choice(kept)
                query = d[: rng.randrange(1, len(d) + 1)]
                assert cache.propose(query, 5) == reference_cache_propose(kept, query, 5, 8, 1, 4)


def test_cache_bounds_and_document_boundaries() -> None:
    cache = NativeContextCache(12, 1, 8, max_documents=3, max_tokens=40)
    cache.add([1, 2, 3])
    cache.add([3, 4])
    # "3" ends document 0 with nothing after it there: only document 1's "3 -> 4" proposes
    assert cache.propose([3], 4).token == (4,)
    # a match never crosses documents: "2 3 3" would be 0's end followed by 1's start
    got = cache.propose([2, 3, 3], 4)
    assert got.match_length == 1 and got.token == (4,)
    cache.add([])  # not kept
    cache.add(list(range(50)))  # longer than max_tokens: not kept, evicts nothing
    assert (cache.n_documents, cache.n_tokens) == (2, 5)
    cache.add([7, 8])
    cache.add([9, 9])  # a fourth document: the oldest goes
    assert (cache.n_documents, cache.n_tokens) == (3, 6)
    assert cache.propose([1, 2], 4) == ContextProposal()
    cache.add(list(range(100, 139)))  # 39 tokens: every other document goes
    assert (cache.n_documents, cache.n_tokens) == (1, 39)
    assert cache.propose([9], 4) == ContextProposal()
    assert cache.propose([100], 2).token == (101, 102)


def test_caches_keep_keys_apart_and_drop_the_least_recently_used() -> None:
    caches = NativeContextCaches(12, 1, 8, max_documents=4, max_tokens=100, max_keys=2)
    caches.add("alice", [1, 2, 3, 4])
    caches.add("bob", [1, 2, 9, 9])
    assert caches.propose("alice", [1, 2], 2).token == (3, 4)
    assert caches.propose("bob", [1, 2], 2).token == (9, 9)
    # a key with no documents proposes nothing, not another key's outputs
    assert caches.propose("carol", [1, 2], 2) == ContextProposal()
    # carol's propose made her the most recent key: alice (used before bob) was dropped
    assert caches.n_keys == 2
    assert "alice" not in caches and "bob" in caches and "carol" in caches
    assert caches.n_documents("alice") == 0 and caches.n_documents("bob") == 1
    caches.propose("bob", [1], 1)  # bob is now the most recent: the next new key drops carol
    caches.add("dave", [5, 6])
    assert "carol" not in caches and "bob" in caches and "dave" in caches
    assert caches.propose("dave", [1, 2], 2) == ContextProposal()
    assert caches.propose("dave", [5], 2).token == (6,)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 1, 8), "max_ngram must be in 1..64"),
        ((65, 1, 8), "max_ngram must be in 1..64"),
        ((4, 0, 8), "min_ngram must be in 1..max_ngram"),
        ((4, 5, 8), "min_ngram must be in 1..max_ngram"),
        ((4, 1, 0), "max_occurrences must be in 1..1024"),
        ((4, 1, -3), "max_occurrences must be in 1..1024"),
    ],
)
def test_index_refuses_bad_options(args: tuple[int, int, int], message: str) -> None:
    with pytest.raises(ContextIndexError, match=message):
        NativeContextIndex(*args)


def test_bad_arguments_are_errors_not_crashes() -> None:
    idx = NativeContextIndex(4, 1, 2)
    idx.append([1, 2, 1])
    with pytest.raises(ContextIndexError, match="capacity 5 is below max_depth x max_occurrences = 6"):
        idx.propose(3, capacity=5)
    with pytest.raises(ContextIndexError, match="max_depth must be in 0..4096"):
        idx.propose(-1, capacity=8)
    with pytest.raises(ContextIndexError, match="hash bits must be in 1..64"):
        NativeContextIndex(4, 1, 2, hash_bits=0)
    assert lib.pdf2_context_index_set_hash_bits(idx._h, 8) == -1
    assert "before the first append" in _last_error()
    n = ffi.new("int32_t *")
    assert lib.pdf2_context_index_append(idx._h, ffi.NULL, 3) == -1
    assert "tokens is NULL" in _last_error()
    assert lib.pdf2_context_index_append(idx._h, ffi.new("int32_t[]", 1), -1) == -1
    assert "token count must be >= 0" in _last_error()
    assert lib.pdf2_context_index_append(ffi.NULL, ffi.NULL, 0) == -1
    assert "context index handle is NULL" in _last_error()
    assert lib.pdf2_context_index_propose(idx._h, 2, 4, ffi.NULL, *[ffi.NULL] * 6) == -1
    assert "n_nodes is NULL" in _last_error()
    # optional outputs may be NULL
    assert lib.pdf2_context_index_propose(idx._h, 2, 4, n, *[ffi.NULL] * 6) == 0 and n[0] == 2
    assert lib.pdf2_context_index_size(ffi.NULL) == -1
    assert len(idx) == 3  # failed calls changed nothing

    with pytest.raises(ContextIndexError, match="max_documents must be >= 1"):
        NativeContextCache(4, 1, 2, 0, 10)
    with pytest.raises(ContextIndexError, match="max_tokens must be in 1..2\\^31"):
        NativeContextCache(4, 1, 2, 3, -1)
    cache = NativeContextCache(4, 1, 2, 3, 10)
    assert lib.pdf2_context_cache_add(cache._h, ffi.NULL, 2) == -1
    assert "tokens is NULL" in _last_error()
    assert lib.pdf2_context_cache_propose(cache._h, ffi.NULL, 1, 1, 2, n, *[ffi.NULL] * 6) == -1
    assert "tokens is NULL" in _last_error()
    with pytest.raises(ContextIndexError, match="capacity 1 is below"):
        cache.propose([1], 1, capacity=1)
    assert lib.pdf2_context_cache_n_documents(ffi.NULL) == -1
    assert lib.pdf2_context_cache_n_tokens(ffi.NULL) == -1
    assert "context cache handle is NULL" in _last_error()

    with pytest.raises(ContextIndexError, match="max_keys must be >= 1"):
        NativeContextCaches(4, 1, 2, 3, 10, 0)
    caches = NativeContextCaches(4, 1, 2, 3, 10, 2)
    assert lib.pdf2_context_caches_add(caches._h, ffi.NULL, ffi.NULL, 0) == -1
    assert "key is NULL" in _last_error()
    assert lib.pdf2_context_caches_contains(caches._h, ffi.NULL) == -1
    assert caches.n_keys == 0  # a refused call made no key

