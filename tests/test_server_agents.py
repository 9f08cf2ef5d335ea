"""The APIs coding agents speak (issue 45), through a real server process on
127.0.0.1 over the tiny tools target with a DFlash2 drafter, with the clients
agents use: the `anthropic` SDK on `/v1/messages` (create, streams of text
and of a tool call, a tool_result turn, count_tokens, errors in Anthropic's
shape) and the `openai` SDK's `responses.create` / `responses.stream` on
`/v1/responses` (function calls, JSON schemas, what is refused); and the
same greedy conversation through chat completions, Messages and Responses
giving the same tokens (one request path inside)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import anthropic
import httpx
import jsonschema
import openai
import pydantic
import pydflash2_testing as testing
import pytest
from server_process import ServerProcess

from pydflash2.server import steering, tools
from pydflash2.server.engine import BatchEngine

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
ALIAS = "agent-model"
GRAMMAR = "grammar" in steering.engine_features(BatchEngine)
needs_grammar = pytest.mark.skipif(not GRAMMAR, reason="the engine has no grammar sampler (forced tool calls)")

SYSTEM = "You are a terse weather bot."
QUESTION = "What is the weather in Paris?"
# a short call: a one-letter name and an enum (a random target writes strings up to their bound)
PARAMS = {"type": "object", "properties": {"u": {"enum": ["C", "F"]}}, "required": ["u"]}
CHAT_TOOL = {"type": "function", "function": {"name": "w", "description": "weather", "parameters": PARAMS}}
ANTHROPIC_TOOL = {"name": "w", "description": "weather", "input_schema": PARAMS}
RESPONSES_TOOL = {"type": "function", "name": "w", "description": "weather", "parameters": PARAMS}
RESULT = "18 C and sunny"
# the anthropic SDK's create() no longer takes sampling fields (Anthropic's newer models fix them); agents
# and other clients still send them in the body, which this server reads
GREEDY = {"extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server-agents")


@pytest.fixture(scope="module")
def server(workdir: Path):
    target = testing.make_target_gguf(workdir / "tools-target.gguf",
                                      testing.TargetSpec(hot_tokens=HOT, chat_template=testing.TOOLS_TEMPLATE))
    ckpt = testing.make_drafter_checkpoint(workdir / "v2-hf", target, testing.DrafterSpec(version=2))
    draft = testing.checkpoint_to_gguf(ckpt, target, workdir / "v2.gguf")
    s = ServerProcess(["--model", str(target), "--draft", str(draft), "--parallel", "2", "--n-ctx", "1024",
                       "--n-max", "3", "--alias", ALIAS], workdir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def claude(server: ServerProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def oai(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def metric(server: ServerProcess, name: str) -> float:
    line = next(x for x in httpx.get(server.url + "/metrics", timeout=10).text.splitlines() if x.startswith(name + " "))
    return float(line.split()[-1])


def sse_events(server: ServerProcess, path: str, body: dict) -> list[tuple[str, dict]]:
    """(event name, data) of a stream, as sent."""
    out, name = [], None
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                out.append((name, json.loads(line[5:])))
    return out


# ---------------------------------------------------------------- Anthropic Messages


def test_messages_create_and_its_stream(claude: anthropic.Anthropic, server: ServerProcess) -> None:
    msg = claude.messages.create(model="claude-x", max_tokens=8, **GREEDY, system=SYSTEM,
                                 messages=[{"role": "user", "content": QUESTION}])
    assert msg.type == "message" and msg.role == "assistant" and msg.model == ALIAS and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text
    assert 1 <= msg.usage.output_tokens <= 8
    assert msg.stop_reason == ("max_tokens" if msg.usage.output_tokens == 8 else "end_turn")
    assert msg.model_extra["timings"]["predicted_n"] == msg.usage.output_tokens
    count = claude.messages.count_tokens(model="claude-x", system=SYSTEM,
                                         messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens

    with claude.messages.stream(model="claude-x", max_tokens=8, **GREEDY, system=SYSTEM,
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert pieces and "".join(pieces) == final.content[0].text == msg.content[0].text
    assert final.stop_reason == msg.stop_reason and final.usage.output_tokens == msg.usage.output_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == count.input_tokens

    # the event sequence as Anthropic sends it
    events = sse_events(server, "/v1/messages", {"max_tokens": 8, "temperature": 0, "system": SYSTEM,
                                                 "messages": [{"role": "user", "content": QUESTION}]})
    names = [n for n, _ in events]
    assert all(d["type"] == n for n, d in events)
    assert names[:3] == ["message_start", "ping", "content_block_start"] and names[-2:] == ["message_delta",
                                                                                         "message_stop"]
    assert set(names[3:-3]) <= {"content_block_delta"} and names[-3] == "content_block_stop"
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["input_tokens"] > 0
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == msg.stop_reason
    assert delta["usage"]["output_tokens"] == msg.usage.output_tokens
    assert "timings" in delta


def test_stop_sequences(claude: anthropic.Anthropic) -> None:
    kw = {"model": "x", **GREEDY, "system": SYSTEM, "messages": [{"role": "user", "content": QUESTION}]}
    full = claude.messages.create(max_tokens=16, **kw).content[0].text
    # two characters from the middle of the answer (no whitespace at their ends) as the stop sequence
    k = next(i for i in range(len(full) // 2, len(full) - 1) if full[i:i + 2].strip() == full[i:i + 2])
    word = full[k:k + 2]
    at = full.index(word)
    msg = claude.messages.create(max_tokens=16, stop_sequences=[word], **kw)
    assert msg.content[0].text == full[:at]
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", word)
    with claude.messages.stream(max_tokens=16, stop_sequences=[word], **kw) as s:
        final = s.get_final_message()
    assert (final.stop_reason, final.stop_sequence, final.content[0].text) == ("stop_sequence", word, full[:at])


@needs_grammar
def test_messages_tool_call_streams_input_json_that_joins_to_the_input(claude: anthropic.Anthropic) -> None:
    kw = {"model": "x", "max_tokens": 64, **GREEDY, "tools": [ANTHROPIC_TOOL],
          "tool_choice": {"type": "tool", "name": "w"}, "messages": [{"role": "user", "content": QUESTION}]}
    whole = claude.messages.create(**kw)
    assert whole.stop_reason == "tool_use"
    (use,) = [b for b in whole.content if b.type == "tool_use"]
    assert use.name == "w" and use.input["u"] in ("C", "F") and use.id.startswith("toolu_")
    jsonschema.validate(use.input, PARAMS)

    pieces, starts = [], []
    with claude.messages.stream(**kw) as stream:
        for event in stream:
            if event.type == "content_block_start":
                starts.append(event.content_block.type)
            elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert starts == ["tool_use"] and pieces
    (streamed,) = [b for b in final.content if b.type == "tool_use"]
    assert json.loads("".join(pieces)) == streamed.input == use.input
    assert final.stop_reason == "tool_use"

    # "any" (a call required) with disable_parallel_tool_use: exactly one call
    one = claude.messages.create(**{**kw, "tool_choice": {"type": "any", "disable_parallel_tool_use": True}})
    assert [b.type for b in one.content] == ["tool_use"] and one.stop_reason == "tool_use"
    jsonschema.validate(one.content[0].input, PARAMS)
    # structured output (output_config.format: the response_format grammar path); extra_body, as SDKs
    # before 2.x have no output_config argument
    shaped = claude.messages.create(model="x", max_tokens=64, messages=[{"role": "user", "content": QUESTION}],
                                    extra_body={"output_config": {"format": {"type": "json_schema", "schema": PARAMS}}})
    assert shaped.stop_reason == "end_turn"
    jsonschema.validate(json.loads(shaped.content[0].text), PARAMS)


def test_tool_result_follow_up_turn(claude: anthropic.Anthropic, oai: openai.OpenAI, server: ServerProcess) -> None:
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                  {"type": "tool_use", "id": "toolu_1", "name": "w",
                                                   "input": {"u": "C"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                              "content": [{"type": "text", "text": RESULT}]},
                                             {"type": "text", "text": "And tomorrow?"}]}]
    msg = claude.messages.create(model="x", max_tokens=6, **GREEDY, system=SYSTEM, tools=[ANTHROPIC_TOOL],
                                 messages=messages)
    assert msg.stop_reason in ("end_turn", "max_tokens", "tool_use")
    count = claude.messages.count_tokens(model="x", system=SYSTEM, tools=[ANTHROPIC_TOOL], messages=messages)
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens
    # the turn the chat template sees: the call in the assistant turn, the result a tool turn, then the text
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
            {"role": "assistant", "content": "Checking.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "w", "arguments": '{"u": "C"}'}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": RESULT},
            {"role": "user", "content": "And tomorrow?"}]
    prompt = post(server, "/apply-template", {"messages": chat, "tools": [CHAT_TOOL]}).json()["prompt"]
    assert f"<tool_response>\n{RESULT}\n</tool_response>" in prompt and '"arguments": {"u": "C"}' in prompt
    same = oai.chat.completions.create(model="x", messages=chat, tools=[CHAT_TOOL], max_tokens=6, temperature=0)
    assert same.usage.prompt_tokens == count.input_tokens


def test_messages_errors_in_anthropics_shape(claude: anthropic.Anthropic, server: ServerProcess) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model="x", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}])
    assert e.value.status_code == 400
    assert e.value.body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "messages.0.content: block 1: 'image' blocks are not supported: this model takes text only"}}
    user = [{"role": "user", "content": QUESTION}]
    cases = [  # (path, body, what the message must say)
        ("/v1/messages", {"messages": user}, "missing required field 'max_tokens'"),
        ("/v1/messages", {"messages": user, "max_tokens": 4, "temperature": -1}, "temperature"),
        ("/v1/messages", {"messages": user, "max_tokens": 4, "stop_sequences": ["a", "b", "c", "d", "e"]},
         "stop_sequences"),
        ("/v1/messages", {"messages": user, "max_tokens": 4, "tools": [{"type": "web_search_20250305",
                                                                        "name": "web_search"}]},
         "server tools are not served"),
        ("/v1/messages", {"messages": user, "max_tokens": 4, "tools": [ANTHROPIC_TOOL],
                          "tool_choice": {"type": "tool", "name": "nope"}}, "no tool named 'nope'"),
        ("/v1/messages", {"messages": [{"role": "assistant", "content": [
            {"type": "tool_result", "tool_use_id": "x", "content": "y"}]}], "max_tokens": 4},
         "cannot be in a assistant message"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "x" * 5000}], "max_tokens": 4},
         "context holds 1024 tokens"),
        ("/v1/messages/count_tokens", {"messages": []}, "messages"),
        ("/v1/messages/count_tokens", {"messages": [{"role": "user", "content": [image]}]}, "text only"),
    ]
    for path, body, needle in cases:
        r = post(server, path, body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error", err
        assert needle in err["error"]["message"], (needle, err)
    r = httpx.post(server.url + "/v1/messages", content=b"{", timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(server.url + "/v1/messages/batches", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    # Anthropic's headers are accepted as its SDK sends them (anthropic-version, x-api-key without keys set)
    r = httpx.post(server.url + "/v1/messages", json={"messages": user, "max_tokens": 2}, timeout=60,
                   headers={"anthropic-version": "2023-06-01", "x-api-key": "anything"})
    assert r.status_code == 200, r.text


# ---------------------------------------------------------------- OpenAI Responses


@needs_grammar
def test_responses_function_call_and_its_output(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="x", instructions=SYSTEM, input=QUESTION, tools=[RESPONSES_TOOL],
                             tool_choice="required", parallel_tool_calls=False, max_output_tokens=64,
                             temperature=0)
    assert r.object == "response" and r.status == "completed" and r.model == ALIAS
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert call.name == "w" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    assert r.usage.output_tokens >= 1 and r.usage.input_tokens > 0

    follow = oai.responses.create(model="x", instructions=SYSTEM, tools=[RESPONSES_TOOL], max_output_tokens=6,
                                  temperature=0, input=[
                                      {"role": "user", "content": QUESTION},
                                      *[o.model_dump(exclude_none=True) for o in r.output],  # as agents resend it
                                      {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > r.usage.input_tokens
    assert follow.status == ("incomplete" if follow.usage.output_tokens == 6 else "completed")

    pieces, kinds = [], []
    with oai.responses.stream(model="x", instructions=SYSTEM, input=QUESTION, tools=[RESPONSES_TOOL],
                              tool_choice={"type": "function", "name": "w"}, max_output_tokens=64,
                              temperature=0) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                pieces.append(event.delta)
        final = stream.get_final_response()
    (streamed,) = [o for o in final.output if o.type == "function_call"]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_item.added" in kinds and "response.function_call_arguments.done" in kinds
    assert pieces and "".join(pieces) == streamed.arguments
    assert json.loads(streamed.arguments) == json.loads(call.arguments)


class Weather(pydantic.BaseModel):
    u: Literal["C", "F"]


@needs_grammar
def test_responses_json_schema(oai: openai.OpenAI) -> None:
    r = oai.responses.create(model="x", input=QUESTION, max_output_tokens=64, temperature=0.7, text={
        "format": {"type": "json_schema", "name": "weather", "schema": PARAMS, "strict": True}})
    assert r.status == "completed"
    jsonschema.validate(json.loads(r.output_text), PARAMS)
    with oai.responses.stream(model="x", input=QUESTION, max_output_tokens=64, text_format=Weather) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == final.output_text and final.output_parsed.u in ("C", "F")


def test_responses_text_and_what_is_refused(oai: openai.OpenAI, server: ServerProcess) -> None:
    whole = oai.responses.create(model="x", input=QUESTION, max_output_tokens=8, temperature=0)
    assert whole.output_text and whole.status == ("incomplete" if whole.usage.output_tokens == 8 else "completed")
    assert whole.incomplete_details is None or whole.incomplete_details.reason == "max_output_tokens"
    with oai.responses.stream(model="x", input=[{"role": "user", "content": [
            {"type": "input_text", "text": QUESTION}]}], max_output_tokens=8, temperature=0) as stream:
        events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text
    # a stream cut by max_output_tokens ends as OpenAI's does: response.incomplete
    assert events[-1].type == f"response.{whole.status}" and events[-1].response.output_text == whole.output_text
    for body, param, needle in [
        ({"input": "hi", "previous_response_id": "resp_1"}, None, "stateless"),
        ({"input": "hi", "tools": [{"type": "custom", "name": "x"}]}, "tools", "'custom' tools are not served"),
        ({"input": "hi", "tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}}, "tool_choice",
         "'web_search' forces a hosted tool"),
        ({"input": "hi", "tool_choice": {"type": "allowed_tools"}}, "tool_choice", "only 'none'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
         "input.0.message.content", "this model takes text only"),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input", "'web_search_call' items are not served"),
        ({"input": "hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
            "type": "object", "properties": {"n": False}}}}}, "text.format", "/properties/n is false"),
        ({"input": "x" * 5000}, "input", "context holds 1024 tokens"),
    ]:
        r = post(server, "/v1/responses", body)
        assert r.status_code == 400, (body, r.text)
        err = r.json()["error"]
        assert err["param"] == param and needle in err["message"], (body, err)
    with pytest.raises(openai.BadRequestError, match="stateless"):
        oai.responses.create(model="x", input="hi", previous_response_id="resp_123")


# ---------------------------------------------------------------- one request path


def test_the_three_apis_give_the_same_greedy_tokens(claude: anthropic.Anthropic, oai: openai.OpenAI,
                                                    server: ServerProcess) -> None:
    """One conversation (a system prompt, a question, a tool call and its result, tools offered) through
    chat completions, Messages and Responses: the same prompt tokens and the same greedy answer."""
    args = '{"u": "C"}'
    generated = metric(server, "pydflash2:generation_tokens_total")
    chat = oai.chat.completions.create(model="x", max_tokens=16, temperature=0, tools=[CHAT_TOOL], messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": args}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": RESULT}], extra_body={"return_token_ids": True})
    tokens = chat.choices[0].model_extra["token_ids"]
    assert len(tokens) == chat.usage.completion_tokens >= 2
    msg = claude.messages.create(model="x", max_tokens=16, **GREEDY, system=SYSTEM, tools=[ANTHROPIC_TOOL],
                                 messages=[
                                     {"role": "user", "content": QUESTION},
                                     {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                                        "name": "w", "input": {"u": "C"}}]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                                   "content": RESULT}]}])
    resp = oai.responses.create(model="x", max_output_tokens=16, temperature=0, instructions=SYSTEM,
                                tools=[RESPONSES_TOOL], input=[
                                    {"role": "user", "content": QUESTION},
                                    {"type": "function_call", "call_id": "call_1", "name": "w", "arguments": args},
                                    {"type": "function_call_output", "call_id": "call_1", "output": RESULT}])
    detok = post(server, "/detokenize", {"tokens": tokens}).json()["content"]
    text = chat.choices[0].message.content
    assert detok == text and msg.content[0].text == text and resp.output_text == text
    assert msg.usage.output_tokens == resp.usage.output_tokens == len(tokens)
    prompt = chat.usage.prompt_tokens
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == resp.usage.input_tokens == prompt
    assert msg.model_extra["timings"]["predicted_n"] == resp.model_extra["timings"]["predicted_n"] == len(tokens)
    assert metric(server, "pydflash2:generation_tokens_total") == generated + 3 * len(tokens)  # the same metrics
    # and streamed
    with claude.messages.stream(model="x", max_tokens=16, **GREEDY, system=SYSTEM, tools=[ANTHROPIC_TOOL],
                                messages=[{"role": "user", "content": QUESTION},
                                          {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                                             "name": "w", "input": {"u": "C"}}]},
                                          {"role": "user", "content": [{"type": "tool_result",
                                                                        "tool_use_id": "call_1",
                                                                        "content": RESULT}]}]) as s:
        assert s.get_final_message().content[0].text == text


# ---------------------------------------------------------------- what agents send (issue 58)


def test_max_tokens_past_the_context_is_capped(claude: anthropic.Anthropic, oai: openai.OpenAI,
                                               server: ServerProcess) -> None:
    """Claude Code asks for max_tokens 32000 whatever the context: as llama-server, the answer runs to the end of
    the context, and the access line states the cap. It ends as each API ends an answer at the context window:
    chat `length` (llama-server), Messages `model_context_window_exceeded` (Anthropic's; Claude Code stops
    there instead of resending the turn), Responses `failed` with `context_length_exceeded` (OpenAI's code,
    which Codex reads as a full context: an `incomplete` response it resends as a broken stream, issue 58
    item 8). The client's own smaller limit still ends as `max_tokens` / `incomplete`."""
    def user(k: int) -> list[dict]:
        return [{"role": "user", "content": "tell me " * k}]

    one, two = (claude.messages.count_tokens(model="x", messages=user(k)).input_tokens for k in (100, 200))
    long = user(100 + (1000 - one) * 100 // (two - one))  # about 1,000 tokens
    prompt = claude.messages.count_tokens(model="x", messages=long).input_tokens
    left = 1024 - prompt
    assert 0 < left < 64, prompt  # a short answer: the test stays quick
    msg = claude.messages.with_raw_response.create(model="x", max_tokens=32000, **GREEDY, messages=long,
                                                   extra_headers={"X-Request-Id": "cap-messages"})
    m = msg.parse()
    assert m.stop_reason == "model_context_window_exceeded" and m.usage.output_tokens == left, m
    with claude.messages.stream(model="x", max_tokens=32000, **GREEDY, messages=long) as s:
        final = s.get_final_message()
        assert final.content[0].text == m.content[0].text and final.stop_reason == m.stop_reason
    own = claude.messages.create(model="x", max_tokens=left - 1, **GREEDY, messages=long)
    assert own.stop_reason == "max_tokens" and own.usage.output_tokens == left - 1
    chat = oai.chat.completions.create(model="x", max_tokens=32000, temperature=0, messages=long)
    assert chat.choices[0].finish_reason == "length" and chat.usage.completion_tokens == left
    assert chat.choices[0].message.content == m.content[0].text
    for limit in ({"max_output_tokens": 32000}, {}):  # Codex sends none
        resp = oai.responses.create(model="x", temperature=0, input=long[0]["content"], **limit)
        assert resp.status == "failed" and resp.error.code == "context_length_exceeded", resp
        assert resp.incomplete_details is None and resp.usage.output_tokens == left
        assert resp.output[0].status == "incomplete" and resp.output_text == m.content[0].text
        with oai.responses.stream(model="x", temperature=0, input=long[0]["content"], **limit) as st:
            events = list(st)
        kinds = [e.type for e in events]
        assert kinds[-1] == "response.failed" and "response.incomplete" not in kinds, kinds
        assert events[-1].response.error.code == "context_length_exceeded"
        assert events[-1].response.output[0].content[0].text == m.content[0].text
    resp = oai.responses.create(model="x", max_output_tokens=left - 1, temperature=0, input=long[0]["content"])
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens" and not resp.error
    line = next(x for x in server.log().splitlines() if "rid=cap-messages" in x)
    assert f"max_tokens=32000->{left}" in line and "finish=length(context)" in line, line


def test_messages_take_system_turns_inside_messages(claude: anthropic.Anthropic) -> None:
    """Claude Code sends a system turn inside messages: joined into the system prompt, after `system`."""
    extra = "Answer in French."
    inside = claude.messages.create(model="x", max_tokens=8, **GREEDY, system=SYSTEM, messages=[
        {"role": "system", "content": extra}, {"role": "user", "content": QUESTION}])
    joined = claude.messages.create(model="x", max_tokens=8, **GREEDY, system=f"{SYSTEM}\n{extra}",
                                    messages=[{"role": "user", "content": QUESTION}])
    assert inside.content[0].text == joined.content[0].text
    assert inside.usage.input_tokens + inside.usage.cache_read_input_tokens == (
        joined.usage.input_tokens + joined.usage.cache_read_input_tokens)
    count = claude.messages.count_tokens(model="x", messages=[{"role": "system", "content": [
        {"type": "text", "text": extra}]}, {"role": "user", "content": QUESTION}])
    alone = claude.messages.count_tokens(model="x", system=extra, messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens == alone.input_tokens
    with pytest.raises(anthropic.BadRequestError, match="tool_use"):  # a system turn holds text only
        claude.messages.create(model="x", max_tokens=2, messages=[
            {"role": "system", "content": [{"type": "tool_use", "id": "t", "name": "w", "input": {}}]},
            {"role": "user", "content": QUESTION}])


NAMESPACE = {"type": "namespace", "name": "weather", "description": "weather tools", "tools": [RESPONSES_TOOL]}
HOSTED = [{"type": "web_search"}, {"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["v"]},
          {"type": "code_interpreter", "container": {"type": "auto"}}, {"type": "image_generation"},
          {"type": "local_shell"}, {"type": "mcp", "server_label": "m", "server_url": "http://127.0.0.1:1"}]


@needs_grammar
def test_responses_namespace_tools_and_hosted_tools(oai: openai.OpenAI, server: ServerProcess) -> None:
    """Codex groups tools in a namespace and offers hosted tools: the namespace's functions are served, their
    calls answered with `namespace`; hosted tools are left out of the prompt and named in a header and the log."""
    kinds = ",".join(t["type"] for t in HOSTED)
    kw = {"model": "x", "instructions": SYSTEM, "input": QUESTION, "tools": [NAMESPACE, *HOSTED],
          "tool_choice": {"type": "function", "name": "w"}, "max_output_tokens": 64, "temperature": 0}
    raw = oai.responses.with_raw_response.create(**kw, extra_headers={"X-Request-Id": "hosted-tools"})
    assert raw.headers["x-pydflash2-ignored-tools"] == kinds
    r = raw.parse()
    (call,) = [o for o in r.output if o.type == "function_call"]
    assert (call.name, call.namespace) == ("w", "weather") and r.status == "completed"
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    line = next(x for x in server.log().splitlines() if "rid=hosted-tools" in x)
    assert f"ignored_tools={kinds}" in line, line
    # the same prompt as the function offered alone: hosted tools are not in it
    alone = oai.responses.create(**{**kw, "tools": [RESPONSES_TOOL]})
    assert alone.usage.input_tokens == r.usage.input_tokens
    with oai.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    (streamed,) = [o for o in final.output if o.type == "function_call"]
    assert (streamed.namespace, streamed.arguments) == ("weather", call.arguments)
    # the call resent with its namespace, and its output: the next turn
    follow = oai.responses.create(model="x", tools=[NAMESPACE, *HOSTED], max_output_tokens=4, temperature=0, input=[
        {"role": "user", "content": QUESTION}, call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}])
    assert follow.status in ("completed", "incomplete")
    r = post(server, "/v1/responses", {"input": "hi", "tools": HOSTED, "tool_choice": {"type": "file_search"}})
    assert r.status_code == 400 and "'file_search' forces a hosted tool" in r.json()["error"]["message"], r.text


# the generic tool format (a template without its own): a target on plain ChatML
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40}}, "required": ["city"]}


