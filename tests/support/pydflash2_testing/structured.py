"""Structured output under hot sampling (issue 58), shared by tests/test_structured_output.py and
benchmarks/structured_output.py: random JSON schemas of the kinds clients send (objects, arrays,
enums, integer bounds, nullable fields, type-less and `true` subschemas), and one request per API
that constrains an answer by a schema (chat `response_format`, a forced tool call, Anthropic
Messages' `output_config`, Responses' `text.format`), read back as the JSON text the client gets and
whether generation finished (not cut off by the token limit)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import httpx
import jsonschema

KINDS = ("response_format", "tool_call", "messages", "responses")
# what JSON Schema reads as "any value": `true`, `{}`, annotations only (zod's z.any().describe())
ANY = (True, {}, {"description": "Optional input value"}, {"title": "Anything", "examples": [1]})
ENUM_VALUES = ("a", "b c", "line\nbreak", 'quote"', 0, 7, -2.5, True, None)
NAMES = ("a", "b", "c", "name", "value", "char", "x y")  # `value`, `char`: the converter's own rule names


def random_schema(rng: random.Random, depth: int = 0) -> Any:
    """A schema the converter enforces whole (no number bounds, which it accepts and does not enforce)."""
    if depth < 2 and rng.random() < 0.45:
        schema = _object(rng, depth) if rng.random() < 0.6 else _array(rng, depth)
    else:
        schema = _leaf(rng)
    if rng.random() < 0.2 and isinstance(schema, dict):  # nullable, both ways clients write it
        kind = schema.get("type")
        if kind == "null":
            return schema
        if isinstance(kind, str) and rng.random() < 0.5:
            return {**schema, "type": [kind, "null"]}
        return {"anyOf": [schema, {"type": "null"}]}
    return schema


def _leaf(rng: random.Random) -> Any:
    kind = rng.choice(("string", "string", "integer", "number", "boolean", "null", "enum", "const", "any", "date"))
    if kind == "string":
        hi = rng.randint(1, 12)
        return {"type": "string", "maxLength": hi, **({"minLength": rng.randint(0, hi)} if rng.random() < 0.4 else {})}
    if kind == "integer":
        schema: dict[str, Any] = {"type": "integer"}
        lo = rng.choice((None, rng.randint(-1000, 1000)))
        if lo is not None:
            schema["minimum" if rng.random() < 0.7 else "exclusiveMinimum"] = lo
        if rng.random() < 0.6:
            schema["maximum"] = (lo or 0) + 1 + rng.randint(0, 10 ** rng.randint(0, 5))
        return schema
    if kind == "enum":
        return {"enum": rng.sample(ENUM_VALUES, rng.randint(1, 4))}
    if kind == "const":
        return {"const": rng.choice(ENUM_VALUES)}
    if kind == "any":
        return rng.choice(ANY)
    if kind == "date":
        return {"type": "string", "format": "date"}
    return {"type": kind}


def _object(rng: random.Random, depth: int) -> dict[str, Any]:
    names = rng.sample(NAMES, rng.randint(1, 3))
    props = {n: random_schema(rng, depth + 1) for n in names}
    schema: dict[str, Any] = {"type": "object", "properties": props,
                              "required": [n for n in names if rng.random() < 0.6]}
    if rng.random() < 0.5:
        schema["additionalProperties"] = False
    if rng.random() < 0.3:
        schema["description"] = "an object"
    return schema


def _array(rng: random.Random, depth: int) -> dict[str, Any]:
    lo = rng.randint(0, 1)
    schema: dict[str, Any] = {"type": "array", "minItems": lo, "maxItems": lo + rng.randint(0, 2)}
    if rng.random() < 0.25:  # a tuple (2020-12): prefixItems, then items or none
        schema["prefixItems"] = [random_schema(rng, depth + 1) for _ in range(rng.randint(1, 2))]
        schema["items"] = rng.choice((False, random_schema(rng, depth + 1)))
        schema["minItems"] = schema["maxItems"] = len(schema["prefixItems"])
    else:
        schema["items"] = random_schema(rng, depth + 1)
    return schema


def tool_parameters(schema: Any) -> dict[str, Any]:
    """A tool's parameters: the schema where it is an object's, else an object holding it."""
    if isinstance(schema, dict) and schema.get("type") == "object":
        return schema
    return {"type": "object", "properties": {"v": schema}, "required": ["v"], "additionalProperties": False}


@dataclass(frozen=True)
class Answer:
    kind: str
    schema: Any  # what the answer must satisfy
    finished: bool  # False: cut off by the token limit
    text: str  # the JSON text the client gets (content, a call's arguments, output_text)

    def verdict(self) -> str:
        """"ok": a JSON value valid under its schema; else what is wrong. (Before issue 58's UTF-8
        fix llama.cpp's grammar let invalid UTF-8 into strings, which it counted as one character
        and the server decoded as up to four U+FFFD: pydflash2.utf8_pieces.)"""
        try:
            value = json.loads(self.text)  # strict: a raw control character in a string is an error
        except ValueError as e:
            return f"not JSON ({e})"
        try:
            jsonschema.validate(value, self.schema)
            return "ok"
        except jsonschema.ValidationError as e:
            return f"invalid: {e.message}"


PROMPT = "Reply in JSON."


def ask(client: httpx.Client, kind: str, schema: Any, *, temperature: float, max_tokens: int,
        seed: int) -> Answer:
    """One request of `kind` constrained by `schema` (a forced call's: tool_parameters(schema))."""
    messages = [{"role": "user", "content": PROMPT}]
    sampling = {"temperature": temperature, "top_p": 1.0}
    if kind in ("response_format", "tool_call"):
        body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "seed": seed, "top_k": 0,
                                "min_p": 0.0, **sampling}
        if kind == "tool_call":
            schema = tool_parameters(schema)
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}
        choice = _post(client, "/v1/chat/completions", body)["choices"][0]
        calls = choice["message"].get("tool_calls") or []
        text = calls[0]["function"]["arguments"] if kind == "tool_call" and calls else choice["message"]["content"]
        return Answer(kind, schema, choice["finish_reason"] != "length", text or "")
    if schema is True and kind in ("messages", "responses"):
        schema = {}  # the same "any value": these APIs type the schema as an object
    if kind == "messages":
        body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "top_k": 0, **sampling,
                "output_config": {"format": {"type": "json_schema", "schema": schema}}}
        out = _post(client, "/v1/messages", body)
        text = "".join(b.get("text", "") for b in out["content"])
        return Answer(kind, schema, out["stop_reason"] != "max_tokens", text)
    if kind == "responses":
        body = {"model": "m", "input": PROMPT, "max_output_tokens": max_tokens, **sampling,
                "text": {"format": {"type": "json_schema", "name": "out", "schema": schema}}}
        out = _post(client, "/v1/responses", body)
        text = "".join(p.get("text", "") for item in out["output"] if item["type"] == "message"
                       for p in item["content"])
        return Answer(kind, schema, out["status"] == "completed", text)
    raise ValueError(f"unknown kind {kind!r}")


def _post(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = client.post(path, json=body)
    if r.status_code != 200:
        raise AssertionError(f"{path}: {r.status_code} {r.text[:500]}\nschema: {json.dumps(body)[:2000]}")
    return dict(r.json())
