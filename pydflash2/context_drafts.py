"""Drafts from the context: what followed earlier occurrences of the text's current suffix in the
request's prompt and output (prompt lookup, SuffixDecoding), verified in one tree with the DFlash2
lattice's candidates (native/src/engine/context_draft_source.h, merged_draft_tree.h).

Modes, as `--context-drafts` and `context_drafts=` take them:
- "off": the drafter alone;
- "request": also this request's prompt and output;
- "global": also past outputs of the same API key (the server's cache; a Speculator's own past
  outputs). Verification is lossless, so no text of another request can reach an answer, but the
  speed of an answer could hint at what another request wrote: the server keeps one cache per API
  key, so only a key's own past outputs draft for it.
"""

from __future__ import annotations

from functools import cache
from typing import NamedTuple

CONTEXT_DRAFTS = ("off", "request", "global")
_MODE = {"off": 0, "request": 1, "global": 2}


class Limits(NamedTuple):
    """The most nodes and leaves of a context or merged tree, and its deepest path (a step then
    commits at most max_depth + 1 tokens)."""

    max_nodes: int
    max_branches: int
    max_depth: int


@cache
def limits() -> Limits:
    """The native engine's limits (loads the native library on first use)."""
    from ._native import ffi, lib

    nodes, branches, depth = ffi.new("int32_t *"), ffi.new("int32_t *"), ffi.new("int32_t *")
    lib.pdf2_context_draft_limits(nodes, branches, depth)
    return Limits(int(nodes[0]), int(branches[0]), int(depth[0]))


def context_drafts_spec(value: str) -> str:
    """The mode, checked."""
    if value not in CONTEXT_DRAFTS:
        raise ValueError(f"context_drafts must be one of {', '.join(CONTEXT_DRAFTS)}, got {value!r}")
    return value


def mode_code(value: str) -> int:
    """The C ABI's code of a mode (pdf2_batch_engine_set_context_drafts)."""
    return _MODE[context_drafts_spec(value)]
