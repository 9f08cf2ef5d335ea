"""The exported drafter measured in the real engine: greedy speculative decoding
with pydflash2's Speculator on held-out prompts, so the number `pydflash2 train`
reports is the one users get (not the training objective's estimate).

The drafter drafts its whole block every step (n_max = block_size - 1), so every
block position is measured. tau: tokens committed per target forward, counted
by the engine, as `pydflash2 bench` counts it. device: where the drafter runs
("auto": the first GPU, else the CPU), as for generate and bench.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np


def evaluate_drafter(target: str | os.PathLike[str], drafter: str | os.PathLike[str], prompts: list[str], *,
                     max_tokens: int = 64, device: str | None = "auto", n_threads: int | None = None,
                     n_ctx: int = 2048, chat: bool = True, n_gpu_layers: int = 0) -> dict[str, Any]:
    """Greedy generations of `prompts` with the drafter; τ and acceptance per block position.

    Returns {"prompts", "max_tokens", "device", "n_max", "tau", "target_forwards", "completion_tokens",
    "drafted_per_position", "accepted_per_position", "acceptance_per_position"
    (accepted / drafted at each position, None where nothing was drafted), "tokens"
    (each prompt's generated ids)}."""
    from ..info import inspect_drafter
    from ..speculator import Speculator

    if not prompts:
        raise ValueError("evaluation needs at least one prompt")
    n_max = int(inspect_drafter(drafter)["block_size"]) - 1
    stats: list[dict[str, Any]] = []
    tokens: list[list[int]] = []
    with Speculator(os.fspath(target), drafter, n_ctx=n_ctx, n_threads=n_threads, n_max=n_max,
                    device=device, n_gpu_layers=n_gpu_layers) as spec:
        assert spec.drafter is not None
        placed = spec.drafter.device
        for prompt in prompts:
            out = spec.generate(prompt, max_tokens=max_tokens, temperature=0.0, chat=chat)
            stats.append(out.stats)
            tokens.append(list(out.tokens))
    drafted = np.sum([s["drafted_per_position"] for s in stats], axis=0)
    accepted = np.sum([s["accepted_per_position"] for s in stats], axis=0)
    steps = sum(int(s["n_steps"]) for s in stats)
    return {
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "device": placed,
        "n_max": n_max,
        # committed per target forward (the first token, from the prompt's forward, excluded)
        "tau": sum(int(s["n_generated"]) - 1 for s in stats) / max(steps, 1),
        "target_forwards": steps,
        "completion_tokens": sum(len(t) for t in tokens),
        "drafted_per_position": [int(x) for x in drafted],
        "accepted_per_position": [int(x) for x in accepted],
        "acceptance_per_position": [float(a) / d if d else None for a, d in zip(accepted, drafted, strict=True)],
        "tokens": tokens,
    }


def describe(result: dict[str, Any]) -> str:
    """One log line: τ and the acceptance at each block position."""
    acc = " ".join("-" if a is None else f"{a:.2f}" for a in result["acceptance_per_position"])
    return (f"engine eval on {result['prompts']} held-out prompts x {result['max_tokens']} tokens "
            f"(drafter on {result['device']}): tau {result['tau']:.2f}, acceptance per position {acc}")


def eval_prompts(path: str | Path, n: int) -> list[str]:
    """The first n prompts of a prompt file (the held-out dev prompts by default)."""
    from .prompts import read_prompts

    return read_prompts(path)[:n]
