"""The FastAPI application: OpenAI-compatible endpoints over the Scheduler, and
Anthropic's Messages and OpenAI's Responses API translated onto the chat path.

Every bad request gets an OpenAI-style error body ({"error": {message, type,
param, code}}; Anthropic's {"type": "error", "error": {type, message}} on
/v1/messages) and a 4xx; the server keeps serving. Bodies are read and
checked here by hand (content type, size, JSON, fields) so that each failure
has its own clear status and message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from sse_starlette.sse import EventSourceResponse

from .._engine import GenerationError
from ..chat_template import ChatTemplate
from ..grammar_limits import GrammarLimits
from ..sampling import random_seed
from . import anthropic_messages, responses_api, schemas, steering
from .answers import Answer
from .auth import context_key, key_matches
from .health import health as health_status
from .scheduler import Finished, GenerationRequest, Logprobs, QueueFull, Sampling, Scheduler
from .template_routes import add_template_routes
from .validation import InvalidField, parse_body

log = logging.getLogger("pydflash2.server")

RETRY_AFTER_S = 1
DISCONNECT_POLL_S = 0.2
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions

Body = TypeVar("Body", bound=BaseModel)
T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type_
        self.headers = headers


@dataclass(frozen=True)
class SamplingDefaults:
    """What a request that leaves a field out gets: llama-server's defaults."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05


@dataclass
class ServerConfig:
    model_id: str  # the name /v1/models lists (--alias); requests may name any model, as llama-server takes them
    n_ctx: int  # per request (slot)
    api_keys: tuple[str, ...] = ()  # none: no key needed
    max_body_bytes: int = 1 << 20
    defaults: SamplingDefaults = field(default_factory=SamplingDefaults)
    body_timeout_s: float = 30.0  # from arrival to the body's last byte (stalled uploads are closed)
    request_timeout_s: float | None = None  # --timeout: from arrival to the last token
    queue_timeout_s: float | None = None  # from arrival to a slot
    stall_timeout_s: float = 0.0  # /health turns 503 after this long without progress while work is pending
    grammar_limits: GrammarLimits = field(default_factory=GrammarLimits)  # --max-grammar-*, --max-schema-*
    # requests' CPU work off the event loop (templates, tokenising, schema conversion, grammar checks):
    # at most this many at once, in worker threads, so that /health and the streams keep answering
    cpu_workers: int = 4


@dataclass
class Tokenizer:
    """What the handlers need from the target's tokenizer."""

    raw: Callable[[str], list[int]]  # a completion prompt, as llama-cpp-python tokenizes it
    n_vocab: int
    # text, add_special (BOS), parse_special: llama.cpp's tokenizer as llama-server's /tokenize calls it
    tokenize: Callable[[str, bool, bool], list[int]]
    piece: Callable[[int], bytes]  # a token's text, special tokens spelled out (llama.cpp's token_to_piece)
    template: ChatTemplate | None  # the GGUF's chat template
    vocab: Any  # the llama_vocab * (llama.cpp checks grammars against it)

    def render(self, messages: list[dict[str, Any]], **variables: Any) -> tuple[str, bool]:
        """A conversation through the chat template: (prompt text, add BOS)."""
        if self.template is None:
            raise ValueError("the model has no chat template")
        return self.template.render(self.template.prepare_messages(messages), **variables)

    def chat(self, messages: list[dict[str, Any]], **variables: Any) -> list[int]:
        text, add_bos = self.render(messages, **variables)
        return self.tokenize(text, add_bos, True)


