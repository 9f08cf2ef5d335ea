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
from typing import Any, Protocol

import numpy as np

from ..sampling import TokenLogprob
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
    status: int = 500  # with finish_reason "error": the HTTP status it stands for
    tau: float | None = None  # tokens committed per target step once generating (None: none committed)
    stop_sequence: str | None = None  # with finish_reason "stop": the stop string that ended it (None: end of turn)
    # with finish_reason "length": cut where the context ends, not by the client's own limit (max_tokens absent,
    # or more than the context left): Responses' context_length_exceeded, Messages' model_context_window_exceeded
    context_full: bool = False


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
    # the engine's sampler chain for it, made before submit() on a worker thread (Scheduler.prepare)
    prepared: Any = None
    # whose past outputs may draft for it (the global context cache): a digest of its API key
    context_key: str = ""
    cancelled: bool = False
    t_arrival: float = field(default_factory=time.perf_counter)
    request_id: str | None = None
    deadline: float | None = None  # perf_counter time by which it ends (finish_reason "length")
    queue_deadline: float | None = None  # perf_counter time by which it must have a slot
    outcome: Finished | None = None  # its last event, once sent (the access log reads it)
    # max_tokens as asked, where more than the context left after the prompt (max_tokens is then capped there)
    max_tokens_asked: int | None = None
    # max_tokens is where the context ends (the client gave none, or more than the context left)
    max_tokens_is_context: bool = False

    def emit(self, event: str | Logprobs | Finished) -> None:
        """From the scheduler thread."""
        if isinstance(event, Finished):
            self.outcome = event
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
    n_steps: int = 0  # target steps that committed tokens to it

    @property
    def tau(self) -> float | None:
        return len(self.tokens) / self.n_steps if self.n_steps else None


RECOVERY_ATTEMPTS = 3  # engine re-creations tried after a fault before the server gives up
RECOVERY_BACKOFF_S = 1.0


class SchedulerHooks(Protocol):
    """Calls the step loop makes at its fault points, for tests that inject faults there
    (tests/support/pydflash2_testing/faults.py); a server started from the CLI has none."""

    def before_step(self) -> None: ...  # may raise, as a failed native step would

    def on_deliver(self, slot: int) -> None: ...  # may raise, as delivering a slot's tokens would

    def before_recover(self) -> None: ...


