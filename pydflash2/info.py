"""Build and file information: native_info() and inspect_drafter()."""

from __future__ import annotations

import os
from typing import Any

from . import _native


class DrafterFileError(ValueError):
    """The drafter GGUF is unreadable or breaks the dflash contract."""


def native_info() -> dict[str, Any]:
    """ggml/llama build info of this process and the ggml backend devices present."""
    info = _native.take_json(_native.lib.pdf2_native_info_json(), "native_info")
    info["native_library"] = _native.LIB_PATH
    return info


def inspect_drafter(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Checks a DFlash/DFlash2 drafter GGUF against the dflash contract and
    returns its hyperparameters. Reads metadata only; raises DrafterFileError
    naming the offending key or tensor."""
    ptr = _native.lib.pdf2_inspect_drafter_json(os.fsencode(os.fspath(path)))
    try:
        return _native.take_json(ptr, "inspect_drafter")
    except _native.NativeError as e:
        raise DrafterFileError(str(e)) from None
