"""A coding agent's first two turns against `pydflash2 serve` (issue 58, long agent prompts): a long
first request (a system prompt and tools of --prompt-tokens tokens, as Claude Code's and Codex's are),
then the agent loop's follow-up (the same history, the answer, a new user turn), as streamed Anthropic
Messages on the default pair at --n-ctx (default 8192: SmolLM2's trained context). Prints each turn's
time to first token (the first delta of the answer), its prompt tokens and the tokens the slot held
already (`cache_read_input_tokens`), and the follow-up's time to first token as a share of the first's:
what the prefix cache saves the agent every turn. One server per --flash-attn setting, one after the
other ("default": the server's choice, on with its context-draft trees).

    python benchmarks/agent_turns.py --threads 2 [--prompt-tokens 7000] [--flash-attn default,off]

The system prompt is this checkout's docs (docs/server.md, then docs/python-api.md), cut to size with
the server's own /v1/messages/count_tokens. Run it from outside the source checkout (the installed
package is imported by the server).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
from server_load import Server, _stop_all_and_exit, free_port

DOCS = [Path(__file__).resolve().parents[1] / "docs" / name for name in ("server.md", "python-api.md")]
TOOLS = [  # a coding agent's usual three, in Anthropic's shape
    {"name": "Bash", "description": "Run a shell command and return its output.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
    {"name": "Read", "description": "Read a file of the workspace.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
    {"name": "Edit", "description": "Replace a string in a file.",
     "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}, "old": {"type": "string"},
                                                       "new": {"type": "string"}},
                      "required": ["file_path", "old", "new"]}},
]
FIRST = "Which flag sets the server's context size? Answer in one sentence."
FOLLOW_UP = "And which flag sets the number of slots? One sentence."


def system_prompt(url: str, tokens: int) -> str:
    """The docs cut to about `tokens` tokens of the whole first request (counted by the server)."""
    text = "\n\n".join(p.read_text() for p in DOCS)
    chars = tokens * 4
    for _ in range(4):  # the ratio of characters to tokens, corrected by the server's count
        body = {"model": "x", "system": text[:chars], "tools": TOOLS, "messages": [{"role": "user", "content": FIRST}]}
        n = httpx.post(url + "/v1/messages/count_tokens", json=body, timeout=60).json()["input_tokens"]
        if abs(n - tokens) <= tokens // 50 or chars >= len(text) and n < tokens:
            break
        chars = min(len(text), int(chars * tokens / n))
    return text[:chars]


def turn(url: str, body: dict) -> dict:
    """One streamed Messages request: seconds to the first delta, the whole answer, its usage."""
    t0 = time.perf_counter()
    ttft, answer, usage, timings = None, [], {}, {}
    with httpx.stream("POST", url + "/v1/messages", json={**body, "stream": True}, timeout=3600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "message_start":
                usage.update(event["message"]["usage"])
            elif event["type"] == "content_block_delta":
                ttft = ttft if ttft is not None else time.perf_counter() - t0
                delta = event["delta"]
                answer.append(delta.get("text") or delta.get("partial_json") or "")
            elif event["type"] == "message_delta":
                usage.update(event.get("usage") or {})
                timings = event.get("timings") or {}
    return {"ttft_s": ttft, "total_s": time.perf_counter() - t0, "answer": "".join(answer), "usage": usage,
            "timings": timings}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=8192)
    ap.add_argument("--prompt-tokens", type=int, default=7000, help="the first request's tokens, tools included")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--flash-attn", default="default,off", help="comma-separated: default, on, off")
    ap.add_argument("--serve-args", default="", help="more arguments for serve ('--model X --draft none')")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, _stop_all_and_exit)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fa in args.flash_attn.split(","):
            port = free_port()
            cmd = [sys.executable, "-m", "pydflash2.server", "--port", str(port), "--n-ctx", str(args.n_ctx),
                   "--threads", str(args.threads), "--temp", "0"]
            if fa != "default":
                cmd += ["--flash-attn", fa]
            cmd += args.serve_args.split()
            server = Server(f"flash-attn {fa}", cmd, port, "/health", Path(tmp))
            try:
                system = system_prompt(server.url, args.prompt_tokens)
                history = [{"role": "user", "content": FIRST}]
                base = {"model": "x", "system": system, "tools": TOOLS, "max_tokens": args.max_tokens}
                first = turn(server.url, {**base, "messages": history})
                history += [{"role": "assistant", "content": first["answer"] or "."},
                            {"role": "user", "content": FOLLOW_UP}]
                second = turn(server.url, {**base, "messages": history})
            finally:
                server.stop()
            for name, t in (("first", first), ("follow-up", second)):
                u = t["usage"]
                prompt = u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0)
                rows.append((fa, name, prompt, u.get("cache_read_input_tokens", 0), t["timings"].get("prompt_n", 0),
                             t["timings"].get("prompt_ms", 0.0) / 1e3, t["ttft_s"], t["total_s"]))
            for name, t in (("first", first), ("follow-up", second)):
                ledger = t["timings"].get("ledger") or {}
                parts = {k[:-3]: v * ledger["steps"] / 1e3 for k, v in ledger.items() if k.endswith("_ms")}
                shown = ", ".join(f"{k} {v:.2f}" for k, v in sorted(parts.items(), key=lambda x: -x[1]) if v >= 0.01)
                print(f"flash-attn {fa}, {name} turn: the engine's seconds by part ({ledger.get('steps')} steps): "
                      f"{shown}", flush=True)
            print(f"flash-attn {fa}: follow-up time to first token {second['ttft_s']:.2f} s = "
                  f"{second['ttft_s'] / first['ttft_s']:.3f} of the first turn's {first['ttft_s']:.2f} s", flush=True)
    # prefilled / prefill s: the server's timings (prompt_n, prompt_ms: the rows it decoded for the prompt)
    print(f"\n{'flash-attn':>10} {'turn':>9} {'prompt':>7} {'cached':>7} {'prefilled':>9} {'prefill s':>9} "
          f"{'ttft s':>8} {'total s':>8}")
    for fa, name, prompt, cached, prefilled, prefill_s, ttft, total in rows:
        print(f"{fa:>10} {name:>9} {prompt:>7} {cached:>7} {prefilled:>9} {prefill_s:>9.2f} {ttft:>8.2f} {total:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
