"""What the callback capture costs per target decode, against llama.cpp's taps.

One target context made with pydflash2's capture callback (on SmolLM2 by
default, a llama target, so the taps exist too). After a prefix, decodes of B
tokens at the same position (rolled back after each) are timed, interleaved:
  plain     = no features captured (the callback installed but not armed)
  tap       = llama.cpp's layer-input taps for the drafter's layers, set for the whole run
  tap, set  = the same taps set again before every decode (what the engine did before issue 57,
              turning them off for a plain step and on for the next verify: each
              llama_set_embeddings_layer_inp call makes llama.cpp reserve its scheduler again)
  callback  = the callback armed for the same layers (the scheduler stops after
              each observed tensor; its rows are copied to the host)
  bare      = a second context made without the callback (what plain costs
              when the callback is not installed at all)
B = 1 and 8 output logits for every row (as a verify does). The modes take
turns in runs of 10 decodes. Prints median ms per decode and the ratios
callback/tap, callback/plain and (tap, set)/tap from one run.

    python benchmarks/capture_cost.py [--target smollm2] [--reps 60] [--threads 2] [--prefix 200]
        [--sizes 1,8] [--requantize F32|Q8_0|Q4_0|Q4_K_M]

The `bare` column at several sizes is llama.cpp's own verify curve for the target's file type.
"""

from __future__ import annotations

import argparse
import statistics
import time

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import llama_cpp
import numpy as np
import pydflash2_testing as testing
from llama_cpp import _internals
from pydflash2_testing.upstream import ext, silence_logs

from pydflash2 import capture


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2", help="target GGUF, or 'smollm2'")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix", type=int, default=200)
    ap.add_argument("--sizes", default="1,8")
    ap.add_argument("--requantize", default=None, choices=list(testing.REQUANTIZE_TYPES),
                    help="the target requantized to this type first (pydflash2_testing.requantized_target, cached)")
    args = ap.parse_args()

    silence_logs()
    target = testing.resolve_target(args.target)
    if args.requantize:
        target = testing.requantized_target(args.requantize, target)
    llm = llama_cpp.Llama(str(target), n_ctx=1024, n_batch=512, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)
    n_layer = int(llama_cpp.llama_model_n_layer(llm._model.model))
    H = llm.n_embd()
    # the layers a drafter from testing.spec_for_target taps (five, spread over the depth)
    layers = [i + 1 for i in testing.spec_for_target(target).target_layer_ids]
    cc = capture.capturing_context(llm)
    bare = llm._ctx  # the Llama's own context: made without the callback
    rng = np.random.default_rng(0)
    prefix = [int(t) for t in rng.integers(20, llm.n_vocab(), args.prefix)]
    sizes = [int(s) for s in args.sizes.split(",")]
    batch = _internals.LlamaBatch(n_tokens=512, embd=0, n_seq_max=1, verbose=False)

    def decode(ctx: _internals.LlamaContext, toks: list[int], pos0: int, all_logits: bool) -> None:
        batch.set_batch(toks, pos0, all_logits)
        ctx.decode(batch)

    for ctx in (cc.context, bare):
        ctx.kv_cache_clear()
        for i0 in range(0, len(prefix), 256):
            decode(ctx, prefix[i0 : i0 + 256], i0, False)

    def set_taps(on: bool) -> None:
        for lid in layers:
            ext.set_embeddings_layer_inp(cc.ctx, lid, on)

    def timed(mode: str, toks: list[int]) -> float:
        ctx = bare if mode == "bare" else cc.context
        if mode == "tap, set":
            set_taps(True)  # the values it had: llama.cpp reserves again all the same
        if mode == "callback":
            cc.capture.arm(layers, H, len(toks))
        t0 = time.perf_counter()
        decode(ctx, toks, args.prefix, True)
        if mode == "callback":
            cc.capture.check("llama")
            _ = [cc.capture.rows(lid) for lid in layers]  # what the engine reads out
        elif mode.startswith("tap"):
            _ = [np.ctypeslib.as_array(ext.get_embeddings_layer_inp(cc.ctx, lid), shape=(len(toks), H)).copy()
                 for lid in layers]
        dt = time.perf_counter() - t0
        cc.capture.disarm()
        llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx.ctx), 0, args.prefix, -1)
        return dt

    modes = ("plain", "tap", "tap, set", "callback", "bare")
    print(f"target {target.name}: n_layer {n_layer}, n_embd {H}, layers {layers}, prefix {args.prefix}, "
          f"threads {args.threads}, reps {args.reps}")
    print(f"{'B':>3} " + " ".join(f"{m + ' ms':>12}" for m in modes) + f" {'cb/tap':>8} {'cb/plain':>9} {'set/tap':>8}")
    for B in sizes:
        times: dict[str, list[float]] = {m: [] for m in modes}
        toks = [int(t) for t in rng.integers(20, llm.n_vocab(), B)]
        # modes take turns in runs of 10 decodes; switching the taps changes the graph, so
        # each run starts with one untimed decode (graph rebuild)
        for _ in range(max(1, args.reps // 10)):
            for m in modes:
                set_taps(m.startswith("tap"))
                timed(m, toks)
                times[m] += [timed(m, toks) for _ in range(10)]
        set_taps(False)
        med = {m: statistics.median(v) * 1e3 for m, v in times.items()}
        print(f"{B:>3} " + " ".join(f"{med[m]:>12.3f}" for m in modes)
              + f" {med['callback'] / med['tap']:>8.3f} {med['callback'] / med['plain']:>9.3f}"
              + f" {med['tap, set'] / med['tap']:>8.3f}")
    batch.close()
    cc.close()


if __name__ == "__main__":
    main()
