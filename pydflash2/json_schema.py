"""JSON schema -> GBNF, for the server's `response_format` and forced tool calls and for the
Python API's `grammar`: llama-cpp-python's converter (the one its server uses) with the integer
ranges its 0.3.36 release lacks.

`minimum`, `maximum`, `exclusiveMinimum` and `exclusiveMaximum` on an `integer` become grammar
rules that accept exactly the integers in range, the construct llama.cpp's converter
(examples/json_schema_to_grammar.py, `_generate_min_max_int`) and later llama-cpp-python
releases write: each length of decimal numeral between the bounds, split digit by digit into
character classes. An open side reaches 16 digits (llama-cpp-python's `integer` rule), or the
other bound's length if that is longer. The range rules are written here for this project (the
construct, not upstream's code). On a `number` the bounds are accepted and not enforced,
as in llama.cpp's converter (it has no rules for them): the client validates. A `type` list
keeps the schema's other keywords in each alternative, as llama.cpp's converter does (0.3.36
dropped them, bounds included, from `{"type": ["integer", "null"], "minimum": 1}`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from llama_cpp.llama_grammar import RESERVED_NAMES
from llama_cpp.llama_grammar import SchemaConverter as _LlamaSchemaConverter

from . import grammar_limits
from .grammar_limits import DEFAULT_LIMITS, GrammarLimits

# Constraints the converter does not turn into grammar rules: a schema using one would be
# ignored in part, so it is refused instead.
UNSUPPORTED = ("multipleOf", "minProperties", "maxProperties", "uniqueItems", "not", "if", "then", "else", "contains",
               "minContains", "maxContains", "patternProperties", "propertyNames", "dependentRequired",
               "dependentSchemas", "unevaluatedProperties", "unevaluatedItems")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# digits of an integer range's open side (llama-cpp-python's `integer` rule: [0-9] | [1-9] [0-9]{0,15})
OPEN_DIGITS = 16
# the longest bound taken: the range rules nest one group per digit
MAX_BOUND_DIGITS = 100

# keywords whose values are schemas, or maps / lists of schemas
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def check_schema(schema: Any, path: str = "") -> None:
    """ValueError naming the first constraint the converter would drop, or a numeric bound that
    is not a number."""
    if not isinstance(schema, dict):
        return
    for key in UNSUPPORTED:
        if key in schema:
            raise ValueError(f"'{key}' at {path or '/'} is not supported by the JSON-schema converter")
    for key in BOUNDS:
        v = schema.get(key)
        draft4 = key.startswith("exclusive") and isinstance(v, bool)  # draft 4: a flag on minimum / maximum
        if v is not None and not draft4 and (isinstance(v, bool) or not isinstance(v, int | float)
                                             or (isinstance(v, float) and not math.isfinite(v))):
            raise ValueError(f"'{key}' at {path or '/'} must be a finite number, got {v!r}")
    kind = schema.get("type")
    if (kind == "integer" or (isinstance(kind, list) and "integer" in kind)) and any(k in schema for k in BOUNDS):
        integer_bounds(schema, path)  # an empty or too long range is a ValueError here, named by its place
    for key in _SUBSCHEMA:
        check_schema(schema.get(key), f"{path}/{key}")
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, dict):
            for name, s in sub.items():
                check_schema(s, f"{path}/{key}/{name}")
    for key in _SCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, s in enumerate(sub):
                check_schema(s, f"{path}/{key}/{i}")


def integer_bounds(schema: dict[str, Any], path: str = "") -> tuple[int | None, int | None]:
    """The least and greatest integer an `integer` schema's bounds allow (None: open). Both
    kinds of bound may be given: the tighter one holds. Fractional bounds round inwards.
    ValueError when no integer is in range, or a bound has more than MAX_BOUND_DIGITS digits."""
    def number(key: str) -> float | int | None:
        v = schema.get(key)
        return None if v is None or isinstance(v, bool) else v

    low, high = number("minimum"), number("maximum")
    ex_low, ex_high = number("exclusiveMinimum"), number("exclusiveMaximum")
    if schema.get("exclusiveMinimum") is True:  # draft 4: minimum itself is excluded
        low, ex_low = None, low
    if schema.get("exclusiveMaximum") is True:
        high, ex_high = None, high
    lows = [math.ceil(low)] if low is not None else []
    lows += [math.floor(ex_low) + 1] if ex_low is not None else []
    highs = [math.floor(high)] if high is not None else []
    highs += [math.ceil(ex_high) - 1] if ex_high is not None else []
    lo, hi = (max(lows) if lows else None), (min(highs) if highs else None)
    where = path or "/"
    for v in (lo, hi):
        if v is not None and abs(v) >= 10**MAX_BOUND_DIGITS:
            raise ValueError(f"integer bound at {where} has more than {MAX_BOUND_DIGITS} digits")
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"no integer is in the range the bounds at {where} set ({lo} > {hi})")
    return lo, hi


def integer_range_gbnf(lo: int | None, hi: int | None) -> str:
    """GBNF alternatives whose sentences are the integers in [lo, hi], written as JSON writes
    them (no leading zeros, no "-0"); an open side reaches OPEN_DIGITS digits, or as many as the
    other bound has."""
    if lo is None and hi is None:
        raise ValueError("an integer range needs a bound")
    digits = max(OPEN_DIGITS, *(len(str(abs(v))) for v in (lo, hi) if v is not None))
    widest = 10**digits - 1
    lo = -widest if lo is None else lo
    hi = widest if hi is None else hi
    if lo > hi:
        raise ValueError(f"empty integer range {lo}..{hi}")
    if hi < 0:
        return f'"-" ({_alternatives(-hi, -lo)})'
    if lo < 0:
        return f'"-" ({_alternatives(1, -lo)}) | {_alternatives(0, hi)}'
    return _alternatives(lo, hi)


def _alternatives(lo: int, hi: int) -> str:
    """The numerals of lo..hi (0 <= lo <= hi), length by length; lengths wholly inside the range
    share one `[1-9] [0-9]{m,n}`."""
    alts: list[str] = []
    full: list[int] = []  # a run of whole lengths (their digits after the first), not yet written
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = str(lo) if n == len(str(lo)) else "1" + "0" * (n - 1)
        b = str(hi) if n == len(str(hi)) else "9" * n
        if a == "1" + "0" * (n - 1) and b == "9" * n:
            full.append(n - 1)
            continue
        if full:
            alts.append(_whole_lengths(full[0], full[-1]))
            full = []
        alts.extend(_span(a, b))
    if full:
        alts.append(_whole_lengths(full[0], full[-1]))
    return " | ".join(alts)


def _whole_lengths(m: int, n: int) -> str:
    """Numerals of 1 + m to 1 + n digits, any."""
    return "[1-9]" if n == 0 else f"[1-9] {_any_digits(m, n)}"


def _any_digits(m: int, n: int) -> str:
    if m == n:
        return "[0-9]" if m == 1 else f"[0-9]{{{m}}}"
    return f"[0-9]{{{m},{n}}}"


def _span(a: str, b: str) -> list[str]:
    """Alternatives whose sentences are the digit strings s of a's length with a <= s <= b."""
    if a == b:
        return [f'"{a}"']
    same = 0
    while a[same] == b[same]:
        same += 1
    if same:  # a shared head, then the rest
        rest = _span(a[same:], b[same:])
        return [f'"{a[:same]}" ' + (rest[0] if len(rest) == 1 else f"({' | '.join(rest)})")]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    n = len(a) - 1
    zeros, nines = "0" * n, "9" * n
    # the first digit's values whose every continuation is in range
    first = a[0] if a[1:] == zeros else chr(ord(a[0]) + 1)
    last = b[0] if b[1:] == nines else chr(ord(b[0]) - 1)
    alts = []
    if a[1:] != zeros:
        alts.append(_head(a[0], _span(a[1:], nines)))
    if first <= last:
        alts.append(f"{_digit_class(first, last)} {_any_digits(n, n)}")
    if b[1:] != nines:
        alts.append(_head(b[0], _span(zeros, b[1:])))
    return alts


