"""A request's sampler chain and logprobs, as the native engine takes and gives them.

The engine applies llama.cpp's own samplers in llama-cpp-python's order (logit
bias, penalties, grammar, then top-k, top-p, min-p, temperature; greedy takes
the argmax after bias, penalties and grammar) and checks every value before
llama.cpp sees it. The Speculator and the server's engine binding both build
their requests here, with the same keyword names.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from . import _native, grammar_limits, utf8_pieces
from ._native import ffi, lib

MAX_LOGPROBS = 20  # top alternatives per token (OpenAI's top_logprobs limit; native MAX_LOGPROBS)
INT32_MAX = 2**31 - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class _Range:
    """What one parameter may be: an integer or a number in lo..hi (lo excluded when open_lo)."""

    integer: bool
    lo: float
    hi: float
    words: str  # the requirement, as the error message says it
    open_lo: bool = False

    def holds(self, v: float) -> bool:
        return (self.lo < v if self.open_lo else self.lo <= v) and v <= self.hi


# The sampling parameters the CLI, the Python API (Speculator.generate/stream, the server's engine) and
# the server's request bodies all take, with the bounds of what the native pdf2_sampling struct holds
# (int32 counts, a 64-bit seed, float32 numbers). check_param() is their one validation.
PARAM_RANGES: dict[str, _Range] = {
    "max_tokens": _Range(True, 1, INT32_MAX, f"an integer in 1..{INT32_MAX}"),
    "top_k": _Range(True, 0, INT32_MAX, f"an integer in 0..{INT32_MAX} (0 = off)"),
    "seed": _Range(True, -(2**63), 2**64 - 1, "an integer in -2**63..2**64-1 (taken modulo 2**64)"),
    "repeat_last_n": _Range(True, -1, INT32_MAX,
                            f"an integer in -1..{INT32_MAX} (-1 = the whole context, 0 = off)"),
    "temperature": _Range(False, 0.0, FLOAT32_MAX, "a finite number >= 0 (0 = greedy)"),
    "top_p": _Range(False, 0.0, 1.0, "a number in (0, 1]", open_lo=True),
    "min_p": _Range(False, 0.0, 1.0, "a number in [0, 1]"),
}


class ParamError(ValueError):
    """A sampling parameter out of its range. requirement: what it must be (PARAM_RANGES' words)."""

    def __init__(self, name: str, requirement: str, value: object) -> None:
        super().__init__(f"{name} must be {requirement}, got {value!r}")
        self.requirement = requirement


def check_param(name: str, value: Any, *, label: str | None = None) -> Any:
    """value, checked against PARAM_RANGES[name] (an int for integer parameters, a float
    otherwise); ParamError (a ValueError) naming label (default: name) when it is not in range."""
    r = PARAM_RANGES[name]
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value) if r.integer else float(value)
    except (TypeError, ValueError):
        raise ParamError(label or name, r.words, value) from None
    if not r.holds(v):  # NaN holds nothing
        raise ParamError(label or name, r.words, value)
    return v


def random_seed() -> int:
    """A seed for a request that gives none (63 random bits)."""
    return int.from_bytes(os.urandom(8), "little") >> 1