@needs_grammar
def test_generic_format_call_cut_by_max_tokens_keeps_its_call(plain_server: ServerProcess) -> None:
    """A generic-format call cut off by max_tokens with its name written: a tool_use / tool call / function_call
    whose input is what its arguments hold so far, not an empty text block."""
    url = plain_server.url
    claude = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    tool = {"name": "w", "description": "weather", "input_schema": CITY}
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 100, "temperature": 0,
            "tools": [{"type": "function", "function": {"name": "w", "parameters": CITY}}], "tool_choice": "required",
            "return_token_ids": True}
    whole = post(plain_server, "/v1/chat/completions", body).json()["choices"][0]
    tokens = whole["token_ids"]
    # the shortest prefix whose text is inside the city's string
    inside = re.compile(r'"name"\s*:\s*"w"\s*,\s*"arguments"\s*:\s*\{\s*"city"\s*:\s*"[^"]')
    cut = next(n for n in range(1, len(tokens)) if inside.search(
        post(plain_server, "/detokenize", {"tokens": tokens[:n]}).json()["content"]))
    kw = {"model": "x", "max_tokens": cut, **GREEDY, "tools": [tool], "tool_choice": {"type": "any"},
          "messages": [{"role": "user", "content": QUESTION}]}
    msg = claude.messages.create(**kw)
    assert msg.stop_reason == "max_tokens" and [b.type for b in msg.content] == ["tool_use"], msg
    city = msg.content[0].input["city"]
    whole_args = json.loads(whole["message"]["tool_calls"][0]["function"]["arguments"], strict=False)
    assert city and whole_args["city"].startswith(city)
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["tool_use"] and final.content[0].input == {"city": city}
    chat = post(plain_server, "/v1/chat/completions", {**body, "max_tokens": cut}).json()["choices"][0]
    assert chat["finish_reason"] == "length" and chat["message"]["tool_calls"][0]["function"]["name"] == "w"
    resp = oai.responses.create(model="x", input=QUESTION, max_output_tokens=cut, temperature=0, tool_choice="required",
                                tools=[{"type": "function", "name": "w", "parameters": CITY}])
    assert resp.status == "incomplete" and [o.type for o in resp.output] == ["function_call"]


