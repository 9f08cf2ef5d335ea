"""The OpenAI-compatible server, as a real subprocess on 127.0.0.1 with the
official `openai` client and raw HTTP: answers equal `pydflash2 generate`,
concurrent answers equal sequential ones, streaming, disconnects, queue
overflow, every bad-input case, and /metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import llama_cpp
import openai
import pydflash2_testing as testing
import pytest
from prometheus_client.parser import text_string_to_metric_families
from server_process import ServerProcess, check_same_greedy

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
API_KEY = "sk-test-key"
MODEL_ID = "target"
N_CTX = 512
N_MAX = 3
PROMPTS = [
    "Once upon a time", "The answer is", "def main():", "Hello", "A small drafter", "Water boils at",
    "The capital of France", "It learned to guess",
]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("server")


@pytest.fixture(scope="module")
def models(workdir: Path) -> dict[str, Path]:
    # hot tokens make the random drafter right now and then, so acceptance counters move
    target = testing.make_target_gguf(workdir / "target.gguf", testing.TargetSpec(hot_tokens=HOT))
    ckpt = testing.make_drafter_checkpoint(workdir / "v2-hf", target, testing.DrafterSpec(version=2))
    return {"target": target, "draft": testing.checkpoint_to_gguf(ckpt, target, workdir / "v2.gguf")}


@pytest.fixture(scope="module")
def server(models: dict[str, Path], workdir: Path):
    s = ServerProcess(["--model", str(models["target"]), "--draft", str(models["draft"]), "--parallel", "4",
                       "--n-ctx", str(N_CTX), "--n-max", str(N_MAX), "--api-key", API_KEY, "--max-queue", "32",
                       "--max-body", "65536"], workdir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def one_slot(models: dict[str, Path], workdir: Path):
    """One slot, one waiting place: for queue overflow and disconnects. No context drafts: they write the
    tiny target's repetitive answers dozens of tokens a step, and these tests need answers that take time."""
    s = ServerProcess(["--model", str(models["target"]), "--draft", str(models["draft"]), "--parallel", "1",
                       "--n-ctx", "2048", "--n-max", str(N_MAX), "--max-queue", "1", "--context-drafts", "off"],
                      workdir)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def llm(models: dict[str, Path]) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(models["target"]), n_ctx=N_CTX, n_batch=512, verbose=False)


def raw_tokens(llm: llama_cpp.Llama, prompt: str) -> list[int]:
    return llm.tokenize(prompt.encode(), add_bos=True, special=True)


def generate_cli(models: dict[str, Path], workdir: Path, prompt: str, *extra: str) -> dict:
    """`pydflash2 generate --json` with the server's drafter settings."""
    out = subprocess.run(
        [sys.executable, "-m", "pydflash2", "generate", prompt, "--json", "--model", str(models["target"]),
         "--draft", str(models["draft"]), "--n-max", str(N_MAX), "--n-ctx", str(N_CTX), *extra],
        cwd=workdir, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def metrics(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, tuple], float]:
    """Every sample of /metrics, parsed by prometheus_client: {(name, labels): value}."""
    r = httpx.get(url + "/metrics", headers=headers or {}, timeout=60)
    assert r.status_code == 200
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


AUTH = {"Authorization": f"Bearer {API_KEY}"}

# ---------------------------------------------------------------- answers


def test_models_and_health(server: ServerProcess, client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_ID]
    h = httpx.get(server.url + "/health", timeout=60).json()  # no key needed
    assert h["status"] == "ok" and h["slots"] == 4


def test_completion_equals_generate(client: openai.OpenAI, models, workdir, llm) -> None:
    prompt = "Once upon a time"
    ref = generate_cli(models, workdir, prompt, "--raw", "--max-tokens", "16")
    r = client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"return_token_ids": True})
    got = r.choices[0].model_extra["token_ids"]
    if not check_same_greedy(got, ref["tokens"], raw_tokens(llm, prompt), llm, prompt):
        assert r.choices[0].text == ref["text"]
    assert r.object == "text_completion"
    assert r.usage.prompt_tokens == len(raw_tokens(llm, prompt))
    assert r.usage.completion_tokens == len(got)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.choices[0].finish_reason == ("length" if len(got) == 16 else "stop")


