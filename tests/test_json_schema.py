"""The JSON-schema converter (pydflash2.json_schema, issue 34 item 3): integer ranges
(`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`) become grammar rules that
llama.cpp's own grammar sampler, fed the answer byte by byte, accepts for exactly the integers
in range, written as JSON writes them; the bounds' forms (exclusive, draft 4's flags, fractions,
both kinds at once); what stays refused; and the Python API's use of the same converter."""

from __future__ import annotations

import ctypes
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import llama_cpp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pydflash2 import json_schema, json_schema_grammar


class GrammarProbe:
    """Whether llama.cpp's grammar sampler lets a text through whole: each byte a token of the tiny
    target's byte-level vocabulary, checked (llama_sampler_apply) before it is accepted, then the end
    of generation allowed only where the grammar is complete (as llama.cpp's test-grammar-integration
    matches strings)."""

    def __init__(self, target: Path) -> None:
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(str(target).encode(), params)
        assert self.model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.eos = llama_cpp.llama_vocab_eos(self.vocab)
        self._ids: dict[str, int] = {}

    def token(self, ch: str) -> int:
        if ch not in self._ids:
            buf = (llama_cpp.llama_token * 8)()
            n = llama_cpp.llama_tokenize(self.vocab, ch.encode(), 1, buf, 8, False, False)
            assert n == 1, (ch, n)
            self._ids[ch] = buf[0]
        return self._ids[ch]

    def _allowed(self, sampler: ctypes.c_void_p, token: int) -> bool:
        data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
        cur = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(cur))
        return data[0].logit > float("-inf")

    def sampler(self, grammar: str) -> ctypes.c_void_p:
        s = llama_cpp.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")
        assert s, grammar  # NULL: llama.cpp did not parse it
        return s

    def accepts(self, sampler: ctypes.c_void_p, text: str) -> bool:
        llama_cpp.llama_sampler_reset(sampler)
        for ch in text:
            tok = self.token(ch)
            if not self._allowed(sampler, tok):
                return False
            llama_cpp.llama_sampler_accept(sampler, tok)
        return self._allowed(sampler, self.eos)

    def close(self) -> None:
        llama_cpp.llama_model_free(self.model)


@pytest.fixture(scope="module")
def probe(target_gguf: Path) -> Iterator[GrammarProbe]:
    p = GrammarProbe(target_gguf)
    yield p
    p.close()


def integer_schema(lo: int | None, hi: int | None) -> dict:
    schema: dict = {"type": "integer"}
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    return schema


def in_range(text: str, lo: int | None, hi: int | None) -> bool:
    """The definition: a JSON integer as json.dumps writes one (no leading zeros, no "-0", no "+"), in
    [lo, hi]; an open side reaches 16 digits (or the other bound's length)."""
    try:
        v = int(text)
    except ValueError:
        return False
    if text != str(v):
        return False
    digits = max(json_schema.OPEN_DIGITS, *(len(str(abs(b))) for b in (lo, hi) if b is not None))
    return (lo is None or v >= lo) and (hi is None or v <= hi) and len(str(abs(v))) <= digits


