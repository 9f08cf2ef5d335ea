"""Structured output under hot sampling (issue 58), through a real server process over the tiny
tools target (byte-level vocabulary, so control characters are tokens like any other) with a DFlash2
drafter: for random JSON schemas (pydflash2_testing.structured: objects, arrays, tuples, enums,
integer bounds, nullable, type-less and `true` subschemas), every finished answer of chat
`response_format`, a forced tool call, Anthropic Messages' `output_config` and Responses'
`text.format` parses (json.loads, strict) and validates (jsonschema), sampled at temperature 2 over
the whole vocabulary (length bounds included: no invalid UTF-8 gets into a string, pydflash2.utf8_pieces);
and the schemas issue 58 saw refused are served, `false` refused by place."""

from __future__ import annotations

import codecs
import json
import random
from collections import Counter
from pathlib import Path

import httpx
import jsonschema
import pydflash2_testing as testing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydflash2_testing import structured
from server_process import ServerProcess

from pydflash2 import Speculator, json_schema_grammar, utf8_pieces
from pydflash2.server import steering
from pydflash2.server.engine import BatchEngine

pytestmark = pytest.mark.skipif("grammar" not in steering.engine_features(BatchEngine),
                                reason="the engine has no grammar sampler")

MAX_TOKENS = 96  # a forced Hermes call's fixed head takes ~30 of the byte-level tokens
TEMPERATURE = 2.0


@pytest.fixture(scope="module")
def flat_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_scale: logits spread over a few units, so at temperature 2 every token the grammar allows is drawn
    return testing.make_target_gguf(tmp_path_factory.mktemp("flat") / "flat-tools-target.gguf",
                                    testing.TargetSpec(chat_template=testing.TOOLS_TEMPLATE, head_scale=0.1))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, flat_target: Path):
    d = tmp_path_factory.mktemp("structured")
    target = flat_target
    ckpt = testing.make_drafter_checkpoint(d / "v2-hf", target, testing.DrafterSpec(version=2))
    draft = testing.checkpoint_to_gguf(ckpt, target, d / "v2.gguf")
    # top-k and min-p off: the whole grammar-allowed vocabulary is sampled, control characters included
    s = ServerProcess(["--model", str(target), "--draft", str(draft), "--parallel", "1", "--n-ctx", "2048",
                       "--n-max", "3", "--threads", "1", "--top-k", "0", "--min-p", "0"], d)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_hot_structured_answers_parse_and_validate(client: httpx.Client) -> None:
    seen: Counter[str] = Counter()

    @settings(max_examples=40, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(rng=st.randoms(use_true_random=False), seed=st.integers(0, 2**31 - 1))
    def check(rng: random.Random, seed: int) -> None:
        schema = structured.random_schema(rng)
        for kind in structured.KINDS:
            answer = structured.ask(client, kind, schema, temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=seed)
            seen[kind] += 1
            if answer.finished:
                seen[f"{kind} finished"] += 1
                verdict = answer.verdict()
                seen[verdict] += 1
                assert verdict == "ok", (kind, verdict, answer.text, answer.schema)
                assert "\ufffd" not in answer.text, (kind, answer.text)

    check()

    # not vacuous: most answers end within the limit on every path
    for kind in structured.KINDS:
        assert seen[f"{kind} finished"] >= seen[kind] // 2, seen


# the Workflow tool Claude Code sends (issue 58): a property with a description and no type, zod's
# z.any().describe()
WORKFLOW = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4},
                                             "input": {"description": "Optional input value for the workflow"}},
            "required": ["name"], "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}


@pytest.mark.parametrize("params", [WORKFLOW, {"type": "object", "properties": {"x": True}},
                                    {"type": "object", "properties": {"x": {}}, "required": ["x"]}],
                         ids=["workflow", "true", "empty"])
def test_type_less_and_true_parameters_are_served(client: httpx.Client, params: dict) -> None:
    for path, body in [
        ("/v1/messages", {"model": "m", "max_tokens": 24, "messages": [{"role": "user", "content": "go"}],
                          "tools": [{"name": "Workflow", "input_schema": params}],
                          "tool_choice": {"type": "tool", "name": "Workflow"}}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 24,
                                  "tools": [{"type": "function", "function": {"name": "Workflow",
                                                                              "parameters": params}}],
                                  "tool_choice": "required"}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go"}], "max_tokens": 24,
                                  "response_format": {"type": "json_schema",
                                                      "json_schema": {"name": "o", "schema": params["properties"]
                                                                      .get("x", True)}}}),
    ]:
        r = client.post(path, json=body)
        assert r.status_code == 200, (path, r.text)


