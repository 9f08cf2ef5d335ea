"""A drop-in for OpenAI clients (issue 34), through a real server process on
127.0.0.1 over the tiny tools target: routes without /v1, models.retrieve,
HEAD /health, /v1/embeddings' 501, CORS (preflights and headers, any origin
by default and a list of origins), content-part arrays, one `created` per
stream, system_fingerprint, cached prompt tokens in usage, compressed bodies,
tool-call arguments streamed as they are generated, cut-off or repeated
calls that never leak markup into `content`, and JSON schemas with bounded
integers (response_format and forced tool calls): every answer in range."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pydantic
import pydflash2_testing as testing
import pytest
from server_process import ServerProcess

from pydflash2.server import steering, tools
from pydflash2.server.cors import CorsOptions, with_cors
from pydflash2.server.engine import BatchEngine

ALIAS = "compat-model"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GRAMMAR = "grammar" in steering.engine_features(BatchEngine)
needs_grammar = pytest.mark.skipif(not GRAMMAR, reason="the engine has no grammar sampler (forced tool calls)")

# a short call: a one-letter name and an enum (a random target writes strings up to their bound)
SHORT = {"type": "function", "function": {"name": "w", "parameters": {
    "type": "object", "properties": {"u": {"enum": ["C", "F"]}}, "required": ["u"]}}}
ORIGIN = "http://page.example:5173"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-compat")


@pytest.fixture(scope="module")
def target(workdir: Path) -> Path:
    return testing.make_target_gguf(workdir / "tools-target.gguf",
                                    testing.TargetSpec(hot_tokens=(testing.FIRST_MERGED_ID,),
                                                       chat_template=testing.TOOLS_TEMPLATE))


@pytest.fixture(scope="module")
def server(target: Path, workdir: Path):
    s = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", "1024", "--alias", ALIAS], workdir)
    yield s
    s.stop()


def post(server: ServerProcess, path: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=60, **kw)


def sse(server: ServerProcess, path: str, body: dict) -> list[dict]:
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[5:]) for line in r.iter_lines() if line.startswith("data:") and "[DONE]" not in line]


# ---------------------------------------------------------------- routes


def test_routes_without_the_v1_prefix(server: ServerProcess) -> None:
    bare = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0, timeout=60)
    assert [m.id for m in bare.models.list().data] == [ALIAS]
    chat = bare.chat.completions.create(model="any", messages=USER, max_tokens=2, temperature=0)
    assert chat.usage.completion_tokens <= 2 and chat.model == ALIAS
    comp = bare.completions.create(model="any", prompt="Hello", max_tokens=2, temperature=0)
    assert comp.usage.completion_tokens <= 2


def test_models_retrieve_head_health_and_embeddings(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    m = client.models.retrieve(ALIAS)
    assert m.id == ALIAS and m.object == "model"
    with pytest.raises(openai.NotFoundError, match="compat-model"):
        client.models.retrieve("gpt-4o")
    head = httpx.head(server.url + "/health", timeout=10)
    assert head.status_code == 200 and head.content == b""
    for path in ("/v1/embeddings", "/embeddings"):
        r = post(server, path, {"model": "x", "input": "hello"})
        assert r.status_code == 501 and r.json()["error"]["message"] == "embeddings: not supported by this server"
    with pytest.raises(openai.APIStatusError, match="not supported") as e:
        client.embeddings.create(model="x", input="hello")
    assert e.value.status_code == 501


# ---------------------------------------------------------------- CORS


def test_cors_any_origin_by_default(server: ServerProcess) -> None:
    pre = httpx.options(server.url + "/v1/chat/completions", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 200, pre.text
    assert pre.headers["access-control-allow-origin"] == "*"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert "authorization" in pre.headers["access-control-allow-headers"].lower()
    ok = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
    bad = post(server, "/v1/chat/completions", {"messages": []}, headers={"Origin": ORIGIN})
    assert bad.status_code == 400 and bad.headers["access-control-allow-origin"] == "*"  # errors readable too
    assert "access-control-allow-origin" not in httpx.get(server.url + "/health").headers  # no Origin: no CORS


def test_cors_origin_list(target: Path, workdir: Path) -> None:
    s = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", "256", "--cors-origins",
                       f"{ORIGIN}, http://other.example"], workdir)
    try:
        def preflight(origin: str) -> httpx.Response:
            return httpx.options(s.url + "/v1/models", timeout=10, headers={
                "Origin": origin, "Access-Control-Request-Method": "GET"})
        assert preflight(ORIGIN).headers["access-control-allow-origin"] == ORIGIN
        refused = preflight("http://evil.example")
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
        got = httpx.get(s.url + "/v1/models", headers={"Origin": "http://evil.example"}, timeout=10)
        assert got.status_code == 200 and "access-control-allow-origin" not in got.headers
    finally:
        s.stop()


def test_cors_off_is_no_middleware() -> None:
    async def app(scope, receive, send) -> None:  # pragma: no cover (never called)
        pass
    assert with_cors(app, CorsOptions(origins=())) is app
    assert with_cors(app, CorsOptions()) is not app


# ---------------------------------------------------------------- message shape


def test_text_parts_join_with_a_newline_and_images_get_a_clear_400(server: ServerProcess) -> None:
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say"}, {"type": "text", "text": "hello."}]}]
    prompt = post(server, "/apply-template", {"messages": parts}).json()["prompt"]
    assert "Say\nhello." in prompt
    image = [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    r = post(server, "/v1/chat/completions", {"messages": image, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] == ("messages.0.content: part 1: 'image_url' parts are not supported: this model takes "
                              "text only")
    assert err["param"] == "messages.0.content"


# ---------------------------------------------------------------- response shape


def test_one_created_per_stream_and_a_system_fingerprint(server: ServerProcess) -> None:
    import llama_cpp

    import pydflash2

    fingerprint = f"pydflash2-{pydflash2.__version__}-llama-cpp-python-{llama_cpp.__version__}"
    body = {"messages": USER, "max_tokens": 6, "temperature": 0, "stream_options": {"include_usage": True}}
    chunks = sse(server, "/v1/chat/completions", body)
    assert len(chunks) >= 3 and len({c["created"] for c in chunks}) == 1
    assert {c["system_fingerprint"] for c in chunks} == {fingerprint}
    comp = sse(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 5})
    assert len({c["created"] for c in comp}) == 1 and comp[0]["system_fingerprint"] == fingerprint
    whole = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0).chat.completions.create(
        model="x", messages=USER, max_tokens=2)
    assert whole.system_fingerprint == fingerprint


def test_cached_tokens_are_the_prefix_the_slot_held(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    msgs = [{"role": "system", "content": "You are a weather bot. " * 20}] + USER
    client.chat.completions.create(model="x", messages=msgs, max_tokens=1, temperature=0)
    again = client.chat.completions.create(model="x", messages=msgs, max_tokens=1, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached == again.model_extra["timings"]["cache_n"] and 0 < cached < again.usage.prompt_tokens
    streamed = list(client.chat.completions.create(model="x", messages=msgs, max_tokens=1, temperature=0, stream=True,
                                                   stream_options={"include_usage": True}))
    assert streamed[-1].usage.prompt_tokens_details.cached_tokens == cached


def test_compressed_body_gets_415(server: ServerProcess) -> None:
    raw = gzip.compress(json.dumps({"messages": USER, "max_tokens": 1}).encode())
    r = httpx.post(server.url + "/v1/chat/completions", content=raw, timeout=10,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 415 and "Content-Encoding 'gzip'" in r.json()["error"]["message"]


# ---------------------------------------------------------------- tool calls


def _stream_calls(chunks: list[dict]) -> tuple[dict[int, dict], int, str]:
    """Calls put together from a stream's deltas, the number of argument deltas, and the content."""
    calls: dict[int, dict] = {}
    n_args, content = 0, ""
    for c in chunks:
        if not c["choices"]:
            continue
        delta = c["choices"][0]["delta"]
        content += delta.get("content") or ""
        for d in delta.get("tool_calls") or []:
            call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
            call["name"] += d.get("function", {}).get("name") or ""
            if d.get("function", {}).get("arguments"):
                n_args += 1
                call["arguments"] += d["function"]["arguments"]
    return calls, n_args, content