def candidates(lo: int | None, hi: int | None) -> list[str]:
    """Texts about the bounds and the digit-count edges, and malformed ones."""
    edges = [0, 1, -1, 9, 10, -9, -10, 99, 100, -99, -100]
    for b in (lo, hi):
        if b is not None:
            edges += [b - 1, b, b + 1, -b, b * 10, b // 10, 10 ** len(str(abs(b))), 10 ** (len(str(abs(b))) - 1) - 1]
    texts = {str(v) for v in edges}
    texts |= {"-0", "00", "01", "-01", "+1", "", "-", "1.0", "1e2", " 1", "9" * 16, "1" + "0" * 16, "-" + "9" * 16}
    if lo is not None:
        texts.add("0" + str(abs(lo)))
    return sorted(texts)


def check_range(probe: GrammarProbe, schema: dict, lo: int | None, hi: int | None) -> None:
    # the root rule ends with the converter's optional space: the texts are checked without it
    sampler = probe.sampler(json_schema_grammar(schema))
    try:
        for text in candidates(lo, hi):
            assert probe.accepts(sampler, text) == in_range(text, lo, hi), (schema, text)
    finally:
        llama_cpp.llama_sampler_free(sampler)


# ranges after llama.cpp's grammar-integration cases for integer bounds (upstream's
# tests/test-grammar-integration.cpp), checked here against the definition
UPSTREAM_RANGES = [(0, None), (2, None), (456, None), (-123, None), (None, 9999), (None, -9999), (5, 30), (-1, 1),
                   (-123, 42), (1, 9999),  # the last: exclusiveMinimum 0, exclusiveMaximum 10000
                   (3, 17), (-17, -3), (0, 0), (-5, 5), (99, 101), (10, 99), (1, 10**16 - 1), (-(2**63), 2**63 - 1)]


@pytest.mark.parametrize("lo, hi", UPSTREAM_RANGES, ids=[f"{lo}..{hi}" for lo, hi in UPSTREAM_RANGES])
def test_integer_range_accepts_exactly_the_integers_in_range(probe: GrammarProbe, lo: int | None,
                                                              hi: int | None) -> None:
    check_range(probe, integer_schema(lo, hi), lo, hi)


def test_every_integer_of_small_ranges(probe: GrammarProbe) -> None:
    # each value of -1,200..1,200 against ranges across the sign and the 1-, 2-, 3- and 4-digit edges
    for lo, hi in [(3, 17), (-17, -3), (-1000, 999), (7, 1100)]:
        sampler = probe.sampler(json_schema_grammar(integer_schema(lo, hi)))
        try:
            for v in range(-1200, 1201):
                assert probe.accepts(sampler, str(v)) == (lo <= v <= hi), (lo, hi, v)
        finally:
            llama_cpp.llama_sampler_free(sampler)


bound = st.one_of(st.none(), st.integers(-10**6, 10**6), st.integers(-(10**20), 10**20))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=bound, b=bound)
def test_random_ranges(probe: GrammarProbe, a: int | None, b: int | None) -> None:
    if a is None and b is None:
        return
    lo, hi = (a, b) if a is None or b is None or a <= b else (b, a)
    check_range(probe, integer_schema(lo, hi), lo, hi)


any_bound = st.integers() | st.floats(allow_nan=False) | st.sampled_from([10**150, -(10**400), True, False, "3", None,
                                                                        [], {}])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["integer", "number", ["integer", "null"], ["null", "integer", "string"]]),
       bounds=st.dictionaries(st.sampled_from(json_schema.BOUNDS), any_bound, max_size=4))
def test_any_bounds_give_a_grammar_llama_cpp_parses_or_a_value_error(probe: GrammarProbe, kind: object,
                                                                      bounds: dict) -> None:
    try:
        grammar = json_schema_grammar({"type": kind, **bounds})
    except ValueError:
        return
    llama_cpp.llama_sampler_free(probe.sampler(grammar))


@pytest.mark.parametrize("schema, lo, hi", [
    ({"type": "integer", "exclusiveMinimum": 0}, 1, None),  # pydantic's PositiveInt
    ({"type": "integer", "exclusiveMinimum": -5, "exclusiveMaximum": 5}, -4, 4),  # Field(gt=-5, lt=5)
    ({"type": "integer", "minimum": 0, "exclusiveMinimum": 3, "maximum": 10, "exclusiveMaximum": 20}, 4, 10),
    ({"type": "integer", "minimum": 0.5, "maximum": 9.5}, 1, 9),  # fractional bounds round inwards
    ({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 3.0}, 1, 2),
    ({"type": "integer", "minimum": 3, "exclusiveMinimum": True, "maximum": 7, "exclusiveMaximum": False}, 4, 7),
    ({"type": "integer", "minimum": -3.0, "exclusiveMaximum": -1}, -3, -2),
], ids=["positive-int", "gt-lt", "tighter-holds", "fractional", "exclusive-fractional", "draft4-flags",
        "float-ints"])
