"""Wiring: load the target and drafters into a BatchEngine, start the
Scheduler, and serve the FastAPI app with uvicorn."""

from __future__ import annotations

import contextlib
import ctypes
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import uvicorn
from fastapi import FastAPI

from .. import exactness
from ..chat_template import ChatTemplate
from ..models import resolve_target
from .app import SamplingDefaults, ServerConfig, Tokenizer, create_app
from .engine import BatchEngine
from .metrics import ServerMetrics
from .scheduler import Scheduler


@dataclass
class ServerOptions:
    model: str = "smollm2"
    draft: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    n_ctx: int = 4096
    parallel: int = 1
    n_max: int | str = "auto"
    selector: str = "auto"
    threads: int | None = None
    device: str | None = None
    n_gpu_layers: int = 0
    exact: bool = False
    flash_attn: bool = False
    api_key: str | None = None
    max_queue: int = 64
    model_alias: str | None = None
    max_body: int = 1 << 20
    log_level: str = "warning"
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)


def _exact_flash_attn(opts: ServerOptions) -> bool:
    """--exact: refuse a build whose forward is not batch-invariant. Flash
    attention as --flash-attn asks (default off, llama-cpp-python's default);
    exactness.flash_attn_for keeps it off in exact mode over >= 512 KV cells."""
    if opts.exact:
        inv = exactness.build_invariance()
        if not inv:
            raise RuntimeError(exactness.unavailable_message(inv))
    return exactness.flash_attn_for(opts.n_ctx, opts.exact, opts.flash_attn)


def token_piece(vocab: Any, token: int) -> bytes:
    """A token's text with special tokens spelled out (llama.cpp's common_token_to_piece, as
    llama-server's /detokenize uses it); llama-cpp-python's own helpers stop at 32 bytes."""
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[:n]


def build_app(opts: ServerOptions) -> tuple[FastAPI, BatchEngine, Scheduler]:
    model_path = resolve_target(opts.model)
    flash_attn = _exact_flash_attn(opts)
    engine = BatchEngine(model_path, opts.draft, n_slots=opts.parallel, n_ctx=opts.n_ctx, n_threads=opts.threads,
                         n_max=opts.n_max, selector=opts.selector, device=opts.device, n_gpu_layers=opts.n_gpu_layers,
                         flash_attn=flash_attn)
    llm = engine.llm
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    metrics = ServerMetrics(engine.n_slots, engine.max_draft)
    scheduler = Scheduler(
        engine, metrics, opts.max_queue,
        token_bytes=lambda t: llm.detokenize([t]),
        is_eog=lambda t: bool(llama_cpp.llama_vocab_is_eog(vocab, t)),
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
    model_id = opts.model_alias or Path(model_path).stem
    config = ServerConfig(model_id=model_id, n_ctx=opts.n_ctx, api_key=opts.api_key, max_body_bytes=opts.max_body,
                          defaults=opts.defaults)
    app = create_app(scheduler, tokenizer, config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        scheduler.start()
        print(f"pydflash2 server: http://{opts.host}:{opts.port} serving '{model_id}' with {opts.parallel} slot(s) "
              f"of {opts.n_ctx} tokens, drafter {opts.draft or 'none'}", file=sys.stderr, flush=True)
        try:
            yield
        finally:
            scheduler.shutdown()

    app.router.lifespan_context = lifespan
    return app, engine, scheduler


def serve(opts: ServerOptions) -> int:
    app, engine, _ = build_app(opts)
    try:
        uvicorn.run(app, host=opts.host, port=opts.port, log_level=opts.log_level, timeout_graceful_shutdown=5)
    finally:
        engine.close()
    return 0
