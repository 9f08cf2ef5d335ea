"""The reduced draft vocabulary (d2t): the V most frequent target tokens in the data.

The drafter's head over SmolLM2's 49,152 tokens costs more than the rest of the
drafter; restricting it to the tokens the target actually writes keeps almost
every draft while cutting that cost. The head rows stay the target's own rows
(frozen), so the same trained drafter can be exported with any V.
"""

from __future__ import annotations

import numpy as np


def draft_vocabulary(counts: np.ndarray, size: int, always: list[int] = ()) -> list[int]:
    """Target ids of the `size` most frequent tokens (ties by id), plus `always`
    (e.g. EOS), sorted by id. size <= 0 or >= the vocabulary: [] (full vocabulary)."""
    n_vocab = len(counts)
    if size <= 0 or size >= n_vocab:
        return []
    keep = set(int(i) for i in always)
    order = np.lexsort((np.arange(n_vocab), -counts))  # by count desc, then id
    for i in order:
        if len(keep) >= size:
            break
        keep.add(int(i))
    return sorted(keep)[:size] if len(keep) > size else sorted(keep)


def coverage(counts: np.ndarray, ids: list[int]) -> float:
    """Share of the data's label tokens inside the draft vocabulary."""
    total = counts.sum()
    if not ids or total == 0:
        return 1.0
    return float(counts[np.asarray(ids)].sum() / total)