def test_bound_forms(probe: GrammarProbe, schema: dict, lo: int | None, hi: int | None) -> None:
    assert json_schema.integer_bounds(schema) == (lo, hi)
    check_range(probe, schema, lo, hi)


def test_bounds_inside_objects_lists_and_defs(probe: GrammarProbe) -> None:
    # as pydantic writes them: Optional[PositiveInt] (anyOf with null), a list of conint, a $ref'd model,
    # and OpenAI strict mode's nullable type list
    schema = {"type": "object", "$defs": {"Inner": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": -3, "maximum": 3}}, "required": ["n"]}},
        "properties": {"a": {"anyOf": [{"type": "integer", "exclusiveMinimum": 0}, {"type": "null"}]},
                       "b": {"type": "array", "items": {"type": "integer", "minimum": 10, "maximum": 12}},
                       "c": {"$ref": "#/$defs/Inner"}, "d": {"type": ["integer", "null"], "maximum": -1}},
        "required": ["a", "b", "c", "d"], "additionalProperties": False}
    sampler = probe.sampler(json_schema_grammar(schema))
    try:
        good = {"a": 5, "b": [10, 12], "c": {"n": -3}, "d": -7}
        for value, ok in [(good, True), ({**good, "a": None, "d": None}, True), ({**good, "a": 0}, False),
                          ({**good, "b": [9]}, False), ({**good, "b": [13]}, False), ({**good, "c": {"n": 4}}, False),
                          ({**good, "d": 0}, False)]:
            text = json.dumps(value, separators=(",", ":"))
            assert probe.accepts(sampler, text) == ok, text
            if ok:
                jsonschema.validate(value, schema)
    finally:
        llama_cpp.llama_sampler_free(sampler)


def test_bounded_numbers_are_accepted_not_enforced(probe: GrammarProbe) -> None:
    # as llama.cpp's converter: a number's bounds write no rules (docs/server.md says so)
    schema = {"type": "number", "minimum": 0, "exclusiveMaximum": 1}
    assert json_schema_grammar(schema) == json_schema_grammar({"type": "number"})
    sampler = probe.sampler(json_schema_grammar(schema))
    try:
        assert probe.accepts(sampler, "0.5") and probe.accepts(sampler, "-2")
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("schema, words", [
    ({"type": "integer", "minimum": 5, "maximum": 4}, ["no integer", "5 > 4"]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, ["no integer"]),
    ({"type": "object", "properties": {"n": {"type": "integer", "minimum": "3"}}}, ["'minimum'", "/properties/n"]),
    ({"type": "integer", "maximum": True}, ["'maximum'"]),
    ({"type": "integer", "minimum": 10**150}, ["100 digits"]),
    ({"type": "integer", "maximum": -(10**400)}, ["100 digits"]),
], ids=["empty", "empty-exclusive", "string-bound", "bool-bound", "too-long", "far-too-long"])
def test_what_stays_refused(schema: dict, words: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        json_schema_grammar(schema)
    for w in words:
        assert w in str(e.value), str(e.value)


@pytest.mark.parametrize("schema, place", [
    ({"type": "integer", "multipleOf": 2}, "/"),
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "/"),  # pydantic's set[int]
    ({"type": "object", "propertyNames": {"pattern": "^a"}, "additionalProperties": {"type": "string"}}, "/"),  # zod
    ({"type": "object", "properties": {"never": {"not": {}}}}, "/properties/never"),  # zod's z.never()
    ({"type": "array", "items": {"type": "object", "minProperties": 1}}, "/items"),
    ({"anyOf": [{"type": "string"}, {"type": "array", "contains": {"type": "integer"}}]}, "/anyOf/1"),
    ({"type": "object", "$defs": {"D": {"type": "object", "dependentRequired": {"a": ["b"]}}},
      "properties": {"d": {"$ref": "#/$defs/D"}}}, "/$defs/D"),
], ids=["multipleOf", "uniqueItems", "propertyNames", "not", "minProperties", "contains", "dependentRequired"])
def test_keywords_the_converter_leaves_unenforced_are_accepted_and_named(schema: dict, place: str) -> None:
    """As llama.cpp's converter (and llama-server) take them: accepted, the grammar the same as without the
    keyword, and unenforced() names the keyword and its place (the server's access log and header)."""
    def without(s: Any) -> Any:
        if isinstance(s, dict):
            return {k: without(v) for k, v in s.items() if k not in json_schema.NOT_ENFORCED}
        return [without(v) for v in s] if isinstance(s, list) else s

    found = json_schema.unenforced(schema)
    assert len(found) == 1 and found[0].endswith("@" + place), found
    assert found[0].split("@")[0] in json_schema.NOT_ENFORCED
    assert json_schema_grammar(schema) == json_schema_grammar(without(schema))


def test_the_callers_schema_is_left_as_it_was() -> None:
    schema = {"type": "object", "$defs": {"N": {"type": "integer", "minimum": 1}},
              "properties": {"n": {"$ref": "#/$defs/N"}}}
    before = json.dumps(schema)
    json_schema_grammar(schema)
    assert json.dumps(schema) == before


def test_python_api_grammar_from_a_schema(target_gguf: Path) -> None:
    # the Python API takes the server's converter's GBNF: sampled answers (temperature 1) are integers in range
    from pydflash2 import Speculator

    schema = {"type": "integer", "minimum": -17, "maximum": -3}
    grammar = json_schema_grammar(schema)
    with Speculator(str(target_gguf), None, n_ctx=64, n_max=0) as spec:
        for seed in range(6):
            out = spec.generate("Hello", max_tokens=8, temperature=1.0, seed=seed, grammar=grammar, chat=False)
            assert out.finish_reason == "eos", out.text  # the grammar ended it
            assert -17 <= json.loads(out.text) <= -3, out.text


# ---------------------------------------------------------------- issue 58: strings, `true`, `false`, type-less

STRING_SCHEMAS = [{"type": "string"}, {"type": "string", "maxLength": 8}, {"type": "string", "minLength": 1},
                  {"type": "string", "pattern": "^.+$"}, {"type": "string", "pattern": "^[^x]+$"}, True]


@pytest.mark.parametrize("schema", STRING_SCHEMAS, ids=["plain", "maxLength", "minLength", "dot", "negated", "true"])
def test_strings_hold_no_raw_control_characters(probe: GrammarProbe, schema: object) -> None:
    # JSON forbids U+0000..U+001F raw in strings: llama.cpp's converter's `char` leaves them out (0.3.36's
    # `[^"\\]` let a raw newline in, and json.loads refused the answer); escaped they are fine
    sampler = probe.sampler(json_schema_grammar(schema))
    try:
        assert probe.accepts(sampler, '"ab"')
        for raw in ("\n", "\t", "\r", "\x01", "\x1f", '"', "\\q"):  # \q: no JSON escape
            assert not probe.accepts(sampler, f'"a{raw}b"'), (schema, raw)
        if schema is True or "pattern" not in schema:  # a pattern's '.' matches one character, not an escape
            assert probe.accepts(sampler, '"a\\nb\\t\\u00e9\\"\\\\"')
    finally:
        llama_cpp.llama_sampler_free(sampler)


def test_keys_and_tool_call_arguments_hold_no_raw_control_characters(probe: GrammarProbe) -> None:
    # the other strings the server's grammars hold: an object's free keys, a forced call's arguments, the
    # generic format's response, and json_object's (llama-cpp-python's JSON_GBNF, already as llama.cpp writes it)
    from pydflash2.server import grammars, tools

    params = {"type": "object", "properties": {"s": {"type": "string"}}, "required": ["s"]}
    cases = [(json_schema_grammar({"type": "object", "additionalProperties": {"type": "integer"}}), '{"k%s": 1}'),
             (tools.HERMES.grammar([{"name": "w", "parameters": params}], False),
              '<tool_call>\n{"name": "w", "arguments": {"s": "a%sb"}}\n</tool_call>'),
             (tools.generic_grammar([{"name": "w", "parameters": params}], False, required=False),
              '{"response": "a%sb"}'),
             (grammars.response_format_grammar({"type": "json_object"}), '{"k": "a%sb"}')]
    for grammar, text in cases:
        sampler = probe.sampler(grammar)
        try:
            assert probe.accepts(sampler, text % "\\n"), text
            assert not probe.accepts(sampler, text % "\n"), text
        finally:
            llama_cpp.llama_sampler_free(sampler)


ANY_VALUES = ["1", "-2.5e3", '"x"', "null", "true", "[]", '[1, {"a": [null]}]', "{}", '{"a": "b", "c": [1]}']


@pytest.mark.parametrize("schema", [True, {}, {"description": "Optional input value"},
                                    {"title": "T", "default": 3, "examples": [1]}, {"format": "email"}],
                         ids=["true", "empty", "description", "annotations", "unknown-format"])
def test_type_less_true_and_empty_schemas_are_any_value(probe: GrammarProbe, schema: object) -> None:
    # JSON Schema reads them as "any value" (zod's z.any().describe() writes {"description": ...}),
    # at the root and as a property
    for root in (schema, {"type": "object", "properties": {"v": schema}, "required": ["v"]}):
        sampler = probe.sampler(json_schema_grammar(root))
        try:
            for value in ANY_VALUES:
                text = value if root is schema else f'{{"v": {value}}}'
                assert probe.accepts(sampler, text), (root, text)
                jsonschema.validate(json.loads(text), root)
            assert not probe.accepts(sampler, '{"v": }' if root is not schema else "nul")
        finally:
            llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("schema, good, bad", [
    ({"minimum": 3, "maximum": 5}, ["3", "5"], ["6", '"a"']),  # bounds imply an integer, as llama.cpp reads them
    ({"maxLength": 2}, ['"ab"'], ['"abc"']),
    ({"minItems": 1, "maxItems": 2}, ['[1, "a"]'], ["[]", "[1, 2, 3]"]),
    ({"type": "array", "items": {}}, ['[1, "a", null]'], ["[1,]"]),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}}, ["[1]", '[1, "a", "b"]'], ['["a"]']),
    ({"prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "maxItems": 2}, ['[1, "a"]'],
     ['[1, "a", "b"]', "[1, 2]"]),
    ({"prefixItems": [{"type": "integer"}], "items": False}, ["[1]"], ["[1, 2]"]),
    ({"type": "object", "properties": {"a": True}, "additionalProperties": False}, ['{"a": [1]}', "{}"], ['{"b": 1}']),
    ({"allOf": [True, {"$ref": "#/$defs/C"}], "description": "a colour", "$defs": {"C": {"enum": ["r", "g"]}}},
     ['"r"'], ['"b"', "{}"]),
], ids=["bounds", "maxLength", "item-counts", "items-any", "prefix-then-items", "prefix-then-items-max",
        "closed-tuple", "true-property", "allOf-one-ref"])