class Scheduler:
    def __init__(self, engine: BatchEngine, metrics: ServerMetrics, max_queue: int,
                 token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool],
                 hooks: SchedulerHooks | None = None) -> None:
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
        self.recovering = False  # re-creating the engine after a fault (/health: degraded)
        self.accepting = True  # False once shutdown began: submit() refuses
        self.progress_at = time.monotonic()  # the step loop's last sign of life (the stall watchdog reads it)
        self.n_faults = 0  # failed steps and slots
        self._hooks = hooks
        self._abort: str | None = None
        self._held = [0] * engine.n_slots  # tokens each slot's sequence holds (its last request's, when idle)
        self._last_request = [""] * engine.n_slots
        self._engine_stats: dict[str, Any] = {}  # the engine's counters after the last step

    # ------------------------------------------------------------ event-loop side

    def start(self) -> None:
        self._engine_stats = self.engine.stats()
        self.metrics.engine_stats(self._engine_stats)
        self._thread.start()

    def shutdown(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def submit(self, req: GenerationRequest) -> None:
        """Queues a request whose sampler chain prepare() made; QueueFull when every slot is busy
        and max_queue wait already."""
        if req.prepared is None:
            raise ValueError("prepare(req) first: the step loop starts requests with their chains made")
        with self._cond:
            if self.fatal is not None:
                raise RuntimeError(self.fatal)
            if not self.accepting:
                raise RuntimeError("server shutting down")
            busy = len(self._active) + len(self._waiting)
            if busy >= self.engine.n_slots + self.max_queue:
                raise QueueFull()
            if busy == 0:
                self.progress_at = time.monotonic()  # an idle loop was not stalled
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

    def pending(self) -> bool:
        with self._cond:
            return bool(self._active or self._waiting)

    def stop_accepting(self) -> None:
        with self._cond:
            self.accepting = False

    def abort_all(self, message: str) -> None:
        """Shutdown past its deadline: every request ends before the next step with an error (503)."""
        with self._cond:
            self._abort = message
            self._cond.notify_all()

    def slots(self) -> list[dict[str, Any]]:
        """Per slot, as llama-server's /slots: state, context, cached tokens, request id, tau so far."""
        out = []
        with self._cond:
            for s in range(self.engine.n_slots):
                a = self._active.get(s)
                entry: dict[str, Any] = {"id": s, "n_ctx": self.engine.n_ctx}
                if a is None:
                    entry.update(state="idle", n_cached=self._held[s], request_id=None,
                                 last_request_id=self._last_request[s] or None)
                else:
                    entry.update(state="prefill" if a.t_first is None else "generating",
                                 n_cached=len(a.req.prompt_tokens) + len(a.tokens), request_id=a.req.request_id,
                                 n_prompt=len(a.req.prompt_tokens), n_decoded=len(a.tokens), tau=a.tau)
                out.append(entry)
        return out

    # ------------------------------------------------------------ scheduler thread

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stopping and not self._waiting and not self._active:
                        self._cond.wait()
                    if self._stopping:
                        break
                    self.progress_at = time.monotonic()
                    t_iter = time.perf_counter()
                    self._end_aborted()
                    self._drop_cancelled_waiting()
                    self._expire_waiting(t_iter)
                try:
                    self._admit()  # takes the lock itself: not while a request's grammar compiles in start()
                    self._stop_cancelled()
                    self._expire_active(t_iter)
                    if self._hooks is not None and self._active:
                        self._hooks.before_step()
                    native_s = self._step() if self._active else 0.0
                except Exception as e:  # a native error: the engine's state is unknown
                    self._recover(e)
                    continue
                self.progress_at = time.monotonic()
                self.metrics.python_seconds.inc(max(0.0, time.perf_counter() - t_iter - native_s))
        except Exception as e:  # beyond recovery: fail everything, refuse new work
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
                    self._finish(slot, "error", error="server shutting down", status=503)
                while self._waiting:
                    self._reject(self._waiting.popleft(), "server shutting down", status=503)

    def _recover(self, error: Exception) -> None:
        """A step failed: its requests fail (the others wait on), and the engine is made anew."""
        log.error("engine fault, recovering: %s", error, exc_info=error)
        self.n_faults += 1
        self.metrics.faults.inc()
        with self._cond:
            self.recovering = True
            for slot in list(self._active):
                self._finish(slot, "error", error=f"engine fault: {error}")
        for attempt in range(1, RECOVERY_ATTEMPTS + 1):
            try:
                if self._hooks is not None:
                    self._hooks.before_recover()
                self.engine.recover()
                break
            except Exception as e:
                if attempt == RECOVERY_ATTEMPTS:
                    raise
                log.error("engine recovery %d/%d failed: %s", attempt, RECOVERY_ATTEMPTS, e)
                time.sleep(RECOVERY_BACKOFF_S * attempt)
        self._held = [0] * self.engine.n_slots
        self._engine_stats = self.engine.stats()
        self.metrics.engine_stats(self._engine_stats, baseline=True)
        self.metrics.recoveries.inc()
        self.progress_at = time.monotonic()
        with self._cond:
            self.recovering = False
        log.warning("engine recovered")

    def _end_aborted(self) -> None:
        if self._abort is None:
            return
        for slot in list(self._active):
            self._finish(slot, "error", error=self._abort, status=503)
        while self._waiting:
            self._reject(self._waiting.popleft(), self._abort, status=503)

    def _expire_waiting(self, now: float) -> None:
        """Requests past their queue bound or their deadline leave the queue (503)."""
        def expired(r: GenerationRequest) -> bool:
            return any(t is not None and now > t for t in (r.queue_deadline, r.deadline))

        if not any(expired(r) for r in self._waiting):
            return
        kept: deque[GenerationRequest] = deque()
        for r in self._waiting:
            if expired(r):
                self.metrics.timeouts.labels(stage="queue").inc()
                self._reject(r, f"no slot became free within {now - r.t_arrival:.1f} s; retry later", status=503)
            else:
                kept.append(r)
        self._waiting = kept
        self.metrics.waiting.set(len(self._waiting))

    def _expire_active(self, now: float) -> None:
        """--timeout: a request past its deadline ends as if it had reached max_tokens."""
        for slot, a in list(self._active.items()):
            if a.req.deadline is not None and now > a.req.deadline:
                self.metrics.timeouts.labels(stage="generation").inc()
                self._finish(slot, "length")

    def _drop_cancelled_waiting(self) -> None:
        kept = deque(r for r in self._waiting if not r.cancelled)
        for r in self._waiting:
            if r.cancelled:
                self.metrics.requests.labels(status="aborted").inc()
                r.emit(Finished("", "aborted", len(r.prompt_tokens), 0))
        self._waiting = kept
        self.metrics.waiting.set(len(self._waiting))

    def _admit(self) -> None:
        """Starts waiting requests on free slots. The lock is held only to take a request and to
        add it to the active ones. A request's grammar was compiled before it came (prepare(), on
        a worker thread: up to a second for one at the limits), so the step loop never waits for it."""
        free = [s for s in range(self.engine.n_slots) if s not in self._active]  # _active: this thread's
        while free:
            with self._cond:
                if not self._waiting:
                    break
                req = self._waiting.popleft()
            try:
                slot = self._pick_slot(free, req.prompt_tokens)
            except Exception:  # the engine failed: the request waits for the recovered one
                with self._cond:
                    self._waiting.appendleft(req)
                raise
            try:
                cached = self.engine.cached_prefix(slot, req.prompt_tokens)
                prepared, req.prepared = req.prepared, None  # made on a worker thread (prepare); start takes it
                self.engine.start(slot, req.prompt_tokens, prepared, context_key=req.context_key)
            except Exception as e:  # parameters the engine refuses (the handler checks them first): this request
                self._reject(req, str(e), status=400)
                continue
            free.remove(slot)
            with self._cond:
                self._active[slot] = _Active(req, TextStream(self._token_bytes, req.stop),
                                             clock=RequestClock(n_prompt=len(req.prompt_tokens), n_cached=cached,
                                                                ledger0=self._engine_stats.get("ledger")))
                self._last_request[slot] = req.request_id or ""
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.running.set(len(self._active))

    def prepare(self, req: GenerationRequest) -> None:
        """Makes the request's sampler chain (its grammar parsed) before submit(), on the caller's
        thread: the step loop then never waits for a grammar (a slow one delays only its request).
        A value the engine refuses raises here."""
        s = req.sampling
        # max_tokens: no step drafts past the request's last token (rows verified there are thrown away)
        req.prepared = self.engine.prepare(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                                           seed=s.seed, max_tokens=req.max_tokens, **req.engine_options)

    def _pick_slot(self, free: list[int], prompt: list[int]) -> int:
        """The free slot that holds the longest prefix of the prompt (its K/V is reused: a
        repeated prompt or system prompt is not prefilled again, as llama-server picks slots
        by prompt similarity); the lowest such slot."""
        if len(free) == 1:
            return free[0]
        tokens = np.ascontiguousarray(prompt, dtype=np.int32)  # once, not once per slot
        return max(free, key=lambda s: (self.engine.cached_prefix(s, tokens), -s))

    def _reject(self, req: GenerationRequest, message: str, status: int = 500) -> None:
        self.metrics.requests.labels(status="invalid" if status == 400 else "error").inc()
        req.emit(Finished("", "error", len(req.prompt_tokens), 0, error=message, status=status))

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
        self._engine_stats = self.engine.stats()
        self.metrics.engine_stats(self._engine_stats)
        for slot, committed in enumerate(per_slot):
            a = self._active.get(slot)
            if a is None:
                continue
            if committed is None:  # the slot's context is full
                self._finish(slot, "length", context_full=True)
                continue
            if committed:
                a.clock.commit(len(committed), now)  # the first commit ends the prefill, each later one a verify step
            if committed and a.t_first is None:
                a.t_first = now
                self.metrics.ttft.observe(now - a.req.t_arrival)
                self.metrics.prompt_tokens.inc(len(a.req.prompt_tokens))
            try:
                if self._hooks is not None:
                    self._hooks.on_deliver(slot)
                entries = (self.engine.logprobs(slot, committed) if committed and "logprobs" in a.req.engine_options
                           else None)
                n_before = len(a.tokens)
                reason = self._deliver(a, committed)
                a.n_steps += bool(committed)  # after the tokens: /slots, reading meanwhile, never sees tau < 1
                if entries is not None:
                    kept = entries[: len(a.tokens) - n_before]  # not the EOS, nor what a stop cut off
                    a.logprobs.extend(kept)
                    if kept:
                        a.req.emit(Logprobs(kept))
            except Exception as e:  # this slot's text handling failed: only its request fails
                log.exception("delivering slot %d", slot)
                self.n_faults += 1
                self.metrics.faults.inc()
                self._finish(slot, "error", error=f"slot {slot} failed: {e}")
                continue
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

    def _finish(self, slot: int, reason: str, error: str | None = None, status: int = 500,
                context_full: bool = False) -> None:
        a = self._active.pop(slot)
        self._held[slot] = len(a.req.prompt_tokens) + len(a.tokens)
        try:
            self.engine.stop(slot)
        except Exception:  # stop only fails on a bad slot index: nothing to free then
            log.exception("stopping slot %d", slot)
        req = a.req
        n = len(a.tokens)
        context_full = reason == "length" and (context_full or req.max_tokens_is_context and n >= req.max_tokens)
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
                          timings=timings(a.clock, time.perf_counter(), n, self._slot_stats(slot),
                                          self._engine_stats.get("ledger")),
                          logprobs=a.logprobs if "logprobs" in req.engine_options else None,
                          status=status, tau=a.tau, stop_sequence=a.text.matched, context_full=context_full))

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
