"""The cost model behind n_max="auto": how long the target takes to verify B
tokens and the drafter to propose n, measured once per model files and machine
and cached on disk (PYDFLASH2_CACHE_DIR, default ~/.cache/pydflash2)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .speculator import Speculator

# Any text will do: costs depend on lengths, not on words.
_WARMUP_TEXT = "The quick brown fox jumps over the lazy dog while the target model verifies a drafted block. " * 4


def cache_dir() -> Path:
    return Path(os.environ.get("PYDFLASH2_CACHE_DIR", Path.home() / ".cache" / "pydflash2"))


def _file_id(path: str | os.PathLike[str]) -> str:
    st = os.stat(path)
    return f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"


def cost_key(spec: Speculator) -> str:
    assert spec.drafter is not None and spec.draft_path is not None
    parts = [
        _file_id(spec.llm.model_path),
        _file_id(spec.draft_path),
        spec.drafter.device,
        str(spec.llm.context_params.n_threads),
        str(spec.max_draft),
        platform.node(),
        platform.machine(),
        str(os.cpu_count()),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:24]


def load_or_measure(spec: Speculator, reps: int = 5) -> dict[str, Any]:
    path = cache_dir() / "costs.json"
    key = cost_key(spec)
    table: dict[str, Any] = {}
    if path.exists():
        try:
            table = json.loads(path.read_text())
        except (OSError, ValueError):
            table = {}
    entry = table.get(key)
    if (
        entry
        and len(entry.get("verify_s", [])) == spec.max_draft + 1
        and len(entry.get("draft_s", [])) == spec.max_draft
    ):
        return entry
    prompt = spec.llm.tokenize(_WARMUP_TEXT.encode(), add_bos=True, special=False)
    prompt = prompt[: max(1, min(len(prompt), spec.llm.n_ctx() - spec.max_draft - 2))]
    entry = spec.measure_costs(prompt, reps=reps)
    table[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(table, indent=1))
        tmp.replace(path)
    except OSError:
        pass  # a read-only home only costs a re-measurement next time
    return entry