def create_app(scheduler: Scheduler, tokenizer: Tokenizer, config: ServerConfig) -> FastAPI:
    app = FastAPI(title="pydflash2", docs_url=None, redoc_url=None, openapi_url=None)
    metrics = app.state.metrics = scheduler.metrics

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> JSONResponse:
        # 499 (client gone) and 5xx are counted by the scheduler, which saw them happen
        if e.status == 503:
            metrics.requests.labels(status="rejected").inc()
        elif 400 <= e.status < 499:
            metrics.requests.labels(status="invalid").inc()
        return _error_response(request, e.status, e.message, e.type, e.param, e.code, e.headers)

    # a dependency, not an HTTP middleware: Starlette's BaseHTTPMiddleware wraps
    # `receive`, and handlers then no longer see a client's disconnect
    async def require_key(request: Request) -> None:
        if not config.api_keys:
            return
        # Authorization: Bearer KEY (OpenAI's clients), or x-api-key: KEY (Anthropic's)
        given, x_api_key = request.headers.get("authorization"), request.headers.get("x-api-key")
        if not key_matches(given, config.api_keys, x_api_key):
            client = f"{request.client.host}:{request.client.port}" if request.client else "?"
            log.warning("auth failed: %s %s from %s (rid=%s): %s", request.method, request.url.path, client,
                        getattr(request.state, "request_id", "-"),
                        "no Authorization or x-api-key header" if given is None and x_api_key is None
                        else "key not accepted")
            raise ApiError(401, "invalid or missing API key (Authorization: Bearer KEY, or x-api-key: KEY)",
                           type_="authentication_error", code="invalid_api_key")

    protected = [Depends(require_key)]  # every route but /health

    @app.exception_handler(404)
    async def _not_found(request: Request, _: Exception) -> JSONResponse:
        return _error_response(request, 404, f"no route {request.method} {request.url.path}", code="not_found")

    @app.exception_handler(405)
    async def _bad_method(request: Request, _: Exception) -> JSONResponse:
        return _error_response(request, 405, f"method {request.method} not allowed on {request.url.path}")

    # HEAD too (load balancers and uptime checkers send it); the status says it all
    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> JSONResponse:
        code, body = health_status(scheduler, config.stall_timeout_s)
        return JSONResponse(body, status_code=code)

    @app.get("/slots", dependencies=protected)
    async def slots() -> JSONResponse:
        return JSONResponse(scheduler.slots())

    @app.get("/metrics", dependencies=protected)
    async def metrics_endpoint() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def model_card() -> dict[str, Any]:
        return {"id": config.model_id, "object": "model", "created": schemas.now(), "owned_by": "pydflash2",
                "meta": {"n_ctx": config.n_ctx, "n_slots": scheduler.engine.n_slots}}

    # every OpenAI route also without the /v1 prefix: a base_url without it is common (llama-server serves both)
    @app.get("/v1/models", dependencies=protected)
    @app.get("/models", dependencies=protected)
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}", dependencies=protected)
    @app.get("/models/{model_id:path}", dependencies=protected)
    async def model(model_id: str) -> JSONResponse:  # the SDK's models.retrieve
        if model_id != config.model_id:
            raise ApiError(404, f"model '{model_id}' not found: this server serves '{config.model_id}' (requests "
                                f"may still name any model)", param="model", code="model_not_found")
        return JSONResponse(model_card())

    @app.post("/v1/embeddings", dependencies=protected)
    @app.post("/embeddings", dependencies=protected)
    async def embeddings() -> JSONResponse:
        raise ApiError(501, "embeddings: not supported by this server", code="not_supported",
                       type_="not_supported_error")

    features = steering.engine_features(scheduler.engine)
    cpu_work = anyio.CapacityLimiter(config.cpu_workers)
    fingerprint = schemas.system_fingerprint()

    async def offload(fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on a worker thread, at most config.cpu_workers at once: never on the event loop."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=cpu_work)

    async def steer(request: Request, body: schemas.CompletionRequest | schemas.ChatCompletionRequest
                    ) -> steering.Steering:
        """The request's steering fields checked and converted (off the event loop: schema conversion and
        llama.cpp's grammar check take a while); the schema keywords left unenforced noted (access_log.NOTES)."""
        st = await offload(_steer, body)
        request.state.unenforced_schema = list(st.unenforced)
        return st

    def _steer(body: schemas.CompletionRequest | schemas.ChatCompletionRequest) -> steering.Steering:
        if body.stream_options is not None and not body.stream:
            raise ApiError(400, "stream_options: only allowed with stream: true", param="stream_options")
        try:
            return steering.build(body, features=features, n_vocab=tokenizer.n_vocab, n_ctx=config.n_ctx,
                                  vocab=tokenizer.vocab, template=tokenizer.template, limits=config.grammar_limits)
        except steering.FieldError as e:
            raise ApiError(400, str(e), param=e.param) from None

    @app.post("/v1/completions", dependencies=protected)
    @app.post("/completions", dependencies=protected)
    async def completions(request: Request) -> Response:
        body = await _read_body(request, schemas.CompletionRequest, config)
        for name, given in (("echo", body.echo), ("suffix", body.suffix is not None),
                            ("best_of", body.best_of not in (None, 1))):
            if given:
                raise ApiError(400, f"{name}: not supported by this server", param=name)
        # tokenizing (and templating, below) a long prompt takes a while: off the event loop
        if isinstance(body.prompt, str):
            tokens = await offload(tokenizer.raw, body.prompt)
        elif isinstance(body.prompt[0], str):
            tokens = await offload(tokenizer.raw, body.prompt[0])
        else:
            tokens = [int(t) for t in body.prompt]  # type: ignore[union-attr]
            bad = [t for t in tokens if not 0 <= t < tokenizer.n_vocab]
            if bad:
                raise ApiError(400, f"prompt token ids outside the vocabulary (0..{tokenizer.n_vocab - 1}): {bad[:5]}",
                               param="prompt")
        st = await steer(request, body)
        req = await _submit(scheduler, request, body, tokens, config, COMPLETION_DEFAULT_MAX_TOKENS, st, offload)
        answer = Answer(schemas.new_id("cmpl"), config.model_id, body, st, tokenizer.piece, fingerprint)
        if body.stream:
            return EventSourceResponse(answer.stream_completion(_events(scheduler, req)))
        return JSONResponse(answer.completion(await _wait(scheduler, request, req)))

    async def start_chat(request: Request, body: schemas.ChatCompletionRequest) -> tuple[GenerationRequest,
                                                                                          steering.Steering]:
        """The one request path of chat completions, Anthropic's Messages and the Responses API."""
        st = await steer(request, body)
        tokens = await offload(_chat_tokens, tokenizer, body)
        return await _submit(scheduler, request, body, tokens, config, None, st, offload), st

    @app.post("/v1/chat/completions", dependencies=protected)
    @app.post("/chat/completions", dependencies=protected)
    async def chat_completions(request: Request) -> Response:
        body = await _read_body(request, schemas.ChatCompletionRequest, config)
        req, st = await start_chat(request, body)
        answer = Answer(schemas.new_id("chatcmpl"), config.model_id, body, st, tokenizer.piece, fingerprint)
        if body.stream:
            return EventSourceResponse(answer.stream_chat(_events(scheduler, req)))
        return JSONResponse(answer.chat(await _wait(scheduler, request, req)))

    # Anthropic's Messages API and OpenAI's Responses API: their bodies translated into a chat-completions
    # request, which takes the path above; errors the chat path raises name their own fields
    @app.post("/v1/messages", dependencies=protected)
    async def messages(request: Request) -> Response:
        body = await _read_body(request, anthropic_messages.MessagesRequest, config)
        with _renamed(anthropic_messages.PARAMS):
            req, st = await start_chat(request, _as_chat(body.chat_body()))
        answer = anthropic_messages.MessageAnswer(anthropic_messages.new_id("msg"), config.model_id, st.tool_plan,
                                                  len(req.prompt_tokens))
        if body.stream:
            return EventSourceResponse(answer.stream(_events(scheduler, req)))
        return JSONResponse(answer.message(await _wait(scheduler, request, req)))

    @app.post("/v1/messages/count_tokens", dependencies=protected)
    async def count_tokens(request: Request) -> Response:
        body = await _read_body(request, anthropic_messages.CountTokensRequest, config)
        with _renamed(anthropic_messages.PARAMS):
            tokens = await offload(_chat_tokens, tokenizer, _as_chat(body.chat_body()))
        return JSONResponse({"input_tokens": len(tokens)})

    @app.post("/v1/responses", dependencies=protected)
    @app.post("/responses", dependencies=protected)
    async def responses(request: Request) -> Response:
        body = await _read_body(request, responses_api.ResponsesRequest, config)
        request.state.ignored_tools = body.ignored_tools()  # hosted tools: left out (access_log.NOTES)
        with _renamed(responses_api.PARAMS):
            req, st = await start_chat(request, _as_chat(body.chat_body()))
        answer = responses_api.ResponseAnswer(responses_api.new_id("resp"), config.model_id, body, st.tool_plan)
        if body.stream:
            return EventSourceResponse(answer.stream(_events(scheduler, req)))
        return JSONResponse(answer.whole(await _wait(scheduler, request, req)))

    add_template_routes(app, protected, tokenizer,
                        read_body=lambda request, model: _read_body(request, model, config),
                        bad_request=lambda message, param: ApiError(400, message, param=param), offload=offload)
    return app


async def _read_body(request: Request, model: type[Body], config: ServerConfig) -> Body:
    limit = config.max_body_bytes
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise ApiError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}")
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise ApiError(415, f"Content-Encoding {encoding!r} is not supported: send the body uncompressed")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    raw = bytearray()
    # the whole body by the deadline, however slowly it trickles in (a stalled upload must not hold
    # its connection for ever); Connection: close, as the rest of the body may still come
    deadline = _arrival(request) + config.body_timeout_s
    chunks = request.stream().__aiter__()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), timeout=max(0.0, deadline - time.perf_counter()))
        except StopAsyncIteration:
            break
        except TimeoutError:
            request.app.state.metrics.timeouts.labels(stage="body").inc()
            raise ApiError(408, f"the request body did not arrive within {config.body_timeout_s:g} s",
                           code="body_timeout", headers={"Connection": "close"}) from None
        raw += chunk
        if len(raw) > limit:
            raise ApiError(413, f"request body exceeds the limit of {limit} bytes")
    try:
        data = parse_body(bytes(raw))
    except InvalidField as e:
        raise ApiError(400, e.message, param=e.param) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _invalid(e) from None


