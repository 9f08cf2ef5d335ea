"""Scheduler: admits requests into the engine's slots and runs the step loop
on its own thread (continuous batching: a request waiting for a slot joins at
the next step, never behind a whole other request).

HTTP handlers submit a GenerationRequest and read its events from an asyncio
queue; the scheduler thread pushes them with call_soon_threadsafe. A request
flagged as cancelled (client gone) leaves its slot before the next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..text_stream import TextStream
from .engine import BatchEngine
from .metrics import ServerMetrics
from .timings import RequestClock, timings

log = logging.getLogger("pydflash2.server")


class QueueFull(Exception):
    """All slots are busy and --max-queue requests already wait."""


@dataclass
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0


@dataclass
class Finished:
    """The last event of a request."""

    text: str
    finish_reason: str  # "stop" | "length" | "aborted" | "error"
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None
    tokens: list[int] = field(default_factory=list)  # the completion's token ids
    timings: dict[str, Any] = field(default_factory=dict)  # llama-server's per-request figures, and speculation's
    logprobs: list[TokenLogprob] | None = None  # one per token in `tokens`, when asked for


# What the engine's take_logprobs(slot) gives per committed token: (token id, its
# logprob, [(id, logprob) of the top alternatives, best first]), under the target's
# distribution after its whole sampler chain.
TokenLogprob = tuple[int, float, list[tuple[int, float]]]


@dataclass
class Logprobs:
    """An event: the logprobs of the tokens delivered since the last one (streams)."""

    entries: list[TokenLogprob]


@dataclass(eq=False)
class GenerationRequest:
    """One request: inputs, and the queue its events go to (str pieces, then one Finished)."""

    prompt_tokens: list[int]
    sampling: Sampling
    max_tokens: int
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue[str | Logprobs | Finished] = field(default_factory=asyncio.Queue)
    # keyword arguments of engine.start() beyond sampling (grammar, penalties, logit_bias, logprobs)
    engine_options: dict[str, Any] = field(default_factory=dict)
    cancelled: bool = False
    t_arrival: float = field(default_factory=time.perf_counter)

    def emit(self, event: str | Logprobs | Finished) -> None:
        """From the scheduler thread."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:
            pass  # the event loop is closed: nobody listens any more