def test_flash_attn_server_equals_generate(models, workdir, llm) -> None:
    # --flash-attn on reaches the target in both: the answers agree (near-tie rule on stock builds)
    s = ServerProcess(["--model", str(models["target"]), "--draft", str(models["draft"]), "--parallel", "2",
                       "--n-ctx", str(N_CTX), "--n-max", str(N_MAX), "--flash-attn", "on"], workdir)
    try:
        prompt = "Water boils at"
        ref = generate_cli(models, workdir, prompt, "--raw", "--max-tokens", "16", "--flash-attn", "on")
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL_ID, "prompt": prompt, "max_tokens": 16,
                                                        "temperature": 0, "return_token_ids": True}, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["token_ids"]
        check_same_greedy(got, ref["tokens"], raw_tokens(llm, prompt), llm, prompt)
    finally:
        s.stop()


@pytest.mark.parametrize("budget", ["6", "auto"])
def test_tree_budget_server_equals_generate(models, workdir, llm, budget) -> None:
    # --tree-budget reaches the engine (each slot verifies a tree, or with auto the chain or a tree
    # per step) and the answers agree with generate's run (near-tie rule: a unified cache, and stock builds)
    s = ServerProcess(["--model", str(models["target"]), "--draft", str(models["draft"]), "--parallel", "2",
                       "--n-ctx", str(N_CTX), "--n-max", str(N_MAX), "--tree-budget", budget], workdir)
    try:
        prompt = "Water boils at"
        ref = generate_cli(models, workdir, prompt, "--raw", "--max-tokens", "16", "--tree-budget", budget)
        assert ref["stats"]["tree_budget"] == (6 if budget == "6" else "auto")
        r = httpx.post(s.url + "/v1/completions", json={"model": MODEL_ID, "prompt": prompt, "max_tokens": 16,
                                                        "temperature": 0, "return_token_ids": True}, timeout=120)
        assert r.status_code == 200, r.text
        got = r.json()["choices"][0]["token_ids"]
        check_same_greedy(got, ref["tokens"], raw_tokens(llm, prompt), llm, prompt)
        m = metrics(s.url)
        if budget == "6":
            # tree nodes were verified, every step (a fixed budget): the drafter's, and the context's with
            # them (the server's default), by source (a node both proposed counts for both)
            drafted = m[("pydflash2:spec_decode_num_draft_tokens_total", ())]
            by_source = {src: m.get(("pydflash2:spec_decode_num_draft_tokens_by_source_total", (("source", src),)), 0)
                         for src in ("lattice", "context")}
            assert by_source["lattice"] > 0 and sum(by_source.values()) >= drafted > 0, by_source
    finally:
        s.stop()


def test_chat_equals_generate(client: openai.OpenAI, models, workdir, llm) -> None:
    prompt = "The capital of France"
    ref = generate_cli(models, workdir, prompt, "--max-tokens", "12")
    r = client.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=12, temperature=0, extra_body={"return_token_ids": True})
    got = r.choices[0].model_extra["token_ids"]
    chat_prompt = llm.tokenize(f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n".encode(),
                               add_bos=True, special=True)
    if not check_same_greedy(got, ref["tokens"], chat_prompt, llm, prompt):
        assert r.choices[0].message.content == ref["text"]
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(chat_prompt)
    assert r.usage.completion_tokens == len(got)


