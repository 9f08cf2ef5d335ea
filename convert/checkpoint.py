"""Reading a DFlash / DFlash2 drafter in the Hugging Face layout.

Only headers are read when a checkpoint is opened; tensor data is loaded
lazily, a block of rows at a time, with numpy (bf16 through ml_dtypes), so no
torch is needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy for safetensors)
import numpy as np

V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
V2_ARCH = "DFlash2DraftModel"
MASK_EMBEDDING_FILE = "mask_embedding.pt"


class CheckpointError(Exception):
    """The directory is not a readable drafter checkpoint."""


@dataclass(frozen=True)
class TensorRef:
    """Where one tensor lives: its file, numpy shape and safetensors dtype."""

    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # safetensors spelling: "BF16", "F16", "F32", "I64", ...

    @property
    def n_rows(self) -> int:
        return self.shape[0] if self.shape else 1


@dataclass
class Checkpoint:
    """A drafter checkpoint: its config, the merged dflash settings and a tensor index."""

    path: Path
    config: dict[str, Any]
    tensors: dict[str, TensorRef] = field(default_factory=dict)

    # ---------------------------------------------------------------- config

    def dflash(self, key: str, default: Any = None) -> Any:
        """A dflash setting: `dflash_config` first, then the top level (older configs)."""
        dc = self.config.get("dflash_config") or {}
        if key in dc:
            return dc[key]
        return self.config.get(key, default)

    @property
    def declares_v2(self) -> bool:
        archs = self.config.get("architectures") or []
        dc = self.config.get("dflash_config") or {}
        return V2_ARCH in archs or any(k in dc for k in V2_KEYS)

    @property
    def version(self) -> int:
        return 2 if self.declares_v2 else 1

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def n_head(self) -> int:
        return int(self.config["num_attention_heads"])

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden_size // self.n_head)

    @property
    def rope_theta(self) -> float:
        rp = self.config.get("rope_parameters") or {}
        return float(rp.get("rope_theta", self.config.get("rope_theta", 10000.0)))

    @property
    def mask_embedding_path(self) -> Path | None:
        p = self.path / MASK_EMBEDDING_FILE
        return p if p.is_file() else None

    # ---------------------------------------------------------------- tensors

    def read_rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows [start, stop) of a tensor (the whole tensor for 0-d/1-d), as stored."""
        from safetensors import safe_open

        ref = self.tensors[name]
        with safe_open(str(ref.file), framework="np") as f:
            if len(ref.shape) <= 1:
                return np.asarray(f.get_tensor(name))
            return np.asarray(f.get_slice(name)[start:stop])

    def read(self, name: str) -> np.ndarray:
        ref = self.tensors[name]
        return self.read_rows(name, 0, ref.n_rows)

    def iter_row_blocks(self, name: str, max_bytes: int) -> Iterator[np.ndarray]:
        """The tensor in blocks of whole rows of about max_bytes each (as stored)."""
        ref = self.tensors[name]
        if len(ref.shape) <= 1:
            yield self.read(name)
            return
        row_bytes = max(1, int(np.prod(ref.shape[1:])) * _itemsize(ref.dtype))
        step = max(1, max_bytes // row_bytes)
        for r0 in range(0, ref.shape[0], step):
            yield self.read_rows(name, r0, min(ref.shape[0], r0 + step))


_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _itemsize(dtype: str) -> int:
    return _ITEMSIZE.get(dtype, 4)


def _shard_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index.name}: not a safetensors index ({e})") from e
        files = [path / p for p in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index.name} lists missing shard(s): {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {path}")
    return files


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Reads config.json and every safetensors header of a drafter directory."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no config.json")
    try:
        config = json.loads(cfg_file.read_text())
    except ValueError as e:
        raise CheckpointError(f"config.json is not valid JSON: {e}") from e
    ckpt = Checkpoint(path=path, config=config)
    for file in _shard_files(path):
        with safe_open(str(file), framework="np") as f:
            for name in f.keys():
                sl = f.get_slice(name)
                if name in ckpt.tensors:
                    raise CheckpointError(f"tensor {name!r} appears in more than one shard")
                ckpt.tensors[name] = TensorRef(name, file, tuple(int(d) for d in sl.get_shape()), sl.get_dtype())
    return ckpt


def load_mask_embedding(path: Path) -> tuple[int, np.ndarray]:
    """(mask_token_id, embedding vector) from a mask_embedding.pt (needs torch)."""
    try:
        import torch
    except ImportError as e:
        raise CheckpointError(
            f"{path.name} is present but torch is not installed; install torch (CPU build is enough: "
            "pip install torch --index-url https://download.pytorch.org/whl/cpu) to convert this drafter"
        ) from e
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or "mask_token_id" not in data or "embedding" not in data:
        raise CheckpointError(f"{path.name} must hold a dict with 'mask_token_id' and 'embedding'")
    return int(data["mask_token_id"]), data["embedding"].float().numpy().astype(np.float32)
