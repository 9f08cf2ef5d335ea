"""The best-first tree over a DFlash2 lattice against a float64 reference of the same expansion."""

from __future__ import annotations

import heapq
import math

import numpy as np
import pytest

from pydflash2.draft_tree import TEMPERATURE, DraftTreeError, build_draft_tree


def reference_tree(cand: np.ndarray, scores: np.ndarray, budget: int) -> list[tuple[int, int, int, int, float]]:
    """(parent, depth, token, cand index, path log-probability) per node, in the order best-first
    expansion adds them: a heap of frontier nodes keyed by path probability (a product of
    softmaxes at TEMPERATURE; ties: pushed first); a popped node pushes its next-ranked sibling and
    its best child."""
    n_pos, k = cand.shape

    def ranked(row: np.ndarray) -> tuple[list[int], list[float]]:
        order = sorted((c for c in range(k) if math.isfinite(row[c])), key=lambda c: (-float(row[c]), c))
        if not order:
            return [], []
        mx = max(float(row[c]) for c in order)
        scaled = {c: (float(row[c]) - mx) / TEMPERATURE for c in order}
        log_z = math.log(sum(math.exp(v) for v in scaled.values()))
        return order, [scaled[c] - log_z for c in order]

    rows = {-1: ranked(scores[0, 0])}
    nodes: list[tuple[int, int, int, int, float]] = []
    heap: list[tuple[float, int, int, int, int]] = []
    seq = 0

    def push(parent: int, depth: int, rank: int, base: float) -> None:
        nonlocal seq
        order, logp = rows[parent]
        if rank < len(order):
            heapq.heappush(heap, (-(base + logp[rank]), seq, parent, depth, rank))
            seq += 1

    push(-1, 1, 0, 0.0)
    while len(nodes) < budget and heap:
        neg, _, parent, depth, rank = heapq.heappop(heap)
        c = rows[parent][0][rank]
        nodes.append((parent, depth, int(cand[depth - 1, c]), c, -neg))
        push(parent, depth, rank + 1, nodes[parent][4] if parent >= 0 else 0.0)
        me = len(nodes) - 1
        rows[me] = ranked(scores[depth, c]) if depth < n_pos else ([], [])
        push(me, depth + 1, 0, -neg)
    return nodes


def random_lattice(rng: np.random.Generator, n_pos: int, k: int, *, ties: bool = False,
                   holes: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    cand = rng.integers(0, 50_000, size=(n_pos, k)).astype(np.int32)
    scores = rng.normal(0.0, 2.0, size=(n_pos, k, k)).astype(np.float32)
    if ties:  # few distinct values: equal path probabilities everywhere
        scores = np.round(scores).astype(np.float32)
    if holes:
        scores[rng.random(scores.shape) < holes] = -np.inf
    scores[0, 1:] = scores[0, 0]  # position 1: every predecessor row is the anchor's
    return cand, scores


def assert_same(cand: np.ndarray, scores: np.ndarray, budget: int) -> None:
    got = build_draft_tree(cand, scores, budget)
    want = reference_tree(cand, scores, budget)
    assert len(got) == len(want)
    for i, (parent, depth, token, c, logp) in enumerate(want):
        node = (int(got.parent[i]), int(got.depth[i]), int(got.token[i]), int(got.cand[i]))
        assert node == (parent, depth, token, c), i
        assert got.logp[i] == pytest.approx(logp, abs=1e-12), i


@pytest.mark.parametrize("budget", [0, 1, 4, 8, 16, 32, 64])
@pytest.mark.parametrize("kind", ["plain", "ties", "holes"])
def test_tree_equals_the_float64_reference(budget: int, kind: str) -> None:
    rng = np.random.default_rng({"plain": 1, "ties": 2, "holes": 3}[kind] * 100 + budget)
    for n_pos, k in [(7, 16), (3, 4), (1, 5)]:
        cand, scores = random_lattice(rng, n_pos, k, ties=kind == "ties", holes=0.3 if kind == "holes" else 0.0)
        assert_same(cand, scores, budget)


def test_a_tree_is_closed_under_ancestors_and_ordered_by_probability() -> None:
    cand, scores = random_lattice(np.random.default_rng(7), 7, 16)
    tree = build_draft_tree(cand, scores, 40)
    assert len(tree) == 40
    for i in range(len(tree)):
        p = int(tree.parent[i])
        assert p < i  # a parent comes first
        assert tree.depth[i] == (1 if p < 0 else tree.depth[p] + 1)
        if p >= 0:
            assert tree.logp[i] <= tree.logp[p]
    assert np.all(np.diff(tree.logp) <= 1e-12)  # popped in order of probability


def test_the_first_node_is_the_greedy_selectors_first_pick() -> None:
    cand, scores = random_lattice(np.random.default_rng(11), 7, 16)
    tree = build_draft_tree(cand, scores, 1)
    assert int(tree.cand[0]) == int(np.argmax(scores[0, 0]))
    # a lattice whose rows are all sharply peaked: the best nodes are the greedy path, in order
    sharp = scores.copy()
    path = []
    prev = 0
    for i in range(7):
        best = int(np.argmax(sharp[i, prev]))
        sharp[i, prev, best] += 50.0
        path.append(best)
        prev = best
    tree = build_draft_tree(cand, sharp, 7)
    assert list(tree.cand) == path
    assert list(tree.parent) == [-1, 0, 1, 2, 3, 4, 5]


def test_match_follows_the_text_down_the_tree() -> None:
    cand = np.array([[10, 11, 12], [20, 21, 22]], dtype=np.int32)
    scores = np.zeros((2, 3, 3), dtype=np.float32)
    scores[0, :, :] = [3.0, 2.0, -np.inf]
    scores[1, 0] = [1.0, 0.0, -1.0]
    scores[1, 1] = [-1.0, 0.0, 2.0]
    tree = build_draft_tree(cand, scores, 8)
    assert [int(tree.token[c]) for c in tree.children(-1)] == [10, 11]  # 12 is no candidate
    assert len(tree) == 2 + 2 * 3
    assert tree.match([10, 20, 99]) == 2
    assert tree.match([11, 22]) == 2  # the second-ranked first token, then its own best child
    assert tree.match([11, 20]) == 2
    assert tree.match([12]) == 0
    assert tree.match([]) == 0


def test_bad_lattices_and_budgets_are_refused() -> None:
    cand, scores = random_lattice(np.random.default_rng(5), 3, 4)
    with pytest.raises(DraftTreeError, match="budget"):
        build_draft_tree(cand, scores, -1)
    with pytest.raises(DraftTreeError, match="budget"):
        build_draft_tree(cand, scores, 1_000_000)
    with pytest.raises(DraftTreeError, match=r"scores \[P, k, k\]"):
        build_draft_tree(cand, scores[:, :, :2], 4)
    with pytest.raises(DraftTreeError, match="n_pos"):
        build_draft_tree(np.zeros((300, 2), np.int32), np.zeros((300, 2, 2), np.float32), 4)