def test_streaming_equals_non_streaming(client: openai.OpenAI, server: ServerProcess) -> None:
    kw = dict(model=MODEL_ID, max_tokens=8, temperature=0)
    whole = client.completions.create(prompt="Hello", **kw)
    chunks = list(client.completions.create(prompt="Hello", stream=True, stream_options={"include_usage": True},
                                            **kw))
    assert "".join(c.choices[0].text for c in chunks[:-1]) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens

    msgs = [{"role": "user", "content": "Hello"}]
    whole = client.chat.completions.create(messages=msgs, **kw)
    chunks = list(client.chat.completions.create(messages=msgs, stream=True, stream_options={"include_usage": True},
                                                 **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens

    # on the wire: server-sent events ending with [DONE]
    with httpx.stream("POST", server.url + "/v1/completions", headers=AUTH, timeout=60,
                      json={"model": MODEL_ID, "prompt": "Hello", "max_tokens": 4, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line for line in r.iter_lines() if line.startswith("data:")]
    assert data[-1] == "data: [DONE]"


def test_concurrent_clients_equal_their_sequential_answers(client: openai.OpenAI, llm) -> None:
    # different lengths: requests finish at different steps and the waiting ones join mid-batch
    lengths = [3 + 2 * i for i in range(len(PROMPTS))]

    def ask(i: int) -> list[int]:
        r = client.completions.create(model=MODEL_ID, prompt=PROMPTS[i], max_tokens=lengths[i], temperature=0,
                                      extra_body={"return_token_ids": True})
        return r.choices[0].model_extra["token_ids"]

    sequential = [ask(i) for i in range(len(PROMPTS))]
    with ThreadPoolExecutor(8) as pool:
        concurrent = list(pool.map(ask, range(len(PROMPTS))))
    for i, prompt in enumerate(PROMPTS):
        check_same_greedy(concurrent[i], sequential[i], raw_tokens(llm, prompt), llm, prompt)


def test_sampling_fields(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL_ID, prompt="The answer is", max_tokens=8, temperature=0.8, top_p=0.9, seed=7,
              extra_body={"top_k": 40, "min_p": 0.05})
    a = client.completions.create(**kw)
    b = client.completions.create(**kw)
    assert a.choices[0].text == b.choices[0].text  # same seed, same answer
    hot = dict(model=MODEL_ID, prompt="The answer is", max_tokens=8, temperature=3.0, top_p=1.0,
               extra_body={"top_k": 0, "min_p": 0.0})  # the whole distribution, not llama-server's default cut
    texts = {client.completions.create(**hot, seed=s).choices[0].text for s in range(4)}
    assert len(texts) > 1  # the seed matters


def test_stop_strings(client: openai.OpenAI) -> None:
    kw = dict(model=MODEL_ID, prompt="Water boils at", max_tokens=16, temperature=0)
    full = client.completions.create(**kw).choices[0].text
    assert len(full) > 12
    stop = full[6:9]
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].text == full[: full.index(stop)]
    assert r.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------- load, disconnects


def test_queue_overflow_gives_503_and_the_server_recovers(one_slot: ServerProcess) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}

    def post(_: int) -> httpx.Response:
        return httpx.post(one_slot.url + "/v1/completions", json=body, timeout=300)

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(post, range(10)))
    codes = sorted(r.status_code for r in answers)
    assert set(codes) == {200, 503}, codes
    busy = [r for r in answers if r.status_code == 503]
    assert all(r.headers["retry-after"].isdigit() and r.json()["error"]["code"] == "queue_full" for r in busy)
    assert post(0).status_code == 200


# The hot-token target practically never emits EOS (its embedding is shrunk), so
# a long answer runs until max_tokens or until the client leaves.
LONG = 1000