@needs_grammar
def test_tool_call_arguments_stream_as_they_are_generated(server: ServerProcess) -> None:
    body = {"messages": USER, "tools": [SHORT], "tool_choice": "required", "parallel_tool_calls": False,
            "max_tokens": 100, "temperature": 0}
    whole = post(server, "/v1/chat/completions", body).json()
    (call,) = whole["choices"][0]["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"])["u"] in ("C", "F")
    calls, n_args, content = _stream_calls(sse(server, "/v1/chat/completions", body))
    assert calls == {0: {"name": "w", "arguments": call["function"]["arguments"]}}
    assert content == ""
    assert n_args >= 4  # piece by piece, not one delta once the call is complete


@needs_grammar
def test_cut_off_and_repeated_calls_never_leak_into_content(server: ServerProcess) -> None:
    # tool_choice "required" with parallel calls (the default), the end of turn banned: the target repeats
    # the call until max_tokens cuts it, anywhere; content never holds call markup (issue 34, item 6)
    eog = [t for text in ("<|im_end|>", "<|endoftext|>")
           for t in post(server, "/tokenize", {"content": text}).json()["tokens"]]
    body = {"messages": USER, "tools": [SHORT], "tool_choice": "required", "temperature": 0,
            "logit_bias": {str(t): -100 for t in eog}}
    full = post(server, "/v1/chat/completions", {**body, "max_tokens": 130}).json()["choices"][0]
    assert len(full["message"]["tool_calls"]) >= 2, full
    for max_tokens in (20, 60, 100):  # in the first call, about its end, in the repeat
        msg = post(server, "/v1/chat/completions", {**body, "max_tokens": max_tokens}).json()["choices"][0]
        streamed, _, content = _stream_calls(sse(server, "/v1/chat/completions", {**body, "max_tokens": max_tokens}))
        assert msg["finish_reason"] == "length" and not msg["message"]["content"], (max_tokens, msg)
        assert content == "", (max_tokens, content)
        assert [c["function"]["arguments"] for c in msg["message"].get("tool_calls") or []] == \
            [c["arguments"] for c in streamed.values()]
    # parallel_tool_calls off: one call, whatever the target writes after it
    one = post(server, "/v1/chat/completions", {**body, "parallel_tool_calls": False, "max_tokens": 130}).json()
    assert len(one["choices"][0]["message"]["tool_calls"]) == 1 and one["choices"][0]["message"]["content"] is None


