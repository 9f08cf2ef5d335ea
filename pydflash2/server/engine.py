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

import os
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llama_cpp

from .. import exactness, utf8_pieces
from .._engine import EngineConfig, NativeEngine, PreparedSampling, exact_config
from ..cpu_threads import default_threads
from ..drafter import Drafter
from ..exactness import ExactnessUnavailable
from ..sampling import SamplingRequest, TokenLogprob

_TOKENIZER_CTX = 256  # the Llama's own context: unused for decoding


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
    decoding. n_max, selector, device, tree_budget, exact: as for Speculator (each
    slot verifies its own tree inside the shared decode; the context then has a
    unified KV cache; exact mode's checks and caps are _engine.exact_config's).
    flash_attn: None = llama.cpp's choice (exact mode: off, but on with a tree,
    and off where exactness.flash_attn_for says)."""

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
        exact: bool = False,
        context_drafts: str = "off",
    ) -> None:
        config = EngineConfig.of(n_max, selector, tree_budget, drafting=draft is not None).with_context(context_drafts)
        max_sequences = llama_cpp.llama_max_parallel_sequences()
        if config.tree_auto:  # every slot's branches need sequences of their own
            config = config.with_tree(max(1, min(config.tree_budget, max_sequences // max(1, n_slots) - 1)))
        if config.context_nodes and n_slots * config.target_sequences() > max_sequences:
            raise ValueError(f"context drafts need {config.target_sequences()} sequences per slot and llama.cpp allows "
                             f"{max_sequences} in all: use at most {max_sequences // config.target_sequences()} slots "
                             "(--parallel), or --context-drafts off")
        path = Path(model)
        if not path.is_file():
            raise FileNotFoundError(f"target model not found: {path}")
        if draft is not None and not Path(draft).is_file():
            raise FileNotFoundError(f"drafter not found: {draft}")
        kv_cells = n_ctx * (n_slots if config.trees else 1)  # a tree's unified cache: every slot's cells
        if exact:  # before anything loads, as Speculator(exact=True)
            build = exactness.build_invariance()
            if not build:
                raise ExactnessUnavailable(exactness.unavailable_message(build))
            # as load_target: off, but on with a tree; off where it would split a token's keys
            wanted = config.trees if flash_attn is None else flash_attn
            flash_attn = exactness.flash_attn_for(kv_cells, True, wanted)
        # One thread count for every decode. llama-cpp-python's defaults (cpu_count // 2 for one-row decodes,
        # cpu_count for batches) would run our verify batches on every core: on a machine with other work,
        # ggml's barriers then wait on descheduled threads and a step gets many times slower.
        threads = default_threads(n_threads)
        self.llm = llama_cpp.Llama(model_path=str(path), n_ctx=_TOKENIZER_CTX, n_batch=64, n_threads=threads,
                                   n_threads_batch=threads, n_gpu_layers=n_gpu_layers, verbose=verbose)
        self._grammar_unsafe = utf8_pieces.GrammarUnsafeTokens(self.llm)  # the tokens a grammar must not draw
        #: exact mode: the target's batch invariance in the engine's context (exactness.py), else None
        self.invariance: exactness.Invariance | None = None
        if exact:
            assert flash_attn is not None
            self.invariance = exactness.model_invariance(self.llm, flash_attn=flash_attn, n_ctx=kv_cells)
            try:
                config = exact_config(config, self.invariance, flash_attn=flash_attn)
            except ExactnessUnavailable:
                self.llm.close()
                raise
        self.exact = exact
        self.flash_attn = flash_attn
        self.n_threads = threads
        self.model_path = str(path)
        self.n_slots = int(n_slots)
        self.n_ctx = int(n_ctx)
        self.n_max: int | str = config.n_max if config.n_max != "block" else "auto"
        self.config = config
        self.drafters: list[Drafter] = []
        if config.drafting:
            # one copy of the weights; each slot its own cache (its sequence's context)
            first = Drafter(draft, self.model_path, n_ctx=self.n_ctx, n_threads=threads,  # type: ignore[arg-type]
                            device=device)
            self.drafters = [first] + [Drafter.sharing_weights(first, n_ctx=self.n_ctx)
                                       for _ in range(self.n_slots - 1)]
            self._ready_drafters()
        self.tree_budget = config.tree_budget
        self.tree_auto = config.tree_auto
        #: "off", "request" or "global" (pydflash2.context_drafts): every request's, under its key
        self.context_drafts = context_drafts if config.context_nodes else "off"
        self._native = self._new_native()
        self.max_draft = self._native.max_draft
        self.max_verify_rows = self._native.max_verify_rows
        self._n_logprobs: dict[int, int] = {}  # per slot: its request's logprobs count (-1: none)
        self.costs: dict[str, list[float]] | None = None
        if self.drafters or config.context_nodes:
            self.costs = self._native.use_measured_costs(
                model_path=self.model_path, draft_path=os.fspath(draft) if draft is not None else "",
                device=self.drafters[0].device if self.drafters else "CPU",
                n_threads=threads, lazy_head=False,
                tokenize=lambda b: self.llm.tokenize(b, add_bos=True, special=False), n_ctx=self.n_ctx,
                run=_on_own_thread)

    def _ready_drafters(self) -> None:
        for d in self.drafters:
            # a drafter per slot: each keeps few graph shapes, so that the server's memory does
            # not grow with the shapes its requests happen to meet (a rebuild costs ~1 ms)
            d.set_max_graphs(SLOT_DRAFTER_GRAPHS)
            d.reserve_graphs()  # all memory at startup: it stays flat while serving

    def _new_native(self) -> NativeEngine:
        """The native engine: one target context over the loaded model, and the slots' drafters."""
        native = NativeEngine.owned(self.llm._model.model, self.config, n_slots=self.n_slots, n_ctx_slot=self.n_ctx,
                                    n_threads=self.n_threads, n_threads_batch=self.n_threads,
                                    flash_attn=self.flash_attn, drafters=self.drafters)
        if self.invariance is not None and self.invariance.max_batch is not None:
            # rows depend on their batch's shape here: every decode in plain decoding's shapes
            native.set_exact_batches(self.invariance.max_batch)
        return native

    def recover(self) -> None:
        """After a failed step: a new target context and new drafter caches (over the same loaded
        weights), made as the constructor makes them; every slot is idle and empty again. The
        measured costs carry over."""
        if self._native is not None:
            self._native.close()
            self._native = None  # type: ignore[assignment]
        if self.drafters:
            old = self.drafters
            self.drafters = [Drafter.sharing_weights(old[0], n_ctx=self.n_ctx) for _ in range(self.n_slots)]
            for d in old:
                d.close()
            self._ready_drafters()
        self._native = self._new_native()
        if self.costs is not None:
            self.set_costs(self.costs["verify_s"], self.costs["draft_s"], self.costs.get("plain_s", 0.0), learn=True,
                           head_s=self.costs.get("head_s", 0.0), verify_full_s=self.costs.get("verify_full_s") or None)

    def close(self) -> None:
        if getattr(self, "_native", None) is not None:
            self._native.close()
            self._native = None  # type: ignore[assignment]
        for d in self.drafters:
            d.close()
        self.drafters = []

    # ------------------------------------------------------------ slots

    def prepare(self, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
                seed: int = 0, max_tokens: int = 0, grammar: str | None = None,
                logit_bias: Mapping[int, float] | None = None, presence_penalty: float = 0.0,
                frequency_penalty: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                logprobs: int | None = None) -> PreparedSampling:
        """A request's sampler chain, made for start(): the grammar parsed and every value checked.
        It reads only the loaded model, so any thread may call it while another steps the engine
        (the server makes it on a worker thread: a long grammar parse then holds up only its own
        request). The chain and logprobs as for Speculator.stream (pydflash2.sampling); a bad value
        raises GenerationError (ValueError for malformed Python values). max_tokens > 0: no step
        drafts past that many tokens. logprobs N: logprobs(slot, committed) after each step."""
        sampling = SamplingRequest(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_tokens=max_tokens,
            grammar=grammar, logit_bias=logit_bias, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
            logprobs=logprobs, grammar_unsafe=self._grammar_unsafe() if grammar else ())
        return PreparedSampling(self.llm._model.model, self.n_ctx, sampling)

    def start(self, slot: int, tokens: Sequence[int], prepared: PreparedSampling | None = None, *,
              context_key: str = "", **options: Any) -> None:
        """Queues a request on an idle slot, with a chain from prepare() (which it takes), or made
        now from prepare()'s keyword arguments. A bad value leaves the slot idle. context_key: whose
        past outputs draft for it (context_drafts "global": one cache per key)."""
        if prepared is None:
            prepared = self.prepare(**options)
        elif options:
            raise TypeError("start() takes a prepared chain or the options to make one, not both")
        if self.context_drafts != "off":
            self._native.set_context_drafts(slot, self.context_drafts, context_key)
        n_logprobs = prepared.n_logprobs
        self._native.start(slot, tokens, prepared)
        self._n_logprobs[int(slot)] = n_logprobs

    def logprobs(self, slot: int, committed: Sequence[int]) -> list[TokenLogprob]:
        """Logprobs of the tokens the last step() committed on `slot` (its list there), for a
        request started with logprobs=N (else []): the target's log-softmax of each token,
        bonus or correction token included, and its N most likely alternatives."""
        n_top = self._n_logprobs.get(int(slot), -1)
        if n_top < 0 or not committed:
            return []
        return self._native.logprobs(slot, committed, n_top)

    def cached_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """Prompt tokens an idle slot already holds (start() there prefills only the rest)."""
        return self._native.cached_prefix(slot, tokens)

    def stop(self, slot: int) -> None:
        self._native.stop(slot)

    def step(self) -> list[list[int] | None]:
        """One target decode for all busy slots: per slot the committed tokens
        ([] = nothing this step, e.g. idle or mid-prefill; None = context full)."""
        return self._native.step()

    def stats(self) -> dict[str, Any]:
        return self._native.stats()

    def set_context_cache_limits(self, *, max_keys: int, max_documents: int, max_tokens: int) -> None:
        """Bounds of the global context cache (pydflash2.context_drafts); empties it."""
        self._native.set_context_cache_limits(max_keys=max_keys, max_documents=max_documents, max_tokens=max_tokens)

    def slot_stats(self, slot: int) -> dict[str, Any]:
        """The counters of the slot's current or last request (drafted and accepted per position...)."""
        return self._native.slot_stats(slot)

    def set_costs(self, verify_s: Sequence[float], draft_s: Sequence[float], plain_s: float = 0.0,
                  learn: bool = False, head_s: float = 0.0, verify_full_s: Sequence[float] | None = None) -> None:
        """The cost model's tables (NativeEngine.set_costs); learn: the steps as they run correct them;
        verify_full_s: the verifies with the full LM head, to choose the head by."""
        self._native.set_costs(verify_s, draft_s, plain_s, learn, head_s, verify_full_s)