def test_disconnect_mid_stream_frees_the_slot(one_slot: ServerProcess) -> None:
    before = metrics(one_slot.url)
    with httpx.stream("POST", one_slot.url + "/v1/completions", timeout=60,
                      json={"prompt": "Once upon a time", "max_tokens": LONG, "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                break  # first token arrived: hang up
    # the slot is freed before the next step; the bound is loose only because a
    # step can take seconds on a loaded CI machine (the token count below is the tight check)
    t0 = time.monotonic()
    while httpx.get(one_slot.url + "/health", timeout=60).json()["busy"] != 0:
        assert time.monotonic() - t0 < 60, "the slot stayed busy after the client left"
        time.sleep(0.02)
    after = metrics(one_slot.url)
    key = ("pydflash2:requests_total", (("status", "aborted"),))
    assert after[key] == before[key] + 1
    gen = ("pydflash2:generation_tokens_total", ())
    assert after[gen] - before[gen] < LONG  # it was stopped, not run to the end
    r = httpx.post(one_slot.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200


def test_non_streaming_disconnect_frees_the_slot(one_slot: ServerProcess) -> None:
    before = metrics(one_slot.url)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(one_slot.url + "/v1/completions", json={"prompt": "Hello", "max_tokens": LONG, "temperature": 0},
                   timeout=0.5)
    t0 = time.monotonic()
    while metrics(one_slot.url)[("pydflash2:requests_total", (("status", "aborted"),))] != \
            before[("pydflash2:requests_total", (("status", "aborted"),))] + 1:
        assert time.monotonic() - t0 < 60, "a vanished non-streaming client kept its slot"
        time.sleep(0.05)


# ---------------------------------------------------------------- bad input

BAD = [
    # (what, path, headers, body bytes or JSON object, status, text expected in the message)
    ("invalid JSON", "/v1/completions", {}, b"{not json", 400, "invalid JSON"),
    ("JSON not an object", "/v1/completions", {}, [1, 2], 400, "object"),
    ("missing prompt", "/v1/completions", {}, {"model": MODEL_ID}, 400, "prompt"),
    ("missing messages", "/v1/chat/completions", {}, {"model": MODEL_ID}, 400, "messages"),
    ("empty messages", "/v1/chat/completions", {}, {"messages": []}, 400, "messages"),
    ("bad role", "/v1/chat/completions", {}, {"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    ("negative max_tokens", "/v1/completions", {}, {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("zero max_tokens", "/v1/completions", {}, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("absurd max_tokens", "/v1/completions", {}, {"prompt": "x", "max_tokens": 10**12}, 400, "max_tokens"),
    ("max_tokens not a number", "/v1/completions", {}, {"prompt": "x", "max_tokens": "many"}, 400, "max_tokens"),
    ("negative temperature", "/v1/completions", {}, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    ("top_p zero", "/v1/completions", {}, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    ("top_p above one", "/v1/chat/completions", {}, {"messages": [{"role": "user", "content": "x"}], "top_p": 1.5},
     400, "top_p"),
    ("n > 1", "/v1/completions", {}, {"prompt": "x", "n": 2}, 400, "n"),
    ("token id outside the vocabulary", "/v1/completions", {}, {"prompt": [1, 10**6]}, 400, "vocabulary"),
    ("prompt longer than the context", "/v1/completions", {}, {"prompt": "Hello world " * 600}, 400, str(N_CTX)),
    ("wrong content type", "/v1/completions", {"Content-Type": "text/plain"}, b'{"prompt": "x"}', 415,
     "application/json"),
    ("oversized body", "/v1/completions", {}, {"prompt": "x" * 70000}, 413, "limit"),
    ("unknown route", "/v1/nothing", {}, {}, 404, "/v1/nothing"),
]


@pytest.mark.parametrize("what, path, headers, body, status, needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_an_openai_error(server: ServerProcess, what, path, headers, body, status, needle) -> None:
    h = {**AUTH, "Content-Type": "application/json", **headers}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + path, content=content, headers=h, timeout=30)
    assert r.status_code == status, (what, r.text)
    err = r.json()["error"]
    assert needle in err["message"] and err["type"], (what, err)


def test_prompt_too_long_names_both_numbers(server: ServerProcess, llm) -> None:
    prompt = "Hello world " * 600
    r = httpx.post(server.url + "/v1/completions", headers=AUTH, json={"prompt": prompt}, timeout=30)
    msg = r.json()["error"]["message"]
    assert str(len(raw_tokens(llm, prompt))) in msg and str(N_CTX) in msg


def test_api_key_is_required(server: ServerProcess) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers=headers, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()


def test_server_keeps_serving_after_bad_input(client: openai.OpenAI, server: ServerProcess) -> None:
    for _ in range(3):
        httpx.post(server.url + "/v1/completions", content=b"\xff\xfe garbage", headers=AUTH, timeout=60)
    assert client.completions.create(model=MODEL_ID, prompt="Hello", max_tokens=4).choices[0].text is not None


# ---------------------------------------------------------------- metrics


def test_metrics_parse_and_move(one_slot: ServerProcess, llm) -> None:
    """On the server without context drafts, where --n-max 3 drafts every step: with them, the cost
    model may verify the context's candidates alone, or none (a plain step), as the measured costs say."""
    server = one_slot
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=300)
    before = metrics(server.url, {})
    client.completions.create(model=MODEL_ID, prompt="quick brown fox", max_tokens=32, temperature=0)
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "top_p": 7}, timeout=60)
    after = metrics(server.url, {})

    def moved(name: str, labels: tuple = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    p = "pydflash2:"
    assert moved(p + "spec_decode_num_drafts_total") > 0
    assert moved(p + "spec_decode_num_draft_tokens_total") >= moved(p + "spec_decode_num_drafts_total")
    assert moved(p + "spec_decode_num_draft_tokens_total") >= moved(p + "spec_decode_num_accepted_tokens_total")
    # (context drafts may go deeper than the block: every position the server exports)
    by_pos = {int(dict(labels)["position"]): v for (name, labels), v in after.items()
              if name == p + "spec_decode_num_accepted_tokens_per_pos_total"}
    per_pos = [by_pos[i] for i in sorted(by_pos)]
    assert len(per_pos) >= N_MAX
    assert sum(per_pos) == after[(p + "spec_decode_num_accepted_tokens_total", ())]
    assert per_pos == sorted(per_pos, reverse=True)  # position i+1 is accepted only after position i
    assert moved(p + "prompt_tokens_total") == len(raw_tokens(llm, "quick brown fox"))
    assert moved(p + "generation_tokens_total") > 0
    assert moved(p + "requests_total", (("status", "success"),)) == 1
    assert moved(p + "requests_total", (("status", "invalid"),)) == 1
    assert moved(p + "time_to_first_token_seconds_count") == 1
    assert moved(p + "time_per_output_token_seconds_count") == 1
    assert moved(p + "spec_decode_draft_seconds_total") > 0
    assert moved(p + "spec_decode_verify_seconds_total") > 0
    # per-phase breakdown of the engine's steps
    phases = ("inject", "propose", "select", "graph_setup", "verify_decode", "prefill_decode", "verify_logic")
    moves = {ph: moved(p + f"spec_decode_{ph}_seconds_total") for ph in phases}
    assert all(v >= 0 for v in moves.values()), moves
    # the drafter proposed (no context drafts here, so no step skipped its propose)
    assert moved(p + "spec_decode_propose_skipped_total") == 0
    assert moves["propose"] > 0 and moves["verify_decode"] > 0 and moves["prefill_decode"] > 0
    step_s = moved(p + "spec_decode_step_seconds_total")
    assert sum(moves.values()) <= step_s + 1e-6
    assert moved(p + "spec_decode_verify_seconds_total") == pytest.approx(
        moves["verify_decode"] + moves["prefill_decode"], rel=1e-6, abs=1e-9)
    assert moved(p + "spec_decode_num_steps_total") > 0
    # the lazy LM head ran for the rows each lazy verify reached: at most one per committed token of a drafted
    # block; fewer where the engine chose the full head from the measured costs for small verifies, none where
    # for all (test_lazy_head_runs_the_head_once_per_committed_token holds the exact count, the head set lazy)
    assert 0 <= moved(p + "spec_decode_num_lazy_head_rows_total") <= (
        moved(p + "spec_decode_num_accepted_tokens_total") + moved(p + "spec_decode_num_drafts_total"))
    assert moved(p + "spec_decode_python_seconds_total") > 0
    assert after[(p + "num_requests_running", ())] == 0
    assert after[(p + "num_requests_waiting", ())] == 0
    assert after[(p + "num_slots", ())] == 1


def test_metrics_serve_vllms_spec_decode_names(client: openai.OpenAI, server: ServerProcess) -> None:
    """vLLM's dashboards read vllm:spec_decode_* with labels model_name and engine: served beside ours,
    counting the same."""
    client.completions.create(model=MODEL_ID, prompt="The answer is", max_tokens=16, temperature=0)
    m = metrics(server.url, AUTH)
    vllm_labels = (("engine", "0"), ("model_name", MODEL_ID))
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        ours = m[(f"pydflash2:spec_decode_{name}_total", ())]
        assert m[(f"vllm:spec_decode_{name}_total", vllm_labels)] == ours, name
    assert m[("vllm:spec_decode_num_drafts_total", vllm_labels)] > 0
    for i in range(N_MAX):
        ours = m[("pydflash2:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
        labels = tuple(sorted((*vllm_labels, ("position", str(i)))))
        assert m[("vllm:spec_decode_num_accepted_tokens_per_pos_total", labels)] == ours, i
    assert {name for name, _ in m if name.startswith("vllm:")} == {
        f"vllm:spec_decode_{n}_{suffix}" for n in ("num_drafts", "num_draft_tokens", "num_accepted_tokens",
                                                    "num_accepted_tokens_per_pos")
        for suffix in ("total", "created")}


def test_prefix_cache_reuses_a_slots_prompt(client: openai.OpenAI, server: ServerProcess, llm) -> None:
    # every slot is idle: both requests go to slot 0, and the second prefills only its last prompt token
    prompt = "A small drafter learned to guess"
    kw = dict(model=MODEL_ID, prompt=prompt, max_tokens=6, temperature=0, extra_body={"return_token_ids": True})
    first = client.completions.create(**kw)
    before = metrics(server.url, AUTH)
    second = client.completions.create(**kw)
    after = metrics(server.url, AUTH)
    n = len(raw_tokens(llm, prompt))
    hits = after[("pydflash2:prefix_cache_hits_total", ())] - before[("pydflash2:prefix_cache_hits_total", ())]
    queries = after[("pydflash2:prefix_cache_queries_total", ())] - before[("pydflash2:prefix_cache_queries_total", ())]
    assert (hits, queries) == (n - 1, n)
    # the reused K/V gives the answer a fresh prefill gave
    check_same_greedy(second.choices[0].model_extra["token_ids"], first.choices[0].model_extra["token_ids"],
                      raw_tokens(llm, prompt), llm, prompt)


def test_a_request_goes_to_the_slot_holding_its_prompt(client: openai.OpenAI, server: ServerProcess, llm) -> None:
    # a long answer keeps slot A busy while a second prompt takes another slot; once both are idle, the
    # second prompt comes back and must go to the slot that holds it (the lowest free slot holds the first)
    first, second = "Forty-two small robots marched", "A quiet lake at dawn"
    with client.completions.create(model=MODEL_ID, prompt=first, max_tokens=300, temperature=0,
                                   stream=True) as stream:
        next(iter(stream))  # the first prompt holds a slot now
        client.completions.create(model=MODEL_ID, prompt=second, max_tokens=6, temperature=0)
        for _ in stream:
            pass
    before = metrics(server.url, AUTH)
    client.completions.create(model=MODEL_ID, prompt=second, max_tokens=6, temperature=0)
    after = metrics(server.url, AUTH)
    hits = after[("pydflash2:prefix_cache_hits_total", ())] - before[("pydflash2:prefix_cache_hits_total", ())]
    assert hits == len(raw_tokens(llm, second)) - 1


def test_busy_slots_gauge_during_load(client: openai.OpenAI, server: ServerProcess) -> None:
    # Four concurrent streams of 450 tokens (about 0.6 s each here on an idle machine, slower under load):
    # they share the slots, so the gauge must show several busy at once. Short requests (16 tokens, 40 ms)
    # could finish before the next one arrived, which made this test flaky.
    seen: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(metrics(server.url, AUTH)[("pydflash2:num_requests_running", ())])
            time.sleep(0.01)

    def stream(prompt: str) -> int:
        n = 0
        for chunk in client.completions.create(model=MODEL_ID, prompt=prompt, max_tokens=450, temperature=0,
                                               stream=True):
            n += bool(chunk.choices and chunk.choices[0].text)
        return n

    t = threading.Thread(target=watch)
    t.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            pieces = list(pool.map(stream, PROMPTS[:4]))
    finally:
        stop.set()
        t.join()
    assert all(n > 0 for n in pieces)
    assert max(seen) >= 2, seen
    assert seen[-1] == 0 or metrics(server.url, AUTH)[("pydflash2:num_requests_running", ())] == 0


def test_probes_follow_one_schedule_per_engine(models: dict[str, Path]) -> None:
    """While drafting does not pay, a slot drafts a probe block now and then so that the
    acceptance estimate can recover. The schedule belongs to the engine and counts steps:
    many short requests must not each probe (with a schedule per request, every request
    of more than 16 tokens probed, at the cost of a decode and a drafter pass each)."""
    from pydflash2.server.engine import BatchEngine

    engine = BatchEngine(models["target"], models["draft"], n_slots=2, n_ctx=256, n_max="auto")
    try:
        engine.set_costs([0.01] + [1.0] * engine.max_draft, [1.0] * engine.max_draft)  # drafting never pays
        prompt = engine.llm.tokenize(b"Once upon a time", add_bos=True)
        before = engine.stats()
        for _ in range(12):  # requests of 24 steps, two at a time
            engine.start(0, prompt)
            engine.start(1, prompt)
            for _ in range(24):
                engine.step()
            engine.stop(0)
            engine.stop(1)
        st = engine.stats()
        n_probes = st["n_drafts"] - before["n_drafts"]
        # one schedule over about 12 x 23 steps: probes after 16, 32, 64 and 128 plain steps
        assert 1 <= n_probes <= 4, n_probes
    finally:
        engine.close()


def test_startup_cost_measurement_leaves_no_thread_pool(smollm2_pair: tuple[Path, Path], tmp_path: Path) -> None:
    """ggml's CPU backend runs on OpenMP, and libgomp keeps a pool for each thread that ran a
    parallel region. The costs measured at startup (n_max auto, nothing cached) must not leave a
    pool on the constructing thread beside the scheduler's: libgomp then counts more threads than
    cores and stops spinning at barriers, and every later decode is slower (1.8x measured). SmolLM2:
    the fixture target is too small for ggml to use a second thread."""
    script = (
        "import os, sys, time\n"
        "from pydflash2.server.engine import BatchEngine\n"
        "def threads(): return len(os.listdir(f'/proc/{os.getpid()}/task'))\n"
        "before = threads()\n"
        "e = BatchEngine(sys.argv[1], sys.argv[2], n_slots=1, n_ctx=256, n_max='auto', n_threads=2)\n"
        "time.sleep(1.0)  # a finished thread's OS exit (libgomp frees its pool there) may lag its join\n"
        "print(before, threads(), e.costs is not None)\n"
    )
    env = {**os.environ, "PYDFLASH2_CACHE_DIR": str(tmp_path / "costs")}  # empty: the engine measures
    out = subprocess.run([sys.executable, "-c", script, *map(str, smollm2_pair)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    before, after, measured = out.stdout.split()
    assert measured == "True"
    assert int(after) == int(before), "a thread pool outlived the cost measurement"


@pytest.mark.parametrize("n_max", [N_MAX, 0], ids=["drafting", "plain"])
def test_slots_between_decoding_slots_get_filler_rows(models: dict[str, Path], llm, n_max: int) -> None:
    """llama.cpp splits a batch whose sequences are not consecutive into several ubatches (a
    pass over the weights each). A slot between two decoding slots (idle, or prefilling) gets
    filler rows instead, cut off right after the decode: the answers stay those of each request
    alone, and the slot's own K/V is intact (its prompt reuse and its prefill go on). Plain
    steps' fillers (one row) skip the LM head; drafting steps' fillers output like the rest."""
    from pydflash2.server.engine import BatchEngine

    def run(engine: BatchEngine, jobs: dict[int, tuple[list[int], int]], n: int) -> dict[int, list[int]]:
        """jobs: slot -> (prompt, the step it starts at); the first n tokens of each answer"""
        out: dict[int, list[int]] = {slot: [] for slot in jobs}
        step = 0
        while any(len(v) < n for v in out.values()):
            for slot, (prompt, at) in jobs.items():
                if at == step:
                    engine.start(slot, prompt)
            for slot, toks in enumerate(engine.step()):
                if slot in out and toks:
                    out[slot].extend(toks)
            step += 1
        for slot in jobs:
            engine.stop(slot)
        return {slot: v[:n] for slot, v in out.items()}

    prompts = [raw_tokens(llm, p) for p in PROMPTS[:3]]
    alone = BatchEngine(models["target"], models["draft"], n_slots=1, n_ctx=256, n_max=n_max)
    engine = BatchEngine(models["target"], models["draft"], n_slots=3, n_ctx=256, n_max=n_max)
    try:
        want = [run(alone, {0: (p, 0)}, 24)[0] for p in prompts]
        assert run(engine, {1: (prompts[1], 0)}, 24)[1] == want[1]  # slot 1 then idles, holding its K/V
        # slot 1 idle between two decoding slots, then (a new request) prefilling between them
        extended = prompts[1] + want[1][:5]
        got = run(engine, {0: (prompts[0], 0), 2: (prompts[2], 0), 1: (extended, 3)}, 24)
        assert engine.stats()["n_filler_rows"] > 0
        for i in (0, 2):
            check_same_greedy(got[i], want[i], prompts[i], llm, PROMPTS[i])
        # slot 1 reused its earlier K/V (fillers at its end were cut off before it prefilled the rest)
        check_same_greedy(got[1][:19], want[1][5:24], extended, llm, "slot 1, prefilled between two decoding slots")
        # and it reuses its prompt's K/V once more
        reused = engine.stats()["n_prompt_reused"]
        assert run(engine, {1: (prompts[1], 0)}, 24)[1] == want[1]
        assert engine.stats()["n_prompt_reused"] - reused == len(prompts[1]) - 1
    finally:
        engine.close()
        alone.close()
