"""The native context index, cache and per-key caches (native/src/engine/context_index.h) through the
C API, and brute-force references of what they propose: plain loops over the tokens, no hashing, so
that a test compares the hashed n-gram index against the definition itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydflash2 import _native
from pydflash2._native import ffi, lib


class ContextIndexError(_native.NativeError):
    """An argument the native context index, cache or per-key caches refuse."""


@dataclass(frozen=True)
class ContextProposal:
    """A proposal as the native side writes it: per node, first seen first, its parent (-1 = under
    the stream's last token), depth, token and count; the matched suffix's length and the
    occurrences merged."""

    parent: tuple[int, ...] = ()
    depth: tuple[int, ...] = ()
    token: tuple[int, ...] = ()
    count: tuple[int, ...] = ()
    match_length: int = 0
    n_occurrences: int = 0


def _check(rc: int, what: str) -> int:
    return _native.check(rc, ContextIndexError, what)


def _tokens(tokens: Sequence[int]) -> Any:
    return ffi.new("int32_t[]", [int(t) for t in tokens]) if len(tokens) else ffi.NULL


class _Outputs:
    """The buffers one propose call writes into."""

    def __init__(self, capacity: int) -> None:
        size = max(capacity, 1)
        self.n_nodes = ffi.new("int32_t *")
        self.parent, self.depth, self.token, self.count = (ffi.new("int32_t[]", size) for _ in range(4))
        self.match_length = ffi.new("int32_t *")
        self.n_occurrences = ffi.new("int32_t *")

    def args(self) -> tuple[Any, ...]:
        return (self.n_nodes, self.parent, self.depth, self.token, self.count, self.match_length, self.n_occurrences)

    def proposal(self) -> ContextProposal:
        n = int(self.n_nodes[0])
        return ContextProposal(
            tuple(self.parent[0:n]), tuple(self.depth[0:n]), tuple(self.token[0:n]), tuple(self.count[0:n]),
            int(self.match_length[0]), int(self.n_occurrences[0]),
        )


class NativeContextIndex:
    """One stream's hashed n-gram index. hash_bits < 64 weakens the n-gram hash (collisions common)."""

    def __init__(self, max_ngram: int, min_ngram: int, max_occurrences: int, hash_bits: int = 64) -> None:
        handle = lib.pdf2_context_index_new(max_ngram, min_ngram, max_occurrences)
        if handle == ffi.NULL:
            raise ContextIndexError(_native.last_error())
        self._h = ffi.gc(handle, lib.pdf2_context_index_free)
        self.max_occurrences = max_occurrences
        if hash_bits != 64:
            _check(lib.pdf2_context_index_set_hash_bits(self._h, hash_bits), "set_hash_bits")

    def append(self, tokens: Sequence[int]) -> None:
        _check(lib.pdf2_context_index_append(self._h, _tokens(tokens), len(tokens)), "append")

    def __len__(self) -> int:
        return _check(lib.pdf2_context_index_size(self._h), "size")

    def propose(self, max_depth: int, capacity: int | None = None) -> ContextProposal:
        cap = max_depth * self.max_occurrences if capacity is None else capacity
        out = _Outputs(cap)
        _check(lib.pdf2_context_index_propose(self._h, max_depth, cap, *out.args()), "propose")
        return out.proposal()


class NativeContextCache:
    """Past outputs (documents) bounded by max_documents and max_tokens."""

    def __init__(self, max_ngram: int, min_ngram: int, max_occurrences: int, max_documents: int, max_tokens: int,
                 hash_bits: int = 64) -> None:
        handle = lib.pdf2_context_cache_new(max_ngram, min_ngram, max_occurrences, max_documents, max_tokens)
        if handle == ffi.NULL:
            raise ContextIndexError(_native.last_error())
        self._h = ffi.gc(handle, lib.pdf2_context_cache_free)
        self.max_occurrences = max_occurrences
        if hash_bits != 64:
            _check(lib.pdf2_context_cache_set_hash_bits(self._h, hash_bits), "set_hash_bits")

    def add(self, document: Sequence[int]) -> None:
        _check(lib.pdf2_context_cache_add(self._h, _tokens(document), len(document)), "add")

    @property
    def n_documents(self) -> int:
        return _check(lib.pdf2_context_cache_n_documents(self._h), "n_documents")

    @property
    def n_tokens(self) -> int:
        return _check(lib.pdf2_context_cache_n_tokens(self._h), "n_tokens")

    def propose(self, query: Sequence[int], max_depth: int, capacity: int | None = None) -> ContextProposal:
        cap = max_depth * self.max_occurrences if capacity is None else capacity
        out = _Outputs(cap)
        _check(lib.pdf2_context_cache_propose(self._h, _tokens(query), len(query), max_depth, cap, *out.args()),
               "propose")
        return out.proposal()


class NativeContextCaches:
    """One cache per key, the least recently used key dropped beyond max_keys."""

    def __init__(self, max_ngram: int, min_ngram: int, max_occurrences: int, max_documents: int, max_tokens: int,
                 max_keys: int) -> None:
        handle = lib.pdf2_context_caches_new(max_ngram, min_ngram, max_occurrences, max_documents, max_tokens,
                                             max_keys)
        if handle == ffi.NULL:
            raise ContextIndexError(_native.last_error())
        self._h = ffi.gc(handle, lib.pdf2_context_caches_free)
        self.max_occurrences = max_occurrences

    def add(self, key: str, document: Sequence[int]) -> None:
        _check(lib.pdf2_context_caches_add(self._h, key.encode(), _tokens(document), len(document)), "add")

    def propose(self, key: str, query: Sequence[int], max_depth: int) -> ContextProposal:
        cap = max_depth * self.max_occurrences
        out = _Outputs(cap)
        _check(lib.pdf2_context_caches_propose(self._h, key.encode(), _tokens(query), len(query), max_depth, cap,
                                               *out.args()), "propose")
        return out.proposal()

    @property
    def n_keys(self) -> int:
        return _check(lib.pdf2_context_caches_n_keys(self._h), "n_keys")

    def __contains__(self, key: str) -> bool:
        return bool(_check(lib.pdf2_context_caches_contains(self._h, key.encode()), "contains"))

    def n_documents(self, key: str) -> int:
        return _check(lib.pdf2_context_caches_n_documents(self._h, key.encode()), "n_documents")


# ---- brute-force references ----


def merge_continuations(continuations: Sequence[Sequence[int]], match_length: int) -> ContextProposal:
    """The trie of continuations, nodes first seen first (walking each continuation token by token)."""
    parent: list[int] = []
    depth: list[int] = []
    token: list[int] = []
    count: list[int] = []
    for cont in continuations:
        node = -1
        for d, t in enumerate(cont):
            child = next((i for i in range(len(token)) if parent[i] == node and token[i] == t), -1)
            if child < 0:
                child = len(token)
                parent.append(node)
                depth.append(d + 1)
                token.append(int(t))
                count.append(0)
            count[child] += 1
            node = child
    return ContextProposal(tuple(parent), tuple(depth), tuple(token), tuple(count), match_length, len(continuations))


def reference_index_propose(tokens: Sequence[int], max_depth: int, max_ngram: int, min_ngram: int,
                            max_occurrences: int) -> ContextProposal:
    """The longest suffix (min_ngram..max_ngram, at most len-1 tokens) that also ends earlier; the
    continuations of its max_occurrences most recent earlier ends, up to max_depth tokens each."""
    toks = [int(t) for t in tokens]
    size = len(toks)
    for n in range(min(max_ngram, size - 1), min_ngram - 1, -1):
        suffix = toks[size - n:]
        ends = [e for e in range(size - 2, n - 2, -1) if toks[e - n + 1:e + 1] == suffix][:max_occurrences]
        if ends:
            return merge_continuations([toks[e + 1:min(e + 1 + max_depth, size)] for e in ends], n)
    return ContextProposal()


def reference_cache_propose(documents: Sequence[Sequence[int]], query: Sequence[int], max_depth: int,
                            max_ngram: int, min_ngram: int, max_occurrences: int) -> ContextProposal:
    """The longest suffix of query (min_ngram..max_ngram) that occurs in a document with a token
    after it; its occurrences newest document first, within one the last first; continuations stop
    at the document's end."""
    q = [int(t) for t in query]
    docs = [[int(t) for t in d] for d in documents]
    for n in range(min(max_ngram, len(q)), min_ngram - 1, -1):
        suffix = q[len(q) - n:]
        found = [(d, e) for d in reversed(docs) for e in range(len(d) - 2, n - 2, -1) if d[e - n + 1:e + 1] == suffix]
        if found:
            found = found[:max_occurrences]
            return merge_continuations([d[e + 1:min(e + 1 + max_depth, len(d))] for d, e in found], n)
    return ContextProposal()


def reference_cache_documents(added: Sequence[Sequence[int]], max_documents: int,
                              max_tokens: int) -> list[list[int]]:
    """The documents a cache keeps after `added` (in order): the oldest go first beyond the bounds;
    an empty document, or one longer than max_tokens, is not kept and evicts nothing."""
    kept: list[list[int]] = []
    for doc in added:
        if not doc or len(doc) > max_tokens:
            continue
        while kept and (len(kept) + 1 > max_documents or sum(map(len, kept)) + len(doc) > max_tokens):
            kept.pop(0)
        kept.append([int(t) for t in doc])
    return kept
