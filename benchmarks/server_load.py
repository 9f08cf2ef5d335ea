"""Load benchmark of the OpenAI-compatible server, and a soak test.

Load (default): the same N requests (mixed prompt and answer lengths, T=0)
from C concurrent clients against our server with --parallel 1 and
--parallel 4 and against llama-cpp-python's own server on the same target,
one after the other in one run. Prints throughput (completion tokens/s and
requests/s), p50/p95 latency, server RSS before/after, completion tokens per
server CPU-second (what a server would reach on a core of its own: less
sensitive than wall time to what else a shared machine runs), the ratios to
llama-cpp-python's server, and where our engine's seconds went.

Soak (--soak): our server under C clients x M requests each, a share of them
malformed, while chaos clients open streams and disconnect mid-stream at
random and slow clients read their streams slowly. Every good request must get
200 with a text, every bad one a 4xx; no 5xx, no dropped connection; every
greedy answer must equal the answer the same request got alone before the
soak (sequentially); every slow stream must end with [DONE]; afterwards no
slot may be busy; RSS growth from the first answer to the last must stay
under 5 %.

    python benchmarks/server_load.py                      # SmolLM2 + its shipped drafter
    python benchmarks/server_load.py --requests 40 --clients 8 --soak --soak-requests 50
    python benchmarks/server_load.py --soak-only --clients 8 --soak-requests 1000 --chaos-clients 2 --slow-clients 2
    python benchmarks/server_load.py --measure-delta       # logit drift of batching (tests' near-tie delta)
    python benchmarks/server_load.py --decode-costs        # CPU cost of 1..32-row target decodes

llama-cpp-python's server needs its extra: pip install "llama-cpp-python[server]==0.3.36".
Run it from outside the source checkout (the installed package is imported).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain why the sky is blue in two sentences.",
    "List five fruits.",
    "What is the capital of France?",
    "Tell me a story about a little robot who wanted to fly.",
    "How do I boil an egg?",
    "Summarise the plot of Romeo and Juliet.",
    "Give me three tips for learning to code.",
    "What is 12 times 7?",
    "Describe a cat to someone who has never seen one.",
]
MAX_TOKENS = [16, 32, 64, 128]  # --max-tokens overrides

# malformed requests for the soak: (body bytes, content type)
BAD_REQUESTS = [
    (b"{not json", "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_p": 0}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": -1}).encode(), "application/json"),
    # (an unknown model name is no longer one: the server answers any name, as llama-server does)
    (json.dumps({"messages": [{"role": "user", "content": 5}]}).encode(), "application/json"),
    (json.dumps({"max_tokens": 5}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode(), "text/plain"),
    (json.dumps({"messages": [{"role": "user", "content": "x" * 2_000_000}]}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**9}).encode(), "application/json"),
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "application/json"),
    (b"[" * 1000 + b"]" * 1000, "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "top_k": 2**40}).encode(), "application/json"),
    (json.dumps({"messages": [{"role": "user", "content": "hi"}], "temperature": 1e300}).encode(),
     "application/json"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (robust to a shared machine's descheduling)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_parts_mb(pid: int) -> dict[str, float]:
    """Resident memory by kind (/proc/PID/smaps): the malloc heap, other anonymous memory (thread
    arenas, ggml buffers, KV cache), and mapped files (the GGUF weights: page cache, reclaimable)."""
    parts = {"heap": 0.0, "anon": 0.0, "files": 0.0}
    kind = "anon"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
            name = head[5] if len(head) > 5 else ""
            kind = "heap" if name == "[heap]" else "files" if name.startswith("/") else "anon"
        elif line.startswith("Rss:"):
            parts[kind] += int(head[1]) / 1024
    return parts


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


_STARTED: list[Server] = []  # stopped on SIGTERM (in-flight client threads would delay `finally`)


def _stop_all_and_exit(*_: object) -> None:
    for s in _STARTED:
        s.proc.kill()
    os._exit(143)


class Server:
    def __init__(self, name: str, cmd: list[str], port: int, ready_path: str, log_dir: Path) -> None:
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(log_dir / f"{name.replace(' ', '_')}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=log_dir)
        _STARTED.append(self)
        deadline = time.monotonic() + 1800  # n_max auto measures costs on first start
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({self.proc.returncode}); see {self.log.name}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not come up")
            time.sleep(0.2)

    def rss(self) -> float:
        return rss_mb(self.proc.pid)

    def cpu(self) -> float:
        return cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@dataclass
class LoadResult:
    name: str
    wall_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    errors: int = 0
    texts: list[str] = field(default_factory=list)
    rss_before: float = 0.0
    rss_after: float = 0.0
    cpu_s: float = 0.0  # the server's CPU seconds while serving
    phases: dict[str, float] = field(default_factory=dict)  # our engine's per-phase counters (warm-up included)

    @property
    def tok_cpu_s(self) -> float:
        """Completion tokens per server CPU-second: the rate on a core of its own, whatever else the machine ran."""
        return self.completion_tokens / self.cpu_s

    @property
    def tok_s(self) -> float:
        return self.completion_tokens / self.wall_s

    @property
    def req_s(self) -> float:
        return len(self.latencies) / self.wall_s

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def engine_phases(server: Server) -> dict[str, float]:
    """Our server's per-phase counters (pydflash2:spec_decode_*) from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=30).text):
        for smp in fam.samples:
            if smp.name.startswith("pydflash2:spec_decode_") and smp.name.endswith("_total") and not smp.labels:
                out[smp.name.removeprefix("pydflash2:spec_decode_").removesuffix("_total")] = smp.value
            elif smp.name in ("pydflash2:prompt_tokens_total", "pydflash2:prefix_cache_hits_total"):
                out[smp.name.removeprefix("pydflash2:").removesuffix("_total")] = smp.value
    return out


