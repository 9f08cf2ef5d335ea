"""Tau with constrained output beside tau without it: the default pair (or --model/--draft) on the first
--prompts of benchmarks/prompts_chat_eval.txt, greedy, a fixed n_max, each prompt once free and once
under response_format {"type": "json_object"} (llama-cpp-python's JSON grammar; the prompt asks for
JSON, as a client using response_format would). Prints tau and acceptance per block position.

    python benchmarks/constrained_tau.py [--n-max 7] [--prompts 8] [--max-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from llama_cpp.llama_grammar import JSON_GBNF

from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import Speculator
from pydflash2.train.prompts import read_prompts

EVAL = Path(__file__).with_name("prompts_chat_eval.txt")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--draft", default=None)
    p.add_argument("--n-max", type=int, default=7)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    prompts = read_prompts(EVAL)[: args.prompts]
    spec = Speculator(args.model or str(default_target()), args.draft or str(default_drafter()),
                      n_ctx=2048, n_threads=args.threads, n_max=args.n_max)
    for name, grammar, suffix in (("free", None, ""), ("json_object", JSON_GBNF, " Answer in JSON.")):
        steps = generated = 0
        drafted = np.zeros(args.n_max, dtype=np.int64)
        accepted = np.zeros(args.n_max, dtype=np.int64)
        for prompt in prompts:
            out = spec.generate(prompt + suffix, max_tokens=args.max_tokens, temperature=0.0, grammar=grammar)
            steps += out.stats["n_steps"]
            generated += out.stats["n_generated"] - 1
            drafted += np.asarray(out.stats["drafted_per_position"][: args.n_max])
            accepted += np.asarray(out.stats["accepted_per_position"][: args.n_max])
        per_pos = " ".join(f"{a / d:.2f}" if d else "-" for a, d in zip(accepted, drafted, strict=True))
        print(f"{name:12s} tau {generated / max(steps, 1):.2f}  acceptance per position {per_pos}")
    spec.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
