"""Bounds on grammars and JSON schemas, checked before llama.cpp parses them.

llama.cpp's GBNF parser is a recursive-descent parser, and its left-recursion
check recurses over the rules the parser derives: a grammar nested deeply
enough overflows the thread's stack and kills the process (SIGSEGV, no
message). Measured with the pinned llama-cpp-python 0.3.36 on an 8 MiB stack
(Linux's default, the same for the main thread and Python's threads): ( )
groups nested 18,600 deep parse and 18,750 crash; a chain of 65,400 rules,
each the next one's first symbol, parses and 65,900 crash (docs/server.md,
"Grammar and schema limits"). So the engine parses every grammar on a thread
with a 64 MiB stack, after refusing one past its hard caps
(native/src/engine/grammar_shape.h: depth 2,000, 100,000 rules; a factor of
70 and 5 below the measured crashes, scaled to that stack). The checks here
come first, name the limit and the option that sets it, and also bound what
the caps do not: the size, the {m,n} repetitions (llama.cpp turns an upper
bound past 2,000 into no bound at all) and, in a JSON schema, the string and
array length bounds (llama-cpp-python's converter writes maxLength n as n
nested groups, which llama.cpp refuses past n = 1,000) and the enum sizes.
The GBNF is measured by the engine's own scanner (pdf2_grammar_shape,
iterative); the schema is walked here without recursion.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, fields
from typing import Any

from ._native import NativeError, ffi, last_error, lib

# The engine's hard caps (native/src/engine/grammar_shape.h): no option may go above them.
NATIVE_MAX_DEPTH = 2000
NATIVE_MAX_RULES = 100_000
# llama.cpp's MAX_REPETITION_THRESHOLD: a larger {m} is refused, a larger {,n} silently unbounded
LLAMA_MAX_REPETITION = 2000
# llama-cpp-python's converter writes maxLength / maxItems n as n nested optional groups, and
# llama.cpp refuses the grammar past n = 1000 (its 2,000-rule repetition threshold; measured)
CONVERTER_MAX_REPEAT = 1000


class LimitError(ValueError):
    """A grammar or schema past one of the limits; `option` names the server option that sets it."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class GrammarLimits:
    """The limits, by the `pydflash2 serve` option that sets each (--max-grammar-depth...)."""

    grammar_bytes: int = 256 << 10  # GBNF text (parsed on a worker thread, and again when the request starts)
    grammar_depth: int = NATIVE_MAX_DEPTH  # nesting of ( ) groups in GBNF
    grammar_rules: int = NATIVE_MAX_RULES  # GBNF rules, defined and derived (per group, * + ?, n - m per {m,n})
    grammar_repeat: int = LLAMA_MAX_REPETITION  # the largest bound of a GBNF {m,n}
    schema_repeat: int = CONVERTER_MAX_REPEAT  # JSON schema: maxLength, minLength, maxItems, minItems
    schema_enum: int = 4096  # JSON schema: values of one enum, alternatives of one anyOf / oneOf

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            cap = LIMIT_CAPS.get(f.name)
            if not isinstance(v, int) or v < 1 or (cap is not None and v > cap):
                bound = f"an integer in 1..{cap}" if cap is not None else "an integer >= 1"
                raise ValueError(f"{option_name(f.name)} must be {bound}, got {v!r}")


# the most each may be set to (the others: any positive int)
LIMIT_CAPS = {"grammar_depth": NATIVE_MAX_DEPTH, "grammar_rules": NATIVE_MAX_RULES,
              "grammar_repeat": LLAMA_MAX_REPETITION, "schema_repeat": CONVERTER_MAX_REPEAT}


DEFAULT_LIMITS = GrammarLimits()


def option_name(field: str) -> str:
    """The serve option of a GrammarLimits field: grammar_depth -> --max-grammar-depth."""
    return "--max-" + field.replace("_", "-")


