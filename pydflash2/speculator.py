"""Speculator: DFlash/DFlash2 speculative decoding over a llama-cpp-python target.

    spec = Speculator(model="target.gguf", draft="drafter.gguf")
    out = spec.generate("Why is the sky blue?", max_tokens=128)
    out.text, out.tokens, out.finish_reason, out.stats
    for piece in spec.stream("Tell me a story", temperature=0.7, seed=1):
        print(piece, end="")

The draft-verify loop runs in native code: the engine the server runs
(pdf2_batch_engine_*), with one slot in the Llama's own context. This class
turns prompts into tokens (chat template or raw), releases text through stop
strings, and reports finish reasons and statistics.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

import llama_cpp
import numpy as np
from llama_cpp import _internals

from . import capture as feature_capture
from . import devices, exactness, utf8_pieces
from ._engine import EngineConfig, GenerationError, NativeEngine, exact_config, greedy_is_exact
from .chat_template import chat_prompt_tokens
from .cpu_threads import default_threads
from .draft_tree import tree_budget_spec
from .drafter import Drafter
from .exactness import ExactnessUnavailable
from .sampling import SamplerOptions, SamplingRequest, TokenLogprob, check_param, random_seed
from .text_stream import TextStream

FINISH_REASONS = ("stop", "length", "eos", "context")


@dataclass
class Completion:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" | "length" | "eos" | "context"
    stats: dict[str, Any] = field(default_factory=dict)
    # one per token when logprobs were asked for (else None)
    logprobs: list[TokenLogprob] | None = None


class Speculator:
    """Speculative decoding with a DFlash/DFlash2 drafter.

    model: a target GGUF path or a ready llama_cpp.Llama (its model, context and
    tokenizer are reused: no second load). draft: a dflash GGUF, or None for
    plain decoding through the same loop. n_max: drafts per block, "auto"
    (adaptive: measured costs, running acceptance) or an int (0 = plain
    decoding). selector (the path selector): "auto" (greedy at temperature 0, sampled
    otherwise), "greedy", "sample" or "viterbi". exact: refuse (with
    ExactnessUnavailable, before loading anything) unless the target's forward
    is batch-invariant here, so that greedy output is bit-identical to plain
    decoding whatever the logit margins; see pydflash2.exactness. flash_attn:
    for a target loaded from a path (default None: off, but on with a tree budget;
    exact mode keeps it off over >= 512 KV cells, where it is not batch-invariant). device: the
    drafter's ggml device, "auto" (first GPU, else CPU) or a name ("CPU",
    "CUDA0", "RPC0"). rpc_servers: "HOST:PORT[,...]" ggml RPC servers
    registered as devices first (as llama-server's --rpc), so that a target
    loaded here with n_gpu_layers > 0 splits across them. n_gpu_layers: target
    layers offloaded (llama-cpp-python's parameter; only when model is a path).
    capture: how the drafter's
    features are read, "auto" (llama.cpp's layer-input taps where the target's
    architecture has them, else the graph evaluation callback: see
    pydflash2.capture), "tap" or "callback". The callback needs a context made
    with it: for a target given as a path the Llama's own context is replaced by
    one (same parameters, same loaded model); for a Llama passed in, a second
    context (with its own KV cache) is made on its model and the Llama's own
    context is left untouched.

    lazy_head (default on): the verify decode stops after the target's final
    norm and the LM head runs only for the rows the verify reaches, once per
    committed token, as in plain decoding (the rest of a rejected block needs
    no logits). It needs pydflash2's evaluation callback in the target context:
    a target given as a path, or a Llama from load_target, has it; for another
    Llama every verify row's logits are computed as before. stats["lazy_head"]
    says which ran.

    tree_budget (default 0: the chain): each step verifies the best-first tree of
    that many drafted nodes over the DFlash2 lattice (pydflash2.draft_tree) in the
    same one target decode, instead of the greedy selector's one path, and commits the
    longest path the target's own choices follow (lossless, as the chain). n_max is
    then the tree's depth ("auto": the drafter's block). The target context needs a
    unified KV cache and 1 + tree_budget sequences: a target given as a path gets
    one; for a Llama of your own, load it with load_target(..., tree_budget=N).
    tree_budget="auto": each step verifies the chain, or a tree of up to
    draft_tree.AUTO_TREE_BUDGET nodes at the block's full depth, whichever the cost
    model prices faster (measured verify costs up to that many rows, the chain's
    acceptance, and the tree's path probabilities calibrated against its verifies);
    stats["tree_auto"] says what it chose.

    context_drafts (default "off"): "request" also drafts what followed earlier occurrences of the
    text's last tokens in the prompt and output, "global" also this Speculator's past outputs,
    merged with the lattice's candidates into one verified tree, each step priced by the cost model
    (pydflash2.context_drafts; works with draft=None). The target context needs what trees need: a
    target given as a path gets it; for a Llama of your own, load_target(..., context_drafts=...).
    stats count the drafts by source (lattice_/context_drafted and _accepted, propose_skipped)."""

    def __init__(
        self,
        model: str | os.PathLike[str] | llama_cpp.Llama,
        draft: str | os.PathLike[str] | None = None,
        *,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_max: int | str = "auto",
        selector: str = "auto",
        device: str | None = "auto",
        rpc_servers: str | Sequence[str] | None = None,
        n_gpu_layers: int = 0,
        verbose: bool = False,
        exact: bool = False,
        flash_attn: bool | None = None,
        capture: str = "auto",
        lazy_head: bool = True,
        tree_budget: int | str = 0,
        context_drafts: str = "off",
    ) -> None:
        config = EngineConfig.of(n_max, selector, tree_budget, drafting=draft is not None).with_context(context_drafts)
        if rpc_servers:
            devices.add_rpc_servers(rpc_servers)  # before the target loads: it may offload to them
        if config.drafting:
            devices.resolve_device(device)  # an unknown name fails before the target loads
        if capture not in ("auto", "tap", "callback"):
            raise ValueError(f"capture must be 'auto', 'tap' or 'callback', got {capture!r}")
        owns_llm = not isinstance(model, llama_cpp.Llama)
        if isinstance(model, llama_cpp.Llama):
            self.invariance = exactness.llama_invariance(model)
            if exact and not self.invariance:
                raise ExactnessUnavailable(exactness.unavailable_message(self.invariance))
            self.llm = model
        else:
            path = Path(model)
            if not path.is_file():
                raise FileNotFoundError(f"target model not found: {path}")
            self.llm, self.invariance = load_target(path, n_ctx=n_ctx, n_threads=n_threads, verbose=verbose,
                                                    exact=exact, flash_attn=flash_attn,
                                                    n_gpu_layers=n_gpu_layers, lazy_head=lazy_head,
                                                    tree_budget=config.tree_budget, context_drafts=context_drafts)
        self.exact = exact
        self.n_max = n_max
        if config.tree_auto and not owns_llm:
            # a Llama of your own: automatic trees up to what its context was made for (load_target)
            config = config.with_tree(min(config.tree_budget, max(1, int(self.llm.context_params.n_seq_max) - 1)))
        if config.trees and (not self.llm.context_params.kv_unified
                             or int(self.llm.context_params.n_seq_max) < config.target_sequences()):
            raise ValueError(f"tree verification (and context drafts) need a target context with a unified KV cache "
                             f"and {config.target_sequences()} sequences: load the Llama with "
                             "pydflash2.load_target(..., tree_budget=N, context_drafts=...)")
        self._flash_attn = self.llm.context_params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if exact:
            config = exact_config(config, self.invariance, flash_attn=self._flash_attn)
        #: the largest tree a step verifies (0: the chain); with tree_auto, each step's is chosen
        self.tree_budget = config.tree_budget
        self.tree_auto = config.tree_auto
        #: "off", "request" or "global" (pydflash2.context_drafts)
        self.context_drafts = context_drafts
        self._trees = config.trees
        self.selector = selector
        self.drafter: Drafter | None = None
        self.draft_path = None if draft is None else os.fspath(draft)
        if config.drafting:
            self.drafter = Drafter(
                draft,  # type: ignore[arg-type]
                self.llm.model_path,
                n_ctx=self.llm.n_ctx(),
                # drafting is generation work: the threads plain decoding uses (see BatchEngine::decode_batch)
                n_threads=self.llm.context_params.n_threads,
                device=device,
            )
        arch = str(self.llm.metadata.get("general.architecture", ""))
        #: "tap" or "callback": how the drafter's features are read (None: no drafter)
        self.capture_path: str | None = None
        self._capturing: feature_capture.CapturingContext | None = None
        target_ctx = self.llm._ctx.ctx
        # the callback context load_target made in place of the Llama's own, if any
        own_capturing: feature_capture.CapturingContext | None = getattr(self.llm, "_pdf2_capturing", None)
        if own_capturing is not None and own_capturing.context is not self.llm._ctx:
            own_capturing = None  # the Llama's context was replaced since
        if self.drafter is not None:
            self.capture_path = feature_capture.capture_path(arch) if capture == "auto" else capture
            if self.capture_path == "callback":
                self._capturing = own_capturing or feature_capture.capturing_context(self.llm, replace=owns_llm)
                target_ctx = self._capturing.ctx
        # the lazy LM head needs the callback in the context the engine decodes in
        head_capturing = self._capturing or own_capturing
        self.lazy_head = bool(lazy_head and (self.drafter is not None or config.context_nodes)
                              and head_capturing is not None)
        self._engine: NativeEngine | None = NativeEngine.borrowed(
            target_ctx, config, drafter=self.drafter,
            feature_capture=self._capturing.capture if self._capturing is not None else None,
            head_capture=head_capturing.capture if self.lazy_head and head_capturing is not None else None)
        self.max_draft = self._engine.max_draft
        self.max_verify_rows = self._engine.max_verify_rows
        if config.context_nodes:
            self._engine.set_context_drafts(0, context_drafts)  # "global": this Speculator's past outputs
        self._vocab = llama_cpp.llama_model_get_vocab(self.llm._model.model)
        # per token id, memoized: one dict lookup per generated token instead of a C call each
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._grammar_unsafe = utf8_pieces.GrammarUnsafeTokens(self.llm)  # the tokens a grammar must not draw
        self.costs: dict[str, list[float]] | None = None
        if self.drafter is not None or config.context_nodes:
            self.llm.reset()  # the measurement decodes in the Llama's context
            self.costs = self._engine.use_measured_costs(
                model_path=self.llm.model_path, draft_path=self.draft_path or "",
                device=self.drafter.device if self.drafter is not None else "CPU",
                n_threads=self.llm.context_params.n_threads, lazy_head=self.lazy_head,
                tokenize=lambda b: self.llm.tokenize(b, add_bos=True, special=False), n_ctx=self.llm.n_ctx(),
                capture=self.capture_path)

    def close(self) -> None:
        """Frees the engine and drafter and returns the target context to plain
        use (a Llama passed in stays usable)."""
        if getattr(self, "_engine", None) is not None:
            self._engine.release_target()
            self._engine.close()
            self._engine = None
        if self.drafter is not None:
            self.drafter.close()
            self.drafter = None
        capturing = getattr(self, "_capturing", None)
        if capturing is not None and capturing.context is not self.llm._ctx:
            capturing.close()  # our second context next to a Llama passed in
        self._capturing = None

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ prompts

    def tokenize_prompt(self, prompt: str | Sequence[int] | Sequence[dict[str, str]], chat: bool = True) -> list[int]:
        """Token ids of a prompt: ids as given; messages or (chat=True) a string
        through the model's chat template; else the raw string with BOS, like
        Llama.tokenize(prompt.encode(), add_bos=True, special=True)."""
        if isinstance(prompt, str):
            if not chat:
                return self.llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
            messages: Sequence[dict[str, str]] = [{"role": "user", "content": prompt}]
        elif len(prompt) > 0 and isinstance(prompt[0], dict):
            messages = prompt  # type: ignore[assignment]
        else:
            ids = [int(t) for t in prompt]  # type: ignore[arg-type]
            n_vocab = self.llm.n_vocab()
            bad = [t for t in ids if not 0 <= t < n_vocab]
            if bad:
                raise ValueError(f"token ids outside the vocabulary (0..{n_vocab - 1}): {bad[:5]}")
            return ids
        return chat_prompt_tokens(self.llm, messages)

    def _token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self.llm.detokenize([token])
        return piece

    def _is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    # ------------------------------------------------------------ engine

    def set_costs(self, verify_s: Sequence[float], draft_s: Sequence[float], plain_s: float = 0.0,
                  learn: bool = False, head_s: float = 0.0, verify_full_s: Sequence[float] | None = None) -> None:
        """The cost model's tables (NativeEngine.set_costs); learn: the steps as they run correct them;
        verify_full_s: the verifies with the full LM head, to choose the head by."""
        self._native.set_costs(verify_s, draft_s, plain_s, learn, head_s, verify_full_s)

    def measure_costs(self, prompt_tokens: Sequence[int], reps: int = 5) -> dict[str, list[float]]:
        """Times target decodes of 1..max_verify_rows tokens and drafter blocks after prompt_tokens."""
        self.llm.reset()  # the Llama object must not trust its KV cache after we used it
        return self._native.measure_costs(list(prompt_tokens), reps)

    @property
    def _native(self) -> NativeEngine:
        if self._engine is None:
            raise GenerationError("the Speculator is closed")
        return self._engine

    def _begin(self, tokens: list[int], sampling: SamplingRequest) -> int:
        """Starts the request on the engine's slot and prefills it; returns the first token."""
        self.llm.reset()  # the Llama object must not trust its KV cache after we used it
        self._native.start(0, tokens, sampling)
        try:
            first: list[int] = []
            while not first:  # prompt chunks, the last of which samples the first token
                first = self._step()
            return first[0]
        except BaseException:
            self._end()
            raise

    def _step(self) -> list[int]:
        """One draft-verify step: the committed tokens ([] while prefilling; [] and
        self.context_full once the context is full)."""
        out = self._native.step()[0]
        if out is None:
            self.context_full = True
            return []
        return out

    def _end(self) -> None:
        """Frees the slot (a no-op when it is idle)."""
        self._native.stop(0)

    def add_draft_source(self, name: str) -> None:
        """Adds a registered draft source (native `draft_sources.cpp`; "repeat": the last tokens'
        repeated run) whose candidates join the merged trees beside the context's; needs
        context_drafts other than "off". stats()["sources"] counts each source's drafts."""
        self._native.add_draft_source(name)

    def engine_stats(self) -> dict[str, Any]:
        """Engine-wide counters since creation (times, lazy head rows, graph builds...)."""
        return self._native.stats()

    def request_stats(self) -> dict[str, Any]:
        """The current or last request's counters (tokens, steps, tau, drafted/accepted per position...)."""
        return self._native.slot_stats(0)

    # ------------------------------------------------------------ generation

    def stream(
        self,
        prompt: str | Sequence[int] | Sequence[dict[str, str]],
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: str | Sequence[str] | None = None,
        chat: bool = True,
        **sampler: Unpack[SamplerOptions],
    ) -> Iterator[str]:
        """Yields text as it becomes final. When the generator is exhausted,
        self.last holds the Completion. Closing it early leaves the Speculator
        ready for the next request.

        The sampler chain is llama-cpp-python's, with llama.cpp's own samplers:
        logit_bias (token id -> added to its logit; -inf: never), the penalties
        (repeat_penalty, frequency_penalty, presence_penalty over the last
        repeat_last_n generated tokens, -1: all; llama-cpp-python's
        last_n_tokens_size is 64), grammar (GBNF text with a `root` rule, e.g.
        from pydflash2.json_schema_grammar, the server's JSON-schema
        converter), then top_k, top_p,
        min_p and temperature. Greedy output (temperature 0) is plain greedy
        decoding's with the same settings; drafts the grammar forbids are
        rejected at verification. logprobs: None (off), or N in 0..20: every
        token's log-probability and its N most likely alternatives, in
        Completion.logprobs (the log-softmax of the target's raw logits, as
        llama-cpp-python and llama-server report them). These keywords
        (pydflash2.sampling.SamplerOptions) default to no grammar, no bias,
        presence_penalty 0, frequency_penalty 0, repeat_penalty 1,
        repeat_last_n 64, logprobs None. A grammar's answer is valid UTF-8:
        the tokens through which llama.cpp's grammar would let invalid UTF-8
        in are masked (pydflash2.utf8_pieces)."""
        max_tokens = check_param("max_tokens", max_tokens)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        tokens = self.tokenize_prompt(prompt, chat=chat)
        if seed is None:
            seed = random_seed()
        t_start = time.perf_counter()
        engine0 = self.engine_stats()
        engine0["step_wall_s"] = self._native.step_wall_s
        self.context_full = False
        sampling = SamplingRequest(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, max_tokens=max_tokens,
            grammar_unsafe=self._grammar_unsafe() if sampler.get("grammar") else (), **sampler)
        n_top = sampling.n_logprobs
        first = self._begin(tokens, sampling)
        ttft = time.perf_counter() - t_start
        # the Python side of the request: everything between native calls (text, stop strings,
        # EOS checks, the consumer of this generator), summed interval by interval
        python_s = 0.0
        t_native_done = time.perf_counter()
        text = TextStream(self._token_bytes, stops)
        out: list[int] = []
        out_lp: list[TokenLogprob] = []
        finish = "length"
        pending = [first]
        pending_lp = self._native.logprobs(0, pending, n_top) if n_top >= 0 else []
        self.last: Completion | None = None
        try:
            while True:
                for i, tok in enumerate(pending):
                    if self._is_eog(tok):
                        finish = "eos"
                        break
                    out.append(tok)
                    if pending_lp:
                        out_lp.append(pending_lp[i])
                    piece = text.push(tok)
                    if piece:
                        yield piece
                    if text.stopped:
                        finish = "stop"
                        break
                    if len(out) >= max_tokens:
                        finish = "length"
                        break
                else:
                    python_s += time.perf_counter() - t_native_done
                    pending = self._step()
                    if n_top >= 0:
                        pending_lp = self._native.logprobs(0, pending, n_top)
                    t_native_done = time.perf_counter()
                    if pending:
                        continue
                    finish = "context"
                break
        finally:
            self._end()  # also when the consumer closes the generator early
        tail = text.finish()
        if tail:
            yield tail
        elapsed = time.perf_counter() - t_start
        python_s += elapsed - (t_native_done - t_start)
        self.llm.reset()
        self.last = Completion(text=text.text, tokens=out, finish_reason=finish,
                               stats=self._stats(engine0, len(out), ttft, elapsed, python_s),
                               logprobs=out_lp if n_top >= 0 else None)

    def generate(self, prompt: str | Sequence[int] | Sequence[dict[str, str]], **kwargs: Any) -> Completion:
        """Runs stream() to the end and returns the Completion."""
        for _ in self.stream(prompt, **kwargs):
            pass
        assert self.last is not None
        return self.last

    def _stats(self, engine0: dict[str, Any], n_tokens: int, ttft: float, elapsed: float,
               python_s: float) -> dict[str, Any]:
        s = self.request_stats()
        e = self.engine_stats()

        def spent(key: str) -> float:  # the engine's seconds during this request
            return float(e[key] - engine0[key])

        # the step ledger's parts during this request (native step_ledger.h: they add up to the engine's
        # steps), plus the Python side: together at most total_s
        ledger, ledger0 = e["ledger"], engine0["ledger"]
        phases: dict[str, Any] = {k: float(v - ledger0[k]) for k, v in ledger.items() if k.endswith("_s")}
        phases["python_s"] = python_s
        phases["n_steps"] = s["n_steps"]
        phases["rows"] = int(ledger["rows"] - ledger0["rows"])

        hist = s["n_max_histogram"]
        decode_s = max(elapsed - ttft, 1e-9)
        s.update(
            phases=phases,
            prefill_s=phases["prefill_s"],
            draft_s=spent("draft_s"),
            verify_decode_s=spent("verify_decode_s"),
            # the engine's steps timed from outside (the native calls): what the ledger's parts add up to
            engine_step_s=self._native.step_wall_s - engine0["step_wall_s"],
            verify_s=spent("verify_decode_s") + spent("verify_logic_s"),
            inject_s=spent("inject_s"),
            lazy_head=bool(e["lazy_head"]),
            lazy_head_rows=int(e["lazy_head_rows"] - engine0["lazy_head_rows"]),
            # the LM head the verifies ran ("lazy", "full", "full up to N rows") and how it was chosen
            # ("costs": the measured tables; "set"; "only")
            head=str(e["head"]),
            head_chosen_by=str(e["head_chosen_by"]),
            drafter_graph_builds=int(e["drafter_graph_builds"] - engine0["drafter_graph_builds"]),
            n_max="auto" if self.n_max == "auto" else int(self.n_max),
            tree_budget="auto" if self.tree_auto else self.tree_budget,
            tree_auto=e.get("tree_auto"),  # the automatic budget's model (engine-wide), else None
            context_drafts=self.context_drafts,
            capture_path=self.capture_path,  # how the drafter's features are read (None: no drafter)
            n_max_mean=float(np.dot(np.arange(len(hist)), hist) / max(1, sum(hist))),
            completion_tokens=n_tokens,
            ttft_s=ttft,
            total_s=elapsed,
            tokens_per_second=(n_tokens - 1) / decode_s if n_tokens > 1 else 0.0,
            # greedy output is plain decoding's, token for token
            exact=greedy_is_exact(self.invariance, self.max_verify_rows - 1, self.max_verify_rows,
                                  tree=self._trees, flash_attn=self._flash_attn),
        )
        if "lazy_head_error" in e:
            s["lazy_head_error"] = e["lazy_head_error"]
        return s


def load_target(
    path: str | os.PathLike[str],
    *,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    verbose: bool = False,
    exact: bool = False,
    flash_attn: bool | None = None,
    n_gpu_layers: int = 0,
    lazy_head: bool = True,
    tree_budget: int | str = 0,
    context_drafts: str = "off",
) -> tuple[llama_cpp.Llama, exactness.Invariance]:
    """Loads a target GGUF the way the Speculator runs it, and says whether its
    forward is batch-invariant. exact=True checks the build first and raises
    ExactnessUnavailable before anything is loaded (see exactness.py).
    flash_attn: None (default): off, but on with a tree budget (a tree row equals its
    path decoded alone only with flash attention: benchmarks/tree_attention.py); and
    off in exact mode over >= 512 KV cells.
    lazy_head: the Llama's context is made with pydflash2's evaluation callback
    (it costs nothing while unused), so that a Speculator on it runs the LM head
    only for the verify rows it reaches (see Speculator). tree_budget > 0: the
    context gets a unified KV cache and 1 + tree_budget sequences, what a
    Speculator's tree verification of that many nodes decodes in ("auto": of
    draft_tree.AUTO_TREE_BUDGET nodes); context_drafts other than "off": the sequences of
    its context trees as well (pydflash2.context_drafts)."""
    nodes, auto = tree_budget_spec(tree_budget)
    config = EngineConfig(n_max="auto", tree_budget=nodes, tree_auto=auto).with_context(context_drafts)
    flash_attn = exactness.flash_attn_for(n_ctx, exact, config.trees if flash_attn is None else flash_attn)
    if exact:
        build = exactness.build_invariance()
        if not build:
            raise ExactnessUnavailable(exactness.unavailable_message(build))
    # one count for generation and batches: llama-cpp-python would use every logical CPU for batches
    n_threads = default_threads(n_threads)
    llm = llama_cpp.Llama(model_path=os.fspath(path), n_ctx=n_ctx, n_threads=n_threads,
                          n_threads_batch=n_threads, n_batch=512, flash_attn=flash_attn, n_gpu_layers=n_gpu_layers,
                          verbose=verbose)
    inv = exactness.llama_invariance(llm)
    if exact and not inv:
        llm.close()
        raise ExactnessUnavailable(exactness.unavailable_message(inv))
    if config.trees:
        # a tree's branch sequences share the context's cells (a copy into a branch is metadata)
        llm.context_params.n_seq_max = config.target_sequences()
        llm.context_params.kv_unified = True
        if not lazy_head:  # with_lazy_head makes the new context below
            context = _internals.LlamaContext(model=llm._model, params=llm.context_params, verbose=verbose)
            old, llm._ctx = llm._ctx, context
            llm._stack.callback(context.close)
            old.close()
    if lazy_head:
        with_lazy_head(llm)
    return llm, inv


def with_lazy_head(llm: llama_cpp.Llama) -> llama_cpp.Llama:
    """Gives a Llama's context pydflash2's graph evaluation callback (a new
    context in place of its own, same parameters and model; the callback costs
    nothing while unused), so that Speculators on it run the LM head only for
    the verify rows they reach. Returns llm."""
    current = getattr(llm, "_pdf2_capturing", None)
    if current is None or current.context is not llm._ctx:
        llm._pdf2_capturing = feature_capture.capturing_context(llm, replace=True)
    return llm
