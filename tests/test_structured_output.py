"""Structured output under hot sampling (issue 58), through a real server process over the tiny
tools target (byte-level vocabulary, so control characters are tokens like any other) with a DFlash2
drafter: for random JSON schemas (pydflash2_testing.structured: objects, arrays, tuples, enums,
integer bounds, nullable, type-less and `true` subschemas), every finished answer of chat
`response_format`, a forced tool call, Anthropic Messages' `output_config` and Responses'
`text.format` parses (json.loads, strict) and validates (jsonschema), sampled at temperature 2 over
the whole vocabulary (a length bound on a string holding invalid UTF-8, which llama.cpp's grammar
counts its own way, excepted: Answer.verdict's "utf8"); and the schemas issue 58 saw refused are
served, `false` refused by place."""

from __future__ import annotations

import random
from collections import Counter

import httpx
import pydflash2_testing as testing
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydflash2_testing import structured
from server_process import ServerProcess

from pydflash2.server import steering
from pydflash2.server.engine import BatchEngine

pytestmark = pytest.mark.skipif("grammar" not in steering.engine_features(BatchEngine),
                                reason="the engine has no grammar sampler")

MAX_TOKENS = 96  # a forced Hermes call's fixed head takes ~30 of the byte-level tokens
TEMPERATURE = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("structured")
    # head_scale: logits spread over a few units, so at temperature 2 every token the grammar allows is drawn
    target = testing.make_target_gguf(d / "flat-tools-target.gguf",
                                      testing.TargetSpec(chat_template=testing.TOOLS_TEMPLATE, head_scale=0.1))
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
                assert verdict in ("ok", "utf8"), (kind, verdict, answer.text, answer.schema)

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
