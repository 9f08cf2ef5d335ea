"""The one Python binding of the native draft-verify engine (pdf2_batch_engine_*).

    config = EngineConfig.of(n_max="auto", selector="auto", tree_budget=0, drafting=True)
    engine = NativeEngine.owned(llama_model, config, n_slots=4, n_ctx_slot=4096, ...)   # the server
    engine = NativeEngine.borrowed(llama_context, config, drafter=d, ...)             # Speculator
    engine.start(0, tokens, SamplingRequest(...)); engine.step(); engine.stop(0)

Speculator (one slot in a Llama's context) and the server's BatchEngine (n slots in a
context the engine owns) are façades over NativeEngine. EngineConfig is the one validated
description of what a step drafts and verifies, and the only place its fields become the C
ABI's sentinels (EngineConfig.abi). exact_config holds exact mode's checks and caps for both.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import numpy as np

from . import _native, draft_costs, exactness
from ._native import ffi, lib
from .context_drafts import context_drafts_spec, limits, mode_code
from .draft_tree import tree_budget_spec
from .drafter import SELECTORS as DRAFTER_SELECTORS
from .drafter import Drafter
from .exactness import ExactnessUnavailable, Invariance
from .sampling import SamplingRequest, TokenLogprob, step_logprobs

#: the path selectors: how a step picks its drafts from the drafter's lattice; "auto": greedy when
#: the request is greedy, sampled otherwise (the native engine decides per request)
SELECTORS = ("auto", *DRAFTER_SELECTORS)
_AUTO_SELECTOR = -1
# the support of a DFlash1 drafter's draft distribution (its top-k logits)
Q_TOP_K = 16

DraftLength = int | Literal["auto", "block"]


class GenerationError(_native.NativeError):
    """The native loop failed (bad sampling parameters, context too small...)."""


def check(rc: int, what: str) -> int:
    """rc of an engine call; a negative one raises GenerationError with the native message."""
    return _native.check(rc, GenerationError, what)


@dataclass(frozen=True)
class EngineConfig:
    """What each step drafts and verifies.

    n_max: drafts per step: an int (0: plain decoding), "auto" (adaptive: the cost model and the
    running acceptance) or "block" (the drafter's whole block: a fixed tree's depth).
    tree_budget: the nodes of the largest tree a step verifies (0: the chain); tree_auto: each
    step's tree (or the chain) chosen by the cost model, up to tree_budget. max_draft: a cap on the
    drafts per step (exact mode), None: the drafter's block."""

    n_max: DraftLength
    selector: str = "auto"
    tree_budget: int = 0
    tree_auto: bool = False
    max_draft: int | None = None
    context_nodes: int = 0  # > 0: context drafts may run, in trees of at most this many nodes

    @classmethod
    def of(cls, n_max: int | str, selector: str, tree_budget: int | str, *, drafting: bool) -> EngineConfig:
        """The config for the public arguments (n_max "auto" or int >= 0, a selector name,
        tree_budget "auto" or 0..255); drafting=False (no drafter): plain decoding."""
        if selector not in SELECTORS:
            raise ValueError(f"selector must be one of {sorted(SELECTORS)}, got {selector!r}")
        if n_max != "auto" and (not isinstance(n_max, int) or isinstance(n_max, bool) or n_max < 0):
            raise ValueError(f"n_max must be 'auto' or an int >= 0, got {n_max!r}")
        nodes, auto = tree_budget_spec(tree_budget)
        if not drafting or n_max == 0:
            return cls(n_max=0, selector=selector)
        return cls(n_max=n_max, selector=selector).with_tree(nodes, auto)  # type: ignore[arg-type]

    def with_tree(self, nodes: int, auto: bool | None = None) -> EngineConfig:
        """This config with a tree of at most `nodes` (0: the chain); n_max follows: a fixed tree
        drafts the drafter's block unless n_max says otherwise."""
        auto = self.tree_auto if auto is None else auto
        auto = auto and nodes > 0
        n_max: DraftLength = "auto" if self.n_max == "block" else self.n_max
        if n_max == "auto" and nodes > 0 and not auto:
            n_max = "block"
        return replace(self, n_max=n_max, tree_budget=nodes, tree_auto=auto)

    def with_context(self, context_drafts: str) -> EngineConfig:
        """This config with context drafts ("off", "request", "global": pydflash2.context_drafts)."""
        return replace(self, context_nodes=0 if context_drafts_spec(context_drafts) == "off" else limits().max_nodes)

    @property
    def drafting(self) -> bool:
        return self.n_max != 0

    @property
    def trees(self) -> bool:
        """Whether steps may verify trees (the lattice's, or the context's): the target context then
        needs a unified KV cache and target_sequences() sequences."""
        return self.tree_budget > 0 or self.context_nodes > 0

    def target_sequences(self) -> int:
        """Sequences per slot the target context needs: the slot's, and one per tree leaf."""
        branches = max(self.tree_budget, limits().max_branches if self.context_nodes else 0)
        return 1 + branches

    @property
    def measure_costs(self) -> bool:
        """Whether the cost model needs measured costs: adaptive chains, automatic trees, and
        context drafts (each step's tree is priced)."""
        return (self.n_max == "auto" and not self.tree_budget) or self.tree_auto or self.context_nodes > 0

    def abi(self) -> tuple[int, int, int, int, int, int]:
        """(n_max, max_draft, selector, q_top_k, tree_budget, context_nodes) as pdf2_batch_engine_new*
        take them: n_max -1 adaptive, 255 the drafter's block (the engine caps it there); max_draft -1
        no cap; selector -1 auto; tree_budget < 0 automatic, at most -tree_budget."""
        n_max = {"auto": -1, "block": 255}.get(self.n_max, self.n_max)  # type: ignore[arg-type]
        selector = _AUTO_SELECTOR if self.selector == "auto" else DRAFTER_SELECTORS[self.selector]
        return (int(n_max), -1 if self.max_draft is None else self.max_draft, selector, Q_TOP_K,
                -self.tree_budget if self.tree_auto else self.tree_budget, self.context_nodes)


