"""Trees of candidate paths through a DFlash2 lattice, for tree verification.

The greedy selector drafts one path through the selector's lattice; when its first pick is wrong the
whole block is lost, although the right token is often among the k candidates. A tree keeps the
`budget` most probable nodes instead (DDTree, Ringel & Romano 2026), expanded best first: a path's
estimated probability is the product of the selector's softmax at TEMPERATURE over each position's
candidates, in the row its predecessor selects (the scores the greedy selector takes the argmax of). The native
builder (native/src/drafter/draft_tree.cpp) is what an engine would run; `DraftTree.match` scores
a tree against the text a target went on to write (what a greedy verify of the tree accepts, or a
sampled one that follows the target's draw down the tree: benchmarks/tree_verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from ._native import ffi, lib

# The largest tree tree_budget="auto" may choose: the cost model prices verifies of up to 33 rows
# (measured once per machine, pydflash2.draft_costs); a GPU can afford a tree that size.
AUTO_TREE_BUDGET = 32

# The selector softmax's temperature in path probabilities (why 1.5: native/src/drafter/draft_tree.h).
TEMPERATURE = float(lib.pdf2_draft_tree_temperature())


def tree_budget_spec(value: int | str) -> tuple[int, bool]:
    """(largest tree, automatic) for a tree_budget argument: an int in 0..255 (0 = the chain) or
    "auto" (each step's budget from the cost model: native/src/engine/tree_budget.h)."""
    if value == "auto":
        return AUTO_TREE_BUDGET, True
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise ValueError(f"tree_budget must be 'auto' or an int in 0..255 (0 = the chain), got {value!r}")
    return value, False


class DraftTreeError(_native.NativeError):
    """A lattice or budget the tree builder refuses."""


@dataclass(frozen=True)
class DraftTree:
    """Per node, in expansion order (a parent before its children): its parent (-1 = the
    anchor), depth (block position 1..n-1), token, index among its position's k candidates,
    and the log of its path's estimated probability."""

    parent: np.ndarray
    depth: np.ndarray
    token: np.ndarray
    cand: np.ndarray
    logp: np.ndarray

    def __len__(self) -> int:
        return int(self.parent.shape[0])

    def children(self, node: int) -> list[int]:
        """The nodes under `node` (-1: under the anchor), most probable first."""
        return [int(i) for i in np.flatnonzero(self.parent == node)]

    def match(self, tokens: Any) -> int:
        """How deep the tree follows `tokens` (the text after the anchor): the drafts that a
        verify accepts when the target's choices are `tokens`."""
        node, depth = -1, 0
        for t in tokens:
            nxt = [c for c in self.children(node) if int(self.token[c]) == int(t)]
            if not nxt:
                break
            node, depth = nxt[0], depth + 1
        return depth


def build_draft_tree(candidates: np.ndarray, scores: np.ndarray, budget: int) -> DraftTree:
    """The `budget` most probable nodes of a lattice: candidates [P, k] (token ids) and scores
    [P, k, k] (predecessor, candidate), as Drafter.propose returns them."""
    cand = np.ascontiguousarray(candidates, dtype=np.int32)
    sc = np.ascontiguousarray(scores, dtype=np.float32)
    if cand.ndim != 2 or sc.shape != (cand.shape[0], cand.shape[1], cand.shape[1]):
        raise DraftTreeError(f"need candidates [P, k] and scores [P, k, k], got {cand.shape} and {sc.shape}")
    budget = int(budget)
    if budget < 0:
        raise DraftTreeError(f"the tree budget must be >= 0, got {budget}")
    n = ffi.new("int32_t *")
    size = max(budget, 1)
    parent, depth, token, idx = (np.empty(size, dtype=np.int32) for _ in range(4))
    logp = np.empty(size, dtype=np.float64)
    rc = lib.pdf2_draft_tree(
        ffi.from_buffer("int32_t[]", cand), ffi.from_buffer("float[]", sc), cand.shape[0], cand.shape[1], budget, n,
        ffi.from_buffer("int32_t[]", parent), ffi.from_buffer("int32_t[]", depth),
        ffi.from_buffer("int32_t[]", token), ffi.from_buffer("int32_t[]", idx), ffi.from_buffer("double[]", logp),
    )
    if rc != 0:
        raise DraftTreeError(_native.last_error())
    m = int(n[0])
    return DraftTree(parent[:m].copy(), depth[:m].copy(), token[:m].copy(), idx[:m].copy(), logp[:m].copy())
