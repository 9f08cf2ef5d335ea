"""The engine's per-token logprobs in OpenAI's two shapes: chat
(`choices[].logprobs.content[]` with token, logprob, bytes, top_logprobs) and
completions (`choices[].logprobs` with tokens, token_logprobs, top_logprobs,
text_offset)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..sampling import TokenLogprob

Piece = Callable[[int], bytes]


def _text(piece: Piece, token: int) -> str:
    return piece(token).decode("utf-8", errors="replace")


def chat(entries: list[TokenLogprob], n_top: int, piece: Piece) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        b = piece(token)
        return {"token": b.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(b)}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, p) for t, p in e.top[:n_top]]}
                        for e in entries], "refusal": None}


def completion(entries: list[TokenLogprob], n_top: int, piece: Piece, offset0: int = 0) -> dict[str, Any]:
    tokens, offsets, offset = [], [], offset0
    for e in entries:
        s = _text(piece, e.token)
        tokens.append(s)
        offsets.append(offset)
        offset += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{_text(piece, t): p for t, p in e.top[:n_top]} for e in entries],
        "text_offset": offsets,
    }
