"""pydflash2: DFlash2 speculative decoding for llama.cpp / GGUF models."""

from __future__ import annotations

from ._native import NativeError
from .drafter import Drafter, DrafterError, DraftPath, Proposal, Walk
from .info import DrafterFileError, inspect_drafter, native_info
from .json_schema import json_schema_grammar
from .ollama import ModelfileError, modelfile
from .speculator import Completion, GenerationError, Speculator, load_target, with_lazy_head

__version__ = "0.1.0"

__all__ = [
    "Completion",
    "Drafter",
    "DrafterError",
    "DrafterFileError",
    "Proposal",
    "DraftPath",
    "Walk",
    "GenerationError",
    "ModelfileError",
    "NativeError",
    "Speculator",
    "inspect_drafter",
    "json_schema_grammar",
    "modelfile",
    "native_info",
    "load_target",
    "with_lazy_head",
    "__version__",
]