def workload(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    # repeat_penalty 1: llama-cpp-python's server would apply 1.1 by default (not greedy; ours ignores the field)
    return [{"messages": [{"role": "user", "content": rng.choice(PROMPTS)}], "max_tokens": rng.choice(MAX_TOKENS),
             "temperature": 0, "repeat_penalty": 1.0} for _ in range(n)]


def warm_up(server: Server, model: str, body: dict) -> None:
    with httpx.Client(timeout=600) as c:  # not timed
        c.post(server.url + "/v1/chat/completions", json={**body, "model": model, "max_tokens": 8})


def run_load(server: Server, model: str, bodies: list[dict], clients: int, res: LoadResult) -> None:
    """One round: `bodies` from `clients` concurrent clients; adds to res."""

    # one connection per client, kept alive as the openai SDK keeps its httpx client: a new
    # httpx.Client per request costs ~28 ms of CPU (an SSL context), which on this 2-core
    # machine is taken from the server under test
    local = threading.local()
    opened: list[httpx.Client] = []

    def one(body: dict) -> tuple[float, int, str | None]:
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = httpx.Client(timeout=600)
            opened.append(c)
        t0 = time.perf_counter()
        r = c.post(server.url + "/v1/chat/completions", json={**body, "model": model})
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            return dt, 0, None
        out = r.json()
        return dt, int(out["usage"]["completion_tokens"]), out["choices"][0]["message"]["content"]

    t0, cpu0 = time.perf_counter(), server.cpu()
    with ThreadPoolExecutor(clients) as pool:
        for dt, n, text in pool.map(one, bodies):
            res.latencies.append(dt)
            res.completion_tokens += n
            res.errors += 0 if text is not None else 1
            res.texts.append(text or "")
    res.wall_s += time.perf_counter() - t0
    for c in opened:
        c.close()
    res.cpu_s += server.cpu() - cpu0


def _soak_body(model: str, rng: random.Random) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
            "max_tokens": rng.choice([8, 16, 32]), "temperature": rng.choice([0, 0.7]), "seed": rng.randrange(1 << 30)}


