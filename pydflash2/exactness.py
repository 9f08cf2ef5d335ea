"""Is greedy speculative decoding bit-identical to plain decoding here?

Verification decodes [anchor, drafts...] as one batch; plain decoding decodes
one token at a time. The accepted tokens (and the K/V rows they leave in the
cache) are identical only when the target's forward is batch-invariant: every
row of a batch computed with the same kernels, in the same order, as a batch
of one. On llama.cpp's CPU backend that holds when

  - llamafile sgemm is compiled out (GGML_LLAMAFILE=OFF): it takes over matrix
    products for batches > 1;
  - verify batches stay below the sizes where ggml switches the target's
    matmul kernels: weights the CPU repacks into interleaved layouts (Q4_0,
    Q4_K, IQ4_NL, MXFP4 on AVX2) take a gemm kernel from 4 rows (gemv below),
    and K-quant / IQ weights take the "tiled" kernel from 8 rows. Measured
    with benchmarks/batch_invariance.py (SmolLM2 requantized, B = 8): Q4_0
    (repacked) stays identical, Q4_K_M differs at 120 of 128 positions (max
    |dlogit| 1.8), with repacking off still at 116 (the tiled kernel). So exact
    mode caps the draft length: batches of at most 3 rows with repacked
    weights, 7 with K-quant/IQ weights (Invariance.max_batch);
  - the CPU has no ARM int8 matrix-multiply kernels (i8mm), which pair rows
    in batches (reported, not measured: no such CPU was at hand);
  - flash attention is off, or the KV cache holds < 512 cells: for a single
    token over >= 512 cells ggml splits the keys across threads and merges
    partial softmaxes, a different summation order than a batch's;
  - the target runs on the CPU alone: GPU backends choose kernels by batch size.

The rest of the CPU forward keeps a batch's rows identical to batch-1 rows
(ggml's source: one dot product per output element whatever the thread split;
KV padding only adds masked zeros), and the tests check it end to end
(tests/test_exact.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import _native

INSTALL_COMMAND = (
    'CMAKE_ARGS="-DGGML_LLAMAFILE=OFF" pip install --no-cache-dir --force-reinstall llama-cpp-python==0.3.36'
)

# flash attention's single-token split path starts at this many KV cells
FLASH_ATTN_SPLIT_KV = 512


class ExactnessUnavailable(RuntimeError):
    """exact=True on a build or target whose forward is not batch-invariant."""


# ggml-cpu/tiled: K-quant and IQ weights switch to a tiled kernel from 8 batch rows
TILED_TYPES = {"q2_K", "q3_K", "q4_K", "q5_K", "q6_K", "iq4_xs", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
               "iq1_s", "iq1_m"}
TILED_MIN_ROWS = 8
REPACK_GEMM_MIN_ROWS = 4


@dataclass(frozen=True)
class Invariance:
    batch_invariant: bool
    reason: str = ""  # why not, when batch_invariant is False
    build: bool = False  # the reason lies in the llama-cpp-python build itself
    # the largest batch whose rows equal batch-1 rows (None: any); larger verify
    # batches are not invariant
    max_batch: int | None = None

    def __bool__(self) -> bool:
        return self.batch_invariant


def build_invariance() -> Invariance:
    """The loaded ggml as a whole (llamafile, non-CPU devices)."""
    from .info import native_info

    info = native_info()
    return Invariance(bool(info["batch_invariant"]), info["batch_invariant_reason"],
                      build=not info["batch_invariant"])


def target_weights(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Weight types of a target GGUF and how many of each the CPU would repack."""
    return _native.take_json(_native.lib.pdf2_target_weights_json(os.fsencode(os.fspath(path))), "target_weights")


def target_invariance(
    path: str | os.PathLike[str],
    *,
    flash_attn: bool,
    n_ctx: int,
    use_extra_bufts: bool = True,
    uses_gpu: bool = False,
) -> Invariance:
    """Whether a target GGUF loaded with these settings decodes batch-invariantly."""
    build = build_invariance()
    if not build:
        return build
    if uses_gpu:
        return Invariance(False, "the target runs on a GPU backend, whose kernels depend on the batch size")
    if flash_attn and n_ctx >= FLASH_ATTN_SPLIT_KV:
        return Invariance(False, f"flash attention with a KV cache of >= {FLASH_ATTN_SPLIT_KV} cells splits a single "
                                 "token's keys across threads (another summation order than a batch's)")
    weights = target_weights(path)
    max_batch = None
    if any(t in TILED_TYPES for t in weights["types"]):
        max_batch = TILED_MIN_ROWS - 1
    if use_extra_bufts and weights["repacked"]:
        max_batch = REPACK_GEMM_MIN_ROWS - 1
    return Invariance(True, max_batch=max_batch)


def llama_invariance(llm: Any) -> Invariance:
    """The same question for a ready llama_cpp.Llama (its own load settings)."""
    import llama_cpp

    fa = int(llm.context_params.flash_attn_type) != llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    return model_invariance(llm, flash_attn=fa, n_ctx=llm.n_ctx())


def model_invariance(llm: Any, *, flash_attn: bool, n_ctx: int) -> Invariance:
    """The same question for another context on a Llama's loaded model (its weights and devices),
    made with flash_attn and n_ctx KV cells (the server's engine makes its own)."""
    return target_invariance(
        llm.model_path,
        flash_attn=flash_attn,
        n_ctx=n_ctx,
        use_extra_bufts=bool(llm.model_params.use_extra_bufts),
        uses_gpu=_uses_gpu(llm),
    )


def _uses_gpu(llm: Any) -> bool:
    from .info import native_info

    gpus = [d for d in native_info()["devices"] if d["type"] != "cpu"]
    if not gpus:
        return False
    # layers offloaded, or host weights whose big batches ggml may offload
    return int(llm.model_params.n_gpu_layers) != 0 or bool(getattr(llm.context_params, "op_offload", True))


def unavailable_message(inv: Invariance) -> str:
    if inv.build:
        return (f"exact output needs a batch-invariant llama-cpp-python, and in this one {inv.reason}. "
                f"Install one with: {INSTALL_COMMAND}")
    return (f"exact output needs a batch-invariant target, and here {inv.reason}. Load the target with "
            "pydflash2.speculator.load_target(path, exact=True) (CPU, flash attention off), or pass its path "
            "to Speculator(exact=True)")


def flash_attn_for(n_ctx: int, exact: bool, wanted: bool) -> bool:
    """Flash attention for a target pydflash2 loads: as asked, except in exact
    mode over a KV cache of >= FLASH_ATTN_SPLIT_KV cells, where it would break
    batch invariance. Off by default (llama-cpp-python's default, so that the
    target decodes as a plain Llama(path) does); benchmarks/flash_attn.py
    measured it 1.3-1.4x faster on SmolLM2 (loaded 2-core machine, one thread)
    with the same tokens at short context."""
    if exact and n_ctx >= FLASH_ATTN_SPLIT_KV:
        return False
    return wanted