def exact_config(config: EngineConfig, invariance: Invariance, *, flash_attn: bool) -> EngineConfig:
    """exact mode's checks and caps: refuses (ExactnessUnavailable) a target whose forward is not
    batch-invariant here (build, GPU offload, weights, flash attention's split), a tree without
    flash attention, and a fixed tree larger than the target's invariant batch; caps the drafts
    (and an automatic tree) so that every verify batch stays at most invariance.max_batch rows."""
    if not invariance:
        raise ExactnessUnavailable(exactness.unavailable_message(invariance))
    if not config.drafting and not config.context_nodes:
        return config
    if config.trees and not flash_attn:
        raise ExactnessUnavailable(
            "a tree's rows are bit-identical to plain decoding only with flash attention, which exact mode "
            f"turns off over >= {exactness.FLASH_ATTN_SPLIT_KV} KV cells: use n_ctx < "
            f"{exactness.FLASH_ATTN_SPLIT_KV}, or no tree")
    if invariance.max_batch is None:
        return config
    cap = invariance.max_batch - 1  # larger verify batches take other matmul kernels (exactness.py)
    if config.tree_auto:
        config = config.with_tree(min(config.tree_budget, cap))
    if config.context_nodes > cap:
        config = replace(config, context_nodes=cap)  # context trees stay in the invariant batch too
    if config.tree_budget > cap:
        raise ExactnessUnavailable(
            f"exact mode keeps verify batches at most {invariance.max_batch} rows with this target "
            f"({invariance.reason or 'its weights switch kernels above that'}): a tree budget of "
            f"{config.tree_budget} needs {config.tree_budget + 1}")
    return replace(config, max_draft=cap)


def greedy_is_exact(invariance: Invariance, max_draft: int, max_verify_rows: int, *, tree: bool,
                    flash_attn: bool) -> bool:
    """Whether greedy output equals plain decoding's token for token: no verify batches at all, or
    a batch-invariant target whose verify batches stay within its invariant size, and for a tree,
    flash attention (without it a tree row differs from its path decoded alone: docs/exactness.md)."""
    if max_draft == 0:
        return True
    if not invariance or (tree and not flash_attn):
        return False
    return invariance.max_batch is None or max_verify_rows <= invariance.max_batch


def _ptr(p: Any) -> Any:
    return ffi.NULL if p is None else p.handle


