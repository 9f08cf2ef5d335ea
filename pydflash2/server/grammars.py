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


def _response_format_schema(response_format: dict[str, Any]) -> Any:
    """The JSON schema a response_format names (None: none, as {"type": "json_object"} alone)."""
    kind = response_format.get("type")
    if kind == "json_object":
        return response_format.get("schema")
    if kind == "json_schema":
        holder = response_format.get("json_schema") or response_format
        schema = holder.get("schema")
        if schema is None:
            raise ValueError("json_schema.schema is missing")
        return schema
    raise ValueError(f"type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


def response_format_grammar(response_format: dict[str, Any], limits: GrammarLimits = DEFAULT_LIMITS) -> str | None:
    """GBNF for an OpenAI response_format; None for {"type": "text"}. ValueError
    for a schema the converter cannot turn into a grammar.

    {"type": "json_object"} (with llama-cpp-python's optional "schema") and
    {"type": "json_schema", "json_schema": {"schema": {...}}} (OpenAI's; also
    the schema at the top level, as llama-server takes it)."""
    if response_format.get("type") == "text":
        return None
    schema = _response_format_schema(response_format)
    return JSON_GBNF if schema is None else json_schema.json_schema_grammar(schema, limits)


def response_format_unenforced(response_format: dict[str, Any]) -> list[str]:
    """The keywords of a response_format's schema that its grammar leaves unenforced (json_schema.unenforced)."""
    if response_format.get("type") == "text":
        return []
    return json_schema.unenforced(_response_format_schema(response_format))


def check_grammar(vocab: Any, grammar: str, limits: GrammarLimits = DEFAULT_LIMITS) -> None:
    """ValueError unless `grammar` is within `limits` (grammar_limits.LimitError) and llama.cpp's
    grammar parser accepts it (root rule "root"), parsed as the engine parses it (on a big stack)."""
    grammar_limits.check_gbnf(grammar, limits)
    grammar_limits.check_parses(vocab, grammar)