def test_type_less_keywords_and_bool_subschemas(probe: GrammarProbe, schema: dict, good: list[str],
                                                bad: list[str]) -> None:
    sampler = probe.sampler(json_schema_grammar(schema))
    try:
        for text in good:
            assert probe.accepts(sampler, text), (schema, text)
            jsonschema.validate(json.loads(text), schema)
        for text in bad:
            assert not probe.accepts(sampler, text), (schema, text)
    finally:
        llama_cpp.llama_sampler_free(sampler)


@pytest.mark.parametrize("schema, where", [
    (False, "at /"),
    ({"type": "object", "properties": {"a": False}}, "at /properties/a"),
    ({"type": "array", "items": False}, "at /items"),
    ({"anyOf": [{"type": "null"}, False]}, "at /anyOf/1"),
    ({"$defs": {"X": {"type": "array", "items": [True, False]}}, "$ref": "#/$defs/X"}, "at /$defs/X/items/1"),
], ids=["root", "property", "items", "anyOf", "tuple-in-defs"])
def test_false_is_refused_where_it_is(schema: object, where: str) -> None:
    with pytest.raises(ValueError) as e:
        json_schema_grammar(schema)
    assert "false" in str(e.value) and where in str(e.value), str(e.value)


subschema = st.recursive(
    st.sampled_from([True, False, {}, {"description": "d"}, {"type": "string"}, {"type": "integer", "minimum": 0},
                     {"enum": [1, "a", None]}, {"minLength": 1}]),
    lambda inner: st.one_of(
        st.builds(lambda p, r: {"type": "object", "properties": p, "required": sorted(p)[:r]},
                  st.dictionaries(st.sampled_from("abc"), inner, max_size=3), st.integers(0, 3)),
        st.builds(lambda i: {"type": "array", "items": i}, inner),
        st.builds(lambda i: {"items": i, "maxItems": 3}, inner),
        st.builds(lambda a: {"anyOf": a}, st.lists(inner, min_size=1, max_size=3)),
        st.builds(lambda a: {"allOf": a}, st.lists(inner, min_size=1, max_size=2)),
        st.builds(lambda p, i: {"prefixItems": p, "items": i}, st.lists(inner, min_size=1, max_size=2), inner),
        st.builds(lambda v: {"type": "object", "additionalProperties": v}, inner)),
    max_leaves=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=subschema)