def check_gbnf(text: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """LimitError unless the GBNF text is within `limits` (its syntax is llama.cpp's to check)."""
    if "\0" in text:
        raise ValueError("the grammar holds a NUL character")
    data = text.encode("utf-8", "surrogatepass")
    depth, rules, repeat = ffi.new("int64_t *"), ffi.new("int64_t *"), ffi.new("int64_t *")
    if lib.pdf2_grammar_shape(data, depth, rules, repeat) != 0:  # a {m,n} with n < m (llama.cpp loops on it)
        raise ValueError(last_error())
    for value, name, what in ((len(data), "grammar_bytes", "{v} bytes of GBNF"),
                              (depth[0], "grammar_depth", "groups nested {v} deep"),
                              (rules[0], "grammar_rules", "{v} rules (defined, and derived from groups and "
                                                          "repetitions)"),
                              (repeat[0], "grammar_repeat", "a repetition bound of {v}")):
        limit = getattr(limits, name)
        if value > limit:
            raise LimitError(f"{what.format(v=value)}: more than the limit of {limit} ({option_name(name)})",
                             option_name(name))


def check_parses(vocab: Any, text: str) -> None:
    """ValueError unless llama.cpp parses the GBNF text (root rule "root") against `vocab` (a
    llama_vocab * from llama_cpp), as the engine parses a request's grammar: within its hard
    caps, on a thread with a 64 MiB stack (pdf2_grammar_check)."""
    address = ctypes.cast(vocab, ctypes.c_void_p).value
    if not address:
        raise NativeError("check_parses: no vocab")
    if lib.pdf2_grammar_check(ffi.cast("void *", address), text.encode("utf-8", "surrogatepass")) != 0:
        raise ValueError(last_error())


_BOUNDS = ("maxLength", "minLength", "maxItems", "minItems")
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems", "not", "if", "then", "else", "contains",
              "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")


def check_schema(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """LimitError naming the first place (a JSON pointer) where the schema passes `limits`, or a
    ValueError for a $ref that cannot be resolved in the schema itself (remote, or missing)."""
    todo: list[tuple[Any, str]] = [(schema, "")]  # no recursion: the server's body parser bounds the nesting
    while todo:                                    # (64 levels), the Python API takes no schemas
        node, path = todo.pop()
        if not isinstance(node, dict):
            continue
        where = path or "/" if len(path) <= 80 else f"{path[:40]}...{path[-37:]}"  # a JSON pointer, shortened
        for key in _BOUNDS:
            v = node.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"'{key}' at {where} must be a non-negative integer, got {v!r}")
            if v > limits.schema_repeat:
                raise LimitError(f"'{key}' {v} at {where}: more than the limit of {limits.schema_repeat} "
                                 f"({option_name('schema_repeat')}; llama.cpp refuses the grammar the converter writes "
                                 f"for a bound past {CONVERTER_MAX_REPEAT})", option_name("schema_repeat"))
        for key in ("enum", "anyOf", "oneOf"):
            v = node.get(key)
            if isinstance(v, list) and len(v) > limits.schema_enum:
                raise LimitError(f"'{key}' at {where} has {len(v)} values: more than the limit of "
                                 f"{limits.schema_enum} ({option_name('schema_enum')})", option_name("schema_enum"))
        ref = node.get("$ref")
        if ref is not None:
            _check_ref(schema, ref, where)
        for key in _SUBSCHEMA:
            if isinstance(node.get(key), dict):
                todo.append((node[key], f"{path}/{key}"))
        for key in _SCHEMA_MAPS:
            sub = node.get(key)
            if isinstance(sub, dict):
                todo.extend((s, f"{path}/{key}/{name}") for name, s in sub.items())
        for key in _SCHEMA_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                todo.extend((s, f"{path}/{key}/{i}") for i, s in enumerate(sub))


def _check_ref(root: Any, ref: Any, where: str) -> None:
    """ValueError unless `ref` points inside the schema (a recursive $ref is fine: the
    converter writes it as a rule that refers to itself)."""
    if not isinstance(ref, str) or not ref.startswith("#/"):
        raise ValueError(f"$ref {ref!r} at {where}: only references inside the schema ('#/$defs/name') are "
                         "supported (no remote schemas, and not '#' itself: put a recursive part under $defs)")
    target = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise ValueError(f"$ref {ref!r} at {where} points to nothing in the schema")


def normalize_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema as llama-cpp-python's converter resolves it: a root that is only a $ref
    beside its $defs (as pydantic writes recursive models) becomes a one-way anyOf, since
    the converter does not look beside a $ref for the definitions it names."""
    if "$ref" in schema and any(k in schema for k in ("$defs", "definitions")):
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return {**rest, "anyOf": [{"$ref": schema["$ref"]}]} if "anyOf" not in rest else schema
    return schema
