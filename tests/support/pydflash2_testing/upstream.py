"""Upstream llama.cpp's own DFlash / DFlash2 drafter, driven from Python.

This is the parity oracle: it runs the `dflash` architecture exactly as
llama-server does (common/speculative.cpp, common_speculative_impl_draft_dflash),
through llama-cpp-python's low-level bindings, so another implementation of the
drafter can be compared against it number for number.

    with UpstreamDrafter(target_gguf, drafter_gguf) as up:
        feats, logits = up.target_decode(prompt_tokens, 0)   # prefill the target
        up.inject(feats, range(len(prompt_tokens)))           # seed the drafter cache
        lat = up.draft(anchor, len(prompt_tokens), up.block_size)
        lat.candidates, lat.scores                             # DFlash2 lattice

Functions that upstream declares only in its staging header src/llama-ext.h
(C++ linkage) are reached by their mangled names in libllama.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pydflash2.capture import capture_rule

__all__ = ["Lattice", "UpstreamDrafter", "UpstreamError", "ext", "silence_logs"]


from pydflash2.llama_ext import LlamaError as UpstreamError
from pydflash2.llama_ext import ext, silence_logs

# ---------------------------------------------------------------- results


@dataclass
class Lattice:
    """DFlash2 selector output for one block of n positions (position 0 = anchor, no row).

    candidates[i-1, c]   : token id of candidate c at block position i (1..n-1)
    scores[i-1, p, c]    : score of candidate c given predecessor p (the anchor for i=1,
                           where upstream reads predecessor row 0; candidate p of position
                           i-1 otherwise)
    raw                  : the n rows of H floats as llama_get_embeddings_nextn returned them
    """

    candidates: np.ndarray  # [n-1, k] int64
    scores: np.ndarray  # [n-1, k, k] float32
    raw: np.ndarray  # [n, H] float32

    @property
    def top_k(self) -> int:
        return int(self.candidates.shape[1])

    def greedy_path(self) -> list[int]:
        """Upstream's greedy path: predecessor row 0 at position 1, then argmax left to right."""
        prev, out = 0, []
        for i in range(self.candidates.shape[0]):
            prev = int(np.argmax(self.scores[i, prev]))
            out.append(int(self.candidates[i, prev]))
        return out


def parse_lattice(raw: np.ndarray, top_k: int) -> Lattice:
    """Splits H-wide nextn rows into candidates [n-1, k] and scores [n-1, k, k]."""
    k = top_k
    body = raw[1:]
    cand = np.rint(body[:, :k]).astype(np.int64)
    scores = body[:, k : k + k * k].reshape(-1, k, k).astype(np.float32)
    return Lattice(cand, scores, raw)


# ---------------------------------------------------------------- the oracle


