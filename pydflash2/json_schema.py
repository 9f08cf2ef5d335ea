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

Beyond 0.3.36, as JSON Schema and llama.cpp's converter read them (issue 58): strings use llama.cpp's
JSON character (no raw control characters); `true`, `{}` and a schema of annotations only are any
JSON value, and `false` is refused by place (check_schema); a type-less schema with one type's own
keywords is that type; `prefixItems` then `items` as 2020-12 defines them; literals escape their
backslashes; a `pattern` writes only what a JSON string may hold raw.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from llama_cpp.llama_grammar import PRIMITIVE_RULES, RESERVED_NAMES, STRING_FORMAT_RULES, BuiltinRule, _build_repetition
from llama_cpp.llama_grammar import SchemaConverter as _LlamaSchemaConverter

from . import grammar_limits
from .grammar_limits import DEFAULT_LIMITS, GrammarLimits

# Constraints the converter does not turn into grammar rules. As llama.cpp's converter (and
# llama-server), a schema using one is accepted and the keyword is not enforced: pydantic writes
# uniqueItems for a set, zod propertyNames for a record and `not: {}` for never. unenforced()
# names each with its place; the server lists them in its access log and a response header.
NOT_ENFORCED = ("multipleOf", "minProperties", "maxProperties", "uniqueItems", "not", "if", "then", "else",
                "contains", "minContains", "maxContains", "patternProperties", "propertyNames", "dependentRequired",
                "dependentSchemas", "unevaluatedProperties", "unevaluatedItems")
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# digits of an integer range's open side (llama-cpp-python's `integer` rule: [0-9] | [1-9] [0-9]{0,15})
OPEN_DIGITS = 16
# the longest bound taken: the range rules nest one group per digit
MAX_BOUND_DIGITS = 100

# keywords whose values are schemas, or maps / lists of schemas
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")  # items: a list in draft 7 tuples


def _children(schema: dict[str, Any], path: str) -> Iterator[tuple[Any, str, bool]]:
    """The subschemas the converter reads, with their places; True where a `false` there closes the
    schema (additionalProperties, additionalItems, items beside prefixItems) instead of saying "no value"."""
    for key in _SUBSCHEMA:
        if key in schema:
            yield schema[key], f"{path}/{key}", key != "items" or "prefixItems" in schema
    for key in _SCHEMA_MAPS:
        sub = schema.get(key)
        if isinstance(sub, dict):
            for name, s in sub.items():
                yield s, f"{path}/{key}/{name}", False
    for key in _SCHEMA_LISTS:
        sub = schema.get(key)
        if isinstance(sub, list):
            for i, s in enumerate(sub):
                yield s, f"{path}/{key}/{i}", False


def check_schema(schema: Any, path: str = "") -> None:
    """ValueError naming the first numeric bound that is not a number, an empty integer range, or a
    `false` subschema (no value satisfies it) where it is not a closing keyword (additionalProperties,
    additionalItems, items beside prefixItems)."""
    if schema is False:
        raise ValueError(f"the schema at {path or '/'} is false: no value satisfies it")
    if not isinstance(schema, dict):
        return
    for key in BOUNDS:
        v = schema.get(key)
        draft4 = key.startswith("exclusive") and isinstance(v, bool)  # draft 4: a flag on minimum / maximum
        if v is not None and not draft4 and (isinstance(v, bool) or not isinstance(v, int | float)
                                             or (isinstance(v, float) and not math.isfinite(v))):
            raise ValueError(f"'{key}' at {path or '/'} must be a finite number, got {v!r}")
    kind = schema.get("type")
    if (kind == "integer" or (isinstance(kind, list) and "integer" in kind)) and any(k in schema for k in BOUNDS):
        integer_bounds(schema, path)  # an empty or too long range is a ValueError here, named by its place
    for sub, place, closes in _children(schema, path):
        if not (sub is False and closes):
            check_schema(sub, place)


def unenforced(schema: Any, path: str = "") -> list[str]:
    """The NOT_ENFORCED keywords in a schema, each as keyword@place (e.g. uniqueItems@/properties/tags):
    accepted, and left to the client to check, as llama.cpp's converter leaves them."""
    if not isinstance(schema, dict):
        return []
    found = [f"{key}@{path or '/'}" for key in NOT_ENFORCED if key in schema]
    for sub, place, _ in _children(schema, path):
        found += unenforced(sub, place)
    return found


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


