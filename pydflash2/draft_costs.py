"""The cost model behind n_max="auto": how long the target takes to verify B
tokens and the drafter to propose n, measured once per model files and machine
and cached on disk (PYDFLASH2_CACHE_DIR, default ~/.cache/pydflash2).

A measurement taken while the machine is oversubscribed (more runnable work
than cores) is used for that run only and not cached: contention distorts the
verify/propose ratios, and a cached entry would steer every later run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# How the costs are measured (BatchEngine::measure_costs): a change makes older entries stale.
# 3: the plain step timed in a run of plain decodes, as plain decoding runs; the lazy head of a row.
# 4: every size timed alike, as the second of two decodes of its size; the capture path in the key
# (the taps no longer switched off for a plain step: issue 57).
# 5: the lazy head's products in groups where a group costs about one row (the verify sizes hold it).
# 6: the full head's decodes beside the lazy head's (verify_full_s), the engine choosing between them.
_METHOD = "6"

# Any text will do: costs depend on lengths, not on words.
_WARMUP_TEXT = "The quick brown fox jumps over the lazy dog while the target model verifies a drafted block. " * 4


def cache_dir() -> Path:
    return Path(os.environ.get("PYDFLASH2_CACHE_DIR", Path.home() / ".cache" / "pydflash2"))


def _file_id(path: str | os.PathLike[str]) -> str:
    st = os.stat(path)
    return f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"


def cost_key(model_path: str, draft_path: str, device: str, n_threads: int, max_draft: int,
             lazy_head: bool = False, max_verify_rows: int | None = None, capture: str | None = None) -> str:
    """What the costs depend on: both files, the drafter's device, threads, draft length, whether
    the verify runs the LM head lazily (Speculator), how the features are captured, and the machine."""
    parts = [
        _METHOD,
        _file_id(model_path),
        _file_id(draft_path) if draft_path else "no-drafter",  # context drafts alone time verifies only
        device,
        str(n_threads),
        str(max_draft),
        platform.node(),
        platform.machine(),
        str(os.cpu_count()),
    ]
    if lazy_head:
        parts.append("lazy-head")
    if max_verify_rows is not None and max_verify_rows != max_draft + 1:
        parts.append(f"verify-rows-{max_verify_rows}")  # an automatic tree's larger verifies
    if capture:
        parts.append(f"capture-{capture}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def warmup_prompt(tokenize: Callable[[bytes], Sequence[int]], n_ctx: int, max_draft: int) -> list[int]:
    """A prompt to measure on that leaves room for the longest verify batch."""
    prompt = list(tokenize(_WARMUP_TEXT.encode()))
    return prompt[: max(1, min(len(prompt), n_ctx - max_draft - 2))]


def machine_oversubscribed() -> bool:
    """More runnable work than cores over the last minute (the measurement itself included)."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1)
    except OSError:
        return False


def load_or_measure(key: str, n_verify: int, n_draft: int, measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The cached costs under `key` (n_verify verify costs, n_draft draft costs), or `measure()`
    (stored there unless the machine was oversubscribed)."""
    path = cache_dir() / "costs.json"
    table: dict[str, Any] = {}
    if path.exists():
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
    entry = table.get(key)
    if (
        entry
        and len(entry.get("verify_s", [])) == n_verify
        and len(entry.get("draft_s", [])) == n_draft
        and "head_s" in entry  # (entries from before the plain baseline and the head cost are measured again)
        and "verify_full_s" in entry
    ):
        return entry
    entry = measure()
    if machine_oversubscribed():
        return {**entry, "oversubscribed": True}
    table[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return entry