def test_generic_format_response_streams(plain_server: ServerProcess) -> None:
    """With tools offered on a template without a tool format, the answer's text streams as it is decoded
    (the response's JSON string, unescaped), on chat completions, Messages and Responses alike."""
    url = plain_server.url
    claude = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)
    chat_tool = CHAT_TOOL  # the same tool as ANTHROPIC_TOOL and RESPONSES_TOOL: the same prompt
    whole = oai.chat.completions.create(model="x", messages=[{"role": "user", "content": QUESTION}], max_tokens=40,
                                        temperature=0, tools=[chat_tool])
    text = whole.choices[0].message.content
    assert text and not whole.choices[0].message.tool_calls and not text.lstrip().startswith("{"), whole
    chunks = [c.choices[0].delta.content for c in oai.chat.completions.create(
        model="x", messages=[{"role": "user", "content": QUESTION}], max_tokens=40, temperature=0, tools=[chat_tool],
        stream=True) if c.choices and c.choices[0].delta.content]
    assert len(chunks) > 5 and "".join(chunks) == text
    with claude.messages.stream(model="x", max_tokens=40, **GREEDY, tools=[ANTHROPIC_TOOL],
                                messages=[{"role": "user", "content": QUESTION}]) as s:
        pieces = list(s.text_stream)
    assert len(pieces) > 5 and "".join(pieces) == text
    with oai.responses.stream(model="x", input=QUESTION, max_output_tokens=40, temperature=0,
                              tools=[RESPONSES_TOOL]) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
    assert len(deltas) > 5 and "".join(deltas) == text