# A JSON string's character as llama.cpp's own converter writes it: no raw control characters,
# which JSON forbids in strings (0.3.36's `[^"\\]` let newlines in at high temperature).
JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})'
_PRIMITIVES = {**PRIMITIVE_RULES, "char": BuiltinRule(JSON_CHAR, [])}
# what a pattern's "any character" may write inside a JSON string (regex class members)
_PATTERN_ANY = r'^"\\\x00-\x1F\x7F'

# keywords the base class builds a rule from when there is no `type` (its visit's branches)
_SHAPING = ("$ref", "anyOf", "oneOf", "const", "enum", "properties", "allOf", "items", "prefixItems", "pattern")
# a type-less schema with one type's own keywords is generated as that type (llama.cpp's converter
# does so for bounds): a subset of what it allows, all of it valid
_IMPLIED = (("integer", BOUNDS), ("string", ("minLength", "maxLength")), ("array", ("minItems", "maxItems")))


def _shaped(schema: dict[str, Any]) -> bool:
    """Whether the base class writes a rule for this type-less schema (else it says 'Unrecognized schema')."""
    fmt = schema.get("format")
    known_format = isinstance(fmt, str) and (re.match(r"^uuid[1-5]?$", fmt) is not None
                                             or f"{fmt}-string" in STRING_FORMAT_RULES)
    return any(k in schema for k in _SHAPING) or schema.get("additionalProperties", True) is not True or known_format


def json_safe_pattern(pattern: str) -> str:
    """A `pattern` whose every match the converter writes as a valid JSON string body: `.` and negated
    classes leave out what a JSON string must escape; ValueError for what would write it raw (a
    quote, a backslash, a control character)."""
    out: list[str] = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            if pattern[i + 1] in '\\"ntrfv0xuU':
                raise ValueError(f"pattern {pattern!r}: the escape {pattern[i:i + 2]!r} would write a character a "
                                 "JSON string must escape (not supported)")
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if c == '"' or ord(c) < 0x20 or c == "\x7f":
            raise ValueError(f"pattern {pattern!r}: {c!r} would be written raw inside a JSON string (not supported)")
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            if pattern.startswith("[^", i):
                out.append("[" + _PATTERN_ANY)
                i += 2
                continue
        elif c == ".":
            c = f"[{_PATTERN_ANY}]"
        out.append(c)
        i += 1
    return "".join(out)


