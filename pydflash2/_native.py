"""Thin cffi binding to the native core (libpydflash2_native).

The C declarations come from the installed header itself (the region between
its cdef markers), so the header stays the single source of truth. llama_cpp
is imported first: its libllama/libggml are then already loaded, and the
dynamic loader resolves our library's dependencies to those same copies, so
the process holds exactly one ggml.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import cffi
import llama_cpp  # noqa: F401  (loads libllama/libggml before our library)

_PKG_DIR = Path(__file__).resolve().parent
_HEADER = _PKG_DIR / "include" / "pydflash2.h"
_LIB_NAME = "libpydflash2_native.so"


class NativeError(RuntimeError):
    """A failure reported by the native core (bad file, bad argument...)."""


def _cdef_source(header: Path) -> str:
    text = header.read_text()
    begin = text.index("/* cdef-begin */") + len("/* cdef-begin */")
    end = text.index("/* cdef-end */")
    return text[begin:end]


def _load() -> tuple[cffi.FFI, Any]:
    lib_path = _PKG_DIR / _LIB_NAME
    if not lib_path.exists():
        raise ImportError(
            f"pydflash2's native library is missing ({lib_path}). Install the package with `pip install .` "
            "(CMake builds the library into the installed copy); when running from a source checkout, "
            "run from another folder so that the installed copy is imported"
        )
    ffi = cffi.FFI()
    ffi.cdef(_cdef_source(_HEADER))
    return ffi, ffi.dlopen(str(lib_path))


ffi, lib = _load()
LIB_PATH = str(_PKG_DIR / _LIB_NAME)


def last_error() -> str:
    return ffi.string(lib.pdf2_last_error()).decode("utf-8", "replace")


def take_string(ptr: Any, what: str) -> str:
    """Copies and frees a string returned by the library; NULL raises NativeError."""
    if ptr == ffi.NULL:
        raise NativeError(last_error() or f"{what} failed")
    try:
        return ffi.string(ptr).decode("utf-8", "replace")
    finally:
        lib.pdf2_free_string(ptr)


def take_json(ptr: Any, what: str) -> dict[str, Any]:
    return json.loads(take_string(ptr, what))


def check(rc: int, error: type[NativeError], what: str) -> int:
    """rc of a library call (negative: failed); a failure raises `error` with the native message."""
    if rc < 0:
        raise error(last_error() or f"{what} failed")
    return rc


def void_ptr(p: Any) -> Any:
    """A ctypes pointer from llama_cpp (llama_model *, llama_context *) as a cffi void *."""
    return ffi.cast("void *", ctypes.cast(p, ctypes.c_void_p).value)