def test_generic_response_string_decodes_across_pieces() -> None:
    """The response's JSON string decoded piece by piece, split anywhere (inside escapes, between a surrogate
    pair's halves): the same text as the whole string's; cut off inside an escape, the escape is dropped."""
    value = 'h\u00e9 "q" \\ \n\t\U0001f600 x\u2028'
    answer = json.dumps({"response": value})  # \u00e9, \ud83d\ude00 escapes
    assert "\\ud83d\\ude00" in answer
    for size in (1, 2, 3, 5, 7):
        s = tools.ToolCallStream(tools.GENERIC, {"w"})
        out = [x for i in range(0, len(answer), size) for x in s.push(answer[i:i + size])] + s.finish()
        assert all(isinstance(x, str) for x in out) and "".join(out) == value, (size, out)
        assert len(out) >= min(5, len(answer) // size // 2), (size, out)  # as it comes, not at the end
    cut = answer[:answer.index("\\ude00") + 3]  # the pair's low half cut off
    assert tools.split_answer(tools.GENERIC, {"w"}, cut) == ('h\u00e9 "q" \\ \n\t\ufffd', [])


@needs_grammar
def test_generic_format_auto_constrains_the_shape_not_the_arguments(plain_server: ServerProcess) -> None:
    """Claude Code offers dozens of tools, one with a string of maxLength 524288 (megabytes of grammar, past
    --max-grammar-bytes): with tool_choice auto the generic grammar holds the answer's shape and the tools'
    names, the arguments any object (read as written, as auto calls in the other formats); a required call
    still follows its tool's schema, so there the same tool is a 400."""
    script = {"type": "object", "properties": {"script": {"type": "string", "maxLength": 524288}}}
    offered = [CHAT_TOOL, {"type": "function", "function": {"name": "Workflow", "parameters": script}}]
    body = {"messages": [{"role": "user", "content": QUESTION}], "tools": offered, "max_tokens": 8, "temperature": 0}
    r = post(plain_server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    r = post(plain_server, "/v1/chat/completions", {**body, "tool_choice": "required"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_tool_choice_none_after_calls_asks_for_text(plain_server: ServerProcess) -> None:
    """tool_choice none after a tool result: the system turn no longer asks for JSON (nor lists tools)."""
    call = {"id": "call_1", "type": "function", "function": {"name": "w", "arguments": '{"u": "C"}'}}
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": RESULT}]
    tool = {"type": "function", "function": {"name": "w", "parameters": PARAMS}}
    prompt = post(plain_server, "/apply-template", {"messages": history, "tools": [tool],
                                                      "tool_choice": "none"}).json()["prompt"]
    system = prompt.split("<|im_end|>")[0]
    assert "JSON" not in system and "You can call" not in system and tools.PLAIN_INSTRUCTION in system, prompt
    auto = post(plain_server, "/apply-template", {"messages": history, "tools": [tool]}).json()["prompt"]
    assert tools.GENERIC_INSTRUCTION in auto  # offered: described, and the answer's JSON asked for
    claude = anthropic.Anthropic(base_url=plain_server.url, api_key="none", max_retries=0, timeout=120)
    msg = claude.messages.create(model="x", max_tokens=8, **GREEDY, tools=[ANTHROPIC_TOOL],
                                 tool_choice={"type": "none"}, messages=[
                                     {"role": "user", "content": QUESTION},
                                     {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1",
                                                                        "name": "w", "input": {"u": "C"}}]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                                   "content": RESULT}]}])
    assert [b.type for b in msg.content] == ["text"]
    count = claude.messages.count_tokens(model="x", tools=[ANTHROPIC_TOOL], tool_choice={"type": "none"},
                                         messages=[{"role": "user", "content": QUESTION}])
    assert count.input_tokens < 40  # no tools described


