"""Propose latency: our drafter graph vs upstream llama.cpp's drafter decode.

Same drafter + target files, same injected context; for each block length n
the two are timed interleaved (ours, upstream, ours, upstream, ...):
  ours     = pdf2_drafter_propose (graph run + one read-back of the lattice)
  upstream = llama_process of the block batch on upstream's drafter context
             (batch building and the seq_rm rollback are outside the timing)
Prints median times and the ratio ours/upstream (goal <= 1.0).

    python benchmarks/propose_latency.py [--ctx 256] [--reps 50] [--threads 2] [--shipped]

--shipped measures the shipped pair (SmolLM2 target, the DFlash2 drafter in
pydflash2/data) instead of generated tiny models.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import numpy as np
import pydflash2_testing as testing
from pydflash2_testing import upstream

from pydflash2 import Drafter
from pydflash2._native import lib


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", type=int, default=256, help="context rows injected before drafting")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--shipped", action="store_true", help="the shipped SmolLM2 pair instead of tiny models")
    args = ap.parse_args()

    if args.shipped:
        from pydflash2.models import default_drafter, default_target

        target, drafter = default_target(), default_drafter()
    else:
        target, drafter = make_tiny_pair(args.embd)
    measure(target, drafter, args.ctx, args.reps, args.threads)


def make_tiny_pair(embd: int) -> tuple[Path, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="pdf2-bench-"))
    tspec = testing.TargetSpec(n_layer=4, n_embd=embd, n_head=4, n_head_kv=2, n_ff=2 * embd)
    target = testing.make_target_gguf(tmp / "target.gguf", tspec)
    dspec = testing.DrafterSpec(
        version=2,
        block_size=16,
        target_layer_ids=(0, 1, 2),
        n_ff=2 * embd,
        selector_top_k=8,
        conv_group_size=32,
        selector_rank=16,
    )
    ck = testing.make_drafter_checkpoint(tmp / "ck", target, dspec)
    return target, testing.checkpoint_to_gguf(ck, target, tmp / "dflash2.gguf")


def measure(target: Path, drafter: Path, ctx: int, reps: int, threads: int) -> None:
    up = upstream.UpstreamDrafter(target, drafter, n_ctx=ctx + 64, n_threads=threads)
    ours = Drafter(drafter, target, n_ctx=ctx + 64, n_threads=threads)
    rng = np.random.default_rng(0)
    prompt = rng.integers(8, up.n_vocab, size=ctx).tolist()
    feats, logits = up.target_decode(prompt, 0)
    up.inject(feats, range(ctx))
    ours.inject(feats, np.arange(ctx))
    anchor, pos = int(np.argmax(logits[-1])), ctx
    lc = up._lc

    def run_upstream(n: int) -> float:
        lc.llama_batch_ext_clear(up._batch_d)
        for i in range(n):
            up._add_token(up._batch_d, anchor if i == 0 else up.mask_token_id, pos + i, False)
        t0 = time.perf_counter()
        up._process(up.drafter_ctx, up._batch_d, "bench")
        lat = upstream.ext.get_embeddings_nextn(up.drafter_ctx)
        _ = lat[0]
        dt = time.perf_counter() - t0
        up._seq_rm(up.drafter_ctx, pos)
        return dt

    def run_ours(n: int) -> float:
        t0 = time.perf_counter()
        rc = lib.pdf2_drafter_propose(ours._h, anchor, pos, n)
        dt = time.perf_counter() - t0
        assert rc == 0
        return dt

    print(f"{Path(target).name} + {Path(drafter).name}: device={ours.device} threads={threads} ctx={ctx} reps={reps}")
    print(f"{'n':>3} {'ours ms':>9} {'upstream ms':>12} {'ratio':>7}")
    for n in [n for n in (4, 8, 16) if n <= ours.block_size]:
        for _ in range(5):  # warm-up (graph build / allocation)
            run_ours(n)
            run_upstream(n)
        t_o, t_u = [], []
        for _ in range(reps):
            t_o.append(run_ours(n))
            t_u.append(run_upstream(n))
        mo, mu = statistics.median(t_o) * 1e3, statistics.median(t_u) * 1e3
        print(f"{n:>3} {mo:9.3f} {mu:12.3f} {mo / mu:7.2f}")
    up.close()


if __name__ == "__main__":
    main()
