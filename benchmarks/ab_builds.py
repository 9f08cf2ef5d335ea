"""Two builds of pydflash2 side by side: the same prompts through the same configurations, interleaved
prompt by prompt so that machine noise hits both alike. Each build runs in a worker process of its own
(one ggml per process), started with that build's Python; the driver hands both the same prompts and
prints tau, median tokens/s and the ratio B/A per configuration, and how many greedy outputs agree.

    python benchmarks/ab_builds.py --python-a /path/to/before/.venv/bin/python \\
        --python-b .venv/bin/python --threads 2 --max-tokens 64 --n-prompts 8 --temperatures 0

(Used to check that a refactor left behaviour and speed alone: issue 44's before/after run.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CONFIGS = ("plain", "lattice chain", "lattice tree 16", "context alone", "merged tree 16", "auto")


def worker(args: argparse.Namespace) -> int:
    """Loads the default pair, makes every configuration, then answers one JSON line per request."""
    from pydflash2.models import default_drafter, default_target
    from pydflash2.speculator import Speculator, load_target

    model, draft = str(default_target()), str(default_drafter())
    llm, _ = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, tree_budget=16, context_drafts="request")
    make = {
        "plain": lambda: Speculator(llm, None, n_max=0),
        "lattice chain": lambda: Speculator(llm, draft, n_max="auto"),
        "lattice tree 16": lambda: Speculator(llm, draft, n_max=7, tree_budget=16),
        "context alone": lambda: Speculator(llm, None, n_max=0, context_drafts="request"),
        "merged tree 16": lambda: Speculator(llm, draft, n_max=7, tree_budget=16, context_drafts="request"),
        "auto": lambda: Speculator(llm, draft, n_max="auto", context_drafts="request"),
    }
    specs = {name: make[name]() for name in args.configs.split(",")}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        out = {}
        for name, spec in specs.items():
            ids = spec.tokenize_prompt(req["messages"])
            c = spec.generate(ids, max_tokens=req["max_tokens"], temperature=req["temperature"], seed=req["seed"])
            out[name] = {"tokens": c.tokens, "steps": c.stats["n_steps"], "generated": c.stats["n_generated"],
                         "tps": c.stats["tokens_per_second"]}
        print(json.dumps(out), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python-a", required=True, help="the first build's Python (e.g. before a change)")
    ap.add_argument("--python-b", default=sys.executable, help="the second build's Python")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-prompts", type=int, default=8, help="per set")
    ap.add_argument("--sets", default="agentic,chat")
    ap.add_argument("--temperatures", default="0")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    sys.path.insert(0, str(BENCH))
    from hybrid_drafts import load_sets

    cmd = [str(Path(__file__).resolve()), "--worker", "--threads", str(args.threads), "--n-ctx", str(args.n_ctx),
           "--configs", args.configs, "--python-a", "-"]
    # one after the other: each worker measures its step costs as it starts, which the other's start
    # would slow (and auto chooses by those costs)
    procs = {}
    for ab, py in (("A", args.python_a), ("B", args.python_b)):
        procs[ab] = subprocess.Popen([py, *cmd], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     stderr=subprocess.DEVNULL, cwd="/")
        assert json.loads(procs[ab].stdout.readline())["ready"]
    names = args.configs.split(",")
    print(f"A: {args.python_a}\nB: {args.python_b}\n--threads {args.threads}, {args.max_tokens} tokens, "
          f"n_ctx {args.n_ctx}, the default pair")
    sets = load_sets(args.n_prompts)
    for set_name in args.sets.split(","):
        for temp in (float(t) for t in args.temperatures.split(",")):
            runs: dict[str, list[dict]] = {"A": [], "B": []}
            for i, messages in enumerate(sets[set_name]):
                req = json.dumps({"messages": messages, "max_tokens": args.max_tokens, "temperature": temp,
                                  "seed": 1000 + i})
                for ab in (("A", "B") if i % 2 == 0 else ("B", "A")):  # who goes first alternates
                    procs[ab].stdin.write(req + "\n")
                    procs[ab].stdin.flush()
                    runs[ab].append(json.loads(procs[ab].stdout.readline()))
            print(f"\n{set_name}, {len(runs['A'])} prompts, T={temp:g}")
            print("| configuration | tau A | tau B | tok/s A | tok/s B | B/A tok/s (median per prompt) | same tokens "
                  "| A = plain A | B = plain B |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for name in names:
                a = [r[name] for r in runs["A"]]
                b = [r[name] for r in runs["B"]]
                tau = [sum(x["generated"] - 1 for x in r) / max(1, sum(x["steps"] for x in r)) for r in (a, b)]
                tps = [statistics.median(x["tps"] for x in r) for r in (a, b)]
                ratio = statistics.median(y["tps"] / max(x["tps"], 1e-9) for x, y in zip(a, b, strict=True))
                same = sum(x["tokens"] == y["tokens"] for x, y in zip(a, b, strict=True))
                # at T=0 a lossless configuration answers its own build's plain tokens
                as_plain = ["-" if "plain" not in names else
                            f"{sum(r[name]['tokens'] == r['plain']['tokens'] for r in runs[ab])}/{len(a)}"
                            for ab in ("A", "B")]
                print(f"| {name} | {tau[0]:.2f} | {tau[1]:.2f} | {tps[0]:.1f} | {tps[1]:.1f} | {ratio:.3f} "
                      f"| {same}/{len(a)} | {as_plain[0]} | {as_plain[1]} |")
            sys.stdout.flush()
    for p in procs.values():
        p.stdin.close()
        p.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