# ---------------------------------------------------------------- SmolLM2 (slow tier)

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
WEATHER_INPUT = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                                  "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"]}


@needs_grammar
def test_smollm2_agent_apis(smollm2_server: ServerProcess) -> None:
    """SmolLM2 and its shipped drafter (a template without a tool format: the generic format): the three
    APIs agree on a greedy answer, a forced call streams to an input that validates, a schema holds."""
    url = smollm2_server.url
    claude = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=600)
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=600)
    chat = oai.chat.completions.create(model="x", max_tokens=24, temperature=0, messages=[
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}])
    msg = claude.messages.create(model="x", max_tokens=24, **GREEDY, system=SYSTEM,
                                 messages=[{"role": "user", "content": QUESTION}])
    resp = oai.responses.create(model="x", max_output_tokens=24, temperature=0, instructions=SYSTEM, input=QUESTION)
    assert chat.choices[0].message.content == msg.content[0].text == resp.output_text
    assert chat.usage.completion_tokens == msg.usage.output_tokens == resp.usage.output_tokens

    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_INPUT}
    pieces = []
    with claude.messages.stream(model="x", max_tokens=100, **GREEDY, tools=[tool],
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": QUESTION}]) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and json.loads("".join(pieces)) == use.input
    jsonschema.validate(use.input, WEATHER_INPUT)

    r = oai.responses.create(model="x", input="Describe a pirate as JSON.", max_output_tokens=200, temperature=0.7,
                             text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), PERSON)