def test_bool_subschemas_give_a_grammar_or_a_named_refusal(probe: GrammarProbe, schema: object) -> None:
    # never a Python error's text ('bool' object has no attribute 'get'), never "Unrecognized schema"
    try:
        grammar = json_schema_grammar(schema)
    except ValueError as e:
        assert "is false" in str(e) or "allOf" in json.dumps(schema), str(e)
        return
    llama_cpp.llama_sampler_free(probe.sampler(grammar))


@pytest.mark.parametrize("value", ["line\nbreak", 'say "hi"', "back\\slash", "tab\there", {"k\"ey": ["a\\\n"]}],
                         ids=["newline", "quote", "backslash", "tab", "nested"])
def test_consts_enums_and_names_are_written_as_json_writes_them(probe: GrammarProbe, value: object) -> None:
    # the literal is the value's JSON text, backslashes escaped in GBNF (0.3.36 left them: a newline came out
    # raw, a quote ended the literal and llama.cpp refused the grammar)
    text = json.dumps(value)
    for schema in ({"const": value}, {"enum": [value, 1]},
                   {"type": "object", "properties": {text: {"const": 1}}, "required": [text]}):
        sampler = probe.sampler(json_schema_grammar(schema))
        try:
            sentence = text if "properties" not in schema else json.dumps({text: 1})
            assert probe.accepts(sampler, sentence), (schema, sentence)
            assert not probe.accepts(sampler, sentence.replace("\\n", "\n")) or "\\n" not in sentence
        finally:
            llama_cpp.llama_sampler_free(sampler)


def test_claude_codes_type_less_tool_through_the_generic_format(probe: GrammarProbe) -> None:
    # issue 58's refusal: on a template without a tool format (SmolLM2's) tools go through the generic
    # format's grammar even with tool_choice auto, and a property with only a description was
    # "Unrecognized schema"; it is any value, the arguments stay an object
    from pydflash2.server import tools

    params = {"type": "object", "properties": {"name": {"type": "string"},
                                               "input": {"description": "Optional input value"}},
              "required": ["name"], "additionalProperties": False, "$schema": "http://json-schema.org/draft-07/schema#"}
    sampler = probe.sampler(tools.generic_grammar([{"name": "Workflow", "parameters": params}], True, required=False))
    try:
        for value in ('[1, "x"]', '{"k": null}', '"text"', "2.5"):
            assert probe.accepts(sampler, '{"tool_calls": [{"name": "Workflow", "arguments": {"name": "a", "input": '
                                          f'{value}}}}}]}}'), value
        assert probe.accepts(sampler, '{"response": "hi"}')
        assert not probe.accepts(sampler, '{"tool_calls": [{"name": "Workflow", "arguments": 3}]}')
    finally:
        llama_cpp.llama_sampler_free(sampler)
