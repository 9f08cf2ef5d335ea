"""Plain and speculative decoding at several thread counts, side by side in one run.

The default pair (or --model/--draft), the first --prompts of benchmarks/prompts_chat_eval.txt,
greedy. For every prompt each configuration runs once, in turns (plain and speculative at each
thread count), so that machine noise hits all alike. Prints tokens/s per configuration, tau, and the
ratios to plain decoding at one thread and at the same threads, and the load average around the run
(ggml's thread barriers spin: on a machine whose cores are busy, more threads can be slower).

    python benchmarks/threads.py [--threads 1,2] [--n-max 7] [--prompts 8] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import Speculator, load_target
from pydflash2.train.prompts import read_prompts

EVAL = Path(__file__).with_name("prompts_chat_eval.txt")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--n-max", type=int, default=7)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    args = p.parse_args()
    model = args.model or str(default_target())
    draft = args.draft or str(default_drafter())
    threads = [int(t) for t in args.threads.split(",")]
    prompts = read_prompts(EVAL)[: args.prompts]

    specs: dict[tuple[int, int], Speculator] = {}
    for t in threads:
        llm, _ = load_target(model, n_ctx=2048, n_threads=t)
        specs[(t, 0)] = Speculator(llm, None, n_max=0)
        specs[(t, args.n_max)] = Speculator(llm, draft, n_max=args.n_max)
    load_before = os.getloadavg()[0]
    rates: dict[tuple[int, int], list[float]] = {k: [] for k in specs}
    taus: dict[tuple[int, int], list[float]] = {k: [] for k in specs}
    for prompt in prompts:
        for key, spec in specs.items():
            out = spec.generate(prompt, max_tokens=args.max_tokens, temperature=0.0)
            rates[key].append(out.stats["tokens_per_second"])
            taus[key].append(out.stats["tau"])
    load_after = os.getloadavg()[0]

    base = statistics.median(rates[(threads[0], 0)])
    print(f"{len(prompts)} prompts x {args.max_tokens} tokens, greedy; load average {load_before:.1f} before, "
          f"{load_after:.1f} after, {os.cpu_count()} logical CPUs")
    print("| threads | mode | tok/s (median) | tau | vs plain at "
          f"{threads[0]} thread{'s' if threads[0] > 1 else ''} | vs plain at the same threads |")
    print("| --- | --- | --- | --- | --- | --- |")
    for (t, n), r in rates.items():
        med = statistics.median(r)
        same = statistics.median(rates[(t, 0)])
        mode = "plain" if n == 0 else f"n_max {n}"
        print(f"| {t} | {mode} | {med:.1f} | {statistics.mean(taus[(t, n)]):.2f} | {med / base:.2f}x | "
              f"{med / same:.2f}x |")
    for spec in specs.values():
        spec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
