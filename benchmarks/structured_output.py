"""Structured output under hot sampling (issue 58): N samples over S random JSON schemas
(pydflash2_testing.structured: objects, arrays, tuples, enums, integer bounds, nullable, type-less
and `true` subschemas), spread evenly over chat `response_format`, forced tool calls, Anthropic
Messages' `output_config` and Responses' `text.format`, against a real `pydflash2 serve` with top-k
and min-p off. Prints, per API, the answers sent and finished (not cut off by --max-tokens), and of
the finished ones how many are JSON values valid under their schema ("ok") and invalid, with the
first invalid answers; "fffd": finished answers holding U+FFFD, which the server writes for invalid
UTF-8 (before pydflash2.utf8_pieces, llama.cpp's grammar let a byte-level vocabulary write it into
strings and counted it as one character, so length bounds broke: 43 of 1,972 at T=2).

Targets: `tiny` (default), the fixtures' tiny tools target with its head scaled down (logits over a
few units, so at temperature 2 every token the grammar allows is drawn, control characters
included) and a random DFlash2 drafter; `default`, SmolLM2-135M-Instruct with the shipped drafter;
or a GGUF path (plain decoding unless --draft is given).

    python benchmarks/structured_output.py [--target tiny|default|PATH] [--samples 2000] [--schemas 50]
        [--temperature 2.0] [--max-tokens 96] [--threads 2] [--parallel 2]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import httpx
import pydflash2_testing as testing
from pydflash2_testing import structured
from server_load import Server, _stop_all_and_exit, free_port


def target_args(target: str, draft: str | None, work: Path) -> list[str]:
    if target == "tiny":
        model = testing.make_target_gguf(work / "flat-tools-target.gguf",
                                         testing.TargetSpec(chat_template=testing.TOOLS_TEMPLATE, head_scale=0.1))
        ckpt = testing.make_drafter_checkpoint(work / "v2-hf", model, testing.DrafterSpec(version=2))
        return ["--model", str(model), "--draft", draft or str(testing.checkpoint_to_gguf(ckpt, model,
                                                                                          work / "v2.gguf"))]
    if target == "default":
        return ["--model", str(testing.default_target()), *(["--draft", draft] if draft else [])]
    return ["--model", target, "--draft", draft or "none"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--target", default="tiny", help="tiny (default), default (SmolLM2-135M) or a GGUF path")
    p.add_argument("--draft", default=None, help="drafter GGUF (or none); default: the target's own")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--schemas", type=int, default=50)
    p.add_argument("--temperature", type=float, default=2.0)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=2, help="server slots, and clients sending at once")
    p.add_argument("--n-ctx", type=int, default=2048, help="per slot")
    p.add_argument("--seed", type=int, default=0, help="of the schemas and the chat requests' seeds")
    p.add_argument("--show", type=int, default=5, help="invalid answers to print")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, _stop_all_and_exit)

    schemas = [structured.random_schema(random.Random(args.seed * 100_003 + i)) for i in range(args.schemas)]
    # every path in turn, each over the schemas in turn
    n_kinds = len(structured.KINDS)
    jobs = [(schemas[(i // n_kinds) % len(schemas)], structured.KINDS[i % n_kinds], args.seed + i)
            for i in range(args.samples)]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cmd = [sys.executable, "-m", "pydflash2.server", *target_args(args.target, args.draft, work),
               "--port", str(port := free_port()), "--parallel", str(args.parallel), "--n-ctx", str(args.n_ctx),
               "--threads", str(args.threads), "--top-k", "0", "--min-p", "0"]
        server = Server("pydflash2", cmd, port, "/health", work)
        counts: Counter[tuple[str, str]] = Counter()
        invalid: list[structured.Answer] = []
        start = time.monotonic()
        try:
            with httpx.Client(base_url=server.url, timeout=600) as client:
                def one(job: tuple[object, str, int]) -> structured.Answer:
                    schema, kind, seed = job
                    return structured.ask(client, kind, schema, temperature=args.temperature,
                                          max_tokens=args.max_tokens, seed=seed)

                with ThreadPoolExecutor(args.parallel) as pool:
                    for answer in pool.map(one, jobs):
                        counts[(answer.kind, "sent")] += 1
                        if answer.finished:
                            counts[(answer.kind, "finished")] += 1
                            verdict = answer.verdict()
                            counts[(answer.kind, "ok" if verdict == "ok" else "invalid")] += 1
                            counts[(answer.kind, "fffd")] += "\ufffd" in answer.text
                            if verdict != "ok":
                                invalid.append(answer)
        finally:
            server.stop()
        wall = time.monotonic() - start

    print(f"target {args.target}, {args.samples} samples over {len(schemas)} schemas, temperature "
          f"{args.temperature}, top-k 0, min-p 0, max_tokens {args.max_tokens}; {wall:.0f} s")
    print(f"{'API':<16}{'sent':>7}{'finished':>10}{'ok':>7}{'invalid':>9}{'fffd':>7}")
    for kind in (*structured.KINDS, "all"):
        row = [sum(counts[(k, c)] for k in structured.KINDS) if kind == "all" else counts[(kind, c)]
               for c in ("sent", "finished", "ok", "invalid", "fffd")]
        print(f"{kind:<16}{row[0]:>7}{row[1]:>10}{row[2]:>7}{row[3]:>9}{row[4]:>7}")
    for answer in invalid[:args.show]:
        print(f"\n{answer.kind}: {answer.verdict()}\n  text   {answer.text[:300]!r}\n  schema {answer.schema}")
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