class UpstreamDrafter:
    """A target context plus upstream's dflash drafter context on top of it (ctx_other).

    Parameters: target / drafter GGUF paths, n_ctx (both contexts), n_threads, quiet
    (silence llama.cpp logging). All positions are absolute and sequence 0 is used.
    """

    def __init__(
        self,
        target_path: str | Path,
        drafter_path: str | Path,
        *,
        n_ctx: int = 1024,
        n_batch: int = 512,
        n_threads: int = 2,
        quiet: bool = True,
    ) -> None:
        from llama_cpp import llama_cpp as lc

        self._lc = lc
        if quiet:
            silence_logs()
        lc.llama_backend_init()
        self.target_model = self.drafter_model = None
        self.target_ctx = self.drafter_ctx = None
        self._batch_t = self._batch_d = None
        try:
            self._open(str(target_path), str(drafter_path), n_ctx, n_batch, n_threads)
        except BaseException:
            self.close()
            raise

    def _open(self, target_path: str, drafter_path: str, n_ctx: int, n_batch: int, n_threads: int) -> None:
        lc = self._lc
        mp = lc.llama_model_default_params()
        mp.n_gpu_layers = 0
        self.target_model = lc.llama_model_load_from_file(target_path.encode(), mp)
        if not self.target_model:
            raise UpstreamError(f"cannot load target {target_path}")
        self.drafter_model = lc.llama_model_load_from_file(drafter_path.encode(), mp)
        if not self.drafter_model:
            raise UpstreamError(f"cannot load drafter {drafter_path}")

        n = int(ext.target_layer_ids_n(self.drafter_model))
        ptr = ext.target_layer_ids(self.drafter_model)
        #: GGUF dflash.target_layers: target layers whose INPUT is tapped (HF id + 1)
        self.target_layers: list[int] = [int(ptr[i]) for i in range(n)]
        self.top_k: int = int(ext.dflash_selector_top_k(self.drafter_model))
        self.is_dflash2 = self.top_k > 0
        n_layer_t = int(lc.llama_model_n_layer(self.target_model))
        arch_t = self._meta("general.architecture", self.target_model) or ""
        # which inputs upstream's taps give (pydflash2.capture's table): most architectures stop at
        # n_layer-1, a few also give n_layer; asking for more GGML_ASSERT-aborts the whole process
        rule = capture_rule(arch_t, n_layer_t)
        if "tap" not in rule.max_layer_by_path:
            raise UpstreamError(
                f"upstream's drafter reads its target through layer-input taps, which a {arch_t} target lacks "
                "in this llama.cpp (pydflash2's own engine reads it through its capture callback)"
            )
        limit = rule.max_layer_by_path["tap"] + 1
        bad = [lid for lid in self.target_layers if not 0 <= lid < limit]
        if bad:
            raise UpstreamError(
                f"dflash.target_layers {bad} cannot be tapped on this {arch_t} target with {n_layer_t} layers: "
                f"upstream extracts layer inputs 0..{limit - 1} only (it would abort the process)"
            )
        self.n_embd_target = int(lc.llama_model_n_embd(self.target_model))
        self.n_embd = int(lc.llama_model_n_embd(self.drafter_model))
        self.n_embd_enc = n * self.n_embd_target
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.target_model)))
        self.mask_token_id = int(lc.llama_vocab_mask(lc.llama_model_get_vocab(self.drafter_model)))
        self.block_size = int(self._meta("dflash.block_size") or 16)
        self.causal = self._meta("dflash.attention.causal") == "true"

        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.n_seq_max = 1
        self.target_ctx = lc.llama_init_from_model(self.target_model, cp)
        if not self.target_ctx:
            raise UpstreamError("cannot create the target context")
        for lid in self.target_layers:
            ext.set_embeddings_layer_inp(self.target_ctx, lid, True)

        cd = lc.llama_context_default_params()
        cd.n_ctx, cd.n_batch, cd.n_ubatch = n_ctx, n_batch, n_batch
        cd.n_threads = cd.n_threads_batch = n_threads
        cd.n_seq_max = 1
        cd.ctx_other = self.target_ctx
        self.drafter_ctx = lc.llama_init_from_model(self.drafter_model, cd)
        if not self.drafter_ctx:
            raise UpstreamError("cannot create the drafter context (ctx_other = target)")
        # as upstream: DFlash2 reads its lattice from h_nextn, unmasked; DFlash1 reads logits
        ext.set_embeddings_nextn(self.drafter_ctx, True, not self.is_dflash2)
        lc.llama_set_causal_attn(self.drafter_ctx, self.causal)

        self._batch_t = lc.llama_batch_ext_init(self.target_ctx)
        self._batch_d = lc.llama_batch_ext_init(self.drafter_ctx)
        if not self._batch_t or not self._batch_d:
            raise UpstreamError("llama_batch_ext_init failed")

    def _meta(self, key: str, model: int | None = None) -> str | None:
        buf = ctypes.create_string_buffer(256)
        model = self.drafter_model if model is None else model
        n = self._lc.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    # ---------------------------------------------------------------- batches

    def _add_token(self, batch: int, token: int, pos: int, output: bool) -> None:
        lc = self._lc
        idx = lc.llama_batch_ext_add_token(batch, 0, int(token))
        if idx < 0:
            raise UpstreamError(f"llama_batch_ext_add_token failed ({idx})")
        p = (lc.llama_pos * 4)(pos, 0, 0, 0)
        lc.llama_batch_ext_set_pos(batch, idx, p)
        lc.llama_batch_ext_set_output_logits(batch, idx, output)

    def _process(self, ctx: int, batch: int, what: str) -> None:
        rc = self._lc.llama_process(ctx, self._lc.LLAMA_PROCESS_TYPE_DECODE, batch)
        if rc != 0:
            raise UpstreamError(f"llama_process({what}) returned {rc}")

    # ---------------------------------------------------------------- API

    def target_decode(self, tokens: Sequence[int], pos0: int) -> tuple[np.ndarray, np.ndarray]:
        """Runs tokens on the target at positions pos0.. and returns
        (features [n, n_tl*H_target] in dflash.target_layers order, logits [n, V])."""
        lc = self._lc
        n = len(tokens)
        lc.llama_batch_ext_clear(self._batch_t)
        for i, t in enumerate(tokens):
            self._add_token(self._batch_t, t, pos0 + i, True)
        self._process(self.target_ctx, self._batch_t, "target")
        feats = np.empty((n, self.n_embd_enc), dtype=np.float32)
        H = self.n_embd_target
        for k, lid in enumerate(self.target_layers):
            ptr = ext.get_embeddings_layer_inp(self.target_ctx, lid)
            if not ptr:
                raise UpstreamError(f"target layer {lid} input was not extracted")
            feats[:, k * H : (k + 1) * H] = np.ctypeslib.as_array(ptr, shape=(n, H))
        logits = np.empty((n, self.n_vocab), dtype=np.float32)
        for i in range(n):
            logits[i] = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.target_ctx, i), shape=(self.n_vocab,))
        return feats, logits

    def inject(self, features: np.ndarray, positions: Sequence[int]) -> None:
        """Feeds target features [n, n_tl*H_target] into the drafter's KV cache at positions."""
        lc = self._lc
        feats = np.ascontiguousarray(features, dtype=np.float32)
        if feats.ndim != 2 or feats.shape[1] != self.n_embd_enc or feats.shape[0] != len(positions):
            raise ValueError(f"features must be [{len(positions)}, {self.n_embd_enc}], got {list(feats.shape)}")
        lc.llama_batch_ext_clear(self._batch_d)
        fptr = feats.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        row = self.n_embd_enc
        for i, p in enumerate(positions):
            row_ptr = ctypes.cast(ctypes.addressof(fptr.contents) + i * row * 4, ctypes.POINTER(ctypes.c_float))
            idx = lc.llama_batch_ext_add_embd(self._batch_d, 0, lc.llama_embd(row_ptr, 1, row))
            if idx < 0:
                raise UpstreamError(f"llama_batch_ext_add_embd failed ({idx})")
            pp = (lc.llama_pos * 4)(int(p), int(p), int(p), 0)
            lc.llama_batch_ext_set_pos(self._batch_d, idx, pp)
            lc.llama_batch_ext_set_output_logits(self._batch_d, idx, False)
        self._process(self.drafter_ctx, self._batch_d, "drafter inject")
        del feats  # kept alive until llama_process returned

    def draft(self, anchor: int, pos: int, n: int | None = None) -> Lattice | np.ndarray:
        """Decodes the block [anchor, MASK x (n-1)] at positions pos..pos+n-1.

        DFlash2: returns the selector Lattice. DFlash1: returns logits [n, V].
        The block's own K/V rows are removed from the drafter cache afterwards
        (positions >= pos), so the next injection at pos starts clean."""
        lc = self._lc
        n = self.block_size if n is None else n
        lc.llama_batch_ext_clear(self._batch_d)
        for i in range(n):
            self._add_token(self._batch_d, anchor if i == 0 else self.mask_token_id, pos + i, not self.is_dflash2)
        try:
            self._process(self.drafter_ctx, self._batch_d, "drafter block")
            if self.is_dflash2:
                ptr = ext.get_embeddings_nextn(self.drafter_ctx)
                if not ptr:
                    raise UpstreamError("DFlash2 selector produced no lattice")
                raw = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd)).copy()
                return parse_lattice(raw, self.top_k)
            out = np.empty((n, self.n_vocab), dtype=np.float32)
            for i in range(n):
                out[i] = np.ctypeslib.as_array(lc.llama_get_logits_ith(self.drafter_ctx, i), shape=(self.n_vocab,))
            return out
        finally:
            self._seq_rm(self.drafter_ctx, pos)

    def truncate(self, pos: int, *, target: bool = True, drafter: bool = True) -> None:
        """Removes cache rows at positions >= pos (drafter and, by default, target)."""
        if drafter:
            self._seq_rm(self.drafter_ctx, pos)
        if target:
            self._seq_rm(self.target_ctx, pos)

    def _seq_rm(self, ctx: int, pos: int) -> None:
        lc = self._lc
        if not lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, pos, -1):
            raise UpstreamError(f"llama_memory_seq_rm(pos={pos}) failed")

    def pos_max(self, which: str = "drafter") -> int:
        """Largest position held in the drafter's (or target's) cache, -1 if empty."""
        ctx = self.drafter_ctx if which == "drafter" else self.target_ctx
        return int(self._lc.llama_memory_seq_pos_max(self._lc.llama_get_memory(ctx), 0))

    # ---------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Frees batches, contexts (drafter first: it points at the target) and models."""
        lc = self._lc
        for attr, free in (
            ("_batch_d", lc.llama_batch_ext_free),
            ("_batch_t", lc.llama_batch_ext_free),
            ("drafter_ctx", lc.llama_free),
            ("target_ctx", lc.llama_free),
            ("drafter_model", lc.llama_model_free),
            ("target_model", lc.llama_model_free),
        ):
            h = getattr(self, attr, None)
            if h:
                free(h)
            setattr(self, attr, None)

    def __enter__(self) -> UpstreamDrafter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
