"""What the KV caches of a configuration will take, read from the GGUF headers before
anything is allocated, and the memory this machine has for them: `serve --parallel
1000000` must be a clear refusal, not a process the kernel's OOM killer ends minutes
later. The target's cache is llama.cpp's (f16 K and V by default, n_slots x n_ctx
cells); each slot's drafter has its own (DrafterCache, f16 by default, n_ctx plus
one block of rows). Weights are not counted: they are mapped from the file."""

from __future__ import annotations

import os
from pathlib import Path

import gguf

F16_BYTES = 2
DRAFTER_BLOCK_ROWS = 64  # rows a drafter cache holds past n_ctx (its block, rounded up): a bound, not exact


def kv_bytes_per_cell(path: str | Path) -> int:
    """Bytes of K and V per cache cell of a GGUF model (f16), from its {arch}.* header keys."""
    r = gguf.GGUFReader(str(path))

    def key(name: str, default: int | None = None) -> int:
        arch = r.get_field("general.architecture").contents()
        field = r.get_field(f"{arch}.{name}")
        if field is None:
            if default is None:
                raise ValueError(f"{path}: no {arch}.{name} in its header")
            return default
        v = field.contents()
        return int(max(v) if isinstance(v, list) else v)  # per-layer arrays: the largest

    n_head = key("attention.head_count")
    head_dim = key("attention.key_length", key("embedding_length") // max(1, n_head))
    value_dim = key("attention.value_length", head_dim)
    return key("block_count") * key("attention.head_count_kv", n_head) * (head_dim + value_dim) * F16_BYTES


def estimate(target: str | Path, draft: str | Path | None, n_slots: int, n_ctx: int) -> dict[str, int]:
    """Bytes the KV caches of n_slots slots of n_ctx tokens take: target, drafter, total."""
    t = kv_bytes_per_cell(target) * n_slots * n_ctx
    d = kv_bytes_per_cell(draft) * n_slots * (n_ctx + DRAFTER_BLOCK_ROWS) if draft else 0
    return {"target": t, "drafter": d, "total": t + d}


def available_bytes() -> int | None:
    """Memory available to a new allocation (Linux's MemAvailable, else free pages); None: unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