@dataclass(eq=False)
class _Active:
    req: GenerationRequest
    text: TextStream
    tokens: list[int] = field(default_factory=list)
    t_first: float | None = None
    clock: RequestClock = field(default_factory=RequestClock)
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Scheduler:
    def __init__(self, engine: BatchEngine, metrics: ServerMetrics, max_queue: int,
                 token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool]) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_queue = max_queue
        self._token_bytes = token_bytes
        self._is_eog = is_eog
        self._cond = threading.Condition()
        self._waiting: deque[GenerationRequest] = deque()
        self._active: dict[int, _Active] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="pydflash2-scheduler", daemon=True)
        self.fatal: str | None = None  # set when the engine failed beyond recovery

    # ------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self.metrics.engine_stats(self.engine.stats())
        self._thread.start()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, req: GenerationRequest) -> None:
        """Queues a request; QueueFull when every slot is busy and max_queue wait already."""
        with self._cond:
            if self.fatal is not None:
                raise RuntimeError(self.fatal)
            busy = len(self._active) + len(self._waiting)
            if busy >= self.engine.n_slots + self.max_queue:
                raise QueueFull()
            self._waiting.append(req)
            self.metrics.waiting.set(len(self._waiting))
            self._cond.notify_all()

    def cancel(self, req: GenerationRequest) -> None:
        with self._cond:
            req.cancelled = True
            self._cond.notify_all()

    def load(self) -> dict[str, int]:
        with self._cond:
            return {"slots": self.engine.n_slots, "busy": len(self._active), "waiting": len(self._waiting)}

    # ------------------------------------------------------------ scheduler thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._active:
                        self._cond.wait()
                    if self._stopping:
                        break
                    t_iter = time.perf_counter()
                    self._drop_cancelled_waiting()
                    self._admit()
                self._stop_cancelled()
                native_s = self._step() if self._active else 0.0
                self.metrics.python_seconds.inc(max(0.0, time.perf_counter() - t_iter - native_s))
        except Exception as e:  # the engine is in an unknown state: fail everything, refuse new work
            log.exception("scheduler failed")
            with self._cond:
                self.fatal = f"engine failure: {e}"
                for slot in list(self._active):
                    self._finish(slot, "error", error=self.fatal)
                while self._waiting:
                    self._reject(self._waiting.popleft(), self.fatal)
        finally:
            with self._cond:
                for slot in list(self._active):
                    self._finish(slot, "aborted")
                while self._waiting:
                    self._reject(self._waiting.popleft(), "server shutting down")

    def _drop_cancelled_waiting(self) -> None:
        kept = deque(r for r in self._waiting if not r.cancelled)
        for r in self._waiting:
            if r.cancelled:
                self.metrics.requests.labels(status="aborted").inc()
                r.emit(Finished("", "aborted", len(r.prompt_tokens), 0))
        self._waiting = kept
        self.metrics.waiting.set(len(self._waiting))

    def _admit(self) -> None:
        free = [s for s in range(self.engine.n_slots) if s not in self._active]
        while free and self._waiting:
            req = self._waiting.popleft()
            slot = self._pick_slot(free, req.prompt_tokens)
            s = req.sampling
            try:
                cached = self.engine.cached_prefix(slot, req.prompt_tokens)
                self.engine.start(slot, req.prompt_tokens, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                                  min_p=s.min_p, seed=s.seed, **req.engine_options)
            except Exception as e:  # bad parameters the handler did not catch: this request only
                self._reject(req, str(e))
                continue
            free.remove(slot)
            self._active[slot] = _Active(req, TextStream(self._token_bytes, req.stop),
                                         clock=RequestClock(n_prompt=len(req.prompt_tokens), n_cached=cached))
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.running.set(len(self._active))

    def _pick_slot(self, free: list[int], prompt: list[int]) -> int:
        """The free slot that holds the longest prefix of the prompt (its K/V is reused: a
        repeated prompt or system prompt is not prefilled again, as llama-server picks slots
        by prompt similarity); the lowest such slot."""
        if len(free) == 1:
            return free[0]
        tokens = np.ascontiguousarray(prompt, dtype=np.int32)  # once, not once per slot
        return max(free, key=lambda s: (self.engine.cached_prefix(s, tokens), -s))

    def _reject(self, req: GenerationRequest, message: str) -> None:
        self.metrics.requests.labels(status="error").inc()
        req.emit(Finished("", "error", len(req.prompt_tokens), 0, error=message))

    def _stop_cancelled(self) -> None:
        for slot, a in list(self._active.items()):
            if a.req.cancelled:
                self._finish(slot, "aborted")

    def _step(self) -> float:
        """One engine step and the delivery of its tokens; returns the seconds spent in the engine."""
        t0 = time.perf_counter()
        per_slot = self.engine.step()
        now = time.perf_counter()
        native_s = now - t0
        self.metrics.engine_stats(self.engine.stats())
        for slot, committed in enumerate(per_slot):
            a = self._active.get(slot)
            if a is None:
                continue
            if committed is None:  # the slot's context is full
                self._finish(slot, "length")
                continue
            if committed:
                a.clock.commit(len(committed), now)  # the first commit ends the prefill, each later one a verify step
            if committed and a.t_first is None:
                a.t_first = now
                self.metrics.ttft.observe(now - a.req.t_arrival)
                self.metrics.prompt_tokens.inc(len(a.req.prompt_tokens))
            entries = self.engine.take_logprobs(slot) if committed and "logprobs" in a.req.engine_options else None
            n_before = len(a.tokens)
            reason = self._deliver(a, committed)
            if entries is not None:
                kept = entries[: len(a.tokens) - n_before]  # not the EOS, nor what a stop cut off
                a.logprobs.extend(kept)
                if kept:
                    a.req.emit(Logprobs(kept))
            if reason is not None:
                self._finish(slot, reason)
        return native_s

    def _deliver(self, a: _Active, committed: list[int]) -> str | None:
        """Pushes committed tokens through EOS / stop strings / max_tokens; the finish reason once done."""
        for tok in committed:
            if self._is_eog(tok):
                return "stop"
            a.tokens.append(tok)
            piece = a.text.push(tok)
            if piece:
                a.req.emit(piece)
            if a.text.stopped:
                return "stop"
            if len(a.tokens) >= a.req.max_tokens:
                return "length"
        return None

    def _finish(self, slot: int, reason: str, error: str | None = None) -> None:
        a = self._active.pop(slot)
        try:
            self.engine.stop(slot)
        except Exception:  # stop only fails on a bad slot index: nothing to free then
            log.exception("stopping slot %d", slot)
        req = a.req
        n = len(a.tokens)
        if reason in ("stop", "length"):
            tail = a.text.finish()
            if tail:
                req.emit(tail)
            end = time.perf_counter()
            self.metrics.requests.labels(status="success").inc()
            self.metrics.request_success.labels(finished_reason=reason).inc()
            self.metrics.generation_tokens.inc(n)
            self.metrics.e2e.observe(end - req.t_arrival)
            if a.t_first is not None and n > 1:
                self.metrics.tpot.observe((end - a.t_first) / (n - 1))
        else:
            self.metrics.requests.labels(status=reason if reason == "aborted" else "error").inc()
            self.metrics.generation_tokens.inc(n)
        self.metrics.running.set(len(self._active))
        req.emit(Finished(a.text.text, reason, len(req.prompt_tokens), n, error=error, tokens=a.tokens,
                          timings=timings(a.clock, time.perf_counter(), n, self._slot_stats(slot)),
                          logprobs=a.logprobs if "logprobs" in req.engine_options else None))

    def _slot_stats(self, slot: int) -> dict[str, Any] | None:
        """The engine's own counters of the slot's last request, where it keeps them."""
        get = getattr(self.engine, "slot_stats", None)
        if get is None:
            return None
        try:
            return dict(get(slot))
        except Exception:  # figures only: the answer goes out without them
            log.exception("slot_stats(%d)", slot)
            return None

    def debug_state(self) -> dict[str, Any]:
        with self._cond:
            return {"active": sorted(self._active), "waiting": len(self._waiting)}