def test_the_issue_answers_split_cleanly() -> None:
    """The answers of issue 34, item 6, and the like: a repeat cut by max_tokens, a closing tag never
    written, a call after the first with parallel_tool_calls off."""
    one = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>'
    names = {"get_weather"}
    assert tools.split_answer(tools.HERMES, names, one + "\n<tool_call>") == (
        "", [tools.ToolCall("get_weather", '{"city": "Paris", "unit": "C"}')])
    content, calls = tools.split_answer(tools.HERMES, names, one + '\n<tool_call>\n{"name": "get_weather", '
                                                                   '"arguments": {"city": "Ro')
    assert content == "" and [c.arguments for c in calls] == ['{"city": "Paris", "unit": "C"}', '{"city": "Ro']
    assert tools.split_answer(tools.HERMES, names, one.removesuffix("\n</tool_call>")) == (
        "", [tools.ToolCall("get_weather", '{"city": "Paris", "unit": "C"}')])
    assert tools.split_answer(tools.HERMES, names, one + "\n" + one, parallel=False)[1] == calls[:1]
    # streamed in any pieces: the same calls, arguments in several pieces
    for step in (1, 4, 9):
        s = tools.ToolCallStream(tools.HERMES, names)
        text = one + "\n" + one
        items = [x for i in range(0, len(text), step) for x in s.push(text[i:i + step])] + s.finish()
        assert tools.assemble(items) == [calls[0], calls[0]]
        assert sum(isinstance(x, tools.ArgsPart) for x in items) > 2
        assert not any(isinstance(x, str) for x in items)


# ---------------------------------------------------------------- tools on a template without a tool format


