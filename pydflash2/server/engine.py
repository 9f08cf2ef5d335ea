"""BatchEngine: Python binding of the native continuous-batching engine.

    engine = BatchEngine("target.gguf", "drafter.gguf", n_slots=4, n_ctx=4096)
    engine.start(0, tokens, temperature=0.0)
    per_slot = engine.step()   # committed tokens per slot ([] none, None: context full)
    engine.stop(0)

The native engine owns one target context with n_slots sequences (one per
slot) and verifies every busy slot's block in a single llama_decode. Each slot
has its own drafter (its K/V cache holds that slot's context), all over one
copy of the drafter's weights. The Llama object here only tokenizes and
renders chat templates (its own context stays tiny).
Not thread-safe: one thread (the scheduler) drives it.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from .. import _native, draft_costs
from .._native import ffi, lib
from ..cpu_threads import default_threads
from ..draft_tree import EnginePlan, tree_budget_spec
from ..drafter import Drafter
from ..sampling import SamplingRequest, TokenLogprob, step_logprobs
from ..speculator import SELECTORS, GenerationError

_TOKENIZER_CTX = 256  # the Llama's own context: unused for decoding


def _check(rc: int, what: str) -> int:
    if rc < 0:
        raise GenerationError(_native.last_error() or f"{what} failed")
    return rc


def _on_own_thread(fn: Callable[[], Any]) -> Any:
    """fn() on a short-lived thread. ggml's CPU backend runs on OpenMP, and libgomp keeps a
    thread pool for every thread that has run a parallel region until that thread exits. A
    second pool (say the startup cost measurement's on the main thread, beside the scheduler
    thread's) makes libgomp count more threads than cores and stop spinning at barriers:
    measured, one-row decodes then took 17.5 ms instead of 9.8 for the server's whole life.
    Leaving the with-block joins the executor's thread, so its pool is gone on return."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="pydflash2-measure") as pool:
        return pool.submit(fn).result()


SLOT_DRAFTER_GRAPHS = 4  # graph shapes each slot's drafter keeps allocated (Drafter.set_max_graphs)


class BatchEngine:
    """n_slots concurrent requests over one target context.

    n_ctx: context of EACH slot (the KV cache holds n_slots x n_ctx tokens).
    draft: a dflash GGUF (one drafter instance per slot), or None for plain
    decoding. n_max, selector, device, tree_budget: as for Speculator (each slot
    verifies its own tree inside the shared decode; the context then has a
    unified KV cache). flash_attn: None = llama.cpp's choice."""

    def __init__(
        self,
        model: str | os.PathLike[str],
        draft: str | os.PathLike[str] | None = None,
        *,
        n_slots: int = 1,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_max: int | str = "auto",
        selector: str = "auto",
        device: str | None = None,
        n_gpu_layers: int = 0,
        flash_attn: bool | None = None,
        verbose: bool = False,
        tree_budget: int | str = 0,
    ) -> None:
        tree_nodes, tree_auto = tree_budget_spec(tree_budget)
        if tree_auto:  # every slot's branches need sequences of their own
            tree_nodes = max(1, min(tree_nodes, llama_cpp.llama_max_parallel_sequences() // max(1, n_slots) - 1))
        if selector not in SELECTORS:
            raise ValueError(f"selector must be one of {sorted(SELECTORS)}, got {selector!r}")
        if n_max != "auto" and (not isinstance(n_max, int) or n_max < 0):
            raise ValueError(f"n_max must be 'auto' or an int >= 0, got {n_max!r}")
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"target model not found: {path}")
        if draft is not None and not Path(draft).is_file():
            raise FileNotFoundError(f"drafter not found: {draft}")
        # One thread count for every decode. llama-cpp-python's defaults (cpu_count // 2 for one-row decodes,
        # cpu_count for batches) would run our verify batches on every core: on a machine with other work,
        # ggml's barriers then wait on descheduled threads and a step gets many times slower.
        threads = default_threads(n_threads)
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=_TOKENIZER_CTX, n_batch=64, n_threads=threads,
                                   n_threads_batch=threads, n_gpu_layers=n_gpu_layers, verbose=verbose)
        self.n_threads = threads
        self.model_path = str(path)
        self.n_slots = int(n_slots)
        self.n_ctx = int(n_ctx)
        self.n_max: int | str = n_max if draft is not None else 0
        self.drafters: list[Drafter] = []
        if draft is not None and n_max != 0:
            # one copy of the weights; each slot its own cache (its sequence's context)
            first = Drafter(draft, self.model_path, n_ctx=self.n_ctx, n_threads=threads, device=device)
            self.drafters = [first] + [Drafter.sharing_weights(first, n_ctx=self.n_ctx)
                                       for _ in range(self.n_slots - 1)]
            for d in self.drafters:
                # a drafter per slot: each keeps few graph shapes, so that the server's memory does
                # not grow with the shapes its requests happen to meet (a rebuild costs ~1 ms)
                d.set_max_graphs(SLOT_DRAFTER_GRAPHS)
                d.reserve_graphs()  # all memory at startup: it stays flat while serving
        self._native_args = (self.n_slots, self.n_ctx, threads, threads, -1 if flash_attn is None else int(flash_attn))
        self.tree_budget = tree_nodes if self.drafters else 0
        self.tree_auto = tree_auto and self.tree_budget > 0
        plan = EnginePlan.of(self.n_max, self.tree_budget, self.tree_auto)
        self._walk_args = (plan.n_max, -1, SELECTORS[selector], 16, plan.tree_budget)  # -1: no max_draft cap
        self._h = self._new_native()
        self.max_draft = int(lib.pdf2_batch_engine_max_draft(self._h))
        self.max_verify_rows = int(lib.pdf2_batch_engine_max_verify_rows(self._h))
        self._counts = np.zeros(self.n_slots, dtype=np.int32)
        self._tokens = np.zeros(self.n_slots * (self.max_draft + 1), dtype=np.int32)
        self._n_logprobs: dict[int, int] = {}  # per slot: its request's logprobs count (-1: none)
        self.costs: dict[str, list[float]] | None = None
        if plan.measure_costs and self.drafters and self.max_draft > 0:
            assert draft is not None
            key = draft_costs.cost_key(self.model_path, os.fspath(draft), self.drafters[0].device, threads,
                                       self.max_draft, max_verify_rows=self.max_verify_rows)
            self.costs = draft_costs.load_or_measure(key, self.max_verify_rows, self.max_draft,
                                                     lambda: _on_own_thread(self._measure_costs))
            self.set_costs(self.costs["verify_s"], self.costs["draft_s"])

    def _new_native(self) -> Any:
        """The native engine: one target context over the loaded model, and the slots' drafters."""
        model_addr = ctypes.cast(self.llm._model.model, ctypes.c_void_p).value
        handles = ffi.new("pdf2_drafter *[]", [d._h for d in self.drafters] or [ffi.NULL])
        handle = lib.pdf2_batch_engine_new(ffi.cast("void *", model_addr), *self._native_args, handles,
                                           len(self.drafters), *self._walk_args)
        if handle == ffi.NULL:
            raise GenerationError(_native.last_error())
        return ffi.gc(handle, lib.pdf2_batch_engine_free)

    def recover(self) -> None:
        """After a failed step: a new target context and new drafter caches (over the same loaded
        weights), made as the constructor makes them; every slot is idle and empty again. The
        measured costs carry over."""
        if self._h is not None:
            ffi.release(self._h)
            self._h = None
        if self.drafters:
            old = self.drafters
            self.drafters = [Drafter.sharing_weights(old[0], n_ctx=self.n_ctx) for _ in range(self.n_slots)]
            for d in old:
                d.close()
            for d in self.drafters:
                d.set_max_graphs(SLOT_DRAFTER_GRAPHS)
                d.reserve_graphs()
        self._h = self._new_native()
        if self.costs is not None:
            self.set_costs(self.costs["verify_s"], self.costs["draft_s"])

    def close(self) -> None:
        if getattr(self, "_h", None) is not None:
            ffi.release(self._h)
            self._h = None
        for d in self.drafters:
            d.close()
        self.drafters = []

    # ------------------------------------------------------------ slots

    def start(self, slot: int, tokens: Sequence[int], *, temperature: float = 0.0, top_k: int = 0,
              top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, max_tokens: int = 0,
              grammar: str | None = None, logit_bias: Mapping[int, float] | None = None,
              presence_penalty: float = 0.0, frequency_penalty: float = 0.0, repeat_penalty: float = 1.0,
              repeat_last_n: int = 64, logprobs: int | None = None) -> None:
        """Queues a request on an idle slot. The sampler chain and logprobs as for
        Speculator.stream (pydflash2.sampling); a bad value (a grammar llama.cpp cannot
        parse, a token id outside the vocabulary...) raises GenerationError (ValueError for
        malformed Python values) and leaves the slot idle. max_tokens > 0: no step drafts
        past that many tokens. logprobs N: logprobs(slot, committed) after each step."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        sampling = SamplingRequest(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_tokens=max_tokens,
            grammar=grammar, logit_bias=logit_bias, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
            logprobs=logprobs)
        _check(lib.pdf2_batch_engine_start(self._h, int(slot), ffi.from_buffer("int32_t[]", arr), len(arr),
                                           sampling.struct), "start")
        self._n_logprobs[int(slot)] = sampling.n_logprobs

    def logprobs(self, slot: int, committed: Sequence[int]) -> list[TokenLogprob]:
        """Logprobs of the tokens the last step() committed on `slot` (its list there), for a
        request started with logprobs=N (else []): the target's log-softmax of each token,
        bonus or correction token included, and its N most likely alternatives."""
        n_top = self._n_logprobs.get(int(slot), -1)
        if n_top < 0 or not committed:
            return []
        return step_logprobs(self._h, slot, list(committed), n_top)

    def cached_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """Prompt tokens an idle slot already holds (start() there prefills only the rest)."""
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        return _check(lib.pdf2_batch_engine_cached_prefix(self._h, int(slot), ffi.from_buffer("int32_t[]", arr),
                                                          len(arr)), "cached_prefix")

    def stop(self, slot: int) -> None:
        _check(lib.pdf2_batch_engine_stop(self._h, int(slot)), "stop")

    def step(self) -> list[list[int] | None]:
        """One target decode for all busy slots: per slot the committed tokens
        ([] = nothing this step, e.g. idle or mid-prefill; None = context full)."""
        _check(lib.pdf2_batch_engine_step(self._h, ffi.from_buffer("int32_t[]", self._counts), len(self._counts),
                                          ffi.from_buffer("int32_t[]", self._tokens), len(self._tokens)), "step")
        width = self.max_draft + 1
        out: list[list[int] | None] = []
        for s, c in enumerate(self._counts.tolist()):
            out.append(None if c < 0 else self._tokens[s * width: s * width + c].tolist())
        return out

    def stats(self) -> dict[str, Any]:
        return _native.take_json(lib.pdf2_batch_engine_stats_json(self._h), "stats")

    def slot_stats(self, slot: int) -> dict[str, Any]:
        """The counters of the slot's current or last request (drafted and accepted per position...)."""
        return _native.take_json(lib.pdf2_batch_engine_slot_stats_json(self._h, int(slot)), "slot_stats")

    # ------------------------------------------------------------ costs

    def set_costs(self, verify_s: Sequence[float], draft_s: Sequence[float]) -> None:
        v = np.ascontiguousarray(verify_s, dtype=np.float64)
        d = np.ascontiguousarray(draft_s, dtype=np.float64)
        _check(lib.pdf2_batch_engine_set_costs(self._h, ffi.from_buffer("double[]", v), len(v),
                                               ffi.from_buffer("double[]", d), len(d)), "set_costs")

    def _measure_costs(self, reps: int = 5) -> dict[str, list[float]]:
        prompt = draft_costs.warmup_prompt(lambda b: self.llm.tokenize(b, add_bos=True, special=False), self.n_ctx,
                                           self.max_verify_rows - 1)
        self.start(0, prompt)
        try:
            while not self.step()[0]:
                pass  # prefill slot 0
            v = np.zeros(self.max_verify_rows, dtype=np.float64)
            d = np.zeros(self.max_draft, dtype=np.float64)
            _check(lib.pdf2_batch_engine_measure_costs(self._h, 0, reps, ffi.from_buffer("double[]", v), len(v),
                                                       ffi.from_buffer("double[]", d), len(d)), "measure_costs")
        finally:
            self.stop(0)
        return {"verify_s": v.tolist(), "draft_s": d.tolist()}