def _head(digit: str, rest: list[str]) -> str:
    return f'"{digit}" ' + (rest[0] if len(rest) == 1 else f"({' | '.join(rest)})")


def _digit_class(first: str, last: str) -> str:
    return f"[{first}]" if first == last else f"[{first}-{last}]"


class SchemaConverter(_LlamaSchemaConverter):
    """llama-cpp-python's SchemaConverter with integer ranges and `type` lists that keep the
    schema's other keywords (see the module's doc)."""

    def visit(self, schema: dict[str, Any], name: str) -> str:
        # the base class's precedence: $ref, then anyOf / oneOf, come before the type
        if isinstance(schema, dict) and not any(k in schema for k in ("$ref", "anyOf", "oneOf")):
            kind = schema.get("type")
            rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
            if isinstance(kind, list):
                return self._add_rule(rule_name, self._generate_union_rule(name, [{**schema, "type": t} for t in kind]))
            if kind == "integer" and "const" not in schema and "enum" not in schema and \
                    any(k in schema for k in BOUNDS):
                lo, hi = integer_bounds(schema)
                return self._add_rule(rule_name, f"({integer_range_gbnf(lo, hi)}) space")
        return super().visit(schema, name)


def converter(prop_order: dict[str, int] | None = None) -> SchemaConverter:
    """A converter as the server uses it: no remote schemas, `.` not matching newlines, patterns
    inside JSON strings."""
    return SchemaConverter(prop_order=prop_order or {}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_schema_grammar(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF (root rule `root`) whose sentences are JSON values valid under `schema`, as the
    server builds it for `response_format`; usable as the Python API's `grammar`. ValueError
    for a schema past `limits` (grammar_limits.LimitError), with a keyword the converter cannot
    enforce (UNSUPPORTED), or that it cannot turn into a grammar."""
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise ValueError("the JSON schema must be an object")
    grammar_limits.check_schema(schema, limits)  # before the converter's recursion and llama.cpp's
    check_schema(schema)
    try:
        conv = converter()
        # a round trip through JSON: the converter rewrites $refs in place, and the caller's schema is theirs
        conv.visit(conv.resolve_refs(json.loads(json.dumps(grammar_limits.normalize_schema(schema))), "stdin"), "")
        return conv.format_grammar()
    except Exception as e:  # the converter raises bare exceptions on what it does not support
        raise ValueError(f"the JSON schema cannot be turned into a grammar: {e}") from None