@dataclass
class TokenLogprob:
    """A committed token's log-probability under the target: the log-softmax of its raw
    logits, as llama-server's n_probs and llama-cpp-python's logprobs report them (the
    bonus or correction token of a step included). top: the most likely tokens there,
    most likely first, as (token id, logprob)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class SamplerOptions(TypedDict, total=False):
    """The sampler chain's keywords beyond temperature and top-k/p/min-p, as Speculator.stream takes them
    (the defaults are SamplingRequest's)."""

    grammar: str | None
    logit_bias: Mapping[int, float] | None
    presence_penalty: float
    frequency_penalty: float
    repeat_penalty: float
    repeat_last_n: int
    logprobs: int | None


class SamplingRequest:
    """The native pdf2_sampling struct of one request, with the buffers it points to."""

    def __init__(
        self,
        *,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: int = 0,
        max_tokens: int = 0,
        grammar: str | None = None,
        logit_bias: Mapping[int, float] | None = None,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        repeat_last_n: int = 64,
        logprobs: int | None = None,
        grammar_unsafe: Sequence[int] = (),
    ) -> None:
        """grammar_unsafe: the tokens a grammar must not draw (pydflash2.utf8_pieces.model_unsafe_tokens:
        their pieces would let llama.cpp's grammar write invalid UTF-8); with a grammar they are masked
        (logit bias -inf, whatever logit_bias gives them), without one they change nothing."""
        temperature, top_p, min_p = (check_param(k, v) for k, v in
                                     (("temperature", temperature), ("top_p", top_p), ("min_p", min_p)))
        top_k, repeat_last_n = check_param("top_k", top_k), check_param("repeat_last_n", repeat_last_n)
        seed = check_param("seed", seed) % 2**64
        if max_tokens != 0:  # 0: no cap
            max_tokens = check_param("max_tokens", max_tokens)
        if logprobs is not None and not 0 <= int(logprobs) <= MAX_LOGPROBS:
            raise ValueError(f"logprobs (top alternatives) must be in 0..{MAX_LOGPROBS}, got {logprobs}")
        if grammar is not None and not isinstance(grammar, str):
            raise TypeError("grammar must be GBNF text (str)")
        if grammar:  # before llama.cpp's recursive parser sees it (a deep text overflows its stack)
            grammar_limits.check_gbnf(grammar)
        bias = dict(logit_bias or {})
        if grammar:
            bias = utf8_pieces.guarded_bias(bias, grammar_unsafe)
        try:
            self._bias_tokens = np.ascontiguousarray([int(t) for t in bias], dtype=np.int32)
            self._bias_values = np.ascontiguousarray([float(v) for v in bias.values()], dtype=np.float32)
        except (TypeError, ValueError, OverflowError) as e:
            raise ValueError(f"logit_bias must map token ids to numbers: {e}") from None
        self._grammar = ffi.new("char[]", grammar.encode("utf-8")) if grammar else ffi.NULL
        self.n_logprobs = -1 if logprobs is None else int(logprobs)
        self.struct = ffi.new("pdf2_sampling *", {
            "temperature": float(temperature), "top_k": int(top_k), "top_p": float(top_p), "min_p": float(min_p),
            "seed": int(seed), "max_tokens": int(max_tokens), "repeat_penalty": float(repeat_penalty),
            "frequency_penalty": float(frequency_penalty), "presence_penalty": float(presence_penalty),
            "repeat_last_n": int(repeat_last_n), "grammar": self._grammar,
            "logit_bias_tokens": ffi.from_buffer("int32_t[]", self._bias_tokens) if len(bias) else ffi.NULL,
            "logit_bias_values": ffi.from_buffer("float[]", self._bias_values) if len(bias) else ffi.NULL,
            "n_logit_bias": len(bias), "n_logprobs": self.n_logprobs,
        })


def step_logprobs(engine: Any, slot: int, tokens: list[int], n_top: int) -> list[TokenLogprob]:
    """Logprobs of `tokens`, the tokens the engine's last step committed on `slot`
    (engine: a pdf2_batch_engine handle; n_top: the request's logprobs count)."""
    n = len(tokens)
    if n == 0:
        return []
    lp = np.zeros(n, dtype=np.float32)
    ids = np.zeros(max(1, n * n_top), dtype=np.int32)
    vals = np.zeros(max(1, n * n_top), dtype=np.float32)
    got = lib.pdf2_batch_engine_logprobs(engine, int(slot), ffi.from_buffer("float[]", lp),
                                         ffi.from_buffer("int32_t[]", ids), ffi.from_buffer("float[]", vals),
                                         int(n_top), n)
    if got != n:
        raise _native.NativeError(_native.last_error() or f"logprobs: {got} of {n} tokens")
    out = []
    for i, tok in enumerate(tokens):
        top = [(int(ids[i * n_top + j]), float(vals[i * n_top + j])) for j in range(n_top)
               if ids[i * n_top + j] >= 0]
        out.append(TokenLogprob(int(tok), float(lp[i]), top))
    return out
