"""pydflash2.Drafter: the DFlash/DFlash2 drafter forward pass (native ggml graphs).

    d = Drafter("dflash2.gguf", "target.gguf", n_ctx=4096)
    d.inject(features, positions)          # committed target rows
    p = d.propose(anchor, pos, n)          # Proposal: lattice (DFlash2) or logits (DFlash1)
    path = d.select_path("greedy")         # DraftPath: tokens (+ draft distributions q)
    d.truncate(pos)                        # roll the cache back

Every failure raises DrafterError (a NativeError) with the native message and
leaves the drafter usable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _native
from ._native import ffi, lib

# the path selectors: how drafts are picked as one path through a proposal (native/src/drafter/path_selector.h)
SELECTORS = {"greedy": 0, "sample": 1, "viterbi": 2}


class DrafterError(_native.NativeError):
    """A drafter call failed (bad argument, mismatch, full cache...)."""


@dataclass(frozen=True)
class Proposal:
    """One proposed block. DFlash2: candidates [n-1, k] (token ids) and scores
    [n-1, k, k] (predecessor index, candidate index); at position 1 every
    predecessor row is the anchor's. DFlash1: logits [n-1, n_vocab]."""

    anchor: int
    pos: int
    n: int
    candidates: np.ndarray | None = None
    scores: np.ndarray | None = None
    logits: np.ndarray | None = None


@dataclass(frozen=True)
class DraftPath:
    """The selector's path: drafted tokens [n-1] and per position the draft distribution q over
    q_ids ([n-1, k]; one-hot for greedy/viterbi)."""

    tokens: np.ndarray
    q_ids: np.ndarray
    q: np.ndarray


#: DraftPath's former name, kept so that `from pydflash2 import Walk` still works
Walk = DraftPath


def _check(rc: int, what: str) -> None:
    _native.check(rc, DrafterError, what)


def _path(p: str | os.PathLike[str] | None) -> Any:
    return ffi.NULL if p is None else os.fsencode(os.fspath(p))


