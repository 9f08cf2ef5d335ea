"""Propose cost of one trained drafter exported with different draft vocabularies,
next to the target's verify cost, and the break-even tau that follows.

For each drafter GGUF (e.g. the same training run exported at V = full / 16k / 8k):
  propose(n) = pdf2_drafter_propose of a block of n (anchor + n-1 drafts), median
  verify(B)  = one target decode of B tokens after the same context, median
A speculative step with n-1 drafts costs propose(n) + verify(n); plain decoding
costs verify(1) per token, so the step pays when tau > (propose(n) + verify(n)) / verify(1).
All timings interleaved in one run.

    python benchmarks/draft_vocab_costs.py TARGET.gguf full=d_full.gguf 16k=d16.gguf 8k=d8.gguf [--ctx 200]
"""

from __future__ import annotations

import argparse
import statistics
import time

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import numpy as np
from pydflash2_testing import upstream

from pydflash2 import Drafter
from pydflash2._native import lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("drafters", nargs="+", help="LABEL=drafter.gguf")
    ap.add_argument("--ctx", type=int, default=200)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n", default="2,4,8", help="block lengths (anchor + drafts)")
    args = ap.parse_args()
    ns = [int(x) for x in args.n.split(",")]
    labels = [d.split("=", 1)[0] for d in args.drafters]
    paths = [d.split("=", 1)[1] for d in args.drafters]

    up = upstream.UpstreamDrafter(args.target, paths[0], n_ctx=args.ctx + 64, n_threads=args.threads)
    rng = np.random.default_rng(0)
    prompt = rng.integers(20, up.n_vocab, size=args.ctx).tolist()
    feats, logits = up.target_decode(prompt, 0)
    anchor = int(np.argmax(logits[-1]))
    drafters = []
    for p in paths:
        d = Drafter(p, args.target, n_ctx=args.ctx + 64, n_threads=args.threads, device="CPU")
        d.inject(feats, np.arange(args.ctx))
        drafters.append(d)

    def verify(b: int) -> float:
        t0 = time.perf_counter()
        up.target_decode([anchor] * b, args.ctx)
        dt = time.perf_counter() - t0
        up.truncate(args.ctx, drafter=False)
        return dt

    def propose(d: Drafter, n: int) -> float:
        t0 = time.perf_counter()
        rc = lib.pdf2_drafter_propose(d._h, anchor, args.ctx, n)
        dt = time.perf_counter() - t0
        assert rc == 0
        return dt

    cols = sorted(set(ns) | {1})
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(args.reps + 3):
        for b in cols:
            t = verify(b)
            if rep >= 3:
                times.setdefault(("verify", b), []).append(t)
        for label, d in zip(labels, drafters, strict=True):
            for n in ns:
                t = propose(d, n)
                if rep >= 3:
                    times.setdefault((label, n), []).append(t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"threads={args.threads} ctx={args.ctx} reps={args.reps} (medians, ms)")
    print("verify(B): " + "  ".join(f"B={b}: {med[('verify', b)]:.2f}" for b in cols))
    print(f"{'drafter':>8} {'n':>3} {'propose ms':>11} {'step ms':>8} {'break-even tau':>15}")
    for label in labels:
        for n in ns:
            step = med[(label, n)] + med[("verify", n)]
            print(f"{label:>8} {n:>3} {med[(label, n)]:11.2f} {step:8.2f} {step / med[('verify', 1)]:15.2f}")
    up.close()


if __name__ == "__main__":
    main()
