"""Hugging Face DFlash / DFlash2 drafter -> upstream `dflash` GGUF (shipped as pydflash2.convert)."""

from .checkpoint import Checkpoint, CheckpointError, open_checkpoint
from .cli import main
from .target import Target, TargetError, open_target
from .validate import validate

__all__ = [
    "Checkpoint", "CheckpointError", "Target", "TargetError", "main", "open_checkpoint", "open_target", "validate",
]
