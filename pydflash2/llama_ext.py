"""llama.cpp functions that llama-cpp-python does not bind: the C++-linkage functions of upstream's
staging header src/llama-ext.h (layer-input taps, the dflash model's facts), reached by their mangled
names in the libllama that llama_cpp loaded; and a log silencer whose ctypes callback outlives the process's
last log line."""

from __future__ import annotations

import ctypes

__all__ = ["LlamaError", "ext", "silence_logs"]


class LlamaError(RuntimeError):
    """A llama.cpp call failed, or a setup upstream would abort on."""


# ---------------------------------------------------------------- llama-ext.h functions


class _Ext:
    """ctypes handles for the C++-linkage functions of llama-ext.h (resolved on first use)."""

    _SIGS = {
        "set_embeddings_layer_inp": (
            "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
            [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_bool],
            None,
        ),
        "get_embeddings_layer_inp": (
            "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
            [ctypes.c_void_p, ctypes.c_uint32],
            ctypes.POINTER(ctypes.c_float),
        ),
        "set_embeddings_nextn": (
            "_Z26llama_set_embeddings_nextnP13llama_contextbb",
            [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool],
            None,
        ),
        "get_embeddings_nextn": (
            "_Z26llama_get_embeddings_nextnP13llama_context",
            [ctypes.c_void_p],
            ctypes.POINTER(ctypes.c_float),
        ),
        "dflash_selector_top_k": (
            "_Z33llama_model_dflash_selector_top_kPK11llama_model",
            [ctypes.c_void_p],
            ctypes.c_int32,
        ),
        "target_layer_ids": (
            "_Z28llama_model_target_layer_idsPK11llama_model",
            [ctypes.c_void_p],
            ctypes.POINTER(ctypes.c_int32),
        ),
        "target_layer_ids_n": (
            "_Z30llama_model_target_layer_ids_nPK11llama_model",
            [ctypes.c_void_p],
            ctypes.c_uint32,
        ),
    }

    def __getattr__(self, name: str):  # noqa: ANN204
        if name not in self._SIGS:
            raise AttributeError(name)
        from llama_cpp import llama_cpp as lc

        symbol, argtypes, restype = self._SIGS[name]
        fn = getattr(lc._lib, symbol)
        fn.argtypes, fn.restype = argtypes, restype
        setattr(self, name, fn)
        return fn


ext = _Ext()

# ctypes callbacks must outlive every later log line, or the next one crashes
_KEEP_ALIVE: list[object] = []


def silence_logs() -> None:
    """Routes llama.cpp / ggml logging to nowhere (once per process; the callback is kept alive)."""
    if _KEEP_ALIVE:
        return
    from llama_cpp import llama_cpp as lc

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def _quiet(level: int, text: bytes, user_data: int) -> None:
        return None

    _KEEP_ALIVE.append(_quiet)
    lc.llama_log_set(_quiet, ctypes.c_void_p(0))