def test_generic_format_prompt_and_history(plain_server: ServerProcess) -> None:
    # the tools and the answer's form in the system turn; earlier calls and results as JSON
    call = {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"u": "C"}'}}
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    prompt = post(plain_server, "/apply-template", {"messages": history, "tools": [SHORT]}).json()["prompt"]
    assert prompt.startswith("<|im_start|>system\nYou can call any of the following tools")
    assert tools.GENERIC_INSTRUCTION in prompt and '"name": "w"' in prompt
    assert '"tool_calls": [' in prompt and '"tool_response": {' in prompt and '\\"temperature\\": 18' in prompt
    # without tools, tool_choice "none": the template as it is
    plain = post(plain_server, "/apply-template", {"messages": USER, "tools": [SHORT], "tool_choice": "none"})
    assert "You can call" not in plain.json()["prompt"]


@needs_grammar
def test_generic_format_calls_and_responses(plain_server: ServerProcess) -> None:
    schema = SHORT["function"]["parameters"]
    body = {"messages": USER, "tools": [SHORT], "max_tokens": 120, "temperature": 0}
    forced = post(plain_server, "/v1/chat/completions", {**body, "tool_choice": "required"}).json()["choices"][0]
    assert forced["finish_reason"] == "tool_calls", forced
    assert forced["message"]["content"] is None
    calls = forced["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] == "w" for c in calls)
    for c in calls:
        assert json.loads(c["function"]["arguments"])["u"] in schema["properties"]["u"]["enum"]
    streamed, _, content = _stream_calls(sse(plain_server, "/v1/chat/completions", {**body, "tool_choice": "required"}))
    assert content == "" and [c["arguments"] for c in streamed.values()] == [c["function"]["arguments"] for c in calls]
    named = post(plain_server, "/v1/chat/completions", {**body, "tool_choice": {"type": "function",
                                                                             "function": {"name": "w"}}}).json()
    assert len(named["choices"][0]["message"]["tool_calls"]) == 1
    # auto: a call or a response, never the JSON around either
    for extra in ({"temperature": 0}, {"temperature": 1.0, "seed": 1}):  # a response, a call (on this target)
        r = post(plain_server, "/v1/chat/completions", {**body, "max_tokens": 60, **extra}).json()["choices"][0]
        msg = r["message"]
        assert msg.get("tool_calls") or r["finish_reason"] in ("stop", "length"), r
        assert not (msg["content"] or "").lstrip().startswith('{"'), r
    # the follow-up turn with the tool's result
    follow = USER + [forced["message"], {"role": "tool", "tool_call_id": calls[0]["id"], "content": "18 C"}]
    r2 = post(plain_server, "/v1/chat/completions", {**body, "messages": follow, "max_tokens": 4})
    assert r2.status_code == 200, r2.text


# ---------------------------------------------------------------- bounded integers (issue 34, item 3)

# one field per kind of bound: small ranges across the sign and the 1- / 2- / 3-digit edges, exclusive
# bounds, and pydantic's PositiveInt (exclusiveMinimum 0, open above: up to 16 digits)
BOUNDED = {"type": "object", "properties": {
    "small": {"type": "integer", "minimum": 3, "maximum": 17},
    "negative": {"type": "integer", "minimum": -17, "maximum": -3},
    "across": {"type": "integer", "exclusiveMinimum": -10, "exclusiveMaximum": 10},
    "edges": {"type": "integer", "minimum": 8, "maximum": 120},
    "positive": {"type": "integer", "exclusiveMinimum": 0}},
    "required": ["small", "negative", "across", "edges", "positive"], "additionalProperties": False}
IN_RANGE = {"small": (3, 17), "negative": (-17, -3), "across": (-9, 9), "edges": (8, 120), "positive": (1, 10**16 - 1)}


def assert_in_range(value: dict, ranges: dict[str, tuple[int, int]]) -> None:
    assert set(value) == set(ranges), value
    for k, (lo, hi) in ranges.items():
        assert isinstance(value[k], int) and lo <= value[k] <= hi, (k, value)


@needs_grammar
def test_response_format_with_integer_bounds(server: ServerProcess) -> None:
    # accepted (it was a 400), and at temperature 1 every answer parses and is in range; the numbers vary
    seen: set[tuple] = set()
    for seed in range(6):
        r = post(server, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "Some numbers, as JSON."}], "max_tokens": 300, "temperature": 1.0,
            "seed": seed, "response_format": {"type": "json_schema",
                                              "json_schema": {"name": "n", "strict": True, "schema": BOUNDED}}})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        value = json.loads(choice["message"]["content"])
        jsonschema.validate(value, BOUNDED)
        assert_in_range(value, IN_RANGE)
        seen.add(tuple(value.values()))
    assert len(seen) > 1


