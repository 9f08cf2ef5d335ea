"""Flash attention off vs on for the target, interleaved in one run.

For each setting: a raw greedy loop through llama-cpp-python (Llama.eval, one
token at a time) and pydflash2's engine (plain n_max=0, and n_max=3 with a
random drafter, so verify batches of 4), on SmolLM2 by default. Prints tokens
per second side by side, and whether the two settings produce the same greedy
tokens as batch-1 decoding does with the same setting (see
benchmarks/batch_invariance.py --flash-attn off,on for the kernel-level check).

    python benchmarks/flash_attn.py [--model T.gguf] [--rounds 3] [--tokens 64] [--n-ctx 4096]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

PROMPTS = ["Why is the sky blue?", "Write a haiku about autumn.", "Explain recursion to a child.",
           "Give me a recipe for pancakes."]


def raw_loop(llm: llama_cpp.Llama, prompt: list[int], n: int) -> tuple[list[int], float]:
    llm.reset()
    llm.eval(prompt)
    out = []
    t0 = time.perf_counter()
    for _ in range(n):
        row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(row, shape=(llm.n_vocab(),))))
        out.append(tok)
        llm.eval([tok])
    dt = time.perf_counter() - t0
    llm.reset()
    return out, n / dt


def main() -> int:
    import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
    import pydflash2_testing as testing

    from pydflash2 import Speculator
    from pydflash2.models import default_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None, help="threads for every batch size")
    args = ap.parse_args()
    model = Path(args.model) if args.model else default_target()

    with tempfile.TemporaryDirectory() as tmp:
        draft = testing.make_random_drafter_for(model, Path(tmp) / "d.gguf")
        llms = {fa: llama_cpp.Llama(str(model), n_ctx=args.n_ctx, n_batch=512, flash_attn=fa, n_threads=args.threads,
                                    n_threads_batch=args.threads, verbose=False)
                for fa in (False, True)}
        specs = {(fa, n): Speculator(llms[fa], draft if n else None, n_max=n) for fa in (False, True) for n in (0, 3)}
        speeds: dict[tuple[bool, str], list[float]] = {}
        tokens: dict[tuple[bool, str], list[list[int]]] = {}
        for r in range(args.rounds):
            for fa in ((False, True) if r % 2 == 0 else (True, False)):
                for p in PROMPTS:
                    ids = specs[(fa, 0)].tokenize_prompt(p)
                    toks, tps = raw_loop(llms[fa], ids, args.tokens)
                    speeds.setdefault((fa, "raw loop"), []).append(tps)
                    tokens.setdefault((fa, "raw loop"), []).append(toks)
                    for n in (0, 3):
                        out = specs[(fa, n)].generate(ids, max_tokens=args.tokens)
                        key = (fa, f"engine n_max={n}")
                        speeds.setdefault(key, []).append(out.stats["tokens_per_second"])
                        tokens.setdefault(key, []).append(out.tokens)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        for s in specs.values():
            s.close()

    print(f"target {model.name}, n_ctx {args.n_ctx}, {args.tokens} tokens x {len(PROMPTS)} prompts x "
          f"{args.rounds} rounds (median tok/s)")
    print(f"{'':<18} {'FA off':>8} {'FA on':>8} {'on/off':>7}  same tokens as the raw loop (off / on)")
    for what in ("raw loop", "engine n_max=0", "engine n_max=3"):
        off, on = statistics.median(speeds[(False, what)]), statistics.median(speeds[(True, what)])
        same = [sum(a == b for a, b in zip(tokens[(fa, what)], tokens[(fa, "raw loop")], strict=True))
                for fa in (False, True)]
        n = len(tokens[(False, what)])
        print(f"{what:<18} {off:8.1f} {on:8.1f} {on / off:7.2f}  {same[0]}/{n} / {same[1]}/{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