# ---------------------------------------------------------------- the translations, without a server


def test_messages_translate_to_the_chat_conversation() -> None:
    from pydflash2.server.anthropic_messages import MessagesRequest

    body = MessagesRequest.model_validate({
        "max_tokens": 4, "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                                    {"type": "text", "text": "b"}],
        "messages": [{"role": "user", "content": "q"},
                     {"role": "assistant", "content": [{"type": "thinking", "thinking": "...", "signature": "s"},
                                                       {"type": "text", "text": "t"},
                                                       {"type": "tool_use", "id": "u1", "name": "w",
                                                        "input": {"u": "C"}},
                                                       {"type": "tool_use", "id": "u2", "name": "w", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "r1"},
                                                  {"type": "tool_result", "tool_use_id": "u2", "is_error": True,
                                                   "content": [{"type": "text", "text": "x"},
                                                               {"type": "text", "text": "y"}]},
                                                  {"type": "text", "text": "next"}]}],
        "tools": [ANTHROPIC_TOOL], "tool_choice": {"type": "tool", "name": "w", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "top_k": 5})
    chat = body.chat_body()
    assert chat["messages"] == [
        {"role": "system", "content": "a\nb"}, {"role": "user", "content": [{"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "t"}], "tool_calls": [
            {"id": "u1", "type": "function", "function": {"name": "w", "arguments": '{"u": "C"}'}},
            {"id": "u2", "type": "function", "function": {"name": "w", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "u1", "content": "r1"},
        {"role": "tool", "tool_call_id": "u2", "content": "x\ny"},
        {"role": "user", "content": [{"type": "text", "text": "next"}]}]
    assert chat["tools"] == [CHAT_TOOL] and chat["parallel_tool_calls"] is False
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "w"}}
    assert (chat["stop"], chat["top_k"], chat["max_tokens"]) == (["END"], 5, 4)


def test_responses_translate_to_the_chat_conversation() -> None:
    from pydflash2.server.responses_api import ResponsesRequest

    body = ResponsesRequest.model_validate({
        "instructions": "sys", "max_output_tokens": 9, "tools": [RESPONSES_TOOL], "tool_choice": "required",
        "parallel_tool_calls": False, "text": {"format": {"type": "json_schema", "name": "n", "schema": PARAMS}},
        "input": [{"role": "developer", "content": "dev"}, {"role": "user", "content": [
                      {"type": "input_text", "text": "q1"}, {"type": "input_text", "text": "q2"}]},
                  {"type": "reasoning", "id": "rs_1", "summary": []},
                  {"type": "message", "role": "assistant", "id": "m1", "status": "completed",
                   "content": [{"type": "output_text", "text": "t", "annotations": []}]},
                  {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"u": "F"}'},
                  {"type": "function_call", "call_id": "c2", "name": "w", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "o1"},
                  {"type": "function_call_output", "call_id": "c2", "output": "o2"},
                  {"type": "function_call", "call_id": "c3", "name": "w", "arguments": "{}"}]})
    chat = body.chat_body()
    call = {"type": "function", "function": {"name": "w", "arguments": "{}"}}
    assert chat["messages"] == [
        {"role": "system", "content": "sys"}, {"role": "developer", "content": [{"type": "text", "text": "dev"}]},
        {"role": "user", "content": [{"type": "text", "text": "q1"}, {"type": "text", "text": "q2"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "t"}], "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"u": "F"}'}},
            {"id": "c2", **call}]},
        {"role": "tool", "tool_call_id": "c1", "content": "o1"},
        {"role": "tool", "tool_call_id": "c2", "content": "o2"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c3", **call}]}]
    assert chat["tools"] == [CHAT_TOOL] and chat["tool_choice"] == "required" and not chat["parallel_tool_calls"]
    assert chat["max_tokens"] == 9
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "n", "schema": PARAMS}}
