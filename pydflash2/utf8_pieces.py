"""The tokens a grammar must not draw: pieces through which llama.cpp's grammar lets invalid UTF-8 in.

llama.cpp's grammar sampler (llama-grammar.cpp, `decode_utf8`) matches a token's piece code point by
code point, carrying an incomplete UTF-8 sequence over to the next token. It checks that a byte that
continues a sequence begun in an earlier token is a continuation byte (10xxxxxx), but not the rest
of what UTF-8 requires:

- within one piece, the bytes after a lead byte are taken as continuations whatever they are;
- a lead byte's second byte is not range-checked: E0 80..9F and F0 80..8F (overlong forms, read as
  the shorter code point: "E0 82 A2" passes as U+00A2), ED A0..BF (surrogates), F4 90..BF and the
  leads F5..FF (past U+10FFFF) all decode to a code point the grammar may allow;
- C0 and C1 (overlong two-byte leads) are refused only where the sequence is cut by a token's end;
- a NUL byte ends the piece for the grammar: what follows it in the piece is never matched.

So under a grammar a byte-level vocabulary (every byte a token) can write a string the grammar
counted as N characters that is not UTF-8 at all, which the server then decodes as U+FFFD each
(issue 58: length bounds broken by invalid UTF-8 at temperature 2).

The fix here is on the token side, where the sampler chain can act on it without a change to
llama.cpp: a request with a grammar gives the tokens of `grammar_unsafe` a logit bias of -inf. A
piece is safe when it could stand in valid UTF-8 text (up to 3 continuation bytes completing a
character begun before it, whole characters, then the start of one) and it does not end on one of
the leads E0, ED, F0, F4 alone (their second byte has a narrower range than the 80..BF llama.cpp
assumes; a piece that holds the lead and its second byte is checked here). With only safe pieces,
every sequence llama.cpp accepts is valid UTF-8: each byte inside a piece is checked here, and a
sequence that runs across pieces is one llama.cpp checks byte by byte and whose range-restricted
second byte never starts a piece.

A real byte-level BPE vocabulary is made of pieces of valid text, so what it loses is the bare leads
E0/ED/F0/F4 (and the pieces ending on them, e.g. " \\xf0" before an emoji): a grammar's string still
reaches those characters through a piece holding the lead and its second byte (SmolLM2-135M: see
tests/test_structured_output.py for the count).

The same mask holds the tokens whose text the answer does not show (control tokens, which the
grammar reads spelled out and the server's text leaves out): model_unsafe_tokens.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Sequence
from typing import Any

import llama_cpp

# the second byte's range after each lead byte (Unicode 15, table 3-7); other leads: 80..BF
_SECOND = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}
# leads whose second byte llama.cpp does not range-check: a piece must not end on them
_NARROW_LEADS = frozenset(_SECOND)


def _length(lead: int) -> int:
    """Bytes in the sequence a valid lead byte starts; 0 for a byte that cannot start one."""
    if lead < 0x80:
        return 1
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0  # a continuation byte, C0, C1, F5..FF


def _continuation(b: int) -> bool:
    return 0x80 <= b <= 0xBF


def grammar_unsafe(piece: bytes) -> bool:
    """True for a piece that could let llama.cpp's grammar accept invalid UTF-8 (module docstring):
    not a possible part of valid UTF-8 text, holding a NUL byte, or ending on a bare E0, ED, F0, F4."""
    if b"\x00" in piece:
        return True
    i, n = 0, len(piece)
    while i < n and i < 3 and _continuation(piece[i]):  # the end of a character begun before the piece
        i += 1
    if i < n and _continuation(piece[i]):
        return True  # four continuation bytes: no character has them
    while i < n:
        lead = piece[i]
        size = _length(lead)
        if size == 0:
            return True
        lo, hi = _SECOND.get(lead, (0x80, 0xBF))
        for k in range(1, size):
            if i + k == n:  # the piece ends inside the character
                return k == 1 and lead in _NARROW_LEADS
            b = piece[i + k]
            if not (lo <= b <= hi if k == 1 else _continuation(b)):
                return True
        i += size
    return False


def unsafe_tokens(pieces: Iterable[tuple[int, bytes]]) -> list[int]:
    """The ids of the (token id, piece) pairs whose pieces are grammar_unsafe (empty pieces are left
    alone: llama.cpp's grammar refuses them itself)."""
    return [t for t, p in pieces if p and grammar_unsafe(p)]


def model_unsafe_tokens(model: Any) -> list[int]:
    """The tokens a grammar must not draw in a model's vocabulary (model: a llama_model pointer, as
    Llama._model.model holds it): those whose piece, as the grammar reads it (llama_token_to_piece with
    special tokens spelled out), is grammar_unsafe, and those the answer does not show as the grammar
    reads them (a control token: the grammar matches its text, e.g. `<|im_start|>` inside a string,
    and the server's text leaves it out, so a string the grammar counted or closed with it is short or
    broken). End-of-generation tokens are left alone (the grammar decides those itself)."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    buf = ctypes.create_string_buffer(256)

    def piece(token: int, special: bool) -> bytes:
        n = llama_cpp.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        if n < 0:  # longer than the buffer
            big = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(vocab, token, big, len(big), 0, special)
            return big.raw[:n]
        return buf.raw[:n]

    out = []
    for t in range(llama_cpp.llama_vocab_n_tokens(vocab)):
        if llama_cpp.llama_vocab_is_eog(vocab, t):
            continue
        read = piece(t, True)
        if read and (grammar_unsafe(read) or piece(t, False) != read):
            out.append(t)
    return out


def guarded_bias(bias: dict[int, float] | None, unsafe: Sequence[int]) -> dict[int, float]:
    """A request's logit_bias with every unsafe token at -inf (a bias the request gives them is overruled)."""
    out = dict(bias or {})
    out.update(dict.fromkeys(unsafe, float("-inf")))
    return out


class GrammarUnsafeTokens:
    """model_unsafe_tokens of one loaded model, read at the first grammar (a pass over the vocabulary)
    and kept; held by what holds the model (a Speculator, the server's engine), so it never outlives
    the model's pointer. Any thread may ask: the list is the same whoever reads it first."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm  # a llama_cpp.Llama
        self._tokens: list[int] | None = None

    def __call__(self) -> list[int]:
        if self._tokens is None:
            self._tokens = model_unsafe_tokens(self._llm._model.model)
        return self._tokens
