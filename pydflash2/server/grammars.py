"""GBNF for what a request constrains: `response_format` (JSON object, JSON
schema) through llama-cpp-python's JSON-schema converter, as its server and
llama-server build them, and a check that llama.cpp's own grammar parser
accepts a grammar before a slot is spent on it."""

from __future__ import annotations

import json
from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from .. import grammar_limits
from ..grammar_limits import DEFAULT_LIMITS, GrammarLimits


def response_format_grammar(response_format: dict[str, Any], limits: GrammarLimits = DEFAULT_LIMITS) -> str | None:
    """GBNF for an OpenAI response_format; None for {"type": "text"}. ValueError
    for a schema the converter cannot turn into a grammar.

    {"type": "json_object"} (with llama-cpp-python's optional "schema") and
    {"type": "json_schema", "json_schema": {"schema": {...}}} (OpenAI's; also
    the schema at the top level, as llama-server takes it)."""
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = response_format.get("schema")
        return JSON_GBNF if schema is None else schema_grammar(schema, limits)
    if kind == "json_schema":
        holder = response_format.get("json_schema") or response_format
        schema = holder.get("schema")
        if schema is None:
            raise ValueError("json_schema.schema is missing")
        return schema_grammar(schema, limits)
    raise ValueError(f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


# Constraints llama-cpp-python's converter does not turn into grammar rules: a schema
# using one would be ignored in part, so it is refused instead.
UNSUPPORTED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
               "maxProperties", "uniqueItems", "not", "if", "then", "else", "contains", "minContains",
               "maxContains", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
               "unevaluatedProperties", "unevaluatedItems")
# keywords whose values are schemas, or maps / lists of schemas
_SUBSCHEMA = ("items", "additionalProperties", "additionalItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def check_schema(schema: Any, path: str = "") -> None:
    """ValueError naming the first constraint the converter would drop."""
    if not isinstance(schema, dict):
        return
    for key in UNSUPPORTED:
        if key in schema:
            raise ValueError(f"'{key}' at {path or '/'} is not supported by llama-cpp-python's JSON-schema converter")
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


def schema_grammar(schema: Any, limits: GrammarLimits = DEFAULT_LIMITS) -> str:
    if isinstance(schema, bool) or not isinstance(schema, dict):
        raise ValueError("the JSON schema must be an object")
    grammar_limits.check_schema(schema, limits)  # before the converter's recursion and llama.cpp's
    check_schema(schema)
    try:
        return json_schema_to_gbnf(json.dumps(grammar_limits.normalize_schema(schema)))
    except Exception as e:  # the converter raises bare exceptions on what it does not support
        raise ValueError(f"the JSON schema cannot be turned into a grammar: {e}") from None


def check_grammar(vocab: Any, grammar: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """ValueError unless `grammar` is within `limits` (grammar_limits.LimitError) and llama.cpp's
    grammar parser accepts it (root rule "root"), parsed as the engine parses it (on a big stack)."""
    grammar_limits.check_gbnf(grammar, limits)
    grammar_limits.check_parses(vocab, grammar)
