"""What a request body may hold before any field reaches the tokenizer or the
native engine: bounds follow what the native side takes (int32 token ids,
counts and top_k; float32 sampling parameters; 64-bit seeds; UTF-8 text).

parse_body() turns raw bytes into a JSON object, or raises InvalidField naming
the offending field, for everything that would otherwise fail deeper down:
JSON nested past MAX_DEPTH (Python's parser recurses and gives up near 1,000
levels with RecursionError), NaN/Infinity literals and overflowing numbers,
numbers no native parameter can hold, and strings with lone UTF-16 surrogates
(`"\\ud800"` decodes to a str that UTF-8 cannot encode, so the tokenizer would
raise). The per-field types (Int32, ...) bound the schema's fields further.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import Field

MAX_DEPTH = 64  # nesting of arrays/objects in a body (a chat with content parts is 5 deep)
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # the widest native integer: a 64-bit seed (signed or not)

Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]


class InvalidField(ValueError):
    """A body the server cannot take; param names the field ("messages.0.content"), or None for the whole body."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def _reject_constant(name: str) -> Any:
    raise InvalidField(f"invalid JSON body: {name} is not a JSON number")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object in raw, checked as the module docstring says."""
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except RecursionError:
        param = _too_deep_field(raw)
        where = f"{param}: " if param else "invalid JSON body: "
        raise InvalidField(f"{where}nested more than {MAX_DEPTH} levels deep", param) from None
    except (ValueError, UnicodeDecodeError) as e:
        if isinstance(e, InvalidField):
            raise
        raise InvalidField(f"invalid JSON body: {e}") from None
    if not isinstance(data, dict):
        raise InvalidField("the JSON body must be an object")
    check_values(data)
    return data


_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _too_deep_field(raw: bytes) -> str | None:
    """The top-level field whose value nests past MAX_DEPTH (None: the body itself), found by
    a scan of brackets and strings that stops there (the parser cannot say: it gave up)."""
    depth, key = 0, None
    for m in _JSON_TOKEN.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            if depth > MAX_DEPTH:
                return key
        elif tok in (b"]", b"}"):
            depth -= 1
        elif depth == 1:
            try:
                key = json.loads(tok)  # the last string at the top level before the deep value: its key
            except ValueError:
                key = None
    return key if depth > MAX_DEPTH else None


def _param(path: list[str | int]) -> str | None:
    return ".".join(str(p) for p in path) or None


def check_values(data: Any) -> None:
    """Depth, numbers and strings of a parsed body, without recursion (the body may be deep)."""
    stack: list[tuple[Any, list[str | int]]] = [(data, [])]
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise InvalidField(f"{_param(path[:1])}: nested more than {MAX_DEPTH} levels deep", _param(path[:1]))
        if isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, path, what="a key")
                stack.append((item, path + [key]))
        elif isinstance(value, list):
            stack.extend((item, path + [i]) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, path)
        elif isinstance(value, bool):
            pass
        elif isinstance(value, float):
            if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
                param = _param(path)
                raise InvalidField(f"{param}: {value!r} is outside the range of a 32-bit float "
                                   f"(|x| <= {FLOAT32_MAX:.4g})", param)
        elif isinstance(value, int) and not INT_MIN <= value <= INT_MAX:
            param = _param(path)
            raise InvalidField(f"{param}: integer outside the 64-bit range", param)


def _check_text(text: str, path: list[str | int], what: str = "the text") -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        param = _param(path)
        where = f"{param}: " if param else ""
        raise InvalidField(f"{where}{what} holds a lone UTF-16 surrogate ({text[e.start]!r} at character "
                           f"{e.start}), which is not valid Unicode text", param) from None
