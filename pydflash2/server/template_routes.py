"""llama-server's tokenizer and template endpoints, with its request and
response shapes:

- POST /tokenize {"content": str | [str | id, ...], "add_special": false,
  "parse_special": true, "with_pieces": false} -> {"tokens": [id, ...]} or,
  with pieces, [{"id", "piece"}] (a piece that is not UTF-8: its byte values);
- POST /detokenize {"tokens": [id, ...]} -> {"content": str} (each token's
  text, special tokens spelled out);
- POST /apply-template (a chat completion body) -> {"prompt": str}, the
  prompt the chat template renders for it, tools included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from . import schemas, steering


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: str | list[str | int] = ""
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    tokens: list[int] = []


def add_template_routes(app: FastAPI, dependencies: list[Any], tokenizer: Any, *,
                        read_body: Callable[[Request, type[Any]], Awaitable[Any]],
                        bad_request: Callable[[str, str | None], Exception],
                        offload: Callable[..., Awaitable[Any]]) -> None:
    """offload(fn, *args): fn on a worker thread (tokenising and templating a long text take a while)."""
    def check_ids(ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < tokenizer.n_vocab]
        if bad:
            raise bad_request(f"{param}: token ids outside the vocabulary (0..{tokenizer.n_vocab - 1}): {bad[:5]}",
                              param)

    @app.post("/tokenize", dependencies=dependencies)
    async def tokenize(request: Request) -> JSONResponse:
        body: TokenizeRequest = await read_body(request, TokenizeRequest)
        return JSONResponse({"tokens": await offload(tokens_of, body)})

    def tokens_of(body: TokenizeRequest) -> list[int] | list[dict[str, Any]]:
        parts = [body.content] if isinstance(body.content, str) else body.content
        ids: list[int] = []
        for i, part in enumerate(parts):  # as llama-server's tokenize_mixed: BOS only before a first text part
            if isinstance(part, str):
                ids += tokenizer.tokenize(part, body.add_special and i == 0, body.parse_special)
            else:
                ids.append(part)
        check_ids(ids, "content")
        if not body.with_pieces:
            return ids
        out = []
        for t in ids:
            b = tokenizer.piece(t)
            try:
                piece: str | list[int] = b.decode("utf-8")
            except UnicodeDecodeError:
                piece = list(b)
            out.append({"id": t, "piece": piece})
        return out

    @app.post("/detokenize", dependencies=dependencies)
    async def detokenize(request: Request) -> JSONResponse:
        body: DetokenizeRequest = await read_body(request, DetokenizeRequest)
        check_ids(body.tokens, "tokens")
        text = await offload(lambda: b"".join(tokenizer.piece(t) for t in body.tokens))
        return JSONResponse({"content": text.decode("utf-8", errors="replace")})

    @app.post("/apply-template", dependencies=dependencies)
    async def apply_template(request: Request) -> JSONResponse:
        body: schemas.ChatCompletionRequest = await read_body(request, schemas.ChatCompletionRequest)
        return JSONResponse({"prompt": await offload(render, body)})

    def render(body: schemas.ChatCompletionRequest) -> str:
        try:
            messages, variables = steering.template_input(body, tokenizer.template)
            return tokenizer.render(messages, **variables)[0]
        except Exception as e:  # the template rejected the conversation
            raise bad_request(f"chat template: {e}", "messages") from None
