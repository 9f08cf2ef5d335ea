"""How a drafter's features (target layer inputs) are captured, on any architecture.

Two capture paths exist (the rule lives in one native table, capture_rule.cpp,
read here through the C API):

- "tap": llama.cpp's own layer-input extraction (`llama_set_embeddings_layer_inp`).
  Only architectures whose graph records layer inputs have it (llama, qwen3,
  gemma4, ...); asking any other graph aborts the process, so pydflash2 never does.
- "callback": llama.cpp's graph evaluation callback (`cb_eval` in
  `llama_context_params`, the mechanism of llama.cpp's imatrix tool). Every model
  builder names its per-layer output `l_out-<il>`; the input of layer L is the
  output of layer L-1. The callback asks the scheduler for exactly the needed
  tensors and copies their rows when computed. It works on any architecture,
  and also gives the last layer's output (layer input n_layer), but the
  callback has to be set when the context is created.

    capture_path("qwen2")                  -> "callback"
    tappable_layers("qwen2", 24)           -> range(1, 25)   (dflash.target_layers values)
    tappable_layers("llama", 30)           -> range(1, 30)

`capturing_context(llm)` makes a context with the callback on an already loaded
`llama_cpp.Llama`'s model (no second weight load); `Speculator` does this by
itself for targets without taps.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np

from . import _native
from ._native import ffi, lib

__all__ = [
    "CaptureError",
    "CaptureRule",
    "CallbackCapture",
    "CapturingContext",
    "capture_rule",
    "capture_path",
    "tappable_layers",
    "target_arch",
    "model_arch",
    "capturing_context",
]

Path_ = Literal["tap", "callback"]


class CaptureError(_native.NativeError):
    """A capture call failed (layer not observed, bad arguments...)."""


@dataclass(frozen=True)
class CaptureRule:
    """Which dflash.target_layers values (layer INPUT indices) a target allows.

    path: the path pydflash2 uses for this architecture; min_layer..max_layer:
    the capturable inputs on that path; max_layer_by_path: the same bound per
    path ("tap" only where the architecture has taps)."""

    arch: str
    path: Path_
    n_layer: int
    min_layer: int
    max_layer: int
    max_layer_by_path: dict[str, int]
    tap_archs: tuple[str, ...]

    def layers(self, path: Path_ | None = None) -> range:
        """Capturable layer inputs on `path` (default: the path in use)."""
        path = path or self.path
        if path not in self.max_layer_by_path:
            raise CaptureError(f"architecture {self.arch!r} has no layer-input taps in this llama.cpp")
        return range(self.min_layer, self.max_layer_by_path[path] + 1)


@lru_cache(maxsize=256)
def capture_rule(arch: str, n_layer: int) -> CaptureRule:
    """The capture rule for an `arch` target with n_layer layers (read from the native table)."""
    d = _native.take_json(lib.pdf2_capture_rule_json(arch.encode(), int(n_layer)), "capture rule")
    return CaptureRule(
        arch=d["arch"],
        path=d["path"],
        n_layer=int(d["n_layer"]),
        min_layer=int(d["min_layer"]),
        max_layer=int(d["max_layer"]),
        max_layer_by_path={k: int(v) for k, v in d["max_layer_by_path"].items()},
        tap_archs=tuple(d["tap_archs"]),
    )


def capture_path(arch: str) -> Path_:
    """"tap" where llama.cpp records layer inputs for `arch`, else "callback"."""
    return capture_rule(arch, 1).path


def tappable_layers(arch: str, n_layer: int, path: Path_ | None = None) -> range:
    """dflash.target_layers values (layer inputs; Hugging Face layer id + 1) a
    drafter may use on an `arch` target with n_layer layers, on `path`
    (default: the path pydflash2 uses for that architecture)."""
    return capture_rule(arch, n_layer).layers(path)


def target_arch(target_gguf: str | Path) -> str:
    """general.architecture of a GGUF file."""
    import gguf

    field = gguf.GGUFReader(str(target_gguf)).get_field("general.architecture")
    if field is None:
        raise CaptureError(f"{target_gguf} has no general.architecture")
    return str(field.contents())


# ---------------------------------------------------------------- the callback


class CallbackCapture:
    """The native capture object a context's eval callback writes into.

    Install it at context creation (`install(params)`); it observes nothing
    until armed. Low-level use (the engine arms it by itself):

        cap.arm([3, 5], n_embd, n_rows); llama_decode(...); cap.check(arch)
        rows = cap.rows(3)             # [n_rows, n_embd] float32
    """

    def __init__(self) -> None:
        h = lib.pdf2_capture_new()
        if h == ffi.NULL:
            raise CaptureError(_native.last_error() or "pdf2_capture_new failed")
        self._h = ffi.gc(h, lib.pdf2_capture_free)
        self._shape = (0, 0)

    @property
    def handle(self) -> Any:
        return self._h

    def install(self, params: Any) -> None:
        """Sets cb_eval / cb_eval_user_data of a llama_cpp.llama_context_params struct."""
        import llama_cpp

        addr = int(ffi.cast("uintptr_t", lib.pdf2_capture_eval_callback()))
        params.cb_eval = llama_cpp.ggml_backend_sched_eval_callback(addr)
        params.cb_eval_user_data = ctypes.c_void_p(int(ffi.cast("uintptr_t", self._h)))

    def arm(self, layers: list[int], n_embd: int, n_rows: int) -> None:
        arr = np.ascontiguousarray(layers, dtype=np.int32)
        if lib.pdf2_capture_arm(self._h, ffi.from_buffer("int32_t[]", arr), len(arr), n_embd, n_rows) != 0:
            raise CaptureError(_native.last_error())
        self._shape = (n_rows, n_embd)

    def disarm(self) -> None:
        lib.pdf2_capture_disarm(self._h)

    def check(self, arch: str = "?") -> None:
        """Raises CaptureError naming the first armed layer the last decode did not show."""
        if lib.pdf2_capture_check(self._h, arch.encode()) != 0:
            raise CaptureError(_native.last_error())

    def rows(self, layer: int) -> np.ndarray:
        out = np.empty(self._shape, dtype=np.float32)
        if lib.pdf2_capture_rows(self._h, layer, ffi.from_buffer("float[]", out), out.size) != 0:
            raise CaptureError(_native.last_error())
        return out


class CapturingContext:
    """A llama_context with the capture callback, on an existing llama_cpp model.

    ctx: the raw llama_context pointer (ctypes); capture: its CallbackCapture;
    context: the llama_cpp._internals.LlamaContext owning it (freed before the
    model, like the Llama's own context)."""

    def __init__(self, context: Any, capture: CallbackCapture) -> None:
        self.context = context
        self.capture = capture
        # the callback's user data must live as long as the context
        context._pdf2_capture = capture

    @property
    def ctx(self) -> Any:
        return self.context.ctx

    def close(self) -> None:
        self.context.close()

    def features(self, tokens: Sequence[int], layers: Sequence[int], pos0: int = 0) -> np.ndarray:
        """Decodes tokens into sequence 0 at positions pos0.. (in n_ubatch chunks) and
        returns the inputs of `layers` (dflash.target_layers values) for every token:
        [len(tokens), len(layers) * n_embd] float32, layers concatenated in order, as
        the drafter reads them. Asking for input n_layer (the last layer's output)
        makes every row output logits: llama.cpp computes that layer only for those."""
        import llama_cpp
        from llama_cpp import _internals

        model = self.context.model.model
        H = int(llama_cpp.llama_model_n_embd(model))
        n_layer = int(llama_cpp.llama_model_n_layer(model))
        arch = model_arch(model)
        all_rows = any(int(lid) == n_layer for lid in layers)
        step = int(min(llama_cpp.llama_n_batch(self.ctx), llama_cpp.llama_n_ubatch(self.ctx)))
        toks = [int(t) for t in tokens]
        out = np.empty((len(toks), len(layers) * H), dtype=np.float32)
        batch = _internals.LlamaBatch(n_tokens=step, embd=0, n_seq_max=1, verbose=False)
        try:
            for i0 in range(0, len(toks), step):
                chunk = toks[i0 : i0 + step]
                batch.set_batch(chunk, pos0 + i0, all_rows)
                self.capture.arm(list(layers), H, len(chunk))
                try:
                    self.context.decode(batch)
                finally:
                    self.capture.disarm()
                self.capture.check(arch)
                for k, lid in enumerate(layers):
                    out[i0 : i0 + len(chunk), k * H : (k + 1) * H] = self.capture.rows(int(lid))
        finally:
            batch.close()
        return out


def model_arch(model: Any) -> str:
    """general.architecture of a loaded llama_model (ctypes pointer), or "" if absent."""
    import llama_cpp

    buf = ctypes.create_string_buffer(128)
    n = llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    return buf.value.decode() if n >= 0 else ""


def capturing_context(llm: Any, *, replace: bool = False) -> CapturingContext:
    """A context on llm's already loaded model (no second weight load), with
    llm's context parameters plus the capture callback.

    replace=False: a second context (its own KV cache) next to llm's, which
    stays as it was. replace=True: the new context takes the place of llm's own
    (llm._ctx), whose memory is freed, so llm decodes through it too (the
    callback costs nothing while not armed)."""
    from llama_cpp import _internals

    params = type(llm.context_params).from_buffer_copy(llm.context_params)
    capture = CallbackCapture()
    capture.install(params)
    context = _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)
    out = CapturingContext(context, capture)
    if replace:
        old = llm._ctx
        llm._ctx = context
        llm._stack.callback(context.close)
        old.close()
    return out

