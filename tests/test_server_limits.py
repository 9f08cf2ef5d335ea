"""One request must never take the server down: grammars and JSON schemas past
the limits (docs/server.md, "Grammar and schema limits") get a 400 naming the
field and the limit, those llama.cpp's recursive parser used to overflow its
stack on included (the process died with SIGSEGV); the server stays alive and
a good request still works; /health answers while a large grammar compiles.

One real server on the tiny fixture target (plain decoding) for the module."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_process import ServerProcess

from pydflash2 import grammar_limits
from pydflash2.grammar_limits import GrammarLimits


@pytest.fixture(scope="module")
def server(target_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    s = ServerProcess(["--model", str(target_gguf), "--draft", "none", "--parallel", "2", "--n-ctx", "128",
                       "--max-body", str(4 << 20)], tmp_path_factory.mktemp("server-limits"))
    yield s
    s.stop()


def post(server: ServerProcess, body: dict, route: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.url + route, json=body, timeout=120)


def alive_and_working(server: ServerProcess) -> None:
    assert server.proc.poll() is None, f"the server died ({server.proc.returncode}):\n{server.log()[-2000:]}"
    r = post(server, {"prompt": "Hello", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


def schema_format(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth + "\n"


def rule_chain(n: int) -> str:
    return "root ::= r0\n" + "".join(f"r{i} ::= r{i + 1}\n" for i in range(n)) + f'r{n} ::= "a"\n'


# (request fields, the param the 400 names, words its message must hold)
CASES = {
    # each of these killed the process before (SIGSEGV in llama.cpp's parser)
    "maxLength 20000": ({"response_format": schema_format({"type": "string", "maxLength": 20000})},
                        "response_format", ["maxLength", "20000", "1000", "--max-schema-repeat"]),
    "maxItems 20000": ({"response_format": schema_format({"type": "array", "items": {"type": "integer"},
                                                          "maxItems": 20000})},
                       "response_format", ["maxItems", "--max-schema-repeat"]),
    "grammar nested 30000": ({"grammar": nested(30000)}, "grammar", ["30000", "2000", "--max-grammar-depth"]),
    "rule chain 70000": ({"grammar": rule_chain(70000)}, "grammar", ["--max-grammar-bytes"]),
    # valid schemas that got a wrong "syntax error" or a bare KeyError
    "maxLength 5000": ({"response_format": schema_format({"type": "string", "maxLength": 5000})},
                       "response_format", ["maxLength", "5000", "--max-schema-repeat"]),
    "missing $ref": ({"response_format": schema_format({"$ref": "#/$defs/nope"})},
                     "response_format", ["#/$defs/nope", "points to nothing"]),
    "remote $ref": ({"response_format": schema_format({"$ref": "https://example.com/s.json"})},
                    "response_format", ["only references inside the schema"]),
    "enum 50000": ({"response_format": schema_format({"enum": [f"v{i}" for i in range(50000)]})},
                   "response_format", ["50000", "4096", "--max-schema-enum"]),
    "schema nested 200": ({"response_format": schema_format(json.loads('{"type":"array","items":' * 200
                                                                       + '{"type":"string"}' + "}" * 200))},
                          "response_format", ["nested more than 64 levels deep"]),  # the body's own bound
    "repetition {0,5000}": ({"grammar": 'root ::= "a"{0,5000}'}, "grammar", ["5000", "--max-grammar-repeat"]),
    # llama.cpp derives n - m rules, unsigned: {5,2} made its parser loop for ever, holding a worker thread
    "repetition {5,2}": ({"grammar": 'root ::= "a"{5,2}'}, "grammar", ["{5,2}", "upper bound below"]),
}


@pytest.mark.parametrize("case", CASES)
def test_past_a_limit_is_a_400_naming_it_and_the_server_lives(server: ServerProcess, case: str) -> None:
    fields, param, words = CASES[case]
    r = post(server, {"prompt": "Hello", "max_tokens": 2, **fields})
    assert r.status_code == 400, (r.status_code, r.text[:500])
    err = r.json()["error"]
    assert err["param"] == param
    for w in words:
        assert w in err["message"], (w, err["message"])
    alive_and_working(server)


def test_recursive_ref_is_supported(server: ServerProcess) -> None:
    """A root $ref beside its $defs (pydantic's recursive models): a 200 whose text follows the schema."""
    schema = {"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                                  "next": {"$ref": "#/$defs/node"}},
                                 "required": ["v"]}}, "$ref": "#/$defs/node"}
    r = post(server, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                      "response_format": schema_format(schema)}, "/v1/chat/completions")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"].startswith("{")


def worst_health_during(server: ServerProcess, route: str, body: dict) -> tuple[httpx.Response, float]:
    """POSTs body to route on a thread and polls /health until it is answered: (its answer, the
    slowest /health)."""
    done: list[httpx.Response] = []
    t = threading.Thread(target=lambda: done.append(post(server, body, route)))
    worst = 0.0
    with httpx.Client(timeout=10) as c:
        c.get(server.url + "/health")  # the connection is open before the clock starts
        t.start()
        while t.is_alive():
            t0 = time.perf_counter()
            assert c.get(server.url + "/health").status_code == 200
            worst = max(worst, time.perf_counter() - t0)
            time.sleep(0.02)
    t.join()
    return done[0], worst


def _large_grammar(n_bytes: int) -> str:
    alts: list[str] = []
    size = 0
    while size < n_bytes:
        alts.append(f'"v{len(alts)}"')
        size += len(alts[-1]) + 3
    return "root ::= " + " | ".join(alts)


def test_health_answers_while_a_large_grammar_compiles(server: ServerProcess) -> None:
    """A grammar of half --max-grammar-bytes (about half a second of llama.cpp's parsing, on a worker
    thread and again when the request starts) stalls neither the event loop nor the scheduler's lock:
    /health answers within 200 ms all along."""
    r, worst = worst_health_during(server, "/v1/completions", {
        "prompt": "Hello", "max_tokens": 2, "grammar": _large_grammar(GrammarLimits().grammar_bytes // 2)})
    assert r.status_code == 200, r.text[:300]
    assert worst < 0.2, f"/health took {worst * 1000:.0f} ms while the grammar compiled"


def test_the_step_loop_never_waits_for_a_grammar(target_gguf: Path, tmp_path: Path) -> None:
    """A request's grammar is parsed on a worker thread before the step loop starts the request
    (Scheduler.prepare): a stream decoding meanwhile keeps its pace. When the scheduler thread
    parsed it, the stream stopped for as long as the parse."""
    # one decoding thread: the parse has the other core (two would make ggml's barriers wait on it)
    server = ServerProcess(["--model", str(target_gguf), "--draft", "none", "--parallel", "2", "--n-ctx", "4096",
                            "--threads", "1", "--max-body", str(4 << 20)], tmp_path)
    try:
        grammar = _large_grammar(GrammarLimits().grammar_bytes // 2)
        t0 = time.perf_counter()
        assert post(server, {"prompt": "Hello", "max_tokens": 1, "grammar": grammar}).status_code == 200
        parse_s = time.perf_counter() - t0  # the request is its parse, nearly all of it
        arrivals: list[float] = []
        answered: list[float] = []

        def grammar_request() -> None:
            r = post(server, {"prompt": "Hello", "max_tokens": 1, "grammar": grammar})
            assert r.status_code == 200, r.text
            answered.append(time.perf_counter())

        fired = 0.0
        with httpx.Client(timeout=120) as c, c.stream("POST", server.url + "/v1/completions", json={
                "prompt": "Once upon a time", "max_tokens": 4000, "temperature": 0, "stream": True}) as stream:
            for line in stream.iter_lines():
                if not line.startswith("data: {"):
                    continue
                arrivals.append(time.perf_counter())
                if len(arrivals) == 20:  # decoding at its pace: now the grammar's request comes
                    fired = time.perf_counter()
                    threading.Thread(target=grammar_request, daemon=True).start()
                if answered and arrivals[-1] > answered[0] + 0.2:
                    break
    finally:
        server.stop()
    assert answered, "the grammar's request was not answered while the stream ran"
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]
    typical = sorted(gaps)[len(gaps) // 2]
    during = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if fired < b <= answered[0] + 0.2]
    # the test can tell: a parse many steps long (else a pause would hide among the steps)
    assert parse_s > 10 * typical, (parse_s, typical)
    assert during and max(during) < parse_s / 2, (
        f"the stream paused {max(during, default=0) * 1000:.0f} ms while a grammar that takes "
        f"{parse_s * 1000:.0f} ms to parse was prepared")


def test_health_answers_while_a_long_text_is_tokenised(server: ServerProcess) -> None:
    """/tokenize of 900 KB stalled /health 0.7 s on the event loop: it runs on a worker thread."""
    r, worst = worst_health_during(server, "/tokenize", {"content": "the quick brown fox jumps over it. " * 26000})
    assert r.status_code == 200, r.text[:300]
    assert len(r.json()["tokens"]) > 100000
    assert worst < 0.2, f"/health took {worst * 1000:.0f} ms during /tokenize"


# ---------------------------------------------------------------- property: 200 or 400, never a dead server

_BOUND = st.integers(-(10**20), 10**20) | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | \
    st.sampled_from([10**150, True, "3", None])
_LEAF = st.sampled_from([{"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"enum": ["a", "b"]},
                         {"type": "string", "maxLength": 3000}, {"type": "string", "maxLength": 8}]) | \
    st.builds(lambda t, bounds: {"type": t, **bounds}, st.sampled_from(["integer", "number", ["integer", "null"]]),
              st.dictionaries(st.sampled_from(["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"]), _BOUND,
                              max_size=4))  # integer ranges (issue 34): any bounds, empty and absurd ones included


def _schemas() -> st.SearchStrategy:
    def extend(inner: st.SearchStrategy) -> st.SearchStrategy:
        return st.one_of(
            st.builds(lambda s, n: {"type": "array", "items": s, "maxItems": n}, inner, st.integers(0, 1500)),
            st.builds(lambda props: {"type": "object", "properties": props},
                      st.dictionaries(st.sampled_from("abcdef"), inner, min_size=1, max_size=4)),
            st.builds(lambda alts: {"anyOf": alts}, st.lists(inner, min_size=1, max_size=4)))

    def deep(depth: int) -> dict:
        s: dict = {"type": "string"}
        for _ in range(depth):
            s = {"type": "array", "items": s}
        return s

    return st.recursive(_LEAF, extend, max_leaves=12) | st.builds(deep, st.integers(1, 400))


def _gbnf() -> st.SearchStrategy:
    return st.one_of(
        st.builds(nested, st.integers(1, 40000)),
        st.builds(lambda n, m: f'root ::= "a"{{{n},{m}}}', st.integers(0, 2500), st.integers(0, 2500)),
        st.builds(lambda n: "root ::= " + '("a" ' * n + ")?" * n, st.integers(1, 3000)),
        st.builds(lambda w, d: "root ::= " + " | ".join([nested(d).split("::= ")[1].strip()] * w),
                  st.integers(1, 50), st.integers(1, 3000)),
        st.text(alphabet='root:=()|"a*+?{}0129 \n#[]^\\', max_size=200))


class HealthWatch:
    """Polls /health every 50 ms on its own thread and keeps the slowest answer."""

    def __init__(self, server: ServerProcess) -> None:
        self.server, self.worst, self.polls, self._stop = server, 0.0, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as c:
            c.get(self.server.url + "/health")
            while not self._stop.wait(0.05):
                t0 = time.perf_counter()
                c.get(self.server.url + "/health").raise_for_status()
                self.worst = max(self.worst, time.perf_counter() - t0)
                self.polls += 1

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.worst


@pytest.fixture(scope="module")
def health_watch(server: ServerProcess):
    w = HealthWatch(server)
    yield w
    w.stop()


_PROPERTY = settings(max_examples=20, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _200_or_400(server: ServerProcess, body: dict) -> None:
    r = post(server, {"prompt": "Hello", "max_tokens": 2, **body})
    assert r.status_code in (200, 400), (r.status_code, r.text[:300])
    if r.status_code == 400:
        assert r.json()["error"]["message"]
    assert server.proc.poll() is None, f"the server died:\n{server.log()[-2000:]}"


@_PROPERTY
@given(schema=_schemas())
def test_generated_schemas_get_200_or_400(server: ServerProcess, health_watch: HealthWatch, schema: dict) -> None:
    _200_or_400(server, {"response_format": schema_format(schema)})


@_PROPERTY
@given(grammar=_gbnf())
def test_generated_grammars_get_200_or_400(server: ServerProcess, health_watch: HealthWatch, grammar: str) -> None:
    if grammar.strip():
        _200_or_400(server, {"grammar": grammar})


def test_the_property_runs_leave_a_working_server(server: ServerProcess, health_watch: HealthWatch) -> None:
    """...and the event loop never stalled: /health, polled every 50 ms all along, answered within 500 ms
    (the issue's 50,000-value enum stalled it 5.1 s). Not 200 ms as in the focused tests above: over the
    whole run, a machine loaded by other work (load 10 on 2 cores) delays a poll by 350-720 ms now and
    then, with no slow callback on the server's loop (PYTHONASYNCIODEBUG=1 logs none)."""
    alive_and_working(server)
    worst = health_watch.stop()
    assert health_watch.polls > 10
    assert worst < 0.5, f"/health took {worst * 1000:.0f} ms during the property runs"


# ---------------------------------------------------------------- the Python API and the engine's own caps

def test_python_api_refuses_a_deep_grammar_before_llama_cpp(target_gguf: Path) -> None:
    from pydflash2 import Speculator

    with Speculator(str(target_gguf), None, n_ctx=64, n_max=0) as spec, \
            pytest.raises(ValueError, match="nested 30000 deep"):
        spec.generate("Hello", max_tokens=2, grammar=nested(30000), chat=False)


def test_engine_caps_hold_whatever_the_caller_checked(target_gguf: Path) -> None:
    """The native engine refuses past its hard caps on its own (limits match the Python constants), and
    parses on a big stack: 10,000 nested groups pass the depth check of a raised limit only to meet the cap."""
    import llama_cpp

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(target_gguf).encode(), params)
    try:
        vocab = llama_cpp.llama_model_get_vocab(model)
        grammar_limits.check_parses(vocab, nested(grammar_limits.NATIVE_MAX_DEPTH))
        with pytest.raises(ValueError, match=f"more than the engine's limit of {grammar_limits.NATIVE_MAX_DEPTH}"):
            grammar_limits.check_parses(vocab, nested(grammar_limits.NATIVE_MAX_DEPTH + 1))
        with pytest.raises(ValueError, match=f"engine's limit of {grammar_limits.NATIVE_MAX_RULES}"):
            grammar_limits.check_parses(vocab, rule_chain(grammar_limits.NATIVE_MAX_RULES))
        # under the caps, a chain deeper than the 8 MiB stack took (65,400 rules) parses on the engine's stack
        grammar_limits.check_parses(vocab, rule_chain(90_000))
    finally:
        llama_cpp.llama_model_free(model)