class Drafter:
    """A DFlash/DFlash2 drafter on one ggml device.

    drafter_path: the dflash GGUF; target_path: the target GGUF whose token
    embedding and output head the drafter uses (the embedding is mapped in
    place; the head too on the CPU, else it is copied to the device). device:
    "auto" (or None) = the first GPU-type device ggml offers, else "CPU"; or a
    ggml device name ("CPU", "CUDA0", "Metal", "RPC0" after
    pydflash2.devices.add_rpc_servers). cache_type: "f16" (as llama.cpp) or "f32"."""

    def __init__(
        self,
        drafter_path: str | os.PathLike[str],
        target_path: str | os.PathLike[str] | None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        device: str | None = "auto",
        cache_type: str = "f16",
    ) -> None:
        if cache_type not in ("f16", "f32"):
            raise ValueError(f"cache_type must be 'f16' or 'f32', got {cache_type!r}")
        if not 0 < int(n_ctx) < 2**32:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        dev = ffi.NULL if device is None else device.encode()
        h = lib.pdf2_drafter_new(
            _path(drafter_path), _path(target_path), int(n_ctx), int(n_threads or 0), dev, int(cache_type == "f32")
        )
        if h == ffi.NULL:
            raise DrafterError(_native.last_error() or "loading the drafter failed")
        self._adopt(h)

    @classmethod
    def sharing_weights(cls, other: Drafter, *, n_ctx: int = 4096, cache_type: str = "f16") -> Drafter:
        """A drafter over `other`'s loaded weights (one copy in memory; same
        device and threads) with its own cache: one per concurrent sequence.
        Drafters that share weights must be driven from one thread at a time."""
        if cache_type not in ("f16", "f32"):
            raise ValueError(f"cache_type must be 'f16' or 'f32', got {cache_type!r}")
        if not 0 < int(n_ctx) < 2**32:
            raise ValueError(f"n_ctx must be positive, got {n_ctx}")
        if getattr(other, "_h", None) is None:
            raise DrafterError("the drafter to share weights with is closed")
        h = lib.pdf2_drafter_new_sharing(other._h, int(n_ctx), int(cache_type == "f32"))
        if h == ffi.NULL:
            raise DrafterError(_native.last_error() or "creating the drafter failed")
        d = cls.__new__(cls)
        d._adopt(h)
        return d

    def _adopt(self, h: Any) -> None:
        self._h = ffi.gc(h, lib.pdf2_drafter_free)
        self.hparams: dict[str, Any] = _native.take_json(lib.pdf2_drafter_hparams_json(self._h), "hparams")
        self.version: int = int(self.hparams["version"])
        self.block_size: int = int(self.hparams["block_size"])
        self.n_vocab: int = int(self.hparams["n_vocab"])
        self.feature_width: int = int(lib.pdf2_drafter_feature_width(self._h))
        self._last_n = 0

    def set_max_graphs(self, n: int) -> None:
        """Keep at most n graph shapes allocated (default 24, about 1 MB of host memory
        each for SmolLM2's drafter; the least recently used is rebuilt when needed again)."""
        _check(lib.pdf2_drafter_set_max_graphs(self._h, int(n)), "set_max_graphs")

    def reserve_graphs(self) -> None:
        """Allocate all of set_max_graphs' slots now, each sized for the largest shapes
        (a full block over the whole cache, a 64-row inject) with its host pages written
        once: memory then stays flat while the drafter serves (the server calls this at
        startup; otherwise slots and buffers grow as shapes come)."""
        _check(lib.pdf2_drafter_reserve_graphs(self._h), "reserve_graphs")

    # ---------------------------------------------------------------- state
    @property
    def info(self) -> dict[str, Any]:
        return _native.take_json(lib.pdf2_drafter_info_json(self._h), "info")

    @property
    def device(self) -> str:
        return str(self.info["device"])

    @property
    def n_cached(self) -> int:
        return int(lib.pdf2_drafter_n_cached(self._h))

    @property
    def last_pos(self) -> int:
        """Position of the last cached row (-1 when empty)."""
        return int(lib.pdf2_drafter_last_pos(self._h))

    def close(self) -> None:
        if getattr(self, "_h", None) is not None:
            ffi.release(self._h)
            self._h = None

    def __enter__(self) -> Drafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- cache
    def inject(self, features: np.ndarray, positions: Any) -> None:
        """Appends committed context rows: features [n, n_target_layers*H]
        (float32), positions [n] strictly increasing after the cache end."""
        f, p = self._rows(features, positions)
        rc = lib.pdf2_drafter_inject(
            self._h, ffi.from_buffer("float[]", f), f.shape[1], ffi.from_buffer("int32_t[]", p), f.shape[0]
        )
        _check(rc, "inject")

    @staticmethod
    def _rows(features: np.ndarray, positions: Any) -> tuple[np.ndarray, np.ndarray]:
        """features as float32 [n, width] and positions as int32 [n], checked for shape."""
        f = np.ascontiguousarray(features, dtype=np.float32)
        if f.ndim == 1:
            f = f[None, :]
        if f.ndim != 2:
            raise DrafterError(f"features must be 2-D [n, width], got shape {f.shape}")
        p = np.ascontiguousarray(np.atleast_1d(positions), dtype=np.int32)
        if p.shape != (f.shape[0],):
            raise DrafterError(f"positions has shape {p.shape}, expected ({f.shape[0]},) (one per feature row)")
        return f, p

    def truncate(self, pos: int) -> None:
        """Drops cached rows at positions >= pos."""
        _check(lib.pdf2_drafter_truncate(self._h, int(pos)), "truncate")

    # ---------------------------------------------------------------- drafting
    def propose(self, anchor: int, pos: int, n: int | None = None, *, features: np.ndarray | None = None,
                positions: Any = None) -> Proposal:
        """Drafts block [anchor, MASK x (n-1)] at positions pos..pos+n-1. With features and
        positions, those context rows are injected first in the same graph (as inject() would:
        what the engine runs each step with the rows it committed)."""
        n = self.block_size if n is None else int(n)
        if features is None and positions is None:
            _check(lib.pdf2_drafter_propose(self._h, int(anchor), int(pos), n), "propose")
        else:
            if features is None or positions is None:
                raise DrafterError("propose: features and positions come together")
            f, p = self._rows(features, positions)
            rc = lib.pdf2_drafter_inject_and_propose(self._h, ffi.from_buffer("float[]", f), f.shape[1],
                                                     ffi.from_buffer("int32_t[]", p), f.shape[0], int(anchor),
                                                     int(pos), n)
            _check(rc, "propose")
        self._last_n = n
        P = n - 1
        if self.version == 2:
            k = int(self.hparams["selector_top_k"])
            cand = np.empty((P, k), dtype=np.int32)
            scores = np.empty((P, k, k), dtype=np.float32)
            rc = lib.pdf2_drafter_get_lattice(
                self._h, ffi.from_buffer("int32_t[]", cand), ffi.from_buffer("float[]", scores)
            )
            _check(rc, "get_lattice")
            return Proposal(int(anchor), int(pos), n, candidates=cand, scores=scores)
        logits = np.empty((P, self.n_vocab), dtype=np.float32)
        _check(lib.pdf2_drafter_get_logits(self._h, ffi.from_buffer("float[]", logits)), "get_logits")
        return Proposal(int(anchor), int(pos), n, logits=logits)

    def select_path(
        self, selector: str = "greedy", temperature: float = 1.0, seed: int = 0, top_k: int = 16
    ) -> DraftPath:
        """The selector's path through the last proposal: "greedy" (the reference), "sample" at
        temperature (q = softmax(score/T) over the k candidates), or "viterbi".
        top_k: size of q for DFlash1 drafters (DFlash2 uses selector_top_k)."""
        if selector not in SELECTORS:
            raise DrafterError(f"selector must be one of {sorted(SELECTORS)}, got {selector!r}")
        if self._last_n == 0:
            raise DrafterError("select_path: no proposal yet (call propose first)")
        P = self._last_n - 1
        k = int(self.hparams["selector_top_k"]) if self.version == 2 else int(top_k)
        if k < 1:
            raise DrafterError(f"top_k must be >= 1, got {top_k}")
        tokens = np.empty(P, dtype=np.int32)
        q_ids = np.empty((P, k), dtype=np.int32)
        q = np.empty((P, k), dtype=np.float32)
        rc = lib.pdf2_drafter_select_path(
            self._h,
            SELECTORS[selector],
            float(temperature),
            int(seed) & (2**64 - 1),
            k,
            ffi.from_buffer("int32_t[]", tokens),
            ffi.from_buffer("int32_t[]", q_ids),
            ffi.from_buffer("float[]", q),
        )
        _check(rc, "select_path")
        return DraftPath(tokens, q_ids, q)

    def __repr__(self) -> str:
        return f"Drafter(v{self.version}, device={self.device!r}, n_cached={self.n_cached})"