class SchemaConverter(_LlamaSchemaConverter):
    """llama-cpp-python's SchemaConverter with integer ranges, `type` lists that keep the
    schema's other keywords (see the module's doc), JSON Schema's reading of `true`, `{}` and
    type-less schemas (any value), and llama.cpp's JSON string character."""

    def visit(self, schema: Any, name: str) -> str:
        if schema is True:  # any value; `false` is refused before (check_schema)
            schema = {}
        if not isinstance(schema, dict):
            return super().visit(schema, name)
        rule_name = name + "-" if name in RESERVED_NAMES else name or "root"
        if isinstance(schema.get("allOf"), list):
            parts = [s for s in schema["allOf"] if s is not True]  # `true` constrains nothing
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            if len(parts) == 1 and not any(k in rest for k in ("properties", "anyOf", "oneOf")):
                # pydantic v1's allOf: [{$ref}] beside a description
                rest["anyOf"] = parts
            elif parts:
                rest["allOf"] = parts
            schema = rest
        # the base class's precedence: $ref, then anyOf / oneOf, come before the type
        if any(k in schema for k in ("$ref", "anyOf", "oneOf")):
            return super().visit(schema, name)
        kind = schema.get("type")
        if kind is None and not _shaped(schema):
            kind = next((t for t, keys in _IMPLIED if any(k in schema for k in keys)), None)
            if kind is None:  # annotations only, or {}: any JSON value (zod's z.any().describe())
                return self._add_rule(rule_name, self._add_primitive("value", PRIMITIVE_RULES["value"]))
            schema = {**schema, "type": kind}
        if isinstance(kind, list):
            return self._add_rule(rule_name, self._generate_union_rule(name, [{**schema, "type": t} for t in kind]))
        if kind == "integer" and "const" not in schema and "enum" not in schema and any(k in schema for k in BOUNDS):
            lo, hi = integer_bounds(schema)
            return self._add_rule(rule_name, f"({integer_range_gbnf(lo, hi)}) space")
        items, prefix = schema.get("items"), schema.get("prefixItems")
        if items == {} or (kind == "array" and items is None and prefix is None
                           and ("minItems" in schema or "maxItems" in schema)):
            # items of any value: the base class's bare `array` would drop the counts, and it reads
            # prefixItems (a KeyError) where items is the falsy {}
            items = True
            schema = {**schema, "items": items}
        if isinstance(prefix, list) and prefix and (items is True or isinstance(items, dict)):
            # 2020-12: items is the schema of the elements after prefixItems (the base class took it for all):
            # every prefix element, then as many more as minItems / maxItems allow
            lo, hi = schema.get("minItems", 0), schema.get("maxItems")
            if hi is not None and hi < len(prefix):
                raise ValueError(f"maxItems {hi} is below the {len(prefix)} prefixItems (not supported)")
            sep = "-" if name else ""
            head = ' "," space '.join(self.visit(s, f"{name}{sep}tuple-{i}") for i, s in enumerate(prefix))
            tail = self.visit(items, f"{name}{sep}item")
            more = _build_repetition(f'("," space {tail})', max(0, lo - len(prefix)),
                                     None if hi is None else hi - len(prefix))
            return self._add_rule(rule_name, f'"[" space {head} {more} "]" space')
        return super().visit(schema, name)

    def _format_literal(self, literal: str) -> str:
        # backslashes too, as llama.cpp's converter escapes them: 0.3.36 left them, so a const "a\nb"
        # (JSON text "a\\nb") wrote a raw newline, and one holding a quote ended the GBNF literal early
        escaped = literal.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n").replace('"', '\\"')
        return f'"{escaped}"'

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        # the base class reads llama_cpp's own table (its `char` lets control characters in): ours instead
        rule = _PRIMITIVES["char"] if rule is PRIMITIVE_RULES["char"] else rule
        key = self._add_rule(name, rule.content)
        for dep in rule.deps:
            if dep not in self._rules:
                self._add_primitive(dep, _PRIMITIVES.get(dep) or STRING_FORMAT_RULES[dep])
        return key

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return super()._visit_pattern(pattern if self._raw_pattern else json_safe_pattern(pattern), name)


def converter(prop_order: dict[str, int] | None = None) -> SchemaConverter:
    """A converter as the server uses it: no remote schemas, `.` not matching newlines, patterns
    inside JSON strings."""
    return SchemaConverter(prop_order=prop_order or {}, allow_fetch=False, dotall=False, raw_pattern=False)


def json_schema_grammar(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    """GBNF (root rule `root`) whose sentences are JSON values valid under `schema` (a dict, or
    `true`: any value), as the server builds it for `response_format`; usable as the Python API's
    `grammar`. ValueError for `false` (at the root or inside, named by its place), for a schema
    past `limits` (grammar_limits.LimitError), or that it cannot turn into a grammar. Keywords the
    converter does not enforce (NOT_ENFORCED; listed by unenforced()) are accepted and left out."""
    if schema is True:  # JSON Schema's "any value"
        schema = {}
    if schema is False:
        check_schema(schema)  # raises: "no value" is refused, named
    if not isinstance(schema, dict):
        raise ValueError("the JSON schema must be an object or a boolean")
    grammar_limits.check_schema(schema, limits)  # before the converter's recursion and llama.cpp's
    check_schema(schema)
    try:
        conv = converter()
        # a round trip through JSON: the converter rewrites $refs in place, and the caller's schema is theirs
        conv.visit(conv.resolve_refs(json.loads(json.dumps(grammar_limits.normalize_schema(schema))), "stdin"), "")
        return conv.format_grammar()
    except Exception as e:  # the converter raises bare exceptions on what it does not support
        raise ValueError(f"the JSON schema cannot be turned into a grammar: {e}") from None