class PreparedSampling:
    """A request's sampler chain made ahead of NativeEngine.start (its grammar parsed, every value
    checked) from the target model alone, so that it can be made on any thread while another steps
    the engine. start() takes it; one start per PreparedSampling."""

    def __init__(self, model: Any, n_ctx_slot: int, sampling: SamplingRequest) -> None:
        handle = lib.pdf2_prepare_sampling(_native.void_ptr(model), int(n_ctx_slot), sampling.struct)
        if handle == ffi.NULL:
            raise GenerationError(_native.last_error())
        self._raw = handle
        self._h: Any = ffi.gc(handle, lib.pdf2_prepared_sampling_free)
        self.n_logprobs = sampling.n_logprobs

    def take(self) -> Any:
        """The native handle, now the caller's to free (start_prepared frees it)."""
        if self._h is None:
            raise GenerationError("this prepared sampling was used already")
        ffi.gc(self._h, None)  # no destructor any more: the engine frees it
        raw, self._h, self._raw = self._raw, None, None
        return raw


class NativeEngine:
    """One pdf2_batch_engine: n slots verified in one target decode per step.
    Not thread-safe: one thread drives it."""

    def __init__(self, handle: Any, config: EngineConfig, n_slots: int) -> None:
        if handle == ffi.NULL:
            raise GenerationError(_native.last_error())
        self._h = ffi.gc(handle, lib.pdf2_batch_engine_free)
        self.config = config
        self.n_slots = n_slots
        self.max_draft = int(lib.pdf2_batch_engine_max_draft(self._h))
        self.max_verify_rows = int(lib.pdf2_batch_engine_max_verify_rows(self._h))
        #: a step commits at most step_width + 1 tokens per slot (context paths go deeper than max_draft)
        self.step_width = int(lib.pdf2_batch_engine_step_width(self._h))
        # step buffers, made once: the step runs per token
        self._counts = np.zeros(n_slots, dtype=np.int32)
        self._tokens = np.zeros(n_slots * (self.step_width + 1), dtype=np.int32)
        self._counts_c = ffi.from_buffer("int32_t[]", self._counts)
        self._tokens_c = ffi.from_buffer("int32_t[]", self._tokens)
        self.step_wall_s = 0.0  # wall time in pdf2_batch_engine_step since creation

    @classmethod
    def owned(cls, model: Any, config: EngineConfig, *, n_slots: int, n_ctx_slot: int, n_threads: int,
              n_threads_batch: int, flash_attn: bool | None, drafters: Sequence[Drafter]) -> NativeEngine:
        """An engine owning its target context (n_slots sequences of n_ctx_slot tokens) on a loaded
        llama_model (ctypes pointer, e.g. Llama._model.model, which must outlive the engine), with
        one drafter per slot (none for plain decoding). flash_attn None: llama.cpp's choice."""
        handles = ffi.new("pdf2_drafter *[]", [d._h for d in drafters] or [ffi.NULL])
        fa = -1 if flash_attn is None else int(flash_attn)
        handle = lib.pdf2_batch_engine_new(_native.void_ptr(model), n_slots, n_ctx_slot, n_threads, n_threads_batch,
                                           fa, handles, len(drafters), *config.abi())
        return cls(handle, config, n_slots)

    @classmethod
    def borrowed(cls, ctx: Any, config: EngineConfig, *, drafter: Drafter | None,
                 feature_capture: Any = None, head_capture: Any = None) -> NativeEngine:
        """One slot in a llama_context the caller owns (ctypes pointer, e.g. Llama._ctx.ctx).
        feature_capture / head_capture: the context's CallbackCapture for the drafter's features /
        the lazy LM head (None: llama.cpp's taps / every verify row's logits)."""
        handle = lib.pdf2_batch_engine_new_borrowed(_native.void_ptr(ctx), _ptr(feature_capture),
                                                    _ptr(head_capture),
                                                    drafter._h if drafter is not None else ffi.NULL, *config.abi())
        return cls(handle, config, 1)

    def close(self) -> None:
        if self._h is not None:
            ffi.release(self._h)
            self._h = None

    def set_exact_batches(self, max_rows: int) -> None:
        """Exact mode over a target whose matmul kernels switch with the batch size: every target
        decode in plain decoding's shapes (verify decodes of at most max_rows rows, prompts in
        n_batch chunks from position 0, prefix reuse in whole chunks); 0: off."""
        check(lib.pdf2_batch_engine_set_exact_batches(self._h, int(max_rows)), "set_exact_batches")

    def release_target(self) -> None:
        """Turns a borrowed context's layer-input taps off again (call while it lives)."""
        if self._h is not None:
            lib.pdf2_batch_engine_release_target(self._h)

    # ------------------------------------------------------------ slots

    def start(self, slot: int, tokens: Sequence[int], sampling: SamplingRequest | PreparedSampling) -> None:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        buf = ffi.from_buffer("int32_t[]", arr)
        if isinstance(sampling, PreparedSampling):
            check(lib.pdf2_batch_engine_start_prepared(self._h, int(slot), buf, len(arr), sampling.take()), "start")
        else:
            check(lib.pdf2_batch_engine_start(self._h, int(slot), buf, len(arr), sampling.struct), "start")

    def set_context_drafts(self, slot: int, mode: str, key: str = "") -> None:
        """Context drafts for the slot's next requests: "off", "request" or "global" (past outputs
        under `key`, e.g. an API key). Needs an engine made with context drafts."""
        check(lib.pdf2_batch_engine_set_context_drafts(self._h, int(slot), mode_code(mode), key.encode("utf-8")),
              "set_context_drafts")

    def add_draft_source(self, name: str) -> None:
        """Adds a registered draft source to every slot (native draft_sources.cpp, e.g. "repeat"): its
        candidates join the merged trees beside the context's. Needs an engine made with context
        drafts, and idle slots."""
        check(lib.pdf2_batch_engine_add_draft_source(self._h, name.encode("utf-8")), "add_draft_source")

    def set_context_cache_limits(self, *, max_keys: int, max_documents: int, max_tokens: int) -> None:
        """Bounds of the global context cache (keys, and per key past outputs and their tokens); empties it."""
        check(lib.pdf2_batch_engine_set_context_cache_limits(self._h, int(max_keys), int(max_documents),
                                                             int(max_tokens)), "set_context_cache_limits")

    def set_head_mode(self, mode: str) -> None:
        """Which LM head the verifies run: "auto" (chosen from the measured costs: engine_stats' "head"
        and "head_chosen_by"), "lazy" (cut before the head, each row's run as the verify reads it) or
        "full" (every verify row's head in the decode's graph)."""
        codes = {"auto": 0, "lazy": 1, "full": 2}
        if mode not in codes:
            raise ValueError(f"head mode must be one of {sorted(codes)}, got {mode!r}")
        check(lib.pdf2_batch_engine_set_head_mode(self._h, codes[mode]), "set_head_mode")

    def set_lazy_head_group(self, rows: int) -> None:
        """Rows per lazy LM head product: 1, 8 (a group), or 0 (the engine times both and chooses)."""
        check(lib.pdf2_batch_engine_set_lazy_head_group(self._h, int(rows)), "set_lazy_head_group")

    def stop(self, slot: int) -> None:
        """Frees the slot (a no-op when it is idle)."""
        check(lib.pdf2_batch_engine_stop(self._h, int(slot)), "stop")

    def cached_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        arr = np.ascontiguousarray(tokens, dtype=np.int32)
        return check(lib.pdf2_batch_engine_cached_prefix(self._h, int(slot), ffi.from_buffer("int32_t[]", arr),
                                                         len(arr)), "cached_prefix")

    def step(self) -> list[list[int] | None]:
        """One target decode for all busy slots: per slot the committed tokens
        ([] = nothing this step, e.g. idle or mid-prefill; None = context full)."""
        t0 = time.perf_counter()
        rc = lib.pdf2_batch_engine_step(self._h, self._counts_c, self.n_slots, self._tokens_c, len(self._tokens))
        self.step_wall_s += time.perf_counter() - t0  # what the ledger's parts add up to, seen from here
        check(rc, "step")
        width = self.step_width + 1
        return [None if c < 0 else self._tokens[s * width: s * width + c].tolist()
                for s, c in enumerate(self._counts.tolist())]

    def logprobs(self, slot: int, committed: Sequence[int], n_top: int) -> list[TokenLogprob]:
        return step_logprobs(self._h, slot, list(committed), n_top)

    def stats(self) -> dict[str, Any]:
        """Engine-wide counters since creation (times, lazy head rows, graph builds...)."""
        return _native.take_json(lib.pdf2_batch_engine_stats_json(self._h), "stats")

    def slot_stats(self, slot: int) -> dict[str, Any]:
        """The counters of the slot's current or last request (drafted and accepted per position...)."""
        return _native.take_json(lib.pdf2_batch_engine_slot_stats_json(self._h, int(slot)), "slot_stats")

    # ------------------------------------------------------------ costs

    def set_costs(self, verify_s: Sequence[float], draft_s: Sequence[float], plain_s: float = 0.0,
                  learn: bool = False, head_s: float = 0.0, verify_full_s: Sequence[float] | None = None) -> None:
        """verify_s[B-1]: a decode of B rows; draft_s[n-1]: drafting n; plain_s: the plain step without the
        drafter's features (0: unknown), the baseline the cost model prices plain decoding at; head_s: the
        lazy LM head's product for one more row a verify reads (0: none; a verify committing k tokens reads
        k rows, its table entry one). learn: the
        costs were measured on this machine, and the steps as they run correct them (a plain step's price
        becomes what plain steps take; other decodes' the table scaled by what verify steps take).
        verify_full_s: the same decodes with every row's LM head in the decode's graph (the full head;
        None or zeros: not measured); with it the engine chooses the head the verifies run
        (set_head_mode) and prices with that head's table."""
        v = np.ascontiguousarray(verify_s, dtype=np.float64)
        d = np.ascontiguousarray(draft_s, dtype=np.float64)
        f = np.ascontiguousarray(verify_full_s if verify_full_s else [], dtype=np.float64)
        check(lib.pdf2_batch_engine_set_costs(self._h, ffi.from_buffer("double[]", v), len(v),
                                              ffi.from_buffer("double[]", d), len(d), float(plain_s),
                                              float(head_s), int(bool(learn)),
                                              ffi.from_buffer("double[]", f) if len(f) else ffi.NULL, len(f)),
              "set_costs")

    def measure_costs(self, prompt: Sequence[int], reps: int = 5) -> dict[str, list[float]]:
        """Times target decodes of 1..max_verify_rows tokens, drafter blocks and the plain step without
        the drafter's features after `prompt` (prefilled on slot 0, which must be idle); where the lazy
        LM head can run, verify_s holds its decodes and verify_full_s the full head's (else zeros)."""
        self.start(0, prompt, SamplingRequest())
        try:
            while not self.step()[0]:
                pass  # prefill slot 0
            v = np.zeros(self.max_verify_rows, dtype=np.float64)
            d = np.zeros(self.max_draft, dtype=np.float64)
            f = np.zeros(self.max_verify_rows, dtype=np.float64)
            plain, head = ffi.new("double *"), ffi.new("double *")
            check(lib.pdf2_batch_engine_measure_costs(self._h, 0, reps, ffi.from_buffer("double[]", v), len(v),
                                                      ffi.from_buffer("double[]", d), len(d), plain, head,
                                                      ffi.from_buffer("double[]", f)),
                  "measure_costs")
        finally:
            self.stop(0)
        return {"verify_s": v.tolist(), "draft_s": d.tolist(), "plain_s": float(plain[0]), "head_s": float(head[0]),
                "verify_full_s": f.tolist() if f.any() else []}

    def use_measured_costs(self, *, model_path: str, draft_path: str, device: str, n_threads: int,
                           lazy_head: bool, tokenize: Callable[[bytes], Sequence[int]], n_ctx: int,
                           capture: str | None = None,
                           run: Callable[[Callable[[], Any]], Any] = lambda f: f()) -> dict[str, list[float]] | None:
        """When the config needs them: the costs cached for these files and this machine, or
        measured now (through run(measure)), given to the cost model. Returns them (None: not needed)."""
        if not (self.config.measure_costs and (self.max_draft > 0 or self.config.context_nodes > 0)):
            return None
        key = draft_costs.cost_key(model_path, draft_path, device, n_threads, self.max_draft, lazy_head,
                                   self.max_verify_rows, capture)
        prompt = draft_costs.warmup_prompt(tokenize, n_ctx, self.max_verify_rows - 1)
        costs = draft_costs.load_or_measure(key, self.max_verify_rows, self.max_draft,
                                            lambda: run(lambda: self.measure_costs(prompt)))
        self.set_costs(costs["verify_s"], costs["draft_s"], costs.get("plain_s", 0.0), learn=True,
                       head_s=costs.get("head_s", 0.0), verify_full_s=costs.get("verify_full_s") or None)
        return costs
