"""The server with context drafts (issue 35): C clients replay agent conversations with variations
against `pydflash2 serve` with --context-drafts off, request and global, one server after the other
in one run (the default pair: SmolLM2-135M-Instruct and the shipped DFlash2 drafter).

A conversation is a task of benchmarks/prompts_agentic_eval.jsonl with a small variation (another
name, number or wording in its last user turn), sent as it is, then again with the answer and a
follow-up turn (the agent loop's next request, which repeats the history). Every client runs the
same conversations in its own order, so that under "global" one client's past outputs are a cache
for another's variation of the same task (one API key). Prints completion tokens per second, tau
(committed tokens per target step after the first, from each answer's timings) and the drafts
accepted by source, with the ratios to "off".

    python benchmarks/hybrid_server.py --threads 2 [--clients 8] [--parallel 4] [--tasks 8] [--max-tokens 96]
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from server_load import Server, _stop_all_and_exit, free_port

AGENTIC = Path(__file__).resolve().parent / "prompts_agentic_eval.jsonl"
FOLLOW_UPS = ["Now do the same for the version above, and keep everything else unchanged.",
              "Good. Repeat your answer with one more sentence of explanation at the end.",
              "Show the result again, exactly as before."]


def conversations(n_tasks: int, n_variants: int) -> list[list[dict]]:
    tasks = [json.loads(line)["messages"] for line in AGENTIC.read_text().splitlines() if line.strip()]
    step = max(1, len(tasks) // n_tasks)
    out = []
    for messages in tasks[::step][:n_tasks]:
        for v in range(n_variants):
            varied = [dict(m) for m in messages]
            varied[-1]["content"] += ("" if v == 0 else f" (variant {v}: keep names as they are)")
            out.append(varied)
    return out


def run(server: Server, convs: list[list[dict]], clients: int, max_tokens: int) -> dict:
    local = threading.local()
    opened: list[httpx.Client] = []
    lock = threading.Lock()
    totals = {"tokens": 0, "steps": 0, "committed": 0, "context_accepted": 0, "context_drafted": 0,
              "lattice_accepted": 0, "lattice_drafted": 0, "errors": 0}

    def ask(messages: list[dict]) -> str:
        c = getattr(local, "client", None)
        if c is None:
            c = local.client = httpx.Client(timeout=900)
            opened.append(c)
        r = c.post(server.url + "/v1/chat/completions",
                   json={"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
        if r.status_code != 200:
            with lock:
                totals["errors"] += 1
            return ""
        out = r.json()
        t = out.get("timings", {})
        with lock:
            totals["tokens"] += out["usage"]["completion_tokens"]
            totals["steps"] += t.get("n_steps", 0)
            totals["committed"] += max(0, t.get("predicted_n", 0) - 1)
            for k in ("context_accepted", "context_drafted", "lattice_accepted", "lattice_drafted"):
                totals[k] += t.get(k, 0)
        return out["choices"][0]["message"]["content"]

    def client(i: int) -> None:
        order = list(range(len(convs)))
        random.Random(i).shuffle(order)
        for k in order[: max(1, len(order) // clients * 2)]:
            messages = convs[k]
            answer = ask(messages)
            ask(messages + [{"role": "assistant", "content": answer},
                            {"role": "user", "content": FOLLOW_UPS[k % len(FOLLOW_UPS)]}])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    totals["wall_s"] = time.perf_counter() - t0
    for c in opened:
        c.close()
    return totals


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--variants", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--modes", default="off,request,global")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _stop_all_and_exit)
    convs = conversations(args.tasks, args.variants)
    log_dir = Path("/tmp/hybrid_server_logs")
    log_dir.mkdir(exist_ok=True)
    print(f"{len(convs)} conversations ({args.tasks} tasks x {args.variants} variants), {args.clients} clients, "
          f"--parallel {args.parallel}, --threads {args.threads}, {args.max_tokens} tokens, T=0")
    results = {}
    for mode in args.modes.split(","):
        port = free_port()
        cmd = [sys.executable, "-m", "pydflash2", "serve", "--port", str(port), "--parallel", str(args.parallel),
               "--threads", str(args.threads), "--n-ctx", str(args.n_ctx), "--context-drafts", mode]
        server = Server(mode, cmd, port, "/health", log_dir)
        try:
            results[mode] = r = run(server, convs, args.clients, args.max_tokens)
        finally:
            server.stop()
        r["tok_s"] = r["tokens"] / r["wall_s"]
        r["tau"] = r["committed"] / max(r["steps"], 1)
        print(f"{mode}: {r['tok_s']:.1f} tok/s, tau {r['tau']:.2f}, context {r['context_accepted']}/"
              f"{r['context_drafted']}, lattice {r['lattice_accepted']}/{r['lattice_drafted']}, "
              f"{r['errors']} errors, {r['wall_s']:.0f} s", flush=True)
    base = results.get("off")
    if base:
        for mode, r in results.items():
            print(f"| {mode} | {r['tok_s']:.1f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['tau']:.2f} "
                  f"| {r['context_accepted']}/{r['context_drafted']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