def _greedy_key(body: dict) -> tuple[str, int] | None:
    return (body["messages"][0]["content"], body["max_tokens"]) if body["temperature"] == 0 else None


def run_soak(server: Server, model: str, clients: int, per_client: int, bad_share: float, chaos_clients: int = 0,
             slow_clients: int = 0) -> dict:
    counts = {"good_ok": 0, "good_empty": 0, "good_fail": 0, "bad_4xx": 0, "bad_other": 0, "5xx": 0, "dropped": 0,
              "greedy_checked": 0, "greedy_differ": 0, "chaos_disconnects": 0, "chaos_errors": 0,
              "slow_done": 0, "slow_fail": 0}
    rss: list[float] = []
    differ: list[dict] = []
    lock = threading.Lock()
    # the sequential answer of every greedy request the soak can send, each alone on an idle server
    sequential: dict[tuple[str, int], str] = {}
    with httpx.Client(timeout=600) as c:
        for prompt in PROMPTS:
            for n in (8, 16, 32):
                r = c.post(server.url + "/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
                    "temperature": 0})
                r.raise_for_status()
                sequential[(prompt, n)] = r.json()["choices"][0]["message"]["content"]
    running = threading.Event()
    running.set()

    def client(k: int) -> None:
        rng = random.Random(1000 + k)
        with httpx.Client(timeout=600) as c:
            for _ in range(per_client):
                bad = rng.random() < bad_share
                body = None
                try:
                    if bad:
                        raw, ctype = rng.choice(BAD_REQUESTS)
                        r = c.post(server.url + "/v1/chat/completions", content=raw,
                                   headers={"Content-Type": ctype})
                    else:
                        body = _soak_body(model, rng)
                        r = c.post(server.url + "/v1/chat/completions", json=body)
                except httpx.HTTPError:
                    with lock:
                        counts["dropped"] += 1
                    continue
                with lock:
                    if r.status_code >= 500:
                        counts["5xx"] += 1
                    elif bad:
                        counts["bad_4xx" if 400 <= r.status_code < 500 else "bad_other"] += 1
                    elif r.status_code == 200:
                        text = r.json()["choices"][0]["message"]["content"]
                        counts["good_ok" if text else "good_empty"] += 1
                        key = _greedy_key(body)
                        if key is not None:
                            counts["greedy_checked"] += 1
                            if text != sequential[key]:
                                counts["greedy_differ"] += 1
                                differ.append({"prompt": key[0], "max_tokens": key[1], "got": text,
                                               "sequential": sequential[key]})
                    else:
                        counts["good_fail"] += 1
                    rss.append(server.rss())

    def chaos(k: int) -> None:
        """Streams that the client drops after a random number of events."""
        rng = random.Random(2000 + k)
        while running.is_set():
            body = {**_soak_body(model, rng), "max_tokens": rng.choice([32, 64, 128]), "stream": True}
            try:
                with httpx.Client(timeout=600) as c, c.stream("POST", server.url + "/v1/chat/completions",
                                                              json=body) as r:
                    if r.status_code != 200:
                        raise httpx.HTTPError(f"status {r.status_code}")
                    cut = rng.randrange(0, 12)
                    for i, _ in enumerate(r.iter_lines()):
                        if i >= cut:
                            break
                with lock:
                    counts["chaos_disconnects"] += 1
            except httpx.HTTPError:
                with lock:
                    counts["chaos_errors"] += 1

    def slow(k: int) -> None:
        """Streams read at a few events per second: they must still end with [DONE]."""
        rng = random.Random(3000 + k)
        while running.is_set():
            body = {**_soak_body(model, rng), "max_tokens": 32, "stream": True}
            last = ""
            try:
                with httpx.Client(timeout=600) as c, c.stream("POST", server.url + "/v1/chat/completions",
                                                              json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data:"):
                            last = line
                            time.sleep(0.2)
            except httpx.HTTPError:
                pass
            with lock:
                counts["slow_done" if last == "data: [DONE]" else "slow_fail"] += 1

    def progress() -> None:
        """A line a minute: how far the soak is, and where the server's memory sits."""
        t0 = time.monotonic()
        while running.wait(0) and not done.wait(60):
            with lock:
                n = counts["good_ok"] + counts["good_empty"] + counts["good_fail"] + counts["bad_4xx"] + \
                    counts["bad_other"] + counts["5xx"] + counts["dropped"]
            parts = rss_parts_mb(server.proc.pid)
            print(f"[soak {time.monotonic() - t0:5.0f} s] {n}/{clients * per_client} requests, "
                  f"RSS {server.rss():.1f} MB (heap {parts['heap']:.1f}, other anonymous {parts['anon']:.1f}, "
                  f"mapped files {parts['files']:.1f})", file=sys.stderr, flush=True)

    done = threading.Event()
    helpers = [threading.Thread(target=chaos, args=(k,)) for k in range(chaos_clients)]
    helpers += [threading.Thread(target=slow, args=(k,)) for k in range(slow_clients)]
    helpers.append(threading.Thread(target=progress, daemon=True))
    for t in helpers:
        t.start()
    try:
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
    finally:
        done.set()
        running.clear()
        for t in helpers:
            t.join()
    time.sleep(1.0)  # the last chaos client's slot is freed at the next step
    from prometheus_client.parser import text_string_to_metric_families

    busy = next(smp.value for fam in text_string_to_metric_families(httpx.get(server.url + "/metrics").text)
                for smp in fam.samples if smp.name == "pydflash2:num_requests_running")
    health = httpx.get(server.url + "/health").json()["status"]
    growth = (rss[-1] - rss[0]) / rss[0] * 100 if rss else float("nan")
    counts["rss_parts_after_mb"] = {k: round(v, 1) for k, v in rss_parts_mb(server.proc.pid).items()}
    counts.update(rss_first_mb=round(rss[0], 1), rss_last_mb=round(rss[-1], 1), rss_growth_pct=round(growth, 2),
                  busy_slots_after=busy, health_after=health, greedy_differ_examples=differ[:5])
    counts["pass"] = (counts["good_fail"] == counts["bad_other"] == counts["5xx"] == counts["dropped"] == 0
                      and counts["greedy_differ"] == counts["chaos_errors"] == counts["slow_fail"] == 0
                      and busy == 0 and health == "ok" and growth < 5.0)
    return counts


def measure_delta(model: str, n_steps: int = 24, rows: int = 4) -> float:
    """Largest |logit difference| of one sequence's verify rows decoded alone
    and decoded in one batch with other sequences' rows, in a context made as
    the server makes it (a KV stream per sequence, flash attention off). The
    tests' near-tie delta for stock builds derives from it (0 on a
    batch-invariant build)."""
    import llama_cpp
    import numpy as np

    from pydflash2.models import resolve_target

    path = str(resolve_target(model))
    llm = llama_cpp.Llama(path, n_ctx=256, verbose=False)
    n_vocab = llm.n_vocab()
    texts = [t.encode() for t in PROMPTS]

    def run(n_other: int) -> np.ndarray:
        p = llama_cpp.llama_context_default_params()
        p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 1024 * (1 + n_other), 512, 512, 1 + n_other
        p.kv_unified = False
        p.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        ctx = llama_cpp.llama_init_from_model(llm._model.model, p)
        batch = llama_cpp.llama_batch_init(512, 0, 1)
        seqs = [llm.tokenize(texts[k % len(texts)] * 40, add_bos=True)[: 8 + n_steps * rows]
                for k in range(1 + n_other)]

        def decode(items: list[tuple[int, int, int, bool]]) -> None:
            batch.n_tokens = len(items)
            for i, (tok, pos, sid, lg) in enumerate(items):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
                batch.seq_id[i][0], batch.logits[i] = sid, lg
            assert llama_cpp.llama_decode(ctx, batch) == 0

        for sid, seq in enumerate(seqs):  # prompts: 8 tokens each, alone
            decode([(seq[j], j, sid, False) for j in range(8)])
        out = []
        for step in range(n_steps):  # verify-like steps: `rows` rows per sequence, all in one batch
            p0 = 8 + step * rows
            decode([(seq[p0 + j], p0 + j, sid, True) for sid, seq in enumerate(seqs) for j in range(rows)])
            for j in range(rows):
                ptr = llama_cpp.llama_get_logits_ith(ctx, j)
                out.append(np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy())
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)
        return np.stack(out)

    alone = run(0)
    worst = 0.0
    for n_other in (1, 3, 7):
        worst = max(worst, float(np.abs(run(n_other) - alone).max()))
        print(f"with {n_other} other sequences in the batch: max |logit diff| so far {worst:.3g}")
    print(f"EPSILON = {worst:.3g} on {Path(path).name}")
    return worst