class Bounded(pydantic.BaseModel):
    small: int = pydantic.Field(ge=3, le=17)
    across: int = pydantic.Field(gt=-10, lt=10)
    positive: pydantic.PositiveInt


@needs_grammar
def test_openai_parse_with_pydantic_bounds(server: ServerProcess) -> None:
    # the openai SDK's parse(): pydantic's ge / le / gt / lt / PositiveInt, sent as a strict json_schema
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    for seed in range(3):
        done = client.chat.completions.parse(model="any", messages=[{"role": "user", "content": "Numbers."}],
                                             response_format=Bounded, max_tokens=200, temperature=1.0, seed=seed)
        parsed = done.choices[0].message.parsed
        assert isinstance(parsed, Bounded)  # pydantic validated the bounds
        assert_in_range(parsed.model_dump(), {"small": (3, 17), "across": (-9, 9), "positive": (1, 10**16 - 1)})


BOUNDED_TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer", "minimum": 3, "maximum": 17},
                                     "k": {"type": "integer", "exclusiveMinimum": -2, "exclusiveMaximum": 2}},
    "required": ["n", "k"], "additionalProperties": False}}}


def _forced_bounded_calls(s: ServerProcess) -> None:
    for seed in range(4):
        r = post(s, "/v1/chat/completions", {"messages": USER, "tools": [BOUNDED_TOOL], "tool_choice": "required",
                                             "parallel_tool_calls": False, "max_tokens": 120, "temperature": 1.0,
                                             "seed": seed})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "pick"
        assert_in_range(json.loads(call["function"]["arguments"]), {"n": (3, 17), "k": (-1, 1)})


@needs_grammar
def test_forced_tool_call_with_bounded_integers(server: ServerProcess) -> None:
    _forced_bounded_calls(server)  # the Hermes format


@needs_grammar
def test_forced_tool_call_with_bounded_integers_generic_format(plain_server: ServerProcess) -> None:
    _forced_bounded_calls(plain_server)  # llama.cpp's generic format: the whole answer is JSON


@needs_grammar
def test_keywords_the_grammar_leaves_unenforced_are_accepted_and_named(server: ServerProcess) -> None:
    """Issue 58: every schema llama.cpp's converter takes is taken (pydantic's uniqueItems for a set, zod's
    propertyNames, multipleOf), as llama-server takes them; what the grammar does not enforce is named in
    the x-pydflash2-unenforced-schema header and the access line, percent-encoded. An empty integer range
    stays a 400 naming it; a bounded number is accepted (not enforced, as llama.cpp's converter)."""
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "multipleOf": 2}}}})
    assert r.status_code == 200 and r.headers["x-pydflash2-unenforced-schema"] == "multipleOf@/", r.text
    tool = {"type": "function", "function": {"name": "tag", "parameters": {
        "type": "object", "properties": {"étiquettes ,": {"type": "array", "items": {"type": "string"},
                                                         "uniqueItems": True}}}}}
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 8, "tools": [tool],
                                              "tool_choice": {"type": "function", "function": {"name": "tag"}}})
    note = "uniqueItems@/tag/properties/%C3%A9tiquettes%20%2C"
    assert r.status_code == 200 and r.headers["x-pydflash2-unenforced-schema"] == note, (r.headers, r.text)
    assert f"unenforced={note}" in server.log_path.read_text(errors="replace")
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5,
                                                                        "maximum": 4}}}})
    assert r.status_code == 400 and "no integer" in r.json()["error"]["message"], r.text
    r = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "minimum": 0}}}})
    assert r.status_code == 200 and "x-pydflash2-unenforced-schema" not in r.headers, r.text
