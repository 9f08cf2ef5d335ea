"""What clients send beyond plain sampling (issue 24), through a real server
process on 127.0.0.1 and the official `openai` client: any model name,
/tokenize, /detokenize, /apply-template, tools (template, parsing, streamed
deltas, forced calls), response_format / grammar, penalties, logit_bias,
logprobs, stream_options.include_usage, timings, sampling defaults, and a 400
naming each field the engine cannot honour.

Tests marked `sampler_chain` need the engine's native sampler chain (grammar,
penalties, logit_bias, logprobs keyword arguments on its start()); where the
engine lacks them, their counterparts check the 400 instead, so each case is
tested whichever engine is installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import jsonschema
import llama_cpp
import openai
import pydflash2_testing as testing
import pytest
from server_process import ServerProcess

from pydflash2.chat_template import ChatTemplate
from pydflash2.server import grammars, steering, tools
from pydflash2.server.engine import BatchEngine

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
ALIAS = "my-model"
N_CTX = 1024

FEATURES = steering.engine_features(BatchEngine)  # what the installed engine's start() takes
SLOT_STATS = callable(getattr(BatchEngine, "slot_stats", None))


def sampler_chain(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if n not in FEATURES]
    return pytest.mark.skipif(bool(missing), reason=f"the engine has no {', '.join(missing)} yet (sampler chain)")


def lacks(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(name in FEATURES, reason=f"the engine honours {name}")


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}


# the same tool with a bounded city: a random tiny target writes strings until a bound stops it
BOUNDED_WEATHER = {"type": "function", "function": {**WEATHER["function"], "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"]}}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-api")


@pytest.fixture(scope="module")
def models(workdir: Path) -> dict[str, Path]:
    # a target whose chat template describes tools (Hermes/Qwen style)
    target = testing.make_target_gguf(workdir / "tools-target.gguf",
                                      testing.TargetSpec(hot_tokens=HOT, chat_template=testing.TOOLS_TEMPLATE))
    ckpt = testing.make_drafter_checkpoint(workdir / "v2-hf", target, testing.DrafterSpec(version=2))
    return {"target": target, "draft": testing.checkpoint_to_gguf(ckpt, target, workdir / "v2.gguf")}


@pytest.fixture(scope="module")
def server(models: dict[str, Path], workdir: Path):
    s = ServerProcess(["--model", str(models["target"]), "--draft", str(models["draft"]), "--parallel", "2",
                       "--n-ctx", str(N_CTX), "--n-max", "3", "--alias", ALIAS], workdir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def llm(models: dict[str, Path]) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(models["target"]), n_ctx=256, verbose=False)


def post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


USER = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---------------------------------------------------------------- tool calls, without a server


def _assistant_turn(tmpl: ChatTemplate, calls: list[dict]) -> str:
    """What the template renders for an assistant turn with these calls (the text a model trained
    on it writes), between the generation prompt and the end of turn."""
    before, _ = tmpl.render(tmpl.prepare_messages(USER), tools=[WEATHER])
    after, _ = tmpl.render(tmpl.prepare_messages(USER + [{"role": "assistant", "content": None, "tool_calls": calls}]),
                           tools=[WEATHER], add_generation_prompt=False)
    assert after.startswith(before)
    return after[len(before):].removesuffix("<|im_end|>\n")


def test_template_caps_and_format() -> None:
    t = ChatTemplate(testing.TOOLS_TEMPLATE, "<|endoftext|>", "<|endoftext|>")
    assert (t.caps.tools, t.caps.tool_calls, t.caps.object_arguments) == (True, True, True)
    assert tools.detect_format(t.source) is tools.HERMES
    plain = ChatTemplate(testing.CHATML_TEMPLATE, "<|endoftext|>", "<|endoftext|>")
    assert (plain.caps.tools, plain.caps.tool_calls) == (False, False)
    assert tools.detect_format(plain.source) is None


def test_tool_calls_parse_back_from_the_templates_own_rendering() -> None:
    t = ChatTemplate(testing.TOOLS_TEMPLATE, "<|endoftext|>", "<|endoftext|>")
    calls = [{"id": "a", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": json.dumps({"city": "Paris", "unit": "C"})}},
             {"id": "b", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": json.dumps({"city": "Rome", "unit": "F"})}}]
    text = _assistant_turn(t, calls)
    content, got = tools.split_answer(tools.HERMES, {"get_weather"}, text)
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in got] == [
        ("get_weather", {"city": "Paris", "unit": "C"}), ("get_weather", {"city": "Rome", "unit": "F"})]
    # streamed piece by piece (any split), the same calls and no markup as content
    for step in (1, 3, 7):
        s = tools.ToolCallStream(tools.HERMES, {"get_weather"})
        items = [x for i in range(0, len(text), step) for x in s.push(text[i:i + step])] + s.finish()
        assert tools.assemble(items) == got
        assert "".join(x for x in items if isinstance(x, str)) == ""
    # parallel_tool_calls false: the first call only
    assert tools.split_answer(tools.HERMES, {"get_weather"}, text, parallel=False)[1] == got[:1]


# What Qwen2.5's, Llama 3.1's and Mistral Nemo's own templates render for an assistant turn
# calling get_weather(city="Paris") (rendered from the templates in llama.cpp's models/templates).
QWEN25_TURN = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
LLAMA31_TURN = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
MISTRAL_NEMO_TURN = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'


@pytest.mark.parametrize("fmt, text", [(tools.HERMES, QWEN25_TURN), (tools.LLAMA3, LLAMA31_TURN),
                                       (tools.LLAMA3, "<|python_tag|>" + LLAMA31_TURN),
                                       (tools.MISTRAL, MISTRAL_NEMO_TURN)])
def test_other_formats_parse(fmt: tools.ToolCallFormat, text: str) -> None:
    content, calls = tools.split_answer(fmt, {"get_weather"}, text)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


@pytest.mark.parametrize("text", [
    "It is sunny.",  # no call
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',  # a tool nobody offered
    '<tool_call>\n{"get_weather": {}}\n</tool_call>',  # not a call's shape
])
def test_what_is_not_a_call_stays_content(text: str) -> None:
    assert tools.split_answer(tools.HERMES, {"get_weather"}, text) == (text, [])


@pytest.mark.parametrize("text, arguments", [
    # once a call of an offered tool has begun, it is a call: its arguments as written, never content
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": \n</tool_call>', '{"city": \n'),  # broken JSON
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}', '{"city": "Paris"}'),  # never closed
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', '{"city": "Pa'),  # cut by max_tokens
])
def test_a_begun_call_is_a_call(text: str, arguments: str) -> None:
    assert tools.split_answer(tools.HERMES, {"get_weather"}, text) == ("", [tools.ToolCall("get_weather", arguments)])


def test_grammars_pass_llama_cpps_parser(llm: llama_cpp.Llama) -> None:
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    fn = WEATHER["function"]
    for fmt in (tools.HERMES, tools.LLAMA3, tools.MISTRAL):
        for parallel in (False, True):
            grammars.check_grammar(vocab, fmt.grammar([fn], parallel))
    grammars.check_grammar(vocab, grammars.response_format_grammar({"type": "json_object"}))
    grammars.check_grammar(vocab, grammars.response_format_grammar({"type": "json_object", "schema": fn["parameters"]}))
    grammars.check_grammar(vocab, grammars.response_format_grammar(
        {"type": "json_schema", "json_schema": {"name": "w", "schema": fn["parameters"]}}))
    with pytest.raises(ValueError, match="GBNF"):
        grammars.check_grammar(vocab, 'root ::= "a" undefined-rule')


ENUM_WEATHER = {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"]}}


@pytest.mark.parametrize("fmt", [tools.HERMES, tools.LLAMA3, tools.MISTRAL], ids=lambda f: f.name)
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_call_grammar_yields_calls_the_parser_reads(llm: llama_cpp.Llama, fmt: tools.ToolCallFormat,
                                                           parallel: bool) -> None:
    # llama-cpp-python's own grammar sampling (T=0.7) on the tiny target: every answer the grammar
    # lets through is read back as calls of the tool, with arguments valid under its schema
    grammar = llama_cpp.LlamaGrammar.from_string(fmt.grammar([ENUM_WEATHER], parallel), verbose=False)
    complete = 0
    for seed in range(12):  # answers the grammar ended (parallel ones may run into max_tokens)
        out = llm.create_completion("<|im_start|>assistant\n", max_tokens=200, temperature=0.7, seed=seed,
                                    grammar=grammar)["choices"][0]
        if out["finish_reason"] != "stop":
            continue
        complete += 1
        content, calls = tools.split_answer(fmt, {"get_weather"}, out["text"], parallel)
        assert content == "" and calls and (parallel or len(calls) == 1), out["text"]
        for c in calls:
            jsonschema.validate(json.loads(c.arguments), ENUM_WEATHER["parameters"])
        if complete == 3:
            break
    assert complete == 3


def test_json_schema_grammar_yields_valid_json(llm: llama_cpp.Llama) -> None:
    # the response_format grammar under llama-cpp-python's own sampling: every finished answer validates
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}, "pet": {"enum": ["cat", "dog"]},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]},
                                                        "maxItems": 3}},
              "required": ["name", "age", "pet"], "additionalProperties": False}
    g = grammars.response_format_grammar({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})
    grammar = llama_cpp.LlamaGrammar.from_string(g, verbose=False)
    complete = 0
    for seed in range(12):
        out = llm.create_completion("<|im_start|>assistant\n", max_tokens=120, temperature=0.7, seed=seed,
                                    grammar=grammar)["choices"][0]
        if out["finish_reason"] == "stop":
            complete += 1
            jsonschema.validate(json.loads(out["text"]), schema)
    assert complete >= 3


# ---------------------------------------------------------------- model names, tokenizer routes


def test_any_model_name_is_accepted_and_models_lists_the_alias(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [ALIAS]
    for name in ("gpt-4o", ALIAS, "whatever/else"):
        r = client.completions.create(model=name, prompt="Hello", max_tokens=2)
        assert r.model == ALIAS


def test_tokenize_detokenize_round_trip(server: ServerProcess, llm: llama_cpp.Llama) -> None:
    text = "The quick brown fox <|im_start|> said 'hello' ünïcödé"
    r = post(server, "/tokenize", {"content": text}).json()
    assert r["tokens"] == llm.tokenize(text.encode(), add_bos=False, special=True)
    r2 = post(server, "/tokenize", {"content": text, "add_special": True, "parse_special": False}).json()
    assert r2["tokens"] == llm.tokenize(text.encode(), add_bos=True, special=False)
    back = post(server, "/detokenize", {"tokens": r["tokens"]}).json()["content"]
    assert back == text == llm.detokenize(r["tokens"], special=True).decode()
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == r["tokens"]
    raw = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert raw.decode() == text
    # mixed content as llama-server takes it: text and ids
    mixed = post(server, "/tokenize", {"content": ["Hello", 5, " world"]}).json()["tokens"]
    assert mixed == llm.tokenize(b"Hello", add_bos=False, special=True) + [5] + \
        llm.tokenize(b" world", add_bos=False, special=True)
    bad = post(server, "/detokenize", {"tokens": [10**7]})
    assert bad.status_code == 400 and "vocabulary" in bad.json()["error"]["message"]


def test_apply_template_equals_the_rendered_prompt(server: ServerProcess, llm: llama_cpp.Llama) -> None:
    tmpl = ChatTemplate.of(llm)
    msgs = [{"role": "system", "content": "Be brief."}] + USER
    r = post(server, "/apply-template", {"messages": msgs}).json()
    assert r["prompt"] == tmpl.render(msgs)[0]
    with_tools = post(server, "/apply-template", {"messages": msgs, "tools": [WEATHER]}).json()["prompt"]
    assert with_tools == tmpl.render(msgs, tools=[WEATHER])[0]
    assert json.dumps(WEATHER["function"]["parameters"], ensure_ascii=False) in with_tools
    # the chat endpoint prefills exactly that prompt
    chat = post(server, "/v1/chat/completions", {"messages": msgs, "tools": [WEATHER], "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] == len(llm.tokenize(with_tools.encode(), add_bos=True, special=True))


# ---------------------------------------------------------------- tools over HTTP


def test_follow_up_turn_with_the_tool_result(client: openai.OpenAI, server: ServerProcess) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "C"}'}}
    history = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    r = client.chat.completions.create(model=ALIAS, messages=history, tools=[WEATHER], max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = post(server, "/apply-template", {"messages": history, "tools": [WEATHER]}).json()["prompt"]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature": 18}\n</tool_response>' in prompt


@sampler_chain("grammar")
@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_weather_call_and_its_stream(client: openai.OpenAI, choice) -> None:
    kw = dict(model=ALIAS, messages=USER, tools=[BOUNDED_WEATHER], tool_choice=choice, max_tokens=200, temperature=0,
              parallel_tool_calls=False)
    r = client.chat.completions.create(**kw)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls", msg
    (call,) = msg.tool_calls
    assert call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), BOUNDED_WEATHER["function"]["parameters"])
    # streamed: deltas that concatenate to the same call
    parts: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        for d in chunk.choices[0].delta.tool_calls or []:
            p = parts.setdefault(d.index, {"name": "", "arguments": ""})
            p["name"] += (d.function.name or "") if d.function else ""
            p["arguments"] += (d.function.arguments or "") if d.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert parts == {0: {"name": "get_weather", "arguments": call.function.arguments}}
    # the follow-up turn, with the tool's result
    follow = USER + [msg.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 18}'}]
    r2 = client.chat.completions.create(model=ALIAS, messages=follow, tools=[BOUNDED_WEATHER], max_tokens=8,
                                        temperature=0)
    assert r2.choices[0].message.role == "assistant"


@lacks("grammar")
def test_forced_call_is_refused_without_a_grammar_sampler(server: ServerProcess) -> None:
    r = post(server, "/v1/chat/completions", {"messages": USER, "tools": [WEATHER], "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


def test_tool_request_errors(server: ServerProcess) -> None:
    cases = [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": [WEATHER]}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [WEATHER, WEATHER]}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"n": False}}}}], "tool_choice": "required"},
         "tools"),
    ]
    for extra, param in cases:
        r = post(server, "/v1/chat/completions", {"messages": USER, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)


# ---------------------------------------------------------------- usage, timings, defaults


def test_include_usage_as_openai_sends_it(client: openai.OpenAI) -> None:
    kw = dict(model=ALIAS, messages=USER, max_tokens=6, temperature=0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    # the same counts (the cached share may differ: the second request finds the first one's prompt in its slot)
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump(exclude={"prompt_tokens_details"}) == \
        whole.usage.model_dump(exclude={"prompt_tokens_details"})
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    plain = list(client.chat.completions.create(stream=True, **kw))
    assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason
    comp = list(client.completions.create(model=ALIAS, prompt="Hello", max_tokens=5, temperature=0, stream=True,
                                          stream_options={"include_usage": True}))
    assert comp[-1].choices == [] and comp[-1].usage.completion_tokens == 5


def test_timings_in_every_answer(server: ServerProcess, llm: llama_cpp.Llama) -> None:
    prompt = "Once upon a time"
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
    r = post(server, "/v1/completions", body).json()
    t = r["timings"]
    n_prompt = len(llm.tokenize(prompt.encode(), add_bos=True, special=True))
    assert t["prompt_n"] + t["cache_n"] == n_prompt == r["usage"]["prompt_tokens"]
    assert t["predicted_n"] == r["usage"]["completion_tokens"] == 24
    assert t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["predicted_per_second"] > 0
    assert t["predicted_per_token_ms"] == pytest.approx(t["predicted_ms"] / t["predicted_n"])
    assert t["n_steps"] >= 1 and 1.0 <= t["tau"] <= 4.0  # n_max 3: at most 4 tokens a step
    assert t.get("draft_n_accepted", 0) == round((t["tau"] - 1) * t["n_steps"])
    if SLOT_STATS:
        assert t["draft_n"] >= t["draft_n_accepted"]
    # the engine's step ledger while the request ran: its steps (this request's among them) and each part
    ledger = t["ledger"]
    assert ledger["steps"] >= t["n_steps"] and ledger["rows"] >= ledger["steps"]
    assert ledger["decode_ms"] > 0 and ledger["verify_ms"] > 0 and all(v >= 0 for v in ledger.values())
    # streamed: on the last chunk
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
        data = [json.loads(line[5:]) for line in s.iter_lines() if line.startswith("data:") and "[DONE]" not in line]
    assert "timings" in data[-1] and all("timings" not in d for d in data[:-1])
    assert data[-1]["timings"]["predicted_n"] == 24


def test_defaults_are_llama_servers(server: ServerProcess, models: dict[str, Path], workdir: Path) -> None:
    base = {"prompt": "The answer is", "max_tokens": 12, "seed": 11, "return_token_ids": True}
    explicit = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    for seed in (11, 12):
        a = post(server, "/v1/completions", {**base, "seed": seed}).json()["choices"][0]["token_ids"]
        b = post(server, "/v1/completions", {**base, "seed": seed, **explicit}).json()["choices"][0]["token_ids"]
        assert a == b
    # `serve --temp 0`: a request without temperature decodes greedily
    s = ServerProcess(["--model", str(models["target"]), "--draft", "none", "--n-ctx", "256", "--temp", "0"], workdir)
    try:
        outs = [post(s, "/v1/completions", {**base, "seed": seed}).json()["choices"][0]["token_ids"] for seed in (1, 2)]
        greedy = post(s, "/v1/completions", {**base, "temperature": 0}).json()["choices"][0]["token_ids"]
        assert outs == [greedy, greedy]
    finally:
        s.stop()


# ---------------------------------------------------------------- fields the engine must honour

UNHONOURED = [
    ("grammar", {"grammar": 'root ::= "yes" | "no"'}, "grammar"),
    ("grammar", {"response_format": {"type": "json_object"}}, "response_format"),
    ("presence_penalty", {"presence_penalty": 0.5}, "presence_penalty"),
    ("frequency_penalty", {"frequency_penalty": 0.5}, "frequency_penalty"),
    ("repeat_penalty", {"repeat_penalty": 1.1}, "repeat_penalty"),
    ("logit_bias", {"logit_bias": {"300": -100}}, "logit_bias"),
    ("logit_bias", {"logit_bias": [[300, -100]]}, "logit_bias"),
    ("repeat_penalty", {"repeat_penalty": 1.1, "repeat_last_n": -1}, "repeat_penalty"),
    ("logprobs", {"logprobs": 2}, "logprobs"),
]


@pytest.mark.parametrize("feature, extra, param", UNHONOURED, ids=[f"{u[2]}-{i}" for i, u in enumerate(UNHONOURED)])
def test_a_field_the_engine_cannot_honour_gets_400(server: ServerProcess, feature: str, extra: dict,
                                                   param: str) -> None:
    if feature in FEATURES:
        pytest.skip(f"the engine honours {feature}")
    r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"]


BAD = [
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
    ("/v1/completions", {"suffix": "x"}, "suffix"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {"repeat_penalty": 0}, "repeat_penalty"),
    ("/v1/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"99999999": 1}}, "logit_bias"),
    ("/v1/completions", {"grammar": "root ::= ("}, "grammar"),
    ("/v1/completions", {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"response_format": {"type": "xml"}}, "response_format"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     "response_format"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    # a subschema no value satisfies is refused, not a grammar that cannot finish
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"schema": {
        "type": "object", "properties": {"age": False}}}}}, "response_format"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize("path, extra, param", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_values_get_400_naming_the_field(server: ServerProcess, path: str, extra: dict, param: str) -> None:
    body = {"prompt": "Hello"} if path == "/v1/completions" else {"messages": USER}
    r = post(server, path, {**body, "max_tokens": 2, **extra})
    assert r.status_code == 400, (extra, r.text)
    assert r.json()["error"]["param"].split(".")[0] == param, r.text


def test_neutral_values_and_unknown_fields_pass(client: openai.OpenAI) -> None:
    r = client.completions.create(model=ALIAS, prompt="Hello", max_tokens=3, presence_penalty=0, frequency_penalty=0,
                                  logit_bias={}, extra_body={"repeat_penalty": 1.0, "mirostat": 2, "no_such": 1,
                                                             "response_format": {"type": "text"}})
    assert r.usage.completion_tokens == 3


# ---------------------------------------------------------------- honoured (needs the sampler chain)


@sampler_chain("logit_bias")
def test_logit_bias_bans_and_forces(client: openai.OpenAI) -> None:
    kw = dict(model=ALIAS, prompt="Once upon a time", max_tokens=12, temperature=0,
              extra_body={"return_token_ids": True})
    free = client.completions.create(**kw).choices[0].model_extra["token_ids"]
    banned = client.completions.create(logit_bias={str(t): -100 for t in set(free)}, **kw)
    assert not set(banned.choices[0].model_extra["token_ids"]) & set(free)
    forced = client.completions.create(logit_bias={"300": 100}, **kw)
    assert set(forced.choices[0].model_extra["token_ids"]) == {300}
    # llama-server's list form
    listed = client.completions.create(extra_body={"return_token_ids": True, "logit_bias": [[301, 100]]},
                                       **{k: v for k, v in kw.items() if k != "extra_body"})
    assert set(listed.choices[0].model_extra["token_ids"]) == {301}


@sampler_chain("presence_penalty", "frequency_penalty", "repeat_penalty", "repeat_last_n")
def test_penalties_reduce_repetition(client: openai.OpenAI, llm: llama_cpp.Llama) -> None:
    # the hot-token target repeats a few tokens; each penalty spreads its greedy answer over more of them
    kw = dict(model=ALIAS, prompt="The answer is", max_tokens=24, temperature=0, extra_body={"return_token_ids": True})

    def distinct(**extra) -> int:
        body = {**kw, "extra_body": {**kw["extra_body"], **extra.pop("extra_body", {})}, **extra}
        return len(set(client.completions.create(**body).choices[0].model_extra["token_ids"]))

    free = distinct()
    assert distinct(frequency_penalty=2.0) > free
    assert distinct(extra_body={"repeat_penalty": 3.0, "repeat_last_n": -1}) >= free
    # a flat presence penalty (OpenAI caps it at 2) or a repeat penalty need not beat the hot tokens' margins:
    # the answer is llama-cpp-python's own greedy answer under the same penalty, whatever that is
    for pen in ({"presence_penalty": 2.0}, {"frequency_penalty": 1.0, "presence_penalty": 1.0},
                {"repeat_penalty": 3.0}, {"frequency_penalty": 0.5, "repeat_penalty": 1.5}):
        extra = {"repeat_penalty": pen.pop("repeat_penalty")} if "repeat_penalty" in pen else {}
        ours = client.completions.create(model=ALIAS, prompt="The answer is", max_tokens=24, temperature=0,
                                         extra_body=extra, **pen)
        pen = {**pen, **extra}
        ref = llm.create_completion("The answer is", max_tokens=24, temperature=0, **pen)
        assert ours.choices[0].text == ref["choices"][0]["text"], pen


@sampler_chain("grammar")
def test_grammar_field(client: openai.OpenAI) -> None:
    r = client.completions.create(model=ALIAS, prompt="Answer:", max_tokens=20, temperature=0.7, seed=3,
                                  extra_body={"grammar": 'root ::= ("yes" | "no") "."'})
    assert r.choices[0].text in ("yes.", "no.") and r.choices[0].finish_reason == "stop"


@sampler_chain("logprobs")
def test_logprobs_shapes(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=ALIAS, messages=USER, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert "".join(c.token for c in content) == r.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)
    assert any(c.logprob < 0 for c in content)  # never all zero
    # greedy: the chosen token is the best alternative
    assert all(c.top_logprobs[0].token == c.token for c in content)
    comp = client.completions.create(model=ALIAS, prompt="Hello", max_tokens=5, temperature=0, logprobs=2)
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == comp.choices[0].text
    # streamed: the same logprobs, in chunks beside the text
    streamed = [c.choices[0].logprobs for c in client.chat.completions.create(
        model=ALIAS, messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3, stream=True)
        if c.choices and c.choices[0].logprobs]
    got = [x for part in streamed for x in part.content]
    assert [(x.token, x.logprob) for x in got] == [(c.token, c.logprob) for c in content]


# ---------------------------------------------------------------- SmolLM2


def test_smollm2_tools_go_through_the_generic_format(smollm2_server: ServerProcess) -> None:
    # SmolLM2's template does not describe tools: llama.cpp's generic format (tests/test_server_compat.py)
    r = post(smollm2_server, "/v1/chat/completions", {"messages": USER, "tools": [WEATHER], "max_tokens": 2})
    assert r.status_code == 200, r.text
    prompt = post(smollm2_server, "/apply-template", {"messages": USER, "tools": [WEATHER]}).json()["prompt"]
    assert tools.GENERIC_INSTRUCTION in prompt
    # tool_choice "none": the tools are only described (here: not at all); the answer is plain text
    r = post(smollm2_server, "/v1/chat/completions", {"messages": USER, "tools": [WEATHER], "tool_choice": "none",
                                                      "max_tokens": 2})
    assert r.status_code == 200


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"},
    "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
    "required": ["name", "age", "hobbies"], "additionalProperties": False}


@sampler_chain("grammar")
def test_smollm2_json_schema_answers_validate(smollm2_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=smollm2_server.url + "/v1", api_key="none", max_retries=0, timeout=600)
    people = ["a pirate", "a chef", "a student", "a pilot", "a farmer", "a poet", "a nurse", "a painter",
              "a miner", "a judge", "a baker", "a sailor", "a monk", "a clown", "a tailor", "a guard",
              "a singer", "a knight", "a doctor", "a driver"]
    taus = []
    for i, who in enumerate(people):
        r = client.chat.completions.create(
            model="anything", messages=[{"role": "user", "content": f"Describe {who} as JSON."}], max_tokens=200,
            temperature=0.7, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        taus.append(r.model_extra["timings"]["tau"])
    print(f"tau with a JSON schema, 20 prompts at T=0.7: {sum(taus) / len(taus):.2f}")


@pytest.mark.parametrize("args, needle", [(["--top-p", "0"], "--top-p"), (["--temp", "-1"], "--temp"),
                                          (["--top-k", "-3"], "--top-k"), (["--min-p", "2"], "--min-p")])
def test_serve_rejects_bad_sampling_defaults(args: list[str], needle: str, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "pydflash2.server", *args], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and needle in out.stderr


# ---------------------------------------------------------------- max_completion_tokens (issue 34)


def test_max_completion_tokens_is_max_tokens(client: openai.OpenAI, server: ServerProcess) -> None:
    """OpenAI's newer name (langchain-openai and pydantic-ai send only it) bounds the answer as
    max_tokens does; both given and different is a 400 naming both; below 1 a 400 naming it."""
    r = client.chat.completions.create(model=ALIAS, messages=USER, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3 and r.choices[0].finish_reason == "length", r
    same = client.chat.completions.create(model=ALIAS, messages=USER, max_tokens=3, temperature=0)
    assert same.choices[0].message.content == r.choices[0].message.content
    c = post(server, "/v1/completions", {"prompt": "Once upon a time", "max_completion_tokens": 2, "temperature": 0})
    assert c.status_code == 200 and c.json()["usage"]["completion_tokens"] <= 2, c.text
    both = post(server, "/v1/chat/completions", {"messages": USER, "max_tokens": 3, "max_completion_tokens": 5})
    assert both.status_code == 400 and "max_completion_tokens" in both.json()["error"]["message"], both.text
    zero = post(server, "/v1/chat/completions", {"messages": USER, "max_completion_tokens": 0})
    assert zero.status_code == 400, zero.text
    assert "max_completion_tokens must be an integer in 1.." in zero.json()["error"]["message"]


# ---------------------------------------------------------------- sampling ranges (issue 32)


def test_sampling_ranges_are_the_python_apis(server: ServerProcess) -> None:
    """The server checks max_tokens, top_k, temperature, top_p and min_p with the check the CLI and the
    Python API use (pydflash2.sampling.check_param): a 400 naming the field, in the same words. (A seed
    past 64 bits never gets that far: the body check refuses any integer there, naming the field.)"""
    from pydflash2.sampling import ParamError, check_param

    for field, value in [("max_tokens", 2**31), ("top_k", 2**31), ("top_k", -1), ("top_p", 0), ("min_p", 1.5),
                         ("temperature", -0.5), ("seed", 2**64), ("seed", -(2**63) - 1)]:
        r = post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 2, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, value, r.text)
        with pytest.raises(ParamError) as e:
            check_param(field, value)
        if field != "seed":
            assert str(e.value) in r.json()["error"]["message"], (field, r.text)
    # any 64-bit seed, signed or not, is taken (modulo 2**64): -1 is 2**64 - 1
    same = [post(server, "/v1/completions", {"prompt": "Hello", "max_tokens": 6, "temperature": 0.9, "seed": seed,
                                             "return_token_ids": True}) for seed in (-1, 2**64 - 1)]
    assert all(r.status_code == 200 for r in same), [r.text for r in same]
    assert same[0].json()["choices"][0]["token_ids"] == same[1].json()["choices"][0]["token_ids"]