def _invalid(e: ValidationError) -> ApiError:
    """A body's first validation error as a 400 naming the field."""
    first = e.errors()[0]
    param = ".".join(str(x) for x in first["loc"]) or None
    msg = first["msg"]
    if first["type"] == "missing":
        msg = f"missing required field '{param}'"
    return ApiError(400, f"{param}: {msg}" if param and first["type"] != "missing" else msg, param=param)


def _error_response(request: Request, status: int, message: str, type_: str = "invalid_request_error",
                    param: str | None = None, code: str | None = None,
                    headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in the shape of the API the route belongs to: Anthropic's on /v1/messages, else OpenAI's."""
    if anthropic_messages.is_route(request.url.path):
        body = anthropic_messages.error_body(status, message)
    else:
        body = schemas.error_body(message, type_, param, code)
    return JSONResponse(body, status_code=status, headers=headers)


def _as_chat(body: dict[str, Any]) -> schemas.ChatCompletionRequest:
    """A translated body (Anthropic's, the Responses API's) as the chat-completions request it stands for."""
    try:
        return schemas.ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise _invalid(e) from None


@contextmanager
def _renamed(names: dict[str, str]) -> Iterator[None]:
    """Errors of the chat path name the translated API's fields (max_tokens -> max_output_tokens...)."""
    try:
        yield
    except ApiError as e:
        if e.param is not None:
            head = e.param.split(".")[0]
            if head in names:
                new = names[head]
                rest = e.message[len(e.param):]
                if e.message.startswith(e.param) and not rest[:1].isidentifier():  # "max_tokens (5000) exceeds..."
                    e.message = new + rest
                e.param = new
        raise


def _chat_tokens(tokenizer: Tokenizer, body: schemas.ChatCompletionRequest) -> list[int]:
    """The conversation (tools included) through the chat template."""
    try:
        messages, variables = steering.template_input(body, tokenizer.template)
        return tokenizer.chat(messages, **variables)
    except Exception as e:  # the template rejected the conversation (e.g. roles out of order)
        raise ApiError(400, f"chat template: {e}", param="messages") from None


def _arrival(request: Request) -> float:
    """perf_counter time the request arrived (access_log.AccessLog stamps it; now, without it)."""
    return getattr(request.state, "arrival", None) or time.perf_counter()


async def _submit(scheduler: Scheduler, request: Request, body: schemas._Sampling, tokens: list[int],
                  config: ServerConfig, default_max_tokens: int | None, steer: steering.Steering,
                  offload: Callable[..., Awaitable[Any]]) -> GenerationRequest:
    n_ctx = config.n_ctx
    if not tokens:
        raise ApiError(400, "the prompt is empty", param="prompt")
    if len(tokens) >= n_ctx:
        raise ApiError(400, f"the prompt has {len(tokens)} tokens but the context holds {n_ctx} tokens per request "
                            f"(at least 1 must be left to generate)", param="prompt", code="context_length_exceeded")
    left = n_ctx - len(tokens)
    max_tokens = body.max_tokens if body.max_tokens is not None else (default_max_tokens or left)
    asked = None
    if max_tokens > left:  # as llama-server: the answer stops where the context ends (finish_reason "length")
        asked, max_tokens = max_tokens, left
    seed = body.seed if body.seed is not None else random_seed()
    d = config.defaults

    def pick(v: Any, default: Any) -> Any:
        return default if v is None else v

    req = GenerationRequest(
        prompt_tokens=tokens,
        sampling=Sampling(temperature=pick(body.temperature, d.temperature), top_p=pick(body.top_p, d.top_p),
                          top_k=pick(body.top_k, d.top_k), min_p=pick(body.min_p, d.min_p), seed=seed),
        max_tokens=max_tokens, stop=body.stop_list(), loop=asyncio.get_running_loop(),
        engine_options=steer.engine_options, max_tokens_asked=asked,
        max_tokens_is_context=max_tokens == left and (asked is not None or body.max_tokens is None),
    )
    arrival = _arrival(request)
    req.t_arrival = arrival
    req.request_id = getattr(request.state, "request_id", None)
    req.context_key = context_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
    if config.request_timeout_s:
        req.deadline = arrival + config.request_timeout_s
    if config.queue_timeout_s:
        req.queue_deadline = arrival + config.queue_timeout_s
    request.state.generation = req  # for the access log
    try:
        # the engine's sampler chain (llama.cpp parses the grammar) here on a worker thread, so that
        # the step loop, which starts the request, never waits for it
        await offload(scheduler.prepare, req)
    except (GenerationError, ValueError) as e:
        raise ApiError(400, str(e)) from None
    try:
        scheduler.submit(req)
    except QueueFull:
        raise ApiError(503, "server busy: every slot is taken and the queue is full; retry later",
                       type_="server_busy", code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except RuntimeError as e:
        raise ApiError(503, str(e), type_="server_error", headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    return req


async def _wait(scheduler: Scheduler, request: Request, req: GenerationRequest) -> Finished:
    """Collects a request's events; a client that goes away cancels it. The check
    runs every DISCONNECT_POLL_S whether or not tokens keep arriving: a fast
    engine emits events more often than that, and must still notice."""
    loop = asyncio.get_running_loop()
    next_check = loop.time() + DISCONNECT_POLL_S
    while True:
        try:
            event = await asyncio.wait_for(req.events.get(), timeout=max(0.0, next_check - loop.time()))
        except TimeoutError:
            event = None
        if loop.time() >= next_check:
            next_check = loop.time() + DISCONNECT_POLL_S
            if await request.is_disconnected():
                scheduler.cancel(req)
                raise ApiError(499, "client disconnected") from None
        if event is None:
            continue
        if isinstance(event, Finished):
            if event.finish_reason == "error":
                raise _error_of(event)
            return event


def _error_of(event: Finished) -> ApiError:
    """A request the scheduler ended with an error, as the HTTP error it stands for."""
    if event.status == 400:
        return ApiError(400, event.error or "invalid request")
    if event.status == 503:
        return ApiError(503, event.error or "server busy", type_="server_busy",
                        headers={"Retry-After": str(RETRY_AFTER_S)})
    return ApiError(event.status, event.error or "generation failed", type_="server_error")


async def _events(scheduler: Scheduler, req: GenerationRequest) -> AsyncIterator[str | Logprobs | Finished]:
    """A request's events; leaving early (client gone: sse-starlette cancels us) cancels it."""
    finished = False
    try:
        while True:
            event = await req.events.get()
            yield event
            if isinstance(event, Finished):
                finished = True
                return
    finally:
        if not finished:
            scheduler.cancel(req)
