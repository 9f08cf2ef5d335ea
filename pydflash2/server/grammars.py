"""GBNF for what a request constrains: `response_format` (JSON object, JSON
schema) through the JSON-schema converter (pydflash2.json_schema:
llama-cpp-python's, with integer ranges), as its server and llama-server build
them, and a check that llama.cpp's own grammar parser accepts a grammar before
a slot is spent on it."""

from __future__ import annotations

from typing import Any

from llama_cpp.llama_grammar import JSON_GBNF

from .. import grammar_limits, json_schema
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
        return JSON_GBNF if schema is None else json_schema.json_schema_grammar(schema, limits)
    if kind == "json_schema":
        holder = response_format.get("json_schema") or response_format
        schema = holder.get("schema")
        if schema is None:
            raise ValueError("json_schema.schema is missing")
        return json_schema.json_schema_grammar(schema, limits)
    raise ValueError(f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def check_grammar(vocab: Any, grammar: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """ValueError unless `grammar` is within `limits` (grammar_limits.LimitError) and llama.cpp's
    grammar parser accepts it (root rule "root"), parsed as the engine parses it (on a big stack)."""
    grammar_limits.check_gbnf(grammar, limits)
    grammar_limits.check_parses(vocab, grammar)