def decode_costs(model: str, threads: int, reps: int = 7) -> None:
    """CPU seconds of one target llama_decode of B rows, spread over up to 8
    sequences as the server's slots are (thread CPU time, so a busy machine's
    descheduling does not count). B rows per decode cost B x cpu/row: a batch of
    8 slots decoding plainly commits 8 tokens for 8 x cpu/row(8), a serial server
    1 token for cpu/row(1); their ratio bounds what batching can gain here."""
    import statistics

    import llama_cpp

    from pydflash2.models import resolve_target

    llm = llama_cpp.Llama(str(resolve_target(model)), n_ctx=256, verbose=False)
    p = llama_cpp.llama_context_default_params()
    p.n_ctx, p.n_batch, p.n_ubatch, p.n_seq_max = 2048 * 8, 512, 512, 8
    p.kv_unified, p.n_threads, p.n_threads_batch = False, threads, threads  # as the server's context
    ctx = llama_cpp.llama_init_from_model(llm._model.model, p)
    mem = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(512, 0, 1)

    def decode(items: list[tuple[int, int, int]]) -> float:
        batch.n_tokens = len(items)
        for i, (tok, pos, sid) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = sid, True
        t0 = time.thread_time()
        assert llama_cpp.llama_decode(ctx, batch) == 0
        return time.thread_time() - t0

    for sid in range(8):  # a 40-token prompt in every sequence
        decode([(100 + j, j, sid) for j in range(40)])
    sizes = (1, 2, 4, 8, 16, 32)
    cpu: dict[int, list[float]] = {b: [] for b in sizes}
    for _ in range(reps):
        for b in sizes:  # interleaved: the machine's drift spreads over all sizes
            n_seq = min(b, 8)
            cpu[b].append(decode([(200 + j, 40 + j, s) for s in range(n_seq) for j in range(b // n_seq)]))
            for s in range(n_seq):
                llama_cpp.llama_memory_seq_rm(mem, s, 40, -1)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    med = {b: statistics.median(v) for b, v in cpu.items()}
    print(f"target decode CPU cost, {threads} thread(s), load average {os.getloadavg()[0]:.1f}")
    for b, c in med.items():
        print(f"  {b:3d} rows: {c * 1e3:7.1f} ms   {c / b * 1e3:6.2f} ms/row   {b / c:6.1f} rows per CPU-second")
    print(f"8 slots decoding plainly vs one stream: {med[1] / (med[8] / 8):.2f}x tokens per CPU-second at most "
          f"(before prompts, HTTP and scheduling)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--draft", default=None,
                    help="drafter GGUF (default: the shipped drafter for the default target, else a random one)")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds the requests are split into")
    ap.add_argument("--parallel", default="1,4", help="our server's --parallel values to run")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                    help="CPU threads of every server, for one-row and batch decodes alike (default: half the CPUs, "
                         "llama-cpp-python's default for generation)")
    ap.add_argument("--n-max", default="auto")
    ap.add_argument("--flash-attn", choices=["on", "off"], default="off",
                    help="flash attention in every server's target (both servers default to off)")
    ap.add_argument("--max-tokens", default=None, help="comma list of answer lengths to mix (default 16,32,64,128)")
    ap.add_argument("--no-llama-cpp", action="store_true", help="skip llama-cpp-python's server")
    ap.add_argument("--soak", action="store_true", help="also run the soak")
    ap.add_argument("--soak-only", action="store_true")
    ap.add_argument("--soak-requests", type=int, default=1000, help="requests per soak client")
    ap.add_argument("--soak-bad", type=float, default=0.3)
    ap.add_argument("--chaos-clients", type=int, default=2, help="soak: clients that drop streams mid-way")
    ap.add_argument("--slow-clients", type=int, default=2, help="soak: clients that read streams slowly")
    ap.add_argument("--measure-delta", action="store_true")
    ap.add_argument("--decode-costs", action="store_true",
                    help="only measure the CPU cost of target decodes of 1..32 rows (the ceiling of batching)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _stop_all_and_exit)

    if args.max_tokens:
        MAX_TOKENS[:] = [int(x) for x in args.max_tokens.split(",")]
    if args.measure_delta:
        measure_delta(args.model)
        return 0
    if args.decode_costs:
        decode_costs(args.model, args.threads)
        return 0

    from pydflash2.models import default_drafter, resolve_target

    target = str(resolve_target(args.model))
    model_id = Path(target).stem
    tmp = Path(tempfile.mkdtemp(prefix="server_load-"))
    draft = args.draft
    if draft is None and args.model == "smollm2" and default_drafter() is not None:
        draft = str(default_drafter())
    if draft is None:
        draft = str(tmp / "random-drafter.gguf")
        subprocess.run([sys.executable, "-m", "pydflash2", "random-drafter", target, "-o", draft], check=True,
                       cwd=tmp, stdout=subprocess.DEVNULL)
    threads = ["--threads", str(args.threads)]
    ours = [sys.executable, "-m", "pydflash2.server", "--model", target, "--draft", draft, "--n-ctx",
            str(args.n_ctx), "--n-max", args.n_max, "--max-queue", "1000", "--flash-attn", args.flash_attn, *threads]
    env_note = f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start"
    results: list[LoadResult] = []
    report: dict = {"target": target, "draft": draft, "requests": args.requests, "clients": args.clients,
                    "machine": env_note}

    if not args.soak_only:
        # every server up at once (idle ones cost no CPU), the workload in rounds run on each server in
        # turn (A, B, C, A, B, C, ...), so that the shared machine's load drifts over all of them alike
        bodies = workload(args.requests)
        servers: list[Server] = []
        try:
            for par in [int(x) for x in args.parallel.split(",")]:
                port = free_port()
                servers.append(Server(f"pydflash2 --parallel {par}",
                                      [*ours, "--port", str(port), "--parallel", str(par)], port, "/health", tmp))
            if not args.no_llama_cpp:
                port = free_port()
                cmd = [sys.executable, "-m", "llama_cpp.server", "--model", target, "--model_alias", model_id,
                       "--n_ctx", str(args.n_ctx), "--host", "127.0.0.1", "--port", str(port),
                       "--n_threads", str(args.threads), "--n_threads_batch", str(args.threads),
                       "--flash_attn", str(args.flash_attn == "on")]
                servers.append(Server("llama-cpp-python server", cmd, port, "/v1/models", tmp))
            results = [LoadResult(s.name) for s in servers]
            for s, r in zip(servers, results, strict=True):
                warm_up(s, model_id, bodies[0])
                r.rss_before = s.rss()
            n_rounds = max(1, min(args.rounds, len(bodies) // args.clients))
            for k in range(n_rounds):
                part = bodies[k * len(bodies) // n_rounds:(k + 1) * len(bodies) // n_rounds]
                for s, r in zip(servers, results, strict=True):
                    run_load(s, model_id, part, args.clients, r)
                    print(f"round {k + 1}/{n_rounds} {s.name}: {r.completion_tokens / r.wall_s:.1f} tok/s so far, "
                          f"load average {os.getloadavg()[0]:.1f}", flush=True)
            for s, r in zip(servers, results, strict=True):
                r.rss_after = s.rss()
                if s.name.startswith("pydflash2"):
                    r.phases = engine_phases(s)
        finally:
            for s in servers:
                s.stop()
        base = results[-1] if not args.no_llama_cpp else results[0]
        print(f"\n{args.requests} requests, {args.clients} clients, target {Path(target).name}, {env_note}")
        print(f"{'server':28s} {'tokens':>7s} {'tok/s':>8s} {'req/s':>7s} {'p50 s':>7s} {'p95 s':>7s} {'errors':>6s} "
              f"{'RSS MB before->after':>22s} {'tok/s ratio':>11s} {'p95 ratio':>9s} {'same text':>9s} "
              f"{'tok/CPU-s':>9s} {'ratio':>6s}")
        for r in results:
            same = sum(a == b for a, b in zip(r.texts, base.texts, strict=True))
            print(f"{r.name:28s} {r.completion_tokens:7d} {r.tok_s:8.1f} {r.req_s:7.2f} {r.pct(0.5):7.2f} "
                  f"{r.pct(0.95):7.2f} {r.errors:6d} {r.rss_before:10.0f}->{r.rss_after:<10.0f} "
                  f"{r.tok_s / base.tok_s:11.2f} {r.pct(0.95) / base.pct(0.95):9.2f} {same:4d}/{len(r.texts):<4d} "
                  f"{r.tok_cpu_s:9.1f} {r.tok_cpu_s / base.tok_cpu_s:6.2f}")
        for r in results:
            if r.phases:
                ph = r.phases
                print(f"{r.name}: {ph.get('num_steps', 0):.0f} target decodes; seconds: " + ", ".join(
                    f"{k.removesuffix('_seconds')} {v:.1f}" for k, v in ph.items() if k.endswith("_seconds")))
        report["load"] = [{"name": r.name, "tok_s": r.tok_s, "req_s": r.req_s, "p50_s": r.pct(0.5),
                           "p95_s": r.pct(0.95), "errors": r.errors, "rss_before_mb": r.rss_before,
                           "rss_after_mb": r.rss_after, "completion_tokens": r.completion_tokens, "cpu_s": r.cpu_s,
                           "tok_per_cpu_s": r.tok_cpu_s, "phases": r.phases,
                           "wall_s": r.wall_s, "same_text_as_baseline": sum(
                               a == b for a, b in zip(r.texts, base.texts, strict=True))} for r in results]

    if args.soak or args.soak_only:
        port = free_port()
        s = Server("pydflash2 soak", [*ours, "--port", str(port), "--parallel", "4"], port, "/health", tmp)
        try:
            soak = run_soak(s, model_id, args.clients, args.soak_requests, args.soak_bad, args.chaos_clients,
                            args.slow_clients)
        finally:
            s.stop()
        print(f"\nsoak: {args.clients} clients x {args.soak_requests} requests, {args.soak_bad:.0%} malformed, "
              f"{args.chaos_clients} chaos and {args.slow_clients} slow streaming clients")
        print(json.dumps(soak, indent=1))
        report["soak"] = soak
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if report.get("soak", {}).get("pass", True) else 1


if __name__ == "__main__":
    sys.exit(main())