@pytest.mark.parametrize("params, where", [
    ({"type": "object", "properties": {"x": False}}, "/f/properties/x"),
    ({"type": "object", "properties": {"x": {"type": "array", "items": False}}}, "/f/properties/x/items"),
    ({"type": "object", "properties": {"x": {"anyOf": [{"type": "null"}, False]}}}, "/f/properties/x/anyOf/1"),
], ids=["property", "items", "anyOf"])
def test_false_is_a_400_naming_its_place(client: httpx.Client, params: dict, where: str) -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "go"}], "max_tokens": 4,
                                                  "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400 and where in r.text and "false" in r.text, r.text
    assert "object has no attribute" not in r.text
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "go"}], "max_tokens": 4,
                                                  "response_format": {"type": "json_schema", "json_schema": {
                                                      "name": "o", "schema": params}}})
    assert r.status_code == 400 and where.removeprefix("/f") in r.text, r.text


def _part_of_valid_utf8(piece: bytes) -> bool:
    """CPython's strict decoder as the oracle: up to 3 continuation bytes (the end of a character begun
    before), then whole characters and the valid start of one (final=False checks a start's bytes)."""
    i = 0
    while i < min(3, len(piece)) and 0x80 <= piece[i] <= 0xBF:
        i += 1
    try:
        codecs.getincrementaldecoder("utf-8")().decode(piece[i:], final=False)
        return True
    except UnicodeDecodeError:
        return False


@settings(max_examples=1500, deadline=None, derandomize=True, database=None)
@given(piece=st.one_of(st.binary(min_size=1, max_size=6),
                       st.text(min_size=1, max_size=4).map(lambda t: t.encode("utf-8", "surrogatepass")),
                       st.tuples(st.text(max_size=3), st.integers(0, 8), st.integers(0, 8)).map(
                           lambda a: a[0].encode("utf-8", "surrogatepass")[a[1]:][:a[2] or None]).filter(bool)))
def test_grammar_unsafe_is_what_cpython_refuses_or_a_bare_narrow_lead(piece: bytes) -> None:
    # safe pieces are exactly the parts of valid UTF-8 text without NUL that do not end on E0/ED/F0/F4 (a
    # lead byte, so alone there)
    expected = b"\0" in piece or not _part_of_valid_utf8(piece) or piece[-1] in (0xE0, 0xED, 0xF0, 0xF4)
    assert utf8_pieces.grammar_unsafe(piece) == expected, piece


STRING6 = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 6}}, "required": ["s"]}


def test_a_grammar_writes_only_valid_utf8(flat_target: Path) -> None:
    """The cause and the fix, on the real engine and llama.cpp's own grammar sampler: at temperature 2 over
    the tiny byte-level vocabulary, with the unsafe pieces allowed (the guard emptied) the grammar lets
    invalid UTF-8 into the string (leads F5..FF and the like, read as code points past U+10FFFF); with
    the model's list masked, every finished answer is UTF-8 and keeps the schema's length bound."""
    grammar = json_schema_grammar(STRING6)
    with Speculator(str(flat_target), None, n_ctx=512, n_threads=1) as sp:
        def answers(n: int) -> list[bytes]:
            out = []
            for seed in range(n):
                c = sp.generate("Reply in JSON.", max_tokens=40, temperature=2.0, seed=seed, grammar=grammar)
                if c.finish_reason == "eos":
                    out.append(b"".join(sp._token_bytes(t) for t in c.tokens))
            return out

        def invalid(raw: bytes) -> bool:
            try:
                raw.decode("utf-8")
                return False
            except UnicodeDecodeError:
                return True

        guard = sp._grammar_unsafe
        unsafe = guard()
        assert {0xC0, 0xF5, 0xFF} <= {sp._token_bytes(t)[0] for t in unsafe if len(sp._token_bytes(t)) == 1}
        # and the control tokens, which the grammar reads spelled out and the answer's text leaves out
        # (a string the grammar counted with `<|im_start|>` in it came back short: found by the hot test)
        control = [t for t in range(sp.llm.n_vocab()) if sp.llm.detokenize([t]) != sp.llm.detokenize([t], special=True)
                   and not sp._is_eog(t)]
        assert control and set(control) <= set(unsafe)
        sp._grammar_unsafe = list  # the guard off (no token masked): llama.cpp's grammar alone
        unguarded = answers(60)
        assert sum(map(invalid, unguarded)) >= 3, unguarded
        sp._grammar_unsafe = guard
        guarded = answers(60)
        assert len(guarded) >= 50
        for raw in guarded:
            assert not invalid(raw), raw
            value = json.loads(raw)
            jsonschema.validate(value, STRING6)
