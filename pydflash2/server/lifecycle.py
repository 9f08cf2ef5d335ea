"""The server's life: the port opens before the model loads, and a signal
drains the server before it exits.

Lifecycle is the ASGI app uvicorn serves. It loads the model on a thread at
startup and, until that is done, answers GET /health with 503
{"status": "loading"} and every other route with 503 + Retry-After; then it
hands requests to the real app (the FastAPI app of app.py).

DrainingServer is uvicorn's Server with its own SIGTERM/SIGINT handling:
stop listening, answer new requests on open connections with 503, let the
requests in flight finish for up to shutdown_timeout_s, then end the rest with
an error (a stream gets an error event and [DONE]), and only then let uvicorn
shut down. The process exits 0. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import uvicorn
from sse_starlette.sse import AppStatus
from starlette.types import ASGIApp, Receive, Scope, Send

from . import anthropic_messages
from .app import RETRY_AFTER_S
from .scheduler import Scheduler
from .schemas import error_body

log = logging.getLogger("pydflash2.server")
FLUSH_S = 5.0  # after the scheduler ended every request: time for handlers to send their last bytes


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "shutting_down"


@dataclass
class Loaded:
    app: ASGIApp
    scheduler: Scheduler
    close: Callable[[], None]  # frees the engine, once the scheduler has stopped


class Lifecycle:
    def __init__(self, load: Callable[[], Loaded], shutdown_timeout_s: float) -> None:
        self._load = load
        self.shutdown_timeout_s = shutdown_timeout_s
        self.phase = Phase.LOADING
        self.loaded: Loaded | None = None
        self.load_error: BaseException | None = None
        self.server: DrainingServer | None = None
        self.in_flight = 0  # HTTP requests handed to the app and not yet answered
        self._loader: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if self.phase is Phase.READY and self.loaded is not None:
            self.in_flight += 1
            try:
                await self.loaded.app(scope, receive, send)
            finally:
                self.in_flight -= 1
            return
        await self._unavailable(scope, send)

    async def _unavailable(self, scope: Scope, send: Send) -> None:
        status = self.phase.value
        if scope["path"] == "/health" and scope["method"] in ("GET", "HEAD"):
            body: dict[str, Any] = {"status": status}
        else:
            what = "the model is loading" if self.phase is Phase.LOADING else "the server is shutting down"
            body = (anthropic_messages.error_body(503, f"{what}; retry later")
                    if anthropic_messages.is_route(scope["path"])
                    else error_body(f"{what}; retry later", "server_unavailable", code=status))
        headers = [(b"content-type", b"application/json"), (b"retry-after", str(RETRY_AFTER_S).encode())]
        if self.phase is Phase.DRAINING:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(body).encode()})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._loop = asyncio.get_running_loop()
                self._loader = threading.Thread(target=self._load_in_thread, name="pydflash2-load", daemon=True)
                self._loader.start()
                await send({"type": "lifespan.startup.complete"})  # uvicorn opens the port now
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self._close)
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ------------------------------------------------------------ loading

    def _load_in_thread(self) -> None:
        t0 = time.perf_counter()
        try:
            loaded = self._load()
        except BaseException as e:  # the server cannot serve: say why, and exit
            self.load_error = e
            log.error("loading failed: %s", e)
            self._call_in_loop(self._exit_now)
            return
        self.loaded = loaded
        if self.phase is Phase.LOADING:
            self.phase = Phase.READY
            log.info("ready in %.1f s", time.perf_counter() - t0)

    def _close(self) -> None:
        if self._loader is not None:
            self._loader.join()  # a load cannot be interrupted: let it end, then free what it made
        if self.loaded is not None:
            self.loaded.scheduler.shutdown()
            self.loaded.close()
            self.loaded = None

    # ------------------------------------------------------------ shutdown

    def _call_in_loop(self, fn: Callable[[], Any]) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)

    def _exit_now(self) -> None:
        AppStatus.should_exit = True
        if self.server is not None:
            self.server.should_exit = True

    def on_signal(self) -> None:
        """From the signal handler: the first signal drains, a second one exits at once."""
        if self._drain_task is None:
            self._call_in_loop(self._start_drain)
        else:
            log.warning("second signal: ending every request now")
            self._call_in_loop(self._force)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    def _force(self) -> None:
        if self.loaded is not None:
            self.loaded.scheduler.abort_all("server shutting down")
        self._exit_now()

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        self.phase = Phase.DRAINING
        scheduler = self.loaded.scheduler if self.loaded is not None else None
        if scheduler is not None:
            scheduler.stop_accepting()
        if self.server is not None:
            for listener in getattr(self.server, "servers", []):
                listener.close()  # no new connections; open ones are answered 503
        log.warning("shutting down: %d request(s) in flight, waiting up to %.0f s", self.in_flight,
                    self.shutdown_timeout_s)
        deadline = loop.time() + self.shutdown_timeout_s
        while self.in_flight and loop.time() < deadline:
            await asyncio.sleep(0.05)
        if scheduler is not None and scheduler.pending():
            log.warning("shutdown timeout: ending the requests still running")
            scheduler.abort_all(f"server shutting down: the request did not finish within "
                                f"{self.shutdown_timeout_s:g} s")
        flush_until = loop.time() + FLUSH_S
        while self.in_flight and loop.time() < flush_until:
            await asyncio.sleep(0.05)
        self._exit_now()


class DrainingServer(uvicorn.Server):
    """uvicorn's server with Lifecycle's signal handling (and no re-raised signal after it: exit 0)."""

    def __init__(self, config: uvicorn.Config, lifecycle: Lifecycle) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        lifecycle.server = self

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.lifecycle.on_signal()
