"""Wiring: serve with uvicorn at once (lifecycle answers "loading"), load the
target and drafters into a BatchEngine on a thread, start the Scheduler, and
hand requests to the FastAPI app."""

from __future__ import annotations

import ctypes
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import uvicorn

from ..chat_template import ChatTemplate
from ..grammar_limits import GrammarLimits
from ..models import resolve_target
from .access_log import AccessLog
from .app import SamplingDefaults, ServerConfig, Tokenizer, create_app
from .auth import bind_warning
from .cors import CorsOptions, with_cors
from .engine import BatchEngine
from .lifecycle import DrainingServer, Lifecycle, Loaded
from .metrics import ServerMetrics
from .scheduler import Scheduler, SchedulerHooks

log = logging.getLogger("pydflash2.server")


@dataclass
class ServerOptions:
    model: str = "smollm2"
    draft: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    n_ctx: int = 4096
    parallel: int = 1
    n_max: int | str = "auto"
    tree_budget: int | str = 0  # > 0: each slot verifies a best-first tree of this many drafted nodes; "auto"
    context_drafts: str = "global"  # pydflash2.context_drafts: off, request, global (past outputs per API key)
    selector: str = "auto"
    threads: int | None = None
    device: str | None = None
    n_gpu_layers: int = 0
    exact: bool = False
    flash_attn: bool | None = None  # None: off, but on with a tree budget (as load_target)
    api_keys: tuple[str, ...] = ()
    max_queue: int = 64
    model_alias: str | None = None
    max_body: int = 1 << 20
    log_level: str = "info"
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    timeout: float | None = 600.0  # per request, from arrival (llama-server's -to)
    queue_timeout: float | None = 120.0
    body_timeout: float = 30.0
    stall_timeout: float = 60.0
    shutdown_timeout: float = 30.0
    # an idle keep-alive connection is closed after this long; longer than clients' own pool expiry
    # (httpx, so the openai package: 5 s), so that a client never reuses a connection the server is closing
    keep_alive_timeout: float = 30.0
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    grammar_limits: GrammarLimits = field(default_factory=GrammarLimits)
    # the step loop's fault points, for tests only (pydflash2_testing.fault_server); no CLI option sets it
    hooks: SchedulerHooks | None = None
    cors: CorsOptions = field(default_factory=CorsOptions)


def token_piece(vocab: Any, token: int) -> bytes:
    """A token's text with special tokens spelled out (llama.cpp's common_token_to_piece, as
    llama-server's /detokenize uses it); llama-cpp-python's own helpers stop at 32 bytes."""
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[:n]


def load(opts: ServerOptions) -> Loaded:
    """The engine, the scheduler (started) and the FastAPI app: what the server needs to serve."""
    model_path = resolve_target(opts.model)
    # flash attention as --flash-attn asks: off (llama-cpp-python's default), but on with a tree budget;
    # --exact: the engine's checks and caps are Speculator(exact=True)'s (pydflash2._engine.exact_config)
    trees = bool(opts.tree_budget) or opts.context_drafts != "off"  # context drafts verify trees too
    flash_attn = trees if opts.flash_attn is None else opts.flash_attn
    engine = BatchEngine(model_path, opts.draft, n_slots=opts.parallel, n_ctx=opts.n_ctx, n_threads=opts.threads,
                         n_max=opts.n_max, selector=opts.selector, device=opts.device, n_gpu_layers=opts.n_gpu_layers,
                         flash_attn=flash_attn, tree_budget=opts.tree_budget, exact=opts.exact,
                         context_drafts=opts.context_drafts)
    llm = engine.llm
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    model_id = opts.model_alias or Path(model_path).stem
    metrics = ServerMetrics(engine.n_slots, engine.max_draft, model_name=model_id)
    scheduler = Scheduler(
        engine, metrics, opts.max_queue,
        token_bytes=lambda t: llm.detokenize([t]),
        is_eog=lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t)),
        hooks=opts.hooks,
    )
    try:
        template: ChatTemplate | None = ChatTemplate.of(llm)
    except ValueError:
        template = None
    tokenizer = Tokenizer(
        raw=lambda text: llm.tokenize(text.encode("utf-8"), add_bos=True, special=True),
        n_vocab=llm.n_vocab(),
        tokenize=lambda text, add_special, parse_special: llm.tokenize(text.encode("utf-8"), add_bos=add_special,
                                                                       special=parse_special),
        piece=lambda t: token_piece(vocab, t),
        template=template,
        vocab=vocab,
    )
    config = ServerConfig(model_id=model_id, n_ctx=opts.n_ctx, api_keys=opts.api_keys, max_body_bytes=opts.max_body,
                          defaults=opts.defaults, body_timeout_s=opts.body_timeout,
                          request_timeout_s=opts.timeout, queue_timeout_s=opts.queue_timeout,
                          stall_timeout_s=opts.stall_timeout, grammar_limits=opts.grammar_limits)
    app = create_app(scheduler, tokenizer, config)
    scheduler.start()
    log.info("serving '%s' with %d slot(s) of %d tokens, drafter %s", model_id, opts.parallel, opts.n_ctx,
             opts.draft or "none")
    return Loaded(app=app, scheduler=scheduler, close=engine.close)


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("pydflash2.server", "pydflash2.access"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False


def serve(opts: ServerOptions) -> int:
    """Serves until SIGTERM/SIGINT (then drains; returns 0). A model that fails to load raises its error."""
    _setup_logging(opts.log_level)
    warning = bind_warning(opts.host, opts.api_keys)
    if warning:
        log.warning(warning)
    lifecycle = Lifecycle(lambda: load(opts), shutdown_timeout_s=opts.shutdown_timeout)
    # the access log outermost (every answer gets its request id), then CORS (every answer, 503s included)
    app = AccessLog(with_cors(lifecycle, opts.cors))
    config = uvicorn.Config(app, host=opts.host, port=opts.port, log_level=opts.log_level,
                            access_log=False, timeout_graceful_shutdown=5,
                            timeout_keep_alive=opts.keep_alive_timeout, ssl_keyfile=opts.ssl_keyfile,
                            ssl_certfile=opts.ssl_certfile, lifespan="on")
    scheme = "https" if opts.ssl_certfile else "http"
    print(f"pydflash2 server: {scheme}://{opts.host}:{opts.port} (loading the model)", file=sys.stderr, flush=True)
    DrainingServer(config, lifecycle).run()
    if lifecycle.load_error is not None:
        raise lifecycle.load_error
    return 0
